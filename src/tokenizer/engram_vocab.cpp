#include "tokenizer/engram_vocab.h"

#include <string>
#include <unordered_map>

#include "tokenizer/json_util.h"
#include "tokenizer/normalizer.h"

namespace atom::tokenizer {

namespace {
// The reference's normalizers.Sequence, as tokenizer.json would spell it.
std::unique_ptr<Normalizer> engram_normalizer() {
  const std::string sentinel = "\xee\x80\x80";  // U+E000
  const Json spec = {
      {"type", "Sequence"},
      {"normalizers",
       Json::array({
           {{"type", "NFKC"}},
           {{"type", "NFD"}},
           {{"type", "StripAccents"}},
           {{"type", "Lowercase"}},
           {{"type", "Replace"}, {"pattern", {{"Regex", "[ \\t\\r\\n]+"}}}, {"content", " "}},
           {{"type", "Replace"}, {"pattern", {{"Regex", "^ $"}}}, {"content", sentinel}},
           {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
           {{"type", "Replace"}, {"pattern", {{"String", sentinel}}}, {"content", " "}},
       })}};
  return normalizer_from_json(spec, "engram normalizer");
}
}  // namespace

CompressedVocab engram_compressed_vocab(const Tokenizer& tok) {
  const std::unique_ptr<Normalizer> norm = engram_normalizer();
  const std::string replacement = "\xef\xbf\xbd";  // U+FFFD
  CompressedVocab v;
  const int32_t n = static_cast<int32_t>(tok.vocab_size());
  v.lookup.resize(static_cast<size_t>(n));
  std::unordered_map<std::string, int64_t> ids;
  for (int32_t id = 0; id < n; ++id) {
    const int32_t one[1] = {id};
    const std::string text = tok.decode(one, /*skip_special_tokens=*/false);
    std::string key;
    if (text.find(replacement) != std::string::npos) {
      key = tok.id_to_token(id).value_or(std::string());
    } else {
      key = text;
      bool at_origin = true;
      norm->normalize(key, at_origin);
      if (key.empty()) key = text;
    }
    const auto [it, added] = ids.emplace(std::move(key), static_cast<int64_t>(ids.size()));
    v.lookup[static_cast<size_t>(id)] = it->second;
  }
  v.size = static_cast<int64_t>(ids.size());
  return v;
}

}  // namespace atom::tokenizer
