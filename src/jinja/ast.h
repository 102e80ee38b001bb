// The parsed template: expression and statement nodes mirroring jinja2's nodes.py. Nodes are plain
// data; the interpreter walks them.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "jinja/value.h"

namespace atom::jinja {

enum class ExprKind : uint8_t {
  kConst,
  kName,
  kList,
  kTuple,
  kDict,
  kGetattr,
  kGetitem,
  kSlice,
  kUnary,
  kBinary,
  kAnd,
  kOr,
  kConcat,
  kCompare,
  kCondExpr,
  kCall,
  kFilter,
  kTest,
};

struct Expr {
  Expr(ExprKind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  ExprKind kind;
  int line;
};
using ExprPtr = std::unique_ptr<Expr>;

struct ConstExpr : Expr {
  ConstExpr(Value v, int l) : Expr(ExprKind::kConst, l), value(std::move(v)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(std::string n, int l) : Expr(ExprKind::kName, l), name(std::move(n)) {}
  std::string name;
};

// List and tuple displays.
struct SeqExpr : Expr {
  SeqExpr(ExprKind k, int l) : Expr(k, l) {}
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(ExprKind::kDict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetattrExpr : Expr {
  GetattrExpr(ExprPtr o, std::string a, int l)
      : Expr(ExprKind::kGetattr, l), obj(std::move(o)), attr(std::move(a)) {}
  ExprPtr obj;
  std::string attr;
};

struct GetitemExpr : Expr {
  GetitemExpr(ExprPtr o, ExprPtr k, int l)
      : Expr(ExprKind::kGetitem, l), obj(std::move(o)), key(std::move(k)) {}
  ExprPtr obj;
  ExprPtr key;  // a SliceExpr for obj[a:b:c]
};

struct SliceExpr : Expr {
  explicit SliceExpr(int l) : Expr(ExprKind::kSlice, l) {}
  ExprPtr start, stop, step;  // each may be null
};

struct UnaryExpr : Expr {
  UnaryExpr(char o, ExprPtr e, int l) : Expr(ExprKind::kUnary, l), op(o), operand(std::move(e)) {}
  char op;  // '-', '+', '!' (not)
  ExprPtr operand;
};

enum class BinOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };

struct BinaryExpr : Expr {
  BinaryExpr(BinOp o, ExprPtr a, ExprPtr b, int l)
      : Expr(ExprKind::kBinary, l), op(o), left(std::move(a)), right(std::move(b)) {}
  BinOp op;
  ExprPtr left, right;
};

// `and` / `or` (kind says which): Python semantics, returns an operand.
struct LogicExpr : Expr {
  LogicExpr(ExprKind k, ExprPtr a, ExprPtr b, int l)
      : Expr(k, l), left(std::move(a)), right(std::move(b)) {}
  ExprPtr left, right;
};

struct ConcatExpr : Expr {
  explicit ConcatExpr(int l) : Expr(ExprKind::kConcat, l) {}
  std::vector<ExprPtr> parts;
};

enum class CmpOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct CompareExpr : Expr {
  explicit CompareExpr(int l) : Expr(ExprKind::kCompare, l) {}
  ExprPtr first;
  std::vector<std::pair<CmpOp, ExprPtr>> ops;  // chained like Python: a < b < c
};

struct CondExpr : Expr {
  explicit CondExpr(int l) : Expr(ExprKind::kCondExpr, l) {}
  ExprPtr test, then, otherwise;  // otherwise may be null: the result is then Undefined
};

// Call arguments as written: positional, keyword, *args and **kwargs.
struct CallSpec {
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr dyn_args, dyn_kwargs;
};

struct CallExpr : Expr {
  explicit CallExpr(int l) : Expr(ExprKind::kCall, l) {}
  ExprPtr callee;
  CallSpec call;
};

// `x|name(args)`, and `x is name(args)` for tests. `input` is null in filter blocks, where the
// block's rendered body is the input.
struct FilterExpr : Expr {
  FilterExpr(ExprKind k, int l) : Expr(k, l) {}
  ExprPtr input;
  std::string name;
  CallSpec call;
  // Set when the name is not a known filter/test and the use sits under an if (or a conditional
  // expression): jinja2 then defers the error to the moment it runs.
  bool unknown = false;
};

// ---- statements ----

enum class StmtKind : uint8_t {
  kData,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kWith,
  kBreak,
  kContinue,
  kScope,
};

struct Stmt {
  Stmt(StmtKind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  int line;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct DataStmt : Stmt {
  DataStmt(std::string t, int l) : Stmt(StmtKind::kData, l), text(std::move(t)) {}
  std::string text;
};

// {{ expr }} and {% print a, b %}.
struct OutputStmt : Stmt {
  explicit OutputStmt(int l) : Stmt(StmtKind::kOutput, l) {}
  std::vector<ExprPtr> exprs;
};

struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(StmtKind::kIf, l) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if + elifs
  Body otherwise;
};

// Assignment targets: a name, `ns.attr`, or a (nested) tuple of them.
struct Target {
  enum class Kind : uint8_t { kName, kNsAttr, kTuple } kind = Kind::kName;
  std::string name;
  std::string attr;
  std::vector<Target> items;
  int line = 0;
};

struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(StmtKind::kFor, l) {}
  Target target;
  ExprPtr iter;
  ExprPtr filter;  // `for x in xs if cond`
  Body body, otherwise;
  bool recursive = false;
};

struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(StmtKind::kSet, l) {}
  Target target;
  ExprPtr value;
};

struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(int l) : Stmt(StmtKind::kSetBlock, l) {}
  Target target;
  ExprPtr filter;  // a FilterExpr chain with a null innermost input, or null
  Body body;
};

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  // Whether the body mentions caller / kwargs / varargs, which decides what calls it accepts.
  bool uses_caller = false, uses_kwargs = false, uses_varargs = false;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(StmtKind::kMacro, l) {}
  std::shared_ptr<MacroDef> def;
};

struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(int l) : Stmt(StmtKind::kCallBlock, l) {}
  std::unique_ptr<CallExpr> call;
  std::shared_ptr<MacroDef> caller;  // the block body, callable as `caller(...)`
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int l) : Stmt(StmtKind::kFilterBlock, l) {}
  ExprPtr filter;
  Body body;
};

struct WithStmt : Stmt {
  explicit WithStmt(int l) : Stmt(StmtKind::kWith, l) {}
  std::vector<std::pair<Target, ExprPtr>> assigns;
  Body body;
};

// A body rendered in place: extension tags such as transformers' {% generation %}.
struct ScopeStmt : Stmt {
  explicit ScopeStmt(int l) : Stmt(StmtKind::kScope, l) {}
  Body body;
};

// Every name the body (or expression) loads, nested macros included: jinja2 decides from these
// whether a macro accepts caller, extra keyword arguments (kwargs) and extra positionals (varargs).
void collect_names(const Body& body, std::set<std::string>& names);
void collect_names(const Expr& expr, std::set<std::string>& names);

// The first use of an unknown filter or test that jinja2 would reject when compiling: one that is
// not under an if or a conditional expression (those are only errors when they run).
const FilterExpr* unknown_outside_if(const Body& body);

}  // namespace atom::jinja
