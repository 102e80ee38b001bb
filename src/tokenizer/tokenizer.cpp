#include "tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace atom::tokenizer {

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("cannot open {}", p.string());
  std::string s;
  f.seekg(0, std::ios::end);
  s.resize(static_cast<size_t>(f.tellg()));
  f.seekg(0, std::ios::beg);
  f.read(s.data(), static_cast<std::streamsize>(s.size()));
  if (!f) fail("cannot read {}", p.string());
  return s;
}

// tokenizer_config.json writes special tokens as "text" or {"content": "text", ...}.
std::string config_token(const Json& cfg, const char* key, std::string_view name) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return json_string(*it, "content", fmt::format("{}: {}", name, key));
  fail("{}: {}: expected a string or an AddedToken object, got {}", name, key, it->type_name());
}

}  // namespace

void TokenizerImpl::load_config(std::string_view text, std::string_view cname) {
  Json cfg;
  try {
    cfg = Json::parse(text);
  } catch (const Json::exception& e) {
    fail("{}: invalid JSON: {}", cname, e.what());
  }
  if (!cfg.is_object()) fail("{}: expected a JSON object", cname);
  auto info = [&](const char* key) {
    SpecialTokenInfo t;
    t.content = config_token(cfg, key, cname);
    if (!t.content.empty()) {
      t.id = added.token_to_id(t.content);
      if (t.id < 0) t.id = model->vocab().find(t.content);
    }
    return t;
  };
  bos = info("bos_token");
  eos = info("eos_token");
  pad = info("pad_token");
  auto flag = [&](const char* key) -> std::optional<bool> {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return std::nullopt;
    if (!it->is_boolean()) fail("{}: {}: expected true or false", cname, key);
    return it->get<bool>();
  };
  add_bos_token = flag("add_bos_token");
  add_eos_token = flag("add_eos_token");
}

Tokenizer Tokenizer::from_json_text(std::string_view tokenizer_json, std::string_view name,
                                    std::string_view tokenizer_config) {
  auto impl = std::make_shared<TokenizerImpl>();
  tokenizer_json_load(tokenizer_json, name, *impl);
  if (!tokenizer_config.empty()) impl->load_config(tokenizer_config, "tokenizer_config.json");
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json,
                               const std::optional<std::filesystem::path>& tokenizer_config) {
  const std::string text = read_file(tokenizer_json);
  auto impl = std::make_shared<TokenizerImpl>();
  tokenizer_json_load(text, tokenizer_json.string(), *impl);
  if (tokenizer_config) impl->load_config(read_file(*tokenizer_config), tokenizer_config->string());
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_dir(const std::filesystem::path& dir) {
  const auto json = dir / "tokenizer.json";
  if (!std::filesystem::exists(json)) {
    fail("{}: no tokenizer.json (atom reads the Hugging Face tokenizers format only)",
         dir.string());
  }
  const auto cfg = dir / "tokenizer_config.json";
  return from_file(json, std::filesystem::exists(cfg) ? std::optional(cfg) : std::nullopt);
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  const TokenizerImpl& t = *impl_;
  std::string repaired;
  std::string_view text = input;
  if (!utf8_is_valid(input)) {
    repaired = utf8_lossy(input);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<TextSplit> raw, norm;
  std::vector<PreToken> pieces;
  std::string normalized;
  t.added.split_raw(text, raw);
  for (const TextSplit& r : raw) {
    if (r.id >= 0) {
      ids.push_back(r.id);
      continue;
    }
    normalized.assign(r.text);
    bool at_origin = r.offset == 0;
    if (t.normalizer) t.normalizer->normalize(normalized, at_origin);
    t.added.split_normalized(normalized, norm);
    for (const TextSplit& n : norm) {
      if (n.id >= 0) {
        ids.push_back(n.id);
        continue;
      }
      pieces.clear();
      pieces.push_back({std::string(n.text), at_origin && n.offset == 0});
      if (t.pre_tokenizer) t.pre_tokenizer->pre_tokenize(pieces);
      for (const PreToken& p : pieces) t.model->tokenize(p.text, ids);
    }
  }
  if (t.post_processor) t.post_processor->process(ids, add_special_tokens);
  return ids;
}

bool TokenizerImpl::token_text(int32_t id, bool skip_special, std::string_view& out) const {
  if (const AddedToken* a = added.token_of(id)) {
    if (skip_special && added.is_special_content(a->content)) return false;
    out = a->content;
    return true;
  }
  if (!model->vocab().has_id(id)) return false;
  out = model->vocab().text(id);
  // A model token can be special when an added token with the same content points elsewhere.
  if (skip_special && added.is_special_content(out)) return false;
  return true;
}

std::string TokenizerImpl::decode_tokens(std::vector<std::string>& tokens) const {
  std::string out;
  if (decoder) {
    decoder->decode_chain(tokens);
    for (const auto& s : tokens) out += s;
    return out;
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i) out.push_back(' ');
    out += tokens[i];
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  std::string_view text;
  for (int32_t id : ids) {
    if (impl_->token_text(id, skip_special_tokens, text)) tokens.emplace_back(text);
  }
  return impl_->decode_tokens(tokens);
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  const int32_t id = impl_->added.token_to_id(token);
  return id >= 0 ? id : impl_->model->vocab().find(token);
}

std::optional<std::string> Tokenizer::token_bytes(int32_t id) const {
  std::string_view text;
  if (!impl_->token_text(id, true, text)) return std::nullopt;
  if (impl_->added.token_of(id)) return std::string(text);  // added tokens are written as is
  const Decoder* d = impl_->decoder.get();
  if (!d) return std::string(text);
  if (d->is_byte_level()) {
    std::string bytes;
    for (size_t i = 0; i < text.size();) {
      const int b = byte_level_byte_of(utf8_next(text, i));
      if (b < 0) return std::string(text);
      bytes.push_back(static_cast<char>(b));
    }
    return bytes;
  }
  if (d->has_byte_fallback() && is_byte_fallback_token(text)) {
    auto hexv = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
    return std::string(1, static_cast<char>(hexv(text[3]) * 16 + hexv(text[4])));
  }
  // Decoded after a plain first token, so that decoders treating the first token differently
  // (a Metaspace prefix, Strip) leave this one as it reads mid-sequence.
  std::vector<std::string> tokens = {"x", std::string(text)};
  std::string out = impl_->decode_tokens(tokens);
  if (out.empty() || out[0] != 'x') return std::string(text);
  return out.substr(1);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  std::string_view text;
  if (!impl_->token_text(id, false, text)) return std::nullopt;
  return std::string(text);
}

size_t Tokenizer::vocab_size() const {
  size_t n = impl_->model->vocab().size();
  for (const auto& [id, tok] : impl_->added.tokens()) {
    if (impl_->model->vocab().find(tok.content) < 0) ++n;
  }
  return n;
}

int32_t Tokenizer::id_limit() const {
  int32_t m = impl_->model->vocab().max_id();
  for (const auto& [id, tok] : impl_->added.tokens()) m = std::max(m, id);
  return m + 1;
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* a = impl_->added.token_of(id);
  return a != nullptr && impl_->added.is_special_content(a->content);
}

const std::string& Tokenizer::bos_token() const { return impl_->bos.content; }
const std::string& Tokenizer::eos_token() const { return impl_->eos.content; }
const std::string& Tokenizer::pad_token() const { return impl_->pad.content; }
int32_t Tokenizer::bos_id() const { return impl_->bos.id; }
int32_t Tokenizer::eos_id() const { return impl_->eos.id; }
int32_t Tokenizer::pad_id() const { return impl_->pad.id; }
std::optional<bool> Tokenizer::add_bos_token() const { return impl_->add_bos_token; }
std::optional<bool> Tokenizer::add_eos_token() const { return impl_->add_eos_token; }

}  // namespace atom::tokenizer
