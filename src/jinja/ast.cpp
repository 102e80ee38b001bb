#include "jinja/ast.h"

namespace atom::jinja {

namespace {

void scan_expr(const Expr* e, std::set<std::string>& names);

void scan_call(const CallSpec& c, std::set<std::string>& names) {
  for (const auto& a : c.args) scan_expr(a.get(), names);
  for (const auto& kv : c.kwargs) scan_expr(kv.second.get(), names);
  scan_expr(c.dyn_args.get(), names);
  scan_expr(c.dyn_kwargs.get(), names);
}

void scan_expr(const Expr* e, std::set<std::string>& names) {
  if (!e) return;
  switch (e->kind) {
    case ExprKind::kConst:
      return;
    case ExprKind::kName:
      names.insert(static_cast<const NameExpr*>(e)->name);
      return;
    case ExprKind::kList:
    case ExprKind::kTuple:
      for (const auto& x : static_cast<const SeqExpr*>(e)->items) scan_expr(x.get(), names);
      return;
    case ExprKind::kDict:
      for (const auto& [k, v] : static_cast<const DictExpr*>(e)->items) {
        scan_expr(k.get(), names);
        scan_expr(v.get(), names);
      }
      return;
    case ExprKind::kGetattr:
      scan_expr(static_cast<const GetattrExpr*>(e)->obj.get(), names);
      return;
    case ExprKind::kGetitem: {
      auto* g = static_cast<const GetitemExpr*>(e);
      scan_expr(g->obj.get(), names);
      scan_expr(g->key.get(), names);
      return;
    }
    case ExprKind::kSlice: {
      auto* s = static_cast<const SliceExpr*>(e);
      scan_expr(s->start.get(), names);
      scan_expr(s->stop.get(), names);
      scan_expr(s->step.get(), names);
      return;
    }
    case ExprKind::kUnary:
      scan_expr(static_cast<const UnaryExpr*>(e)->operand.get(), names);
      return;
    case ExprKind::kBinary: {
      auto* b = static_cast<const BinaryExpr*>(e);
      scan_expr(b->left.get(), names);
      scan_expr(b->right.get(), names);
      return;
    }
    case ExprKind::kAnd:
    case ExprKind::kOr: {
      auto* b = static_cast<const LogicExpr*>(e);
      scan_expr(b->left.get(), names);
      scan_expr(b->right.get(), names);
      return;
    }
    case ExprKind::kConcat:
      for (const auto& x : static_cast<const ConcatExpr*>(e)->parts) scan_expr(x.get(), names);
      return;
    case ExprKind::kCompare: {
      auto* c = static_cast<const CompareExpr*>(e);
      scan_expr(c->first.get(), names);
      for (const auto& op : c->ops) scan_expr(op.second.get(), names);
      return;
    }
    case ExprKind::kCondExpr: {
      auto* c = static_cast<const CondExpr*>(e);
      scan_expr(c->test.get(), names);
      scan_expr(c->then.get(), names);
      scan_expr(c->otherwise.get(), names);
      return;
    }
    case ExprKind::kCall: {
      auto* c = static_cast<const CallExpr*>(e);
      scan_expr(c->callee.get(), names);
      scan_call(c->call, names);
      return;
    }
    case ExprKind::kFilter:
    case ExprKind::kTest: {
      auto* f = static_cast<const FilterExpr*>(e);
      scan_expr(f->input.get(), names);
      scan_call(f->call, names);
      return;
    }
  }
}

}  // namespace

void collect_names(const Body& body, std::set<std::string>& names) {
  for (const auto& st : body) {
    switch (st->kind) {
      case StmtKind::kOutput:
        for (const auto& e : static_cast<const OutputStmt*>(st.get())->exprs)
          scan_expr(e.get(), names);
        break;
      case StmtKind::kIf: {
        auto* n = static_cast<const IfStmt*>(st.get());
        for (const auto& [test, b] : n->branches) {
          scan_expr(test.get(), names);
          collect_names(b, names);
        }
        collect_names(n->otherwise, names);
        break;
      }
      case StmtKind::kFor: {
        auto* n = static_cast<const ForStmt*>(st.get());
        scan_expr(n->iter.get(), names);
        scan_expr(n->filter.get(), names);
        collect_names(n->body, names);
        collect_names(n->otherwise, names);
        break;
      }
      case StmtKind::kSet:
        scan_expr(static_cast<const SetStmt*>(st.get())->value.get(), names);
        break;
      case StmtKind::kSetBlock: {
        auto* n = static_cast<const SetBlockStmt*>(st.get());
        scan_expr(n->filter.get(), names);
        collect_names(n->body, names);
        break;
      }
      case StmtKind::kMacro: {
        auto* n = static_cast<const MacroStmt*>(st.get());
        collect_names(n->def->body, names);
        for (const auto& d : n->def->defaults) scan_expr(d.get(), names);
        break;
      }
      case StmtKind::kCallBlock: {
        auto* n = static_cast<const CallBlockStmt*>(st.get());
        scan_expr(n->call.get(), names);
        collect_names(n->caller->body, names);
        break;
      }
      case StmtKind::kFilterBlock: {
        auto* n = static_cast<const FilterBlockStmt*>(st.get());
        scan_expr(n->filter.get(), names);
        collect_names(n->body, names);
        break;
      }
      case StmtKind::kWith: {
        auto* n = static_cast<const WithStmt*>(st.get());
        for (const auto& a : n->assigns) scan_expr(a.second.get(), names);
        collect_names(n->body, names);
        break;
      }
      case StmtKind::kScope:
        collect_names(static_cast<const ScopeStmt*>(st.get())->body, names);
        break;
      default:
        break;
    }
  }
}

void collect_names(const Expr& e, std::set<std::string>& names) { scan_expr(&e, names); }

namespace {

// jinja2's code generator checks filter and test names when it compiles them, except in "soft"
// frames: the test and branches of an if, and conditional expressions. Loop bodies, macros and
// other inner frames are not soft again, even inside an if.
const FilterExpr* hard_unknown(const Expr* e, bool soft);

const FilterExpr* hard_unknown(const CallSpec& c, bool soft) {
  for (const auto& a : c.args) {
    if (auto* f = hard_unknown(a.get(), soft)) return f;
  }
  for (const auto& kv : c.kwargs) {
    if (auto* f = hard_unknown(kv.second.get(), soft)) return f;
  }
  if (auto* f = hard_unknown(c.dyn_args.get(), soft)) return f;
  return hard_unknown(c.dyn_kwargs.get(), soft);
}

const FilterExpr* hard_unknown(const Expr* e, bool soft) {
  if (!e) return nullptr;
  auto any = [&](std::initializer_list<const Expr*> xs, bool s) -> const FilterExpr* {
    for (const Expr* x : xs) {
      if (auto* f = hard_unknown(x, s)) return f;
    }
    return nullptr;
  };
  switch (e->kind) {
    case ExprKind::kConst:
    case ExprKind::kName:
      return nullptr;
    case ExprKind::kList:
    case ExprKind::kTuple:
      for (const auto& x : static_cast<const SeqExpr*>(e)->items) {
        if (auto* f = hard_unknown(x.get(), soft)) return f;
      }
      return nullptr;
    case ExprKind::kDict:
      for (const auto& [k, v] : static_cast<const DictExpr*>(e)->items) {
        if (auto* f = any({k.get(), v.get()}, soft)) return f;
      }
      return nullptr;
    case ExprKind::kGetattr:
      return hard_unknown(static_cast<const GetattrExpr*>(e)->obj.get(), soft);
    case ExprKind::kGetitem: {
      auto* g = static_cast<const GetitemExpr*>(e);
      return any({g->obj.get(), g->key.get()}, soft);
    }
    case ExprKind::kSlice: {
      auto* s = static_cast<const SliceExpr*>(e);
      return any({s->start.get(), s->stop.get(), s->step.get()}, soft);
    }
    case ExprKind::kUnary:
      return hard_unknown(static_cast<const UnaryExpr*>(e)->operand.get(), soft);
    case ExprKind::kBinary: {
      auto* b = static_cast<const BinaryExpr*>(e);
      return any({b->left.get(), b->right.get()}, soft);
    }
    case ExprKind::kAnd:
    case ExprKind::kOr: {
      auto* b = static_cast<const LogicExpr*>(e);
      return any({b->left.get(), b->right.get()}, soft);
    }
    case ExprKind::kConcat:
      for (const auto& x : static_cast<const ConcatExpr*>(e)->parts) {
        if (auto* f = hard_unknown(x.get(), soft)) return f;
      }
      return nullptr;
    case ExprKind::kCompare: {
      auto* c = static_cast<const CompareExpr*>(e);
      if (auto* f = hard_unknown(c->first.get(), soft)) return f;
      for (const auto& op : c->ops) {
        if (auto* f = hard_unknown(op.second.get(), soft)) return f;
      }
      return nullptr;
    }
    case ExprKind::kCondExpr: {
      auto* c = static_cast<const CondExpr*>(e);
      return any({c->test.get(), c->then.get(), c->otherwise.get()}, true);
    }
    case ExprKind::kCall: {
      auto* c = static_cast<const CallExpr*>(e);
      if (auto* f = hard_unknown(c->callee.get(), soft)) return f;
      return hard_unknown(c->call, soft);
    }
    case ExprKind::kFilter:
    case ExprKind::kTest: {
      auto* fe = static_cast<const FilterExpr*>(e);
      if (auto* f = hard_unknown(fe->input.get(), soft)) return f;
      if (auto* f = hard_unknown(fe->call, soft)) return f;
      return fe->unknown && !soft ? fe : nullptr;
    }
  }
  return nullptr;
}

const FilterExpr* hard_unknown(const Body& body, bool soft) {
  for (const auto& st : body) {
    const FilterExpr* f = nullptr;
    switch (st->kind) {
      case StmtKind::kOutput:
        for (const auto& e : static_cast<const OutputStmt*>(st.get())->exprs) {
          if ((f = hard_unknown(e.get(), soft))) break;
        }
        break;
      case StmtKind::kIf: {
        auto* n = static_cast<const IfStmt*>(st.get());
        for (const auto& [test, b] : n->branches) {
          if ((f = hard_unknown(test.get(), true)) || (f = hard_unknown(b, true))) break;
        }
        if (!f) f = hard_unknown(n->otherwise, true);
        break;
      }
      case StmtKind::kFor: {
        auto* n = static_cast<const ForStmt*>(st.get());
        if (!(f = hard_unknown(n->iter.get(), soft)) &&
            !(f = hard_unknown(n->filter.get(), false)) && !(f = hard_unknown(n->body, false))) {
          f = hard_unknown(n->otherwise, false);
        }
        break;
      }
      case StmtKind::kSet:
        f = hard_unknown(static_cast<const SetStmt*>(st.get())->value.get(), soft);
        break;
      case StmtKind::kSetBlock: {
        auto* n = static_cast<const SetBlockStmt*>(st.get());
        if (!(f = hard_unknown(n->filter.get(), false))) f = hard_unknown(n->body, false);
        break;
      }
      case StmtKind::kMacro: {
        auto* n = static_cast<const MacroStmt*>(st.get());
        for (const auto& d : n->def->defaults) {
          if ((f = hard_unknown(d.get(), false))) break;
        }
        if (!f) f = hard_unknown(n->def->body, false);
        break;
      }
      case StmtKind::kCallBlock: {
        auto* n = static_cast<const CallBlockStmt*>(st.get());
        if (!(f = hard_unknown(n->call.get(), soft))) {
          for (const auto& d : n->caller->defaults) {
            if ((f = hard_unknown(d.get(), false))) break;
          }
        }
        if (!f) f = hard_unknown(n->caller->body, false);
        break;
      }
      case StmtKind::kFilterBlock: {
        auto* n = static_cast<const FilterBlockStmt*>(st.get());
        if (!(f = hard_unknown(n->filter.get(), false))) f = hard_unknown(n->body, false);
        break;
      }
      case StmtKind::kWith: {
        auto* n = static_cast<const WithStmt*>(st.get());
        for (const auto& a : n->assigns) {
          if ((f = hard_unknown(a.second.get(), soft))) break;
        }
        if (!f) f = hard_unknown(n->body, false);
        break;
      }
      case StmtKind::kScope:
        f = hard_unknown(static_cast<const ScopeStmt*>(st.get())->body, false);
        break;
      default:
        break;
    }
    if (f) return f;
  }
  return nullptr;
}

}  // namespace

const FilterExpr* unknown_outside_if(const Body& body) { return hard_unknown(body, false); }

}  // namespace atom::jinja
