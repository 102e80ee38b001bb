// Unicode character properties and normalization forms, with the exact definitions Hugging Face
// tokenizers gets from Rust (char::is_whitespace, char::is_numeric, ...). Data comes from utf8proc.
#pragma once

#include <string>
#include <string_view>

namespace atom::tokenizer {

// Rust char::is_whitespace: the White_Space property.
bool uni_is_whitespace(char32_t c);
// Rust char::is_numeric: general categories Nd, Nl, No.
bool uni_is_numeric(char32_t c);
// Rust char::is_ascii_punctuation || char::is_punctuation (categories P*).
bool uni_is_punctuation_or_ascii_punct(char32_t c);
// Rust regex \w (Alphabetic, M, Nd, Pc, Join_Control), used by added tokens' single_word.
bool uni_is_word_char(char32_t c);
// Categories Mn, Mc, Me.
bool uni_is_combining_mark(char32_t c);
bool uni_is_nonspacing_mark(char32_t c);  // category Mn
// Bert normalizer helpers.
bool uni_is_control(char32_t c);
bool uni_is_chinese_char(char32_t c);

// Rust char::to_lowercase (full mapping, no context) appended to out.
void uni_append_lowercase(std::string& out, char32_t c);

enum class NormForm { kNFC, kNFD, kNFKC, kNFKD };
// Normalizes valid UTF-8 s; returns s unchanged when it cannot change (pure ASCII fast path).
std::string uni_normalize(std::string_view s, NormForm form);

}  // namespace atom::tokenizer
