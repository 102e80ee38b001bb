// libFuzzer harness: a tokenizer.json loaded, then a fixed text encoded and decoded with it.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Cap: deeply nested normalizers/pre-tokenizers overflow the stack (issue 22; the limit on
  // nesting belongs to the tokenizer loader and lands on the harden-input branch). Until then
  // the harness keeps inputs small enough not to reach it.
  if (size > 64 << 10) return 0;
  try {
    const atom::tokenizer::Tokenizer t = atom::tokenizer::Tokenizer::from_json_text(
        std::string_view(reinterpret_cast<const char*>(data), size));
    const auto ids = t.encode("Hello, world! 123 <|im_start|>  naïve café 😀\n\tend", true);
    t.decode(ids, false);
    t.decode(ids, true);
  } catch (const atom::Error&) {
  }
  return 0;
}
