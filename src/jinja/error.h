// Errors raised while parsing or rendering a template. They are atom::Error, so callers that do
// not care about the details (the CLI, the server's HTTP 400) treat them like any other error.
#pragma once

#include <string>

#include "core/error.h"

namespace atom::jinja {

class TemplateError : public Error {
 public:
  enum class Kind {
    kSyntax,   // the template does not parse
    kRuntime,  // evaluation failed: undefined value misuse, type error, unknown filter, limits
    kRaised,   // the template called raise_exception(message); message() is the template's text
  };

  TemplateError(Kind kind, std::string message, std::string where, int line)
      : Error(format_what(kind, message, where, line)),
        kind_(kind),
        message_(std::move(message)),
        line_(line) {}

  Kind kind() const { return kind_; }
  // The bare message without the location prefix.
  const std::string& message() const { return message_; }
  // 1-based template line, 0 when unknown.
  int line() const { return line_; }

 private:
  static std::string format_what(Kind kind, const std::string& message, const std::string& where,
                                 int line) {
    // A raised message is written by the template author for end users: keep it verbatim.
    if (kind == Kind::kRaised) return message;
    std::string out = where.empty() ? std::string("template") : where;
    if (line > 0) out += ", line " + std::to_string(line);
    out += kind == Kind::kSyntax ? ": syntax error: " : ": error: ";
    out += message;
    return out;
  }

  Kind kind_;
  std::string message_;
  int line_;
};

}  // namespace atom::jinja
