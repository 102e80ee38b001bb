// Loading tokenizer.json: the top level and the model object are scanned by hand so that the
// vocabulary and merges go straight into their tables; the small components go through nlohmann.
#include <string>

#include "core/log.h"
#include "tokenizer/json_scan.h"
#include "tokenizer/tokenizer_impl.h"

namespace atom::tokenizer {

namespace {

struct ModelParts {
  Json fields = Json::object();  // every model field except vocab and merges
  TokenTable vocab;
  bool have_vocab = false;
  RawMerges merges;
  bool have_merges = false;
};

void read_model(JsonScanner& sc, ModelParts& m, std::string_view name, const std::string& where) {
  sc.expect('{');
  std::string key, a, b;
  if (sc.consume('}')) return;
  do {
    sc.read_string(key);
    sc.expect(':');
    if (key == "vocab" && sc.peek() == '{') {
      m.have_vocab = true;
      m.vocab.reserve(1 << 16);
      sc.expect('{');
      if (!sc.consume('}')) {
        do {
          sc.read_string(a);
          sc.expect(':');
          const int64_t id = sc.read_int();
          if (id < 0 || id > kMaxTokenId)
            sc.error(fmt::format("{}.vocab[\"{}\"]: id {} is outside [0, {}]", where, a, id,
                                 kMaxTokenId));
          m.vocab.add(a, static_cast<int32_t>(id));
        } while (sc.consume(','));
        sc.expect('}');
      }
    } else if (key == "merges" && sc.peek() == '[') {
      m.have_merges = true;
      sc.expect('[');
      if (!sc.consume(']')) {
        size_t index = 0;
        do {
          if (sc.peek() == '[') {  // ["a", "b"]
            sc.expect('[');
            sc.read_string(a);
            sc.expect(',');
            sc.read_string(b);
            sc.expect(']');
          } else {  // "a b"
            sc.read_string(a);
            const size_t sp = a.find(' ');
            if (sp == std::string::npos || a.find(' ', sp + 1) != std::string::npos) {
              fail("{}: {}.merges[{}] = {:?} is not two tokens separated by one space", name, where,
                   index, a);
            }
            b.assign(a, sp + 1);
            a.resize(sp);
          }
          m.merges.add(a, b);
          ++index;
        } while (sc.consume(','));
        sc.expect(']');
      }
    } else {
      const std::string_view raw = sc.skip_value(where + "." + key);
      try {
        m.fields[key] = Json::parse(raw);
      } catch (const Json::exception& e) {
        sc.error(fmt::format("{}.{}: {}", where, key, e.what()));
      }
    }
  } while (sc.consume(','));
  sc.expect('}');
}

AddedToken added_token_from_json(const Json& j, const std::string& where) {
  AddedToken t;
  t.content = json_string(j, "content", where);
  t.special = json_bool(j, "special", false, where);
  t.single_word = json_bool(j, "single_word", false, where);
  t.lstrip = json_bool(j, "lstrip", false, where);
  t.rstrip = json_bool(j, "rstrip", false, where);
  t.normalized = json_bool(j, "normalized", !t.special, where);
  return t;
}

void build_model(ModelParts& m, std::string_view name, TokenizerImpl& impl) {
  const std::string where = fmt::format("{}: model", name);
  const Json& f = m.fields;
  std::string type = "BPE";
  if (auto it = f.find("type"); it != f.end()) {
    if (!it->is_string()) fail("{}.type: expected a string", where);
    type = it->get<std::string>();
  } else if (!m.have_merges) {
    fail("{}: no \"type\" and no merges; atom supports only BPE models", where);
  }
  if (type != "BPE") {
    fail("{}.type: model type \"{}\" is not supported by atom (supported: BPE)", where, type);
  }
  if (!m.have_vocab) fail("{}: missing \"vocab\" object", where);
  if (!m.have_merges) fail("{}: missing \"merges\" array", where);
  if (auto it = f.find("dropout"); it != f.end() && !it->is_null()) {
    if (!it->is_number()) fail("{}.dropout: expected a number", where);
    const double d = it->get<double>();
    if (d < 0.0 || d > 1.0) fail("{}.dropout: {} is outside [0, 1]", where, d);
    if (d != 0.0)
      fail("{}.dropout: BPE dropout ({}) is random and not supported by atom", where, d);
  }
  BpeOptions o;
  o.unk_token = json_opt_string(f, "unk_token", where);
  o.continuing_subword_prefix = json_opt_string(f, "continuing_subword_prefix", where);
  o.end_of_word_suffix = json_opt_string(f, "end_of_word_suffix", where);
  o.fuse_unk = json_bool(f, "fuse_unk", false, where);
  o.byte_fallback = json_bool(f, "byte_fallback", false, where);
  o.ignore_merges = json_bool(f, "ignore_merges", false, where);
  impl.model = std::make_unique<BpeModel>(std::move(m.vocab), m.merges, std::move(o), name);
}

}  // namespace

void tokenizer_json_load(std::string_view text, std::string_view name, TokenizerImpl& impl) {
  impl.name = std::string(name);
  JsonScanner sc(text, name);
  ModelParts model;
  bool have_model = false;
  Json rest = Json::object();
  std::string key;
  sc.expect('{');
  if (!sc.consume('}')) {
    do {
      sc.read_string(key);
      sc.expect(':');
      if (key == "model") {
        read_model(sc, model, name, "model");
        have_model = true;
        continue;
      }
      const std::string_view raw = sc.skip_value(key);
      try {
        rest[key] = Json::parse(raw);
      } catch (const Json::exception& e) {
        sc.error(fmt::format("{}: {}", key, e.what()));
      }
    } while (sc.consume(','));
    sc.expect('}');
  }
  if (!sc.at_end()) sc.error("unexpected text after the top-level object");
  if (!have_model) fail("{}: missing \"model\"", name);

  const std::string n(name);
  auto get = [&](const char* k) -> const Json& {
    static const Json null_json;
    auto it = rest.find(k);
    return it == rest.end() ? null_json : *it;
  };
  impl.normalizer = normalizer_from_json(get("normalizer"), n + ": normalizer");
  impl.pre_tokenizer = pre_tokenizer_from_json(get("pre_tokenizer"), n + ": pre_tokenizer");
  build_model(model, name, impl);
  impl.post_processor = post_processor_from_json(get("post_processor"), n + ": post_processor");
  impl.decoder = decoder_from_json(get("decoder"), n + ": decoder");
  // Truncation and padding settings are ignored, as transformers ignores them unless a call asks
  // for truncation or padding; atom's callers never do.
  if (!get("truncation").is_null()) log_debug("{}: ignoring \"truncation\"", name);
  if (!get("padding").is_null()) log_debug("{}: ignoring \"padding\"", name);

  std::vector<AddedToken> added;
  if (const Json& list = get("added_tokens"); !list.is_null()) {
    if (!list.is_array()) fail("{}: added_tokens: expected an array", name);
    for (size_t i = 0; i < list.size(); ++i) {
      added.push_back(added_token_from_json(list[i], fmt::format("{}: added_tokens[{}]", name, i)));
    }
  }
  impl.added.add_all(added, impl.model->vocab(), impl.normalizer.get());
}

}  // namespace atom::tokenizer
