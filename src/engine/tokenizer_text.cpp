#include "engine/tokenizer_text.h"

#include "tokenizer/incremental_detokenizer.h"

namespace atom {

namespace {
class TokenizerTextStream final : public TokenTextStream {
 public:
  TokenizerTextStream(tokenizer::Tokenizer tok, bool skip_special, std::span<const int32_t> prompt)
      : detok_(std::move(tok), skip_special, prompt) {}
  std::string append(int32_t id) override { return detok_.add(id); }
  std::string finish() override { return detok_.finish(); }

 private:
  tokenizer::IncrementalDetokenizer detok_;
};
}  // namespace

TextStreamFactory tokenizer_text_streams(tokenizer::Tokenizer tok) {
  return [tok = std::move(tok)](std::span<const int32_t> prompt, bool skip_special) {
    return std::make_unique<TokenizerTextStream>(tok, skip_special, prompt);
  };
}

}  // namespace atom
