// Builds the AST from tokens following jinja2's parser.py: the same operator precedence, the same
// statements, and the same compile-time checks (unknown filters and tests, break outside a loop).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace atom::jinja {

struct ParserOptions {
  std::function<bool(std::string_view)> has_filter;
  std::function<bool(std::string_view)> has_test;
  bool loop_controls = true;            // jinja2.ext.loopcontrols: break / continue
  std::vector<std::string> scope_tags;  // `{% tag %}...{% endtag %}` rendered in place
  std::string where;                    // template name for error messages
  int max_depth = 256;                  // Limits::max_depth
};

// Throws TemplateError (kSyntax).
Body parse(const std::vector<Token>& tokens, const ParserOptions& options);

}  // namespace atom::jinja
