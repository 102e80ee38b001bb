#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace atom::tokenizer {

namespace {
struct Tables {
  std::array<std::string, 256> chars;
  std::array<int16_t, 512> byte_of{};  // indexed by code point (all are < 0x144)
  Tables() {
    byte_of.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      utf8_append(chars[b], cp);
      byte_of[cp] = static_cast<int16_t>(b);
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}
}  // namespace

const std::array<std::string, 256>& byte_level_chars() { return tables().chars; }

void byte_level_encode(std::string_view bytes, std::string& out) {
  const auto& chars = tables().chars;
  out.reserve(out.size() + bytes.size() * 2);
  for (char c : bytes) out.append(chars[static_cast<unsigned char>(c)]);
}

int byte_level_byte_of(char32_t c) { return c < 512 ? tables().byte_of[c] : -1; }

}  // namespace atom::tokenizer
