#include "grammar/grammar.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace atom::grammar {

namespace {

// A parsed element before compilation: a character set, a rule name, or a group of alternatives
// with a repetition.
struct Node;
using Seq = std::vector<Node>;
struct Node {
  enum Kind { kChars, kRef, kGroup } kind = kChars;
  bool negated = false;
  std::vector<CharRange> ranges;
  std::string ref;
  std::vector<Seq> alts;  // kGroup
  int min = 1, max = 1;   // repetition; max -1: unbounded
};

class Parser {
 public:
  Parser(std::string_view text, const GrammarLimits& limits) : s_(text), limits_(limits) {}

  std::vector<std::pair<std::string, std::vector<Seq>>> parse() {
    std::vector<std::pair<std::string, std::vector<Seq>>> rules;
    skip_space(true);
    while (i_ < s_.size()) {
      const std::string name = ident();
      if (name.empty()) error("a rule name");
      skip_space(true);
      if (s_.substr(i_, 3) != "::=") error("'::='");
      i_ += 3;
      rules.emplace_back(name, alternatives(0));
      skip_space(true);
    }
    return rules;
  }

 private:
  [[noreturn]] void error(std::string_view want) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    fail("grammar: expected {} at line {}, column {}", want, line, col);
  }

  static bool ident_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
  }
  std::string ident() {
    const size_t b = i_;
    // '.' alone is the any-character terminal, not a name.
    while (i_ < s_.size() && ident_char(s_[i_]) && !(s_[i_] == '.' && i_ == b)) ++i_;
    return std::string(s_.substr(b, i_ - b));
  }

  // Spaces and comments; newlines too when `newlines` (between rules, or inside a group).
  void skip_space(bool newlines) {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++i_;
      } else {
        break;
      }
    }
  }

  // Whether the text at i_ (after spaces and newlines) begins a new rule: `name ::=`.
  bool at_rule_start() const {
    size_t k = i_;
    while (k < s_.size() &&
           (s_[k] == ' ' || s_[k] == '\t' || s_[k] == '\r' || s_[k] == '\n' || s_[k] == '#')) {
      if (s_[k] == '#')
        while (k < s_.size() && s_[k] != '\n') ++k;
      else
        ++k;
    }
    const size_t b = k;
    while (k < s_.size() && ident_char(s_[k])) ++k;
    if (k == b) return false;
    while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t')) ++k;
    return s_.substr(k, 3) == "::=";
  }

  std::vector<Seq> alternatives(int depth) {
    if (depth > limits_.max_nesting)
      fail("grammar: groups nest deeper than {} (the nesting limit)", limits_.max_nesting);
    std::vector<Seq> alts;
    alts.push_back(sequence(depth));
    for (;;) {
      skip_space(depth > 0);
      if (i_ < s_.size() && s_[i_] == '|') {
        ++i_;
        alts.push_back(sequence(depth));
        continue;
      }
      // A rule's alternatives may continue on the next line after a '|' at its end or start.
      if (depth == 0 && i_ < s_.size() && s_[i_] == '\n' && !at_rule_start()) {
        size_t k = i_;
        while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t' || s_[k] == '\r' || s_[k] == '\n'))
          ++k;
        if (k < s_.size() && s_[k] == '|') {
          i_ = k + 1;
          alts.push_back(sequence(depth));
          continue;
        }
      }
      return alts;
    }
  }

  Seq sequence(int depth) {
    Seq seq;
    for (;;) {
      skip_space(depth > 0);
      // A newline ends the rule at the top level, unless the next line continues it (a line that
      // is not a new rule and does not start with '|').
      if (depth == 0 && i_ < s_.size() && s_[i_] == '\n') {
        if (at_rule_start()) return seq;
        size_t k = i_;
        while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t' || s_[k] == '\r' || s_[k] == '\n'))
          ++k;
        if (k >= s_.size() || s_[k] == '|') return seq;
        i_ = k;
      }
      if (i_ >= s_.size()) return seq;
      const char c = s_[i_];
      if (c == '|' || c == ')') return seq;
      Node n;
      if (c == '"') {
        ++i_;
        // A string is a sequence of one-character sets.
        Node group;
        group.kind = Node::kGroup;
        group.alts.emplace_back();
        while (i_ < s_.size() && s_[i_] != '"') {
          const char32_t ch = character();
          Node one;
          one.ranges.push_back({ch, ch});
          group.alts[0].push_back(std::move(one));
        }
        if (i_ >= s_.size()) error("the closing '\"' of a string");
        ++i_;
        n = std::move(group);
      } else if (c == '[') {
        ++i_;
        if (i_ < s_.size() && s_[i_] == '^') {
          n.negated = true;
          ++i_;
        }
        while (i_ < s_.size() && s_[i_] != ']') {
          const char32_t lo = character();
          char32_t hi = lo;
          if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
            ++i_;
            hi = character();
          }
          if (hi < lo) error("a character range whose end is not below its start");
          n.ranges.push_back({lo, hi});
        }
        if (i_ >= s_.size()) error("the closing ']' of a character class");
        ++i_;
      } else if (c == '.') {
        ++i_;
        n.negated = true;  // [^] : any character
      } else if (c == '(') {
        ++i_;
        n.kind = Node::kGroup;
        n.alts = alternatives(depth + 1);
        skip_space(true);
        if (i_ >= s_.size() || s_[i_] != ')') error("')'");
        ++i_;
      } else if (ident_char(c)) {
        if (at_rule_start()) return seq;
        n.kind = Node::kRef;
        n.ref = ident();
      } else {
        error("a string, character class, rule name or '('");
      }
      repetition(n);
      seq.push_back(std::move(n));
    }
  }

  void repetition(Node& n) {
    if (i_ >= s_.size()) return;
    const char c = s_[i_];
    if (c == '*') {
      n.min = 0, n.max = -1;
    } else if (c == '+') {
      n.min = 1, n.max = -1;
    } else if (c == '?') {
      n.min = 0, n.max = 1;
    } else if (c == '{') {
      ++i_;
      skip_space(false);
      n.min = number();
      skip_space(false);
      n.max = n.min;
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        skip_space(false);
        n.max = (i_ < s_.size() && s_[i_] == '}') ? -1 : number();
        skip_space(false);
      }
      if (i_ >= s_.size() || s_[i_] != '}') error("'}'");
      if (n.max >= 0 && n.max < n.min) error("{m,n} with n >= m");
    } else {
      return;
    }
    ++i_;
  }

  int number() {
    const size_t b = i_;
    int64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      v = v * 10 + (s_[i_] - '0');
      if (v > limits_.max_repeat)
        fail("grammar: a repetition count exceeds {} (the repeat limit)", limits_.max_repeat);
      ++i_;
    }
    if (i_ == b) error("a number");
    return static_cast<int>(v);
  }

  int hex(int digits) {
    int v = 0;
    for (int k = 0; k < digits; ++k) {
      if (i_ >= s_.size()) error("a hex digit");
      const char c = s_[i_++];
      int d = (c >= '0' && c <= '9')   ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                       : -1;
      if (d < 0) error("a hex digit");
      v = v * 16 + d;
    }
    return v;
  }

  // One character of a string or class, escapes decoded.
  char32_t character() {
    if (i_ >= s_.size()) error("a character");
    if (s_[i_] == '\\') {
      ++i_;
      if (i_ >= s_.size()) error("an escape");
      const char e = s_[i_++];
      switch (e) {
        case 'n':
          return '\n';
        case 't':
          return '\t';
        case 'r':
          return '\r';
        case 'x':
          return static_cast<char32_t>(hex(2));
        case 'u':
          return static_cast<char32_t>(hex(4));
        case 'U':
          return static_cast<char32_t>(hex(8));
        default:
          return static_cast<unsigned char>(e);  // \\ \" \] \[ \- and the like
      }
    }
    const auto b = static_cast<unsigned char>(s_[i_]);
    const int len = tokenizer::utf8_seq_len(b);
    if (tokenizer::utf8_valid_seq(s_, i_) == 0) error("valid UTF-8");
    size_t k = i_;
    const char32_t cp = tokenizer::utf8_next(s_, k);
    i_ += static_cast<size_t>(len);
    return cp;
  }

  std::string_view s_;
  size_t i_ = 0;
  const GrammarLimits& limits_;
};

class Compiler {
 public:
  Compiler(Grammar& g, const GrammarLimits& limits) : g_(g), limits_(limits) {}

  void compile(const std::vector<std::pair<std::string, std::vector<Seq>>>& rules,
               std::string_view root) {
    for (const auto& [name, alts] : rules) {
      if (ids_.count(name)) fail("grammar: rule '{}' is defined twice", name);
      ids_[name] = new_rule(name);
    }
    for (const auto& [name, alts] : rules) define(ids_.at(name), alts);
    auto it = ids_.find(std::string(root));
    if (it == ids_.end()) fail("grammar: no rule '{}' to start from", root);
    g_.root = it->second;
  }

 private:
  uint32_t new_rule(const std::string& name) {
    g_.rule_names.push_back(name);
    g_.rule_alts.emplace_back();
    return static_cast<uint32_t>(g_.rule_alts.size() - 1);
  }

  void push(Item it) {
    if (g_.items.size() >= limits_.max_items)
      fail("grammar: more than {} compiled elements (the size limit)", limits_.max_items);
    g_.items.push_back(it);
  }

  void define(uint32_t rule, const std::vector<Seq>& alts) {
    // Items of one alternative must be contiguous, so the elements an alternative needs (generated
    // rules for groups) are made first and the alternative written after.
    for (const Seq& seq : alts) {
      std::vector<Item> body;
      for (const Node& n : seq) append(n, body);
      g_.rule_alts[rule].push_back(static_cast<uint32_t>(g_.items.size()));
      for (const Item& it : body) push(it);
      push(Item{});
    }
  }

  Item atom(const Node& n) {
    Item it;
    if (n.kind == Node::kChars) {
      it.kind = Item::kChars;
      it.negated = n.negated;
      it.ranges_begin = static_cast<uint32_t>(g_.ranges.size());
      for (const auto& r : n.ranges) g_.ranges.push_back(r);
      it.ranges_end = static_cast<uint32_t>(g_.ranges.size());
    } else if (n.kind == Node::kRef) {
      auto f = ids_.find(n.ref);
      if (f == ids_.end()) fail("grammar: rule '{}' is used but not defined", n.ref);
      it.kind = Item::kRule;
      it.rule = f->second;
    } else {
      // A group: its own rule.
      const uint32_t r = new_rule(fmt::format("group-{}", g_.rule_alts.size()));
      define(r, n.alts);
      it.kind = Item::kRule;
      it.rule = r;
    }
    return it;
  }

  // Appends n with its repetition: m copies, then (max - m) nested optionals or a star rule.
  void append(const Node& n, std::vector<Item>& body) {
    if (n.min == 1 && n.max == 1) {
      // A string group of one alternative is spliced in directly.
      if (n.kind == Node::kGroup && n.alts.size() == 1) {
        for (const Node& c : n.alts[0]) append(c, body);
        return;
      }
      body.push_back(atom(n));
      return;
    }
    Node once = n;
    once.min = once.max = 1;
    const Item a = atom(once);
    if (static_cast<size_t>(n.min) + body.size() > limits_.max_items)
      fail("grammar: more than {} compiled elements (the size limit)", limits_.max_items);
    for (int k = 0; k < n.min; ++k) body.push_back(a);
    if (n.max < 0) {
      // star ::= a star | ε
      const uint32_t star = new_rule(fmt::format("star-{}", g_.rule_alts.size()));
      Item ref;
      ref.kind = Item::kRule;
      ref.rule = star;
      g_.rule_alts[star].push_back(static_cast<uint32_t>(g_.items.size()));
      push(a);
      push(ref);
      push(Item{});
      g_.rule_alts[star].push_back(static_cast<uint32_t>(g_.items.size()));
      push(Item{});
      body.push_back(ref);
      return;
    }
    // opt_k ::= a opt_{k-1} | ε, opt_1 ::= a | ε
    uint32_t prev = UINT32_MAX;
    for (int k = 0; k < n.max - n.min; ++k) {
      const uint32_t opt = new_rule(fmt::format("opt-{}", g_.rule_alts.size()));
      g_.rule_alts[opt].push_back(static_cast<uint32_t>(g_.items.size()));
      push(a);
      if (prev != UINT32_MAX) {
        Item ref;
        ref.kind = Item::kRule;
        ref.rule = prev;
        push(ref);
      }
      push(Item{});
      g_.rule_alts[opt].push_back(static_cast<uint32_t>(g_.items.size()));
      push(Item{});
      prev = opt;
    }
    if (prev != UINT32_MAX) {
      Item ref;
      ref.kind = Item::kRule;
      ref.rule = prev;
      body.push_back(ref);
    }
  }

  Grammar& g_;
  const GrammarLimits& limits_;
  std::map<std::string, uint32_t> ids_;
};

// Rules that can match the empty string, then a search for a rule that reaches itself through
// leading nullable elements (which a top-down matcher would expand forever).
void check_left_recursion(const Grammar& g) {
  const size_t R = g.rule_alts.size();
  std::vector<char> nullable(R, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < R; ++r) {
      if (nullable[r]) continue;
      for (uint32_t a : g.rule_alts[r]) {
        bool all = true;
        for (uint32_t p = a; g.items[p].kind != Item::kEnd; ++p)
          if (g.items[p].kind == Item::kChars || !nullable[g.items[p].rule]) {
            all = false;
            break;
          }
        if (all) {
          nullable[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<uint32_t>> left(R);
  for (size_t r = 0; r < R; ++r)
    for (uint32_t a : g.rule_alts[r])
      for (uint32_t p = a; g.items[p].kind == Item::kRule; ++p) {
        left[r].push_back(g.items[p].rule);
        if (!nullable[g.items[p].rule]) break;
      }
  std::vector<int> color(R, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<uint32_t, size_t>> stack;
  for (uint32_t s = 0; s < R; ++s) {
    if (color[s]) continue;
    stack.push_back({s, 0});
    color[s] = 1;
    while (!stack.empty()) {
      auto& [r, k] = stack.back();
      if (k < left[r].size()) {
        const uint32_t nx = left[r][k++];
        if (color[nx] == 1) fail("grammar: rule '{}' is left-recursive", g.rule_names[nx]);
        if (color[nx] == 0) {
          color[nx] = 1;
          stack.push_back({nx, 0});
        }
      } else {
        color[r] = 2;
        stack.pop_back();
      }
    }
  }
}

}  // namespace

Grammar Grammar::from_gbnf(std::string_view text, const GrammarLimits& limits,
                           std::string_view root) {
  if (text.size() > limits.max_text_bytes)
    fail("grammar: {} bytes is longer than {} (the grammar size limit)", text.size(),
         limits.max_text_bytes);
  Grammar g;
  g.limits = limits;
  Parser p(text, limits);
  const auto rules = p.parse();
  if (rules.empty()) fail("grammar: no rules");
  Compiler c(g, limits);
  c.compile(rules, root);
  check_left_recursion(g);
  return g;
}

bool Grammar::char_matches(const Item& it, char32_t c) const {
  bool in = false;
  for (uint32_t k = it.ranges_begin; k < it.ranges_end && !in; ++k)
    in = ranges[k].lo <= c && c <= ranges[k].hi;
  return in != it.negated;
}

bool Grammar::char_range_matches(const Item& it, char32_t lo, char32_t hi) const {
  if (!it.negated) {
    for (uint32_t k = it.ranges_begin; k < it.ranges_end; ++k)
      if (ranges[k].lo <= hi && lo <= ranges[k].hi) return true;
    return false;
  }
  // Negated: some code point in [lo, hi] lies outside every range.
  std::vector<CharRange> rs(ranges.begin() + it.ranges_begin, ranges.begin() + it.ranges_end);
  std::sort(rs.begin(), rs.end(),
            [](const CharRange& a, const CharRange& b) { return a.lo < b.lo; });
  char32_t next = lo;
  for (const auto& r : rs) {
    if (r.hi < next) continue;
    if (r.lo > next) return true;
    if (r.hi >= hi) return false;
    next = r.hi + 1;
  }
  return next <= hi;
}

std::string gbnf_literal(std::string_view s) {
  std::string o = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      o.push_back('\\');
      o.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      o += "\\n";
    } else if (c == '\r') {
      o += "\\r";
    } else if (c == '\t') {
      o += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      o += fmt::format("\\x{:02X}", c);
    } else {
      o.push_back(static_cast<char>(c));
    }
  }
  return o + "\"";
}

std::string choice_to_gbnf(const std::vector<std::string>& choices) {
  if (choices.empty()) fail("guided_choice: the list of choices is empty");
  std::string o = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i) o += " | ";
    o += choices[i].empty() ? "\"\"" : gbnf_literal(choices[i]);
  }
  return o + "\n";
}

}  // namespace atom::grammar
