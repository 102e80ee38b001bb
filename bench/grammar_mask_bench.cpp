// What one structured-output mask costs on the host: a tokenizer folder's vocabulary in a trie, a
// grammar (any JSON object, or a JSON Schema), and a JSON text fed token by token. At every token
// boundary the mask is computed three ways and timed: the whole trie walked from the state (no
// cache: TokenTrie::fill_allowed), the engine's constraint on its first text (suffix cache cold),
// and the same constraint on a second text (suffix cache warm, whole-state cache cold: the steady
// state of a server). Prints the distribution of each, in microseconds per row: the work a
// constrained row adds to a step, on a worker thread overlapped with the forward.
//   grammar_mask_bench TOKENIZER_DIR
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

using namespace atom;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: grammar_mask_bench TOKENIZER_DIR\n");
    return 2;
  }
  const std::string texts[2] = {
      R"({"book": "Genesis", "chapter": 1, "verse": "In the beginning God created the heaven and the earth.", "tags": ["creation", "light", "day one"], "notes": {"x": [1, 2.5, -3e2, true, null], "y": "\u00e9t\u00e9 \"quoted\""}})",
      R"({"book": "Exodus", "chapter": 20, "verse": "Thou shalt have no other gods before me.", "tags": ["law", "commandments"], "notes": {"deep": {"er": [[1, {"z": "w"}], []]}, "n": -0.25}})"};
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_dir(argv[1]);
  auto trie = grammar::TokenTrie::from_tokenizer(tok, tok.vocab_size());
  const std::string schema =
      R"({"type": "object", "properties": {"book": {"type": "string"}, "chapter": {"type": "integer"}, "verse": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}, "notes": {"type": "object"}}, "required": ["book", "chapter", "verse"]})";
  std::printf("vocabulary %lld tokens\n", static_cast<long long>(trie->vocab_size()));
  struct Stats {
    std::vector<double> us;
    void print(const char* what) {
      std::sort(us.begin(), us.end());
      double sum = 0;
      for (double u : us) sum += u;
      auto q = [&](double f) {
        return us[static_cast<size_t>(f * static_cast<double>(us.size() - 1))];
      };
      std::printf("  %-34s %3zu masks: mean %8.1f us, median %8.1f, p90 %8.1f, max %8.1f\n", what,
                  us.size(), sum / static_cast<double>(us.size()), q(0.5), q(0.9), us.back());
    }
  };
  using Clock = std::chrono::steady_clock;
  for (const auto& [name, gbnf] :
       {std::pair<std::string, std::string>{"json_object", grammar::json_object_gbnf()},
        {"json_schema", grammar::json_schema_to_gbnf(schema)}}) {
    auto g = std::make_shared<const grammar::Grammar>(grammar::Grammar::from_gbnf(gbnf));
    grammar::GrammarConstraint c(g, trie);
    std::printf("%s\n", name.c_str());
    Stats walk, cold, warm;
    std::vector<uint64_t> mask(static_cast<size_t>((trie->vocab_size() + 63) / 64));
    for (int pass = 0; pass < 2; ++pass) {
      grammar::Matcher m(g);
      for (std::int32_t id : tok.encode(texts[pass], false)) {
        if (pass == 0) {
          std::fill(mask.begin(), mask.end(), 0);
          const auto t0 = Clock::now();
          trie->fill_allowed(m, mask);
          walk.us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        }
        std::fill(mask.begin(), mask.end(), 0);
        const auto t0 = Clock::now();
        c.fill(m, mask);
        (pass == 0 ? cold : warm)
            .us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        const std::string* b = trie->bytes(id);
        if (!b || !m.accept_bytes(*b)) {
          std::printf("  the text leaves the grammar at token %d\n", id);
          break;
        }
      }
    }
    walk.print("whole trie walk (no cache)");
    cold.print("constraint, first text (cold)");
    warm.print("constraint, second text (warm)");
  }
  return 0;
}
