// Splits template source into tokens exactly as jinja2's lexer does, including its whitespace
// rules: `-`/`+` markers, trim_blocks, lstrip_blocks, newline normalisation and the dropped final
// newline. Whitespace control is settled here, so the parser only sees the surviving text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace atom::jinja {

enum class Tok : uint8_t {
  kData,        // template text
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,    // text holds the decoded value
  kInteger,   // ival
  kFloat,     // fval
  kOperator,  // text holds the operator ("+", "//", "(", ...)
  kEof,
};

struct Token {
  Tok type = Tok::kEof;
  std::string text;
  int64_t ival = 0;
  double fval = 0;
  int line = 1;

  bool is_op(std::string_view op) const { return type == Tok::kOperator && text == op; }
  bool is_name(std::string_view name) const { return type == Tok::kName && text == name; }
};

struct LexerOptions {
  bool trim_blocks = false;
  bool lstrip_blocks = false;
  bool keep_trailing_newline = false;
};

// Throws TemplateError (kSyntax) naming `where` and the line.
std::vector<Token> tokenize(std::string_view source, const LexerOptions& options,
                            const std::string& where);

// How jinja2 names a token in syntax errors ("end of print statement", "'foo'").
std::string describe_token(const Token& t);

// Whose reading of the escapes decode_python_escapes follows. jinja2 decodes string literals
// through Python's unicode-escape codec, after encoding them with backslashreplace; a Python
// string literal (ast.literal_eval) is read by Python's own parser. The two differ in a
// backslash before a non-ASCII character (jinja2: the text of the character's \x, \u or \U
// escape, as backslashreplace wrote it; a literal: both kept as written) and in lone surrogates
// \uD800-\uDFFF (jinja2 keeps them, as three bytes; atom refuses them in a literal, whose value
// is written back as UTF-8 JSON).
enum class EscapeDialect { kJinja, kPythonLiteral };

// Decodes Python string-literal escapes (\n, \t, \xNN, \uNNNN, \UNNNNNNNN, octal, ...) of the
// inside of a string literal. Throws std::invalid_argument on a truncated escape, on \N{...},
// and on what the dialect refuses.
std::string decode_python_escapes(std::string_view s,
                                  EscapeDialect dialect = EscapeDialect::kJinja);

}  // namespace atom::jinja
