#include "tokenizer/incremental_detokenizer.h"

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace atom::tokenizer {

namespace {
// How many prompt ids the first window reaches back (vLLM uses the same 5): enough for any
// decoder's context, short enough to keep every step cheap.
constexpr size_t kPromptContext = 5;

bool ends_with_replacement(const std::string& s) {
  return s.size() >= kReplacementChar.size() &&
         s.compare(s.size() - kReplacementChar.size(), kReplacementChar.size(), kReplacementChar) ==
             0;
}
}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(Tokenizer tokenizer, bool skip_special_tokens,
                                               std::span<const int32_t> prompt_ids)
    : tok_(std::move(tokenizer)),
      skip_special_(skip_special_tokens),
      ids_(prompt_ids.begin(), prompt_ids.end()) {
  read_offset_ = ids_.size();
  prefix_offset_ = ids_.size() > kPromptContext ? ids_.size() - kPromptContext : 0;
}

std::string IncrementalDetokenizer::add(int32_t id) {
  ids_.push_back(id);
  return step(false);
}

std::string IncrementalDetokenizer::finish() { return step(true); }

// True while the last token that reaches the decoder is a "<0xNN>" byte of a ByteFallback decoder:
// HF decodes such a run as a whole and turns all of it into U+FFFDs if any byte is invalid, so no
// part of the run is final until a different token (or the end) closes it.
bool IncrementalDetokenizer::in_byte_run() const {
  const TokenizerImpl& impl = tok_.impl();
  if (!impl.decoder || !impl.decoder->has_byte_fallback()) return false;
  std::string_view text;
  for (size_t i = ids_.size(); i-- > read_offset_;) {
    if (impl.token_text(ids_[i], skip_special_, text)) return is_byte_fallback_token(text);
  }
  return false;
}

std::string IncrementalDetokenizer::step(bool final) {
  if (!final && in_byte_run()) return {};
  const std::span<const int32_t> all(ids_);
  const std::string prefix_text =
      tok_.decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  const std::string new_text = tok_.decode(all.subspan(prefix_offset_), skip_special_);
  if (new_text.size() <= prefix_text.size()) return {};
  if (!final && ends_with_replacement(new_text)) return {};  // a character may still be incomplete
  std::string piece;
  if (new_text.compare(0, prefix_text.size(), prefix_text) == 0) {
    piece = new_text.substr(prefix_text.size());
  } else {
    // The window's earlier text changed (no decoder atom knows does this; kept as a safety net):
    // what was emitted stands; continue after it on a character boundary so the output stays
    // valid UTF-8.
    size_t k = prefix_text.size();
    while (k < new_text.size() && (static_cast<unsigned char>(new_text[k]) & 0xC0) == 0x80) ++k;
    piece = new_text.substr(k);
  }
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return piece;
}

}  // namespace atom::tokenizer
