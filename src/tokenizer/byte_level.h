// GPT-2's byte <-> unicode map used by ByteLevel pre-tokenizer, normalizer and decoder: printable
// bytes map to themselves, the other 68 bytes to U+0100.. in order.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace atom::tokenizer {

// UTF-8 text of the character standing for each byte.
const std::array<std::string, 256>& byte_level_chars();
// Appends the byte-level form of bytes to out.
void byte_level_encode(std::string_view bytes, std::string& out);
// The byte a character stands for, or -1 when it is not one of the 256.
int byte_level_byte_of(char32_t c);

}  // namespace atom::tokenizer
