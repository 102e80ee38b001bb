#include "jinja/parser.h"

#include <algorithm>
#include <set>

namespace atom::jinja {

namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const ParserOptions& o) : t_(tokens), opt_(o) {}

  Body parse_template() {
    Body body = subparse({});
    if (cur().type != Tok::kEof) fail(cur().line, "unexpected " + describe(cur()));
    if (const FilterExpr* f = unknown_outside_if(body)) {
      fail(f->line, fmt::format("No {} named '{}'.", f->kind == ExprKind::kTest ? "test" : "filter",
                                f->name));
    }
    return body;
  }

 private:
  // ---- token stream ----
  const Token& cur() const { return t_[pos_]; }
  const Token& look() const { return t_[std::min(pos_ + 1, t_.size() - 1)]; }
  const Token& next() {
    const Token& tok = t_[pos_];
    if (pos_ + 1 < t_.size()) ++pos_;
    return tok;
  }
  bool skip_op(std::string_view op) {
    if (!cur().is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!cur().is_name(n)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(int line, std::string msg) const {
    throw TemplateError(TemplateError::Kind::kSyntax, std::move(msg), opt_.where, line);
  }
  static std::string describe(const Token& t) { return describe_token(t); }
  void expect_op(std::string_view op) {
    if (!skip_op(op))
      fail(cur().line, fmt::format("expected token '{}', got {}", op, describe(cur())));
  }
  const Token& expect_name() {
    if (cur().type != Tok::kName) fail(cur().line, "expected token 'name', got " + describe(cur()));
    return next();
  }
  void expect_name(std::string_view n) {
    if (!skip_name(n))
      fail(cur().line, fmt::format("expected token '{}', got {}", n, describe(cur())));
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type)
      fail(cur().line, fmt::format("expected token '{}', got {}", what, describe(cur())));
    next();
  }

  // ---- statements ----
  Body subparse(const std::vector<std::string_view>& end_tags) {
    Body body;
    while (cur().type != Tok::kEof) {
      const Token& tok = cur();
      if (tok.type == Tok::kData) {
        body.push_back(std::make_unique<DataStmt>(tok.text, tok.line));
        next();
      } else if (tok.type == Tok::kVarBegin) {
        next();
        auto out = std::make_unique<OutputStmt>(tok.line);
        out->exprs.push_back(parse_tuple(false, true, {}, false));
        expect(Tok::kVarEnd, "end of print statement");
        body.push_back(std::move(out));
      } else if (tok.type == Tok::kBlockBegin) {
        next();
        if (cur().type == Tok::kName &&
            std::find(end_tags.begin(), end_tags.end(), cur().text) != end_tags.end()) {
          return body;
        }
        body.push_back(parse_statement());
        expect(Tok::kBlockEnd, "end of statement block");
      } else {
        fail(tok.line, "unexpected " + describe(tok));
      }
    }
    if (!end_tags.empty()) {
      std::string want;
      for (size_t i = 0; i < end_tags.size(); ++i) {
        want += (i ? " or '" : "'") + std::string(end_tags[i]) + "'";
      }
      fail(cur().line,
           "Unexpected end of template. Jinja was looking for the following tags: " + want + ".");
    }
    return body;
  }

  // Parses a tag body up to one of end_tags; leaves the stream on that tag's name.
  Body parse_statements(const std::vector<std::string_view>& end_tags, bool drop_needle) {
    skip_op(":");
    expect(Tok::kBlockEnd, "end of statement block");
    Body body = subparse(end_tags);
    if (cur().type == Tok::kEof) fail(cur().line, "unexpected end of template");
    if (drop_needle) next();
    return body;
  }

  // Recursive descent: bound the nesting so a hostile template cannot overflow the stack.
  // jinja2 itself gives up (RecursionError) well before the default depth.
  void enter(int line) {
    if (++depth_ > opt_.max_depth)
      fail(line, fmt::format("the template nests deeper than the depth limit of {} levels",
                             opt_.max_depth));
  }
  struct DepthGuard {
    DepthGuard(Parser* p, int line) : p(p) { p->enter(line); }
    ~DepthGuard() { --p->depth_; }
    Parser* p;
  };
  // A chain parsed by a loop (a.b.c, 1 + 2 + 3, x|f|g, a or b or c) nests the tree one level per
  // link without recursing here; its links count against the same limit, so that walking the tree
  // afterwards (rendering, freeing) is bounded too.
  struct ChainGuard {
    explicit ChainGuard(Parser* p) : p(p) {}
    ~ChainGuard() { p->depth_ -= links; }
    void link(int line) {
      ++links;
      p->enter(line);
    }
    Parser* p;
    int links = 0;
  };

  StmtPtr parse_statement() {
    const Token& tok = cur();
    DepthGuard depth(this, tok.line);
    if (tok.type != Tok::kName) fail(tok.line, "tag name expected");
    const std::string& n = tok.text;
    if (n == "if") return parse_if();
    if (n == "for") return parse_for();
    if (n == "set") return parse_set();
    if (n == "macro") return parse_macro();
    if (n == "call") return parse_call_block();
    if (n == "filter") return parse_filter_block();
    if (n == "with") return parse_with();
    if (n == "print") return parse_print();
    if (n == "raw") fail(tok.line, "unexpected raw tag");
    if (opt_.loop_controls && (n == "break" || n == "continue")) {
      if (loop_depth_ == 0) fail(tok.line, "'" + n + "' outside loop");
      next();
      return std::make_unique<Stmt>(n == "break" ? StmtKind::kBreak : StmtKind::kContinue,
                                    tok.line);
    }
    if (std::find(opt_.scope_tags.begin(), opt_.scope_tags.end(), n) != opt_.scope_tags.end()) {
      auto node = std::make_unique<ScopeStmt>(next().line);
      FrameGuard frame(this, /*function=*/true);
      node->body = parse_statements({"end" + n}, true);
      return node;
    }
    for (const char* unsupported :
         {"block", "extends", "include", "import", "from", "autoescape"}) {
      if (n == unsupported)
        fail(tok.line,
             "the '" + n + "' tag is not supported by atom (templates are rendered standalone)");
    }
    fail(tok.line, "Encountered unknown tag '" + n + "'.");
  }

  // Function bodies (macros, call blocks, extension tags) cannot break out of an enclosing loop.
  struct FrameGuard {
    FrameGuard(Parser* p, bool function) : p(p), loops(p->loop_depth_) {
      if (function) p->loop_depth_ = 0;
    }
    ~FrameGuard() { p->loop_depth_ = loops; }
    Parser* p;
    int loops;
  };

  StmtPtr parse_if() {
    auto node = std::make_unique<IfStmt>(next().line);
    while (true) {
      ExprPtr test = parse_tuple(false, false, {}, false);
      Body body = parse_statements({"elif", "else", "endif"}, false);
      node->branches.emplace_back(std::move(test), std::move(body));
      const Token& tok = next();
      if (tok.text == "elif") continue;
      if (tok.text == "else") node->otherwise = parse_statements({"endif"}, true);
      break;
    }
    return node;
  }

  StmtPtr parse_for() {
    auto node = std::make_unique<ForStmt>(next().line);
    node->target = parse_assign_target({"in"});
    expect_name("in");
    node->iter = parse_tuple(false, false, {"recursive"}, false);
    {
      FrameGuard frame(this, false);
      if (skip_name("if")) node->filter = parse_expression(true);
    }
    node->recursive = skip_name("recursive");
    {
      FrameGuard frame(this, false);
      ++loop_depth_;
      node->body = parse_statements({"endfor", "else"}, false);
    }
    if (next().text == "else") {
      FrameGuard frame(this, false);
      node->otherwise = parse_statements({"endfor"}, true);
    }
    return node;
  }

  StmtPtr parse_set() {
    int line = next().line;
    Target target;
    if (cur().type == Tok::kName && look().is_op(".")) {
      target.kind = Target::Kind::kNsAttr;
      target.line = cur().line;
      target.name = next().text;
      next();
      target.attr = expect_name().text;
    } else {
      target = parse_assign_target({});
    }
    if (skip_op("=")) {
      auto node = std::make_unique<SetStmt>(line);
      node->target = std::move(target);
      node->value = parse_tuple(false, true, {}, false);
      return node;
    }
    auto node = std::make_unique<SetBlockStmt>(line);
    node->target = std::move(target);
    FrameGuard frame(this, false);
    if (cur().is_op("|")) node->filter = parse_filter(nullptr, false);
    node->body = parse_statements({"endset"}, true);
    return node;
  }

  StmtPtr parse_macro() {
    auto node = std::make_unique<MacroStmt>(next().line);
    auto def = std::make_shared<MacroDef>();
    def->name = expect_name().text;
    FrameGuard frame(this, true);
    parse_signature(*def);
    def->body = parse_statements({"endmacro"}, true);
    scan_special_names(*def);
    node->def = std::move(def);
    return node;
  }

  void parse_signature(MacroDef& def) {
    expect_op("(");
    while (!cur().is_op(")")) {
      if (!def.params.empty()) expect_op(",");
      def.params.push_back(expect_name().text);
      if (skip_op("=")) {
        def.defaults.push_back(parse_expression(true));
      } else if (!def.defaults.empty()) {
        fail(cur().line, "non-default argument follows default argument");
      }
    }
    expect_op(")");
  }

  StmtPtr parse_call_block() {
    auto node = std::make_unique<CallBlockStmt>(next().line);
    auto def = std::make_shared<MacroDef>();
    def->name = "caller";
    {
      FrameGuard frame(this, true);
      if (cur().is_op("(")) parse_signature(def);
    }
    ExprPtr call = parse_expression(true);
    if (call->kind != ExprKind::kCall) fail(node->line, "expected call");
    node->call.reset(static_cast<CallExpr*>(call.release()));
    FrameGuard frame(this, true);
    def->body = parse_statements({"endcall"}, true);
    scan_special_names(*def);
    node->caller = std::move(def);
    return node;
  }

  void parse_signature(std::shared_ptr<MacroDef>& def) { parse_signature(*def); }

  StmtPtr parse_filter_block() {
    auto node = std::make_unique<FilterBlockStmt>(next().line);
    FrameGuard frame(this, false);
    node->filter = parse_filter(nullptr, true);
    node->body = parse_statements({"endfilter"}, true);
    return node;
  }

  StmtPtr parse_with() {
    auto node = std::make_unique<WithStmt>(next().line);
    std::vector<std::pair<Target, ExprPtr>> assigns;
    while (cur().type != Tok::kBlockEnd) {
      if (!assigns.empty()) expect_op(",");
      Target target = parse_assign_target({});
      expect_op("=");
      assigns.emplace_back(std::move(target), parse_expression(true));
    }
    node->assigns = std::move(assigns);
    FrameGuard frame(this, false);
    node->body = parse_statements({"endwith"}, true);
    return node;
  }

  StmtPtr parse_print() {
    auto node = std::make_unique<OutputStmt>(next().line);
    while (cur().type != Tok::kBlockEnd) {
      if (!node->exprs.empty()) expect_op(",");
      node->exprs.push_back(parse_expression(true));
    }
    return node;
  }

  // ---- assignment targets ----
  Target parse_target_primary() {
    DepthGuard depth(this, cur().line);
    Target t;
    t.line = cur().line;
    if (cur().type == Tok::kName) {
      const std::string& n = cur().text;
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" ||
          n == "None") {
        fail(t.line, "can't assign to 'const'");
      }
      t.name = next().text;
      return t;
    }
    if (skip_op("(")) {
      t.kind = Target::Kind::kTuple;
      while (!cur().is_op(")")) {
        if (!t.items.empty()) expect_op(",");
        if (cur().is_op(")")) break;
        t.items.push_back(parse_target_primary());
      }
      expect_op(")");
      return t;
    }
    fail(t.line, "can't assign to " + describe(cur()));
  }

  Target parse_assign_target(const std::vector<std::string_view>& extra_end) {
    Target first;
    first.line = cur().line;
    std::vector<Target> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_target_primary());
      if (cur().is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (items.empty()) fail(first.line, "Expected an expression, got " + describe(cur()));
      return std::move(items[0]);
    }
    first.kind = Target::Kind::kTuple;
    first.items = std::move(items);
    return first;
  }

  bool is_tuple_end(const std::vector<std::string_view>& extra_end) const {
    const Token& t = cur();
    if (t.type == Tok::kVarEnd || t.type == Tok::kBlockEnd || t.is_op(")")) return true;
    return t.type == Tok::kName &&
           std::find(extra_end.begin(), extra_end.end(), t.text) != extra_end.end();
  }

  // ---- expressions ----
  ExprPtr parse_tuple(bool simplified, bool with_condexpr,
                      const std::vector<std::string_view>& extra_end, bool explicit_parens) {
    int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (cur().is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
      line = cur().line;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail(cur().line, "Expected an expression, got " + describe(cur()));
    }
    auto node = std::make_unique<SeqExpr>(ExprKind::kTuple, line);
    node->items = std::move(args);
    return node;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    int line = cur().line;
    ExprPtr expr1 = parse_or();
    ChainGuard chain(this);
    while (cur().is_name("if")) {
      chain.link(next().line);
      auto node = std::make_unique<CondExpr>(line);
      node->test = parse_or();
      if (skip_name("else")) node->otherwise = parse_condexpr();
      node->then = std::move(expr1);
      expr1 = std::move(node);
    }
    return expr1;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    ChainGuard chain(this);
    while (cur().is_name("or")) {
      int line = next().line;
      chain.link(line);
      left = std::make_unique<LogicExpr>(ExprKind::kOr, std::move(left), parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    ChainGuard chain(this);
    while (cur().is_name("and")) {
      int line = next().line;
      chain.link(line);
      left = std::make_unique<LogicExpr>(ExprKind::kAnd, std::move(left), parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (cur().is_name("not")) {
      DepthGuard depth(this, cur().line);
      int line = next().line;
      return std::make_unique<UnaryExpr>('!', parse_not(), line);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr expr = parse_math1();
    std::vector<std::pair<CmpOp, ExprPtr>> ops;
    while (true) {
      const Token& t = cur();
      std::optional<CmpOp> op;
      if (t.type == Tok::kOperator) {
        if (t.text == "==")
          op = CmpOp::kEq;
        else if (t.text == "!=")
          op = CmpOp::kNe;
        else if (t.text == "<")
          op = CmpOp::kLt;
        else if (t.text == "<=")
          op = CmpOp::kLe;
        else if (t.text == ">")
          op = CmpOp::kGt;
        else if (t.text == ">=")
          op = CmpOp::kGe;
        if (op) next();
      } else if (t.is_name("in")) {
        next();
        op = CmpOp::kIn;
      } else if (t.is_name("not") && look().is_name("in")) {
        next();
        next();
        op = CmpOp::kNotIn;
      }
      if (!op) break;
      ops.emplace_back(*op, parse_math1());
    }
    if (ops.empty()) return expr;
    auto node = std::make_unique<CompareExpr>(line);
    node->first = std::move(expr);
    node->ops = std::move(ops);
    return node;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    ChainGuard chain(this);
    while (cur().is_op("+") || cur().is_op("-")) {
      const Token& t = next();
      chain.link(t.line);
      BinOp op = t.text == "+" ? BinOp::kAdd : BinOp::kSub;
      left = std::make_unique<BinaryExpr>(op, std::move(left), parse_concat(), t.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    int line = cur().line;
    ExprPtr first = parse_math2();
    if (!cur().is_op("~")) return first;
    auto node = std::make_unique<ConcatExpr>(line);
    node->parts.push_back(std::move(first));
    while (skip_op("~")) node->parts.push_back(parse_math2());
    return node;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    ChainGuard chain(this);
    while (true) {
      const Token& t = cur();
      BinOp op;
      if (t.is_op("*"))
        op = BinOp::kMul;
      else if (t.is_op("/"))
        op = BinOp::kDiv;
      else if (t.is_op("//"))
        op = BinOp::kFloorDiv;
      else if (t.is_op("%"))
        op = BinOp::kMod;
      else
        break;
      int line = next().line;
      chain.link(line);
      left = std::make_unique<BinaryExpr>(op, std::move(left), parse_pow(), line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    ChainGuard chain(this);
    while (cur().is_op("**")) {
      int line = next().line;
      chain.link(line);
      left = std::make_unique<BinaryExpr>(BinOp::kPow, std::move(left), parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard depth(this, cur().line);
    ExprPtr node;
    const Token& t = cur();
    if (t.is_op("-") || t.is_op("+")) {
      char op = t.text[0];
      int line = next().line;
      node = std::make_unique<UnaryExpr>(op, parse_unary(false), line);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.type == Tok::kName) {
      const std::string& n = t.text;
      ExprPtr node;
      if (n == "true" || n == "True")
        node = std::make_unique<ConstExpr>(Value::boolean(true), line);
      else if (n == "false" || n == "False")
        node = std::make_unique<ConstExpr>(Value::boolean(false), line);
      else if (n == "none" || n == "None")
        node = std::make_unique<ConstExpr>(Value::none(), line);
      else
        node = std::make_unique<NameExpr>(n, line);
      next();
      return node;
    }
    if (t.type == Tok::kString) {
      std::string s = next().text;
      while (cur().type == Tok::kString) s += next().text;  // adjacent literals concatenate
      return std::make_unique<ConstExpr>(Value::string(std::move(s)), line);
    }
    if (t.type == Tok::kInteger)
      return std::make_unique<ConstExpr>(Value::integer(next().ival), line);
    if (t.type == Tok::kFloat) return std::make_unique<ConstExpr>(Value::number(next().fval), line);
    if (t.is_op("(")) {
      next();
      ExprPtr node = parse_tuple(false, true, {}, true);
      expect_op(")");
      return node;
    }
    if (t.is_op("[")) {
      next();
      auto node = std::make_unique<SeqExpr>(ExprKind::kList, line);
      while (!cur().is_op("]")) {
        if (!node->items.empty()) expect_op(",");
        if (cur().is_op("]")) break;
        node->items.push_back(parse_expression(true));
      }
      expect_op("]");
      return node;
    }
    if (t.is_op("{")) {
      next();
      auto node = std::make_unique<DictExpr>(line);
      while (!cur().is_op("}")) {
        if (!node->items.empty()) expect_op(",");
        if (cur().is_op("}")) break;
        ExprPtr key = parse_expression(true);
        expect_op(":");
        node->items.emplace_back(std::move(key), parse_expression(true));
      }
      expect_op("}");
      return node;
    }
    fail(line, "unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    ChainGuard chain(this);
    while (true) {
      if (cur().is_op(".") || cur().is_op("[") || cur().is_op("(")) chain.link(cur().line);
      if (cur().is_op(".") || cur().is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (cur().is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    ChainGuard chain(this);
    while (true) {
      if (cur().is_op("|") || cur().is_name("is") || cur().is_op("(")) chain.link(cur().line);
      if (cur().is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (cur().is_name("is")) {
        node = parse_test(std::move(node));
      } else if (cur().is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& t = next();
    if (t.text == ".") {
      const Token& attr = next();
      if (attr.type == Tok::kName)
        return std::make_unique<GetattrExpr>(std::move(node), attr.text, t.line);
      if (attr.type != Tok::kInteger) fail(attr.line, "expected name or number");
      auto key = std::make_unique<ConstExpr>(Value::integer(attr.ival), attr.line);
      return std::make_unique<GetitemExpr>(std::move(node), std::move(key), t.line);
    }
    std::vector<ExprPtr> args;
    while (!cur().is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    ExprPtr key;
    if (args.size() == 1) {
      key = std::move(args[0]);
    } else {
      auto tuple = std::make_unique<SeqExpr>(ExprKind::kTuple, t.line);
      tuple->items = std::move(args);
      key = std::move(tuple);
    }
    return std::make_unique<GetitemExpr>(std::move(node), std::move(key), t.line);
  }

  ExprPtr parse_subscribed() {
    int line = cur().line;
    auto slice = std::make_unique<SliceExpr>(line);
    if (cur().is_op(":")) {
      next();
    } else {
      ExprPtr node = parse_expression(true);
      if (!cur().is_op(":")) return node;
      next();
      slice->start = std::move(node);
    }
    if (!cur().is_op(":") && !cur().is_op("]") && !cur().is_op(",")) {
      slice->stop = parse_expression(true);
    }
    if (skip_op(":")) {
      if (!cur().is_op("]") && !cur().is_op(",")) slice->step = parse_expression(true);
    }
    return slice;
  }

  CallSpec parse_call_args() {
    int line = cur().line;
    expect_op("(");
    CallSpec spec;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail(line, "invalid syntax for function call expression");
    };
    while (!cur().is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (cur().is_op(")")) break;
      }
      if (cur().is_op("*")) {
        ensure(!spec.dyn_args && !spec.dyn_kwargs);
        next();
        spec.dyn_args = parse_expression(true);
      } else if (cur().is_op("**")) {
        ensure(!spec.dyn_kwargs);
        next();
        spec.dyn_kwargs = parse_expression(true);
      } else if (cur().type == Tok::kName && look().is_op("=")) {
        ensure(!spec.dyn_kwargs);
        std::string key = next().text;
        next();
        spec.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!spec.dyn_args && !spec.dyn_kwargs && spec.kwargs.empty());
        spec.args.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
    return spec;
  }

  ExprPtr parse_call(ExprPtr node) {
    auto call = std::make_unique<CallExpr>(cur().line);
    call->callee = std::move(node);
    call->call = parse_call_args();
    return call;
  }

  std::string parse_dotted_name() {
    std::string name = expect_name().text;
    while (cur().is_op(".")) {
      next();
      name += "." + expect_name().text;
    }
    return name;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    ChainGuard chain(this);
    while (cur().is_op("|") || start_inline) {
      chain.link(cur().line);
      if (!start_inline) next();
      start_inline = false;
      int line = cur().line;
      auto f = std::make_unique<FilterExpr>(ExprKind::kFilter, line);
      f->name = parse_dotted_name();
      if (cur().is_op("(")) f->call = parse_call_args();
      check_known(*f, opt_.has_filter);
      f->input = std::move(node);
      node = std::move(f);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    int line = next().line;  // 'is'
    bool negated = skip_name("not");
    auto t = std::make_unique<FilterExpr>(ExprKind::kTest, line);
    t->name = parse_dotted_name();
    const Token& c = cur();
    if (c.is_op("(")) {
      t->call = parse_call_args();
    } else if ((c.type == Tok::kName || c.type == Tok::kString || c.type == Tok::kInteger ||
                c.type == Tok::kFloat || c.is_op("(") || c.is_op("[") || c.is_op("{")) &&
               !c.is_name("else") && !c.is_name("or") && !c.is_name("and")) {
      if (c.is_name("is")) fail(c.line, "You cannot chain multiple tests with is");
      t->call.args.push_back(parse_postfix(parse_primary()));
    }
    check_known(*t, opt_.has_test);
    t->input = std::move(node);
    if (negated) return std::make_unique<UnaryExpr>('!', std::move(t), line);
    return t;
  }

  // Unknown names are only marked here: whether jinja2 rejects them at compile time depends on
  // where they sit, which parse_template checks over the whole tree (unknown_outside_if).
  static void check_known(FilterExpr& f, const std::function<bool(std::string_view)>& known) {
    f.unknown = !(known && known(f.name));
  }

  // ---- macro bodies: which special names they use ----
  static void scan_special_names(MacroDef& def) {
    std::set<std::string> names;
    collect_names(def.body, names);
    for (const auto& d : def.defaults) collect_names(*d, names);
    def.uses_caller = names.count("caller") > 0;
    def.uses_kwargs = names.count("kwargs") > 0;
    def.uses_varargs = names.count("varargs") > 0;
  }

  const std::vector<Token>& t_;
  const ParserOptions& opt_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const ParserOptions& options) {
  return Parser(tokens, options).parse_template();
}

}  // namespace atom::jinja
