// JSON Schema and regular expressions to GBNF (grammar.h).
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "grammar/grammar.h"
#include "tokenizer/utf8.h"

namespace atom::grammar {

namespace {

using ojson = nlohmann::ordered_json;

// The JSON primitives every schema grammar shares. Whitespace is at most one space after ':' and
// ',' (so a sampled output cannot stall in whitespace); numbers have bounded digits.
constexpr const char* kJsonPrimitives = R"(ws ::= " "?
value ::= object | array | string | number | boolean | null
object ::= "{" ( string ":" ws value ( "," ws string ":" ws value )* )? "}"
array ::= "[" ( value ( "," ws value )* )? "]"
string ::= "\"" char* "\""
char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
number ::= integer ( "." [0-9]{1,15} )? ( [eE] [-+]? [0-9]{1,3} )?
boolean ::= "true" | "false"
null ::= "null"
)";

class SchemaConverter {
 public:
  // prefix: put before every rule name this converter makes, its root included (schemas that
  // share one grammar, as a structural tag's do).
  SchemaConverter(const ojson& root, const GrammarLimits& limits, std::string prefix = "")
      : root_(root), limits_(limits), prefix_(std::move(prefix)) {}

  std::string convert(bool with_primitives = true) {
    const std::string r = visit(root_, "root", 0);
    std::string out = prefix_ + "root ::= " + r + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    if (with_primitives) out += kJsonPrimitives;
    return out;
  }

 private:
  [[noreturn]] void unsupported(const std::string& what) const {
    fail("json_schema: {} is not supported", what);
  }

  std::string add_rule(const std::string& hint, const std::string& body) {
    std::string name;
    for (char c : hint)
      name.push_back((std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '-');
    if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) name = "r-" + name;
    name = prefix_ + name;
    std::string n = name;
    for (int k = 1; rules_.count(n) || reserved(n.substr(prefix_.size())); ++k)
      n = name + "-" + std::to_string(k);
    rules_[n] = body;
    return n;
  }
  static bool reserved(const std::string& n) {
    static const std::set<std::string> kNames = {"root",   "ws",      "value", "object",
                                                 "array",  "string",  "char",  "integer",
                                                 "number", "boolean", "null"};
    return kNames.count(n) > 0;
  }

  static std::string literal_json(const ojson& v) { return gbnf_literal(v.dump()); }

  std::string visit(const ojson& s, const std::string& name, int depth) {
    if (depth > limits_.max_nesting)
      fail("json_schema: nests deeper than {} (the nesting limit)", limits_.max_nesting);
    if (s.is_boolean()) {
      if (s.get<bool>()) return "value";
      unsupported("the schema 'false' (nothing matches it)");
    }
    if (!s.is_object())
      fail("json_schema: a schema must be an object or a boolean, got {}", s.dump());
    if (s.contains("$ref")) return ref(s.at("$ref"), depth);
    if (s.contains("const")) return literal_json(s.at("const"));
    if (s.contains("enum")) {
      const ojson& e = s.at("enum");
      if (!e.is_array() || e.empty()) fail("json_schema: 'enum' must be a non-empty array");
      std::string body;
      for (size_t i = 0; i < e.size(); ++i) body += (i ? " | " : "") + literal_json(e[i]);
      return "(" + body + ")";
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      const ojson& alts = s.at(k);
      if (!alts.is_array() || alts.empty()) fail("json_schema: '{}' must be a non-empty array", k);
      std::string body;
      for (size_t i = 0; i < alts.size(); ++i)
        body += (i ? " | " : "") + visit(alts[i], name + "-" + std::to_string(i), depth + 1);
      return "(" + body + ")";
    }
    if (s.contains("allOf")) {
      const ojson& all = s.at("allOf");
      if (!all.is_array() || all.size() != 1) unsupported("'allOf' with other than one schema");
      return visit(all[0], name, depth + 1);
    }
    for (const char* k : {"not", "if", "dependentSchemas", "patternProperties", "propertyNames"})
      if (s.contains(k)) unsupported(fmt::format("the keyword '{}'", k));
    if (s.contains("type")) {
      const ojson& t = s.at("type");
      if (t.is_array()) {
        if (t.empty()) fail("json_schema: 'type' is an empty array");
        std::string body;
        for (size_t i = 0; i < t.size(); ++i) {
          ojson one = s;
          one["type"] = t[i];
          body += (i ? " | " : "") + visit(one, name, depth + 1);
        }
        return "(" + body + ")";
      }
      if (!t.is_string()) fail("json_schema: 'type' must be a string or an array of strings");
      const std::string ty = t.get<std::string>();
      if (ty == "object") return object(s, name, depth);
      if (ty == "array") return array(s, name, depth);
      if (ty == "string") return string(s, name);
      if (ty == "integer") return "integer";
      if (ty == "number") return "number";
      if (ty == "boolean") return "boolean";
      if (ty == "null") return "null";
      fail("json_schema: unknown type '{}'", ty);
    }
    if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required"))
      return object(s, name, depth);
    if (s.contains("items") || s.contains("prefixItems")) return array(s, name, depth);
    return "value";
  }

  // A count keyword (minItems, maxLength, ...): a non-negative integer within the repeat limit,
  // or `dflt` when absent.
  int64_t repeat_count(const ojson& s, const char* k, int64_t dflt) const {
    if (!s.contains(k)) return dflt;
    const ojson& v = s.at(k);
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      fail("json_schema: '{}' must be a non-negative integer", k);
    if (v.get<int64_t>() > limits_.max_repeat)
      fail("json_schema: '{}' {} exceeds {} (the repeat limit)", k, v.get<int64_t>(),
           limits_.max_repeat);
    return v.get<int64_t>();
  }

  std::string ref(const ojson& r, int depth) {
    if (!r.is_string()) fail("json_schema: '$ref' must be a string");
    const std::string path = r.get<std::string>();
    auto it = refs_.find(path);
    if (it != refs_.end()) return it->second;
    const ojson* target = nullptr;
    if (path == "#") {
      target = &root_;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        if (path.rfind(p, 0) != 0) continue;
        const std::string key = p.substr(2, p.size() - 3);
        const std::string name = path.substr(p.size());
        if (root_.contains(key) && root_.at(key).contains(name)) target = &root_.at(key).at(name);
      }
    }
    if (!target) fail("json_schema: '$ref' {} does not name a definition of this schema", path);
    // Named before it is visited, so a recursive definition refers to itself.
    const std::string rule = add_rule("def-" + path.substr(path.rfind('/') + 1), "");
    refs_[path] = rule;
    rules_[rule] = visit(*target, rule, depth + 1);
    return rule;
  }

  std::string object(const ojson& s, const std::string& name, int depth) {
    std::vector<std::pair<std::string, std::string>> props;  // key literal ":" ws value, required?
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s.at("required").is_array()) fail("json_schema: 'required' must be an array");
      for (const auto& r : s.at("required")) required.insert(r.get<std::string>());
    }
    std::vector<std::string> req_kv, opt_kv;
    if (s.contains("properties")) {
      if (!s.at("properties").is_object()) fail("json_schema: 'properties' must be an object");
      for (const auto& [k, v] : s.at("properties").items()) {
        const std::string kv =
            gbnf_literal(ojson(k).dump()) + " \":\" ws " + visit(v, name + "-" + k, depth + 1);
        (required.count(k) ? req_kv : opt_kv).push_back(kv);
      }
    }
    for (const auto& r : required) {
      bool found = s.contains("properties") && s.at("properties").contains(r);
      if (!found) fail("json_schema: required property '{}' is not in 'properties'", r);
    }
    // Extra keys: a schema or true allows them; absent with properties given forbids them (what
    // OpenAI's strict mode and most grammar engines do), absent without properties allows any.
    std::string extra;
    if (s.contains("additionalProperties")) {
      const ojson& a = s.at("additionalProperties");
      if (!(a.is_boolean() && !a.get<bool>()))
        extra = "string \":\" ws " + visit(a, name + "-additional", depth + 1);
    } else if (!s.contains("properties")) {
      extra = "string \":\" ws value";
    }
    std::vector<std::string> optional = opt_kv;
    if (!extra.empty()) optional.push_back("");  // the marker for the extra keys, last
    auto opt_item = [&](size_t i) { return optional[i].empty() ? extra : optional[i]; };
    auto opt_tail = [&](size_t i) {
      // ( "," ws kv )? for an optional property; ( "," ws extra )* for the extras.
      return optional[i].empty() ? "( \",\" ws " + extra + " )*"
                                 : "( \",\" ws " + optional[i] + " )?";
    };
    std::string body = "\"{\" ";
    if (!req_kv.empty()) {
      for (size_t i = 0; i < req_kv.size(); ++i) body += (i ? "\",\" ws " : "") + req_kv[i] + " ";
      for (size_t i = 0; i < optional.size(); ++i) body += opt_tail(i) + " ";
    } else if (!optional.empty()) {
      // The first property present has no comma: one alternative per choice of the first.
      std::string alts;
      for (size_t i = 0; i < optional.size(); ++i) {
        std::string a = opt_item(i) + " ";
        if (optional[i].empty()) a += "( \",\" ws " + extra + " )* ";
        for (size_t j = i + 1; j < optional.size(); ++j) a += opt_tail(j) + " ";
        alts += (i ? " | " : "") + a;
      }
      body += "( " + alts + " )? ";
    }
    body += "\"}\"";
    return add_rule(name, body);
  }

  std::string array(const ojson& s, const std::string& name, int depth) {
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      if (!s.at("prefixItems").is_array()) fail("json_schema: 'prefixItems' must be an array");
      for (size_t i = 0; i < s.at("prefixItems").size(); ++i)
        prefix.push_back(visit(s.at("prefixItems")[i], name + "-" + std::to_string(i), depth + 1));
    }
    std::string item = "value";
    bool more = true;
    if (s.contains("items")) {
      const ojson& it = s.at("items");
      if (it.is_boolean() && !it.get<bool>())
        more = false;
      else
        item = visit(it, name + "-item", depth + 1);
    }
    const int64_t lo = repeat_count(s, "minItems", 0), hi = repeat_count(s, "maxItems", -1);
    if (hi >= 0 && hi < lo) fail("json_schema: maxItems {} is below minItems {}", hi, lo);
    std::string body = "\"[\" ";
    if (!prefix.empty()) {
      // The prefix items in order (a shorter array is allowed unless minItems says otherwise).
      const auto n = static_cast<int64_t>(prefix.size());
      std::string tail;
      if (more && (hi < 0 || hi > n)) {
        const int64_t extra_lo = std::max<int64_t>(0, lo - n);
        tail = hi < 0 ? fmt::format(" ( \",\" ws {} ){{{},}}", item, extra_lo)
                      : fmt::format(" ( \",\" ws {} ){{{},{}}}", item, extra_lo, hi - n);
      }
      std::string seq;
      for (int64_t i = n - 1; i >= 0; --i) {
        const std::string me = (i ? "\",\" ws " : "") + prefix[static_cast<size_t>(i)];
        seq = i + 1 >= lo
                  ? "( " + me + (seq.empty() ? tail : " " + seq) + " )" + (i >= lo ? "?" : "")
                  : me + (seq.empty() ? tail : " " + seq);
      }
      body += seq + " ";
    } else if (more) {
      if (lo == 0) {
        body += hi == 0  ? ""
                : hi < 0 ? fmt::format("( {} ( \",\" ws {} )* )? ", item, item)
                         : fmt::format("( {} ( \",\" ws {} ){{0,{}}} )? ", item, item, hi - 1);
      } else {
        body += hi < 0 ? fmt::format("{} ( \",\" ws {} ){{{},}} ", item, item, lo - 1)
                       : fmt::format("{} ( \",\" ws {} ){{{},{}}} ", item, item, lo - 1, hi - 1);
      }
    }
    body += "\"]\"";
    return add_rule(name, body);
  }

  std::string string(const ojson& s, const std::string& name) {
    if (s.contains("pattern")) {
      std::string p = s.at("pattern").get<std::string>();
      return add_rule(name, "\"\\\"\" " + regex_body(p) + " \"\\\"\"");
    }
    if (s.contains("format")) {
      const std::string f = s.at("format").get<std::string>();
      // Formats as validators check them: real month lengths (February without its 29th, which
      // depends on the year), hours and offsets in range, octets up to 255, labels that do not
      // start or end with '-'.
      static const std::string kDay28 = R"(( "0" [1-9] | "1" [0-9] | "2" [0-8] ))";
      static const std::string kDate = R"([0-9]{4} "-" ( "02-" )" + kDay28 +
                                       R"( | ( "0" [469] | "11" ) "-" ( )" + kDay28 +
                                       R"( | "29" | "30" ) | ( "0" [13578] | "1" [02] ) "-" ( )" +
                                       kDay28 + R"( | "29" | "30" | "31" ) ))";
      static const std::string kTime =
          R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))";
      static const std::string kLabel = R"(( [a-zA-Z0-9] ( [a-zA-Z0-9-]{0,20} [a-zA-Z0-9] )? ))";
      static const std::string kOctet =
          R"(( "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9]? [0-9] ))";
      static const std::map<std::string, std::string> kFormats = {
          {"date", kDate},
          {"time", kTime},
          {"uuid",
           R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})"},
          {"email", R"([a-zA-Z0-9_%+-] [a-zA-Z0-9._%+-]{0,30} "@" )" + kLabel + R"( ( "." )" +
                        kLabel + R"( ){1,3})"},
          {"ipv4", kOctet + R"( "." )" + kOctet + R"( "." )" + kOctet + R"( "." )" + kOctet},
      };
      if (f == "date-time")
        return add_rule(name, "\"\\\"\" " + kFormats.at("date") + " \"T\" " + kFormats.at("time") +
                                  " \"\\\"\"");
      auto it = kFormats.find(f);
      if (it != kFormats.end()) return add_rule(name, "\"\\\"\" " + it->second + " \"\\\"\"");
      // Other formats (uri, hostname, ...) are plain strings, as annotations are by default.
    }
    const bool has_lo = s.contains("minLength"), has_hi = s.contains("maxLength");
    if (!has_lo && !has_hi) return "string";
    const int64_t lo = repeat_count(s, "minLength", 0), hi = repeat_count(s, "maxLength", -1);
    if (has_hi && hi < lo) fail("json_schema: maxLength is below minLength");
    const std::string rep = has_hi ? fmt::format("{{{},{}}}", lo, hi) : fmt::format("{{{},}}", lo);
    return add_rule(name, "\"\\\"\" char" + rep + " \"\\\"\"");
  }

  // A JSON string's content matching the pattern: the regex's GBNF, restricted to characters a
  // JSON string may hold unescaped (an escaped quote or backslash in the pattern is refused).
  std::string regex_body(std::string p) {
    if (!p.empty() && p.front() == '^') p.erase(0, 1);
    if (!p.empty() && p.back() == '$' && (p.size() < 2 || p[p.size() - 2] != '\\')) p.pop_back();
    const std::string g = regex_to_gbnf(p, limits_);
    // regex_to_gbnf writes "root ::= X\n" plus helper rules; splice X in as a rule of ours.
    const size_t eq = g.find("::= ");
    const size_t nl = g.find('\n');
    ATOM_CHECK(eq != std::string::npos && nl != std::string::npos, "regex grammar shape");
    return "(" + g.substr(eq + 4, nl - eq - 4) + ")";
  }

  const ojson& root_;
  const GrammarLimits& limits_;
  std::string prefix_;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> refs_;
};

// --- regular expressions ---

class RegexConverter {
 public:
  RegexConverter(std::string_view p, const GrammarLimits& limits) : s_(p), limits_(limits) {}
  std::string convert() {
    std::string r = alternatives(0);
    if (i_ != s_.size()) error("an unmatched ')'");
    return "root ::= " + (r.empty() ? std::string("\"\"") : r) + "\n";
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail("regex: {} at offset {} of '{}'", what, i_, std::string(s_.substr(0, 200)));
  }

  std::string alternatives(int depth) {
    if (depth > limits_.max_nesting)
      fail("regex: groups nest deeper than {} (the nesting limit)", limits_.max_nesting);
    std::vector<std::string> alts = {sequence(depth)};
    while (i_ < s_.size() && s_[i_] == '|') {
      ++i_;
      alts.push_back(sequence(depth));
    }
    if (alts.size() == 1) return alts[0];
    std::string o = "(";
    for (size_t k = 0; k < alts.size(); ++k)
      o += (k ? " | " : " ") + (alts[k].empty() ? std::string("\"\"") : alts[k]);
    return o + " )";
  }

  std::string sequence(int depth) {
    std::string o;
    while (i_ < s_.size() && s_[i_] != '|' && s_[i_] != ')') {
      std::string a = atom(depth);
      if (a.empty()) continue;
      a += quantifier();
      o += (o.empty() ? "" : " ") + a;
    }
    return o;
  }

  std::string quantifier() {
    if (i_ >= s_.size()) return "";
    std::string q;
    const char c = s_[i_];
    if (c == '*' || c == '+' || c == '?') {
      q = std::string(1, c);
      ++i_;
    } else if (c == '{') {
      const size_t close = s_.find('}', i_);
      if (close == std::string_view::npos) return "";
      q = std::string(s_.substr(i_, close - i_ + 1));
      for (char d : q.substr(1, q.size() - 2))
        if (!std::isdigit(static_cast<unsigned char>(d)) && d != ',') error("a repetition {m,n}");
      i_ = close + 1;
    } else {
      return "";
    }
    if (i_ < s_.size() && s_[i_] == '?') ++i_;  // lazy: the same language
    if (i_ < s_.size() && (s_[i_] == '*' || s_[i_] == '+'))
      error("a possessive or repeated quantifier");
    return q;
  }

  static std::string class_char(char32_t c) {
    if (c == ']' || c == '\\' || c == '^' || c == '-' || c == '[')
      return std::string("\\") + static_cast<char>(c);
    if (c == '\n') return "\\n";
    if (c == '\t') return "\\t";
    if (c == '\r') return "\\r";
    if (c < 0x20) return fmt::format("\\x{:02X}", static_cast<unsigned>(c));
    std::string o;
    tokenizer::utf8_append(o, c);
    return o;
  }

  char32_t next_char() {
    if (tokenizer::utf8_valid_seq(s_, i_) == 0) error("valid UTF-8");
    return tokenizer::utf8_next(s_, i_);
  }

  // An escape's class body (without brackets) for \d \w \s, or empty.
  static std::string shorthand(char e) {
    switch (e) {
      case 'd':
      case 'D':
        return "0-9";
      case 'w':
      case 'W':
        return "a-zA-Z0-9_";
      case 's':
      case 'S':
        return " \\t\\n\\r\\x0B\\x0C";
      default:
        return "";
    }
  }

  char32_t escaped_char(char e) {
    switch (e) {
      case 'n':
        return '\n';
      case 't':
        return '\t';
      case 'r':
        return '\r';
      case 'f':
        return '\f';
      case 'v':
        return '\v';
      case '0':
        return 0;
      case 'x': {
        if (i_ + 2 > s_.size()) error("two hex digits");
        const auto v = std::stoul(std::string(s_.substr(i_, 2)), nullptr, 16);
        i_ += 2;
        return static_cast<char32_t>(v);
      }
      case 'u': {
        if (i_ + 4 > s_.size()) error("four hex digits");
        const auto v = std::stoul(std::string(s_.substr(i_, 4)), nullptr, 16);
        i_ += 4;
        return static_cast<char32_t>(v);
      }
      default:
        if (std::isdigit(static_cast<unsigned char>(e))) error("a backreference (not supported)");
        if (e == 'b' || e == 'B') error("a word boundary (not supported)");
        return static_cast<unsigned char>(e);
    }
  }

  std::string atom(int depth) {
    const char c = s_[i_];
    if (c == '(') {
      ++i_;
      if (s_.substr(i_, 2) == "?:") {
        i_ += 2;
      } else if (i_ < s_.size() && s_[i_] == '?') {
        error("a lookaround or named group (not supported)");
      }
      std::string inner = alternatives(depth + 1);
      if (i_ >= s_.size() || s_[i_] != ')') error("')'");
      ++i_;
      return "(" + (inner.empty() ? std::string("\"\"") : " " + inner) + " )";
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++i_;
      return "[^\\n]";
    }
    if (c == '^' || c == '$') {
      ++i_;
      if ((c == '^' && i_ != 1) || (c == '$' && i_ != s_.size()))
        error("an anchor inside the pattern (not supported)");
      return "";
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') error("a quantifier with nothing before it");
    if (c == '\\') {
      ++i_;
      if (i_ >= s_.size()) error("an escape");
      const char e = s_[i_++];
      const std::string sh = shorthand(e);
      if (!sh.empty())
        return std::string(std::isupper(static_cast<unsigned char>(e)) ? "[^" : "[") + sh + "]";
      std::string lit;
      tokenizer::utf8_append(lit, escaped_char(e));
      return gbnf_literal(lit);
    }
    std::string lit;
    tokenizer::utf8_append(lit, next_char());
    return gbnf_literal(lit);
  }

  std::string char_class() {
    ++i_;  // '['
    std::string o = "[";
    if (i_ < s_.size() && s_[i_] == '^') {
      o += "^";
      ++i_;
    }
    bool first = true;
    while (i_ < s_.size() && (s_[i_] != ']' || first)) {
      first = false;
      char32_t lo;
      if (s_[i_] == '\\') {
        ++i_;
        if (i_ >= s_.size()) error("an escape");
        const char e = s_[i_++];
        const std::string sh = shorthand(e);
        if (!sh.empty()) {
          if (std::isupper(static_cast<unsigned char>(e)))
            error("a negated shorthand inside a class (not supported)");
          o += sh;
          continue;
        }
        lo = e == 'b' ? U'\b' : escaped_char(e);
      } else {
        lo = next_char();
      }
      o += class_char(lo);
      if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
        ++i_;
        char32_t hi;
        if (s_[i_] == '\\') {
          ++i_;
          if (i_ >= s_.size()) error("an escape");
          hi = escaped_char(s_[i_++]);
        } else {
          hi = next_char();
        }
        if (hi < lo) error("a range whose end is below its start");
        o += "-" + class_char(hi);
      }
    }
    if (i_ >= s_.size()) error("the closing ']'");
    ++i_;
    return o + "]";
  }

  std::string_view s_;
  size_t i_ = 0;
  const GrammarLimits& limits_;
};

}  // namespace

std::string json_schema_to_gbnf(const std::string& schema_json, const GrammarLimits& limits) {
  if (schema_json.size() > limits.max_text_bytes)
    fail("json_schema: {} bytes is longer than {} (the grammar size limit)", schema_json.size(),
         limits.max_text_bytes);
  ojson schema;
  try {
    schema = ojson::parse(schema_json);
  } catch (const std::exception& e) {
    fail("json_schema: not valid JSON: {}", e.what());
  }
  return SchemaConverter(schema, limits).convert();
}

namespace {

std::vector<char32_t> code_points(const std::string& s, const std::string& what) {
  if (!tokenizer::utf8_is_valid(s)) fail("structural_tag: {} is not valid UTF-8", what);
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) out.push_back(tokenizer::utf8_next(s, i));
  return out;
}

std::string utf8_of(const std::vector<char32_t>& cps) {
  std::string s;
  for (char32_t c : cps) tokenizer::utf8_append(s, c);
  return s;
}

bool ends_with(const std::vector<char32_t>& s, const std::vector<char32_t>& t) {
  return t.size() <= s.size() &&
         std::equal(t.begin(), t.end(), s.end() - static_cast<ptrdiff_t>(t.size()));
}

}  // namespace

std::string structural_tag_to_gbnf(const std::string& spec_json, const GrammarLimits& limits) {
  if (spec_json.size() > limits.max_text_bytes)
    fail("structural_tag: {} bytes is longer than {} (the grammar size limit)", spec_json.size(),
         limits.max_text_bytes);
  ojson spec;
  try {
    spec = ojson::parse(spec_json);
  } catch (const std::exception& e) {
    fail("structural_tag: not valid JSON: {}", e.what());
  }
  if (!spec.is_object()) fail("structural_tag: must be an object");
  if (spec.contains("format"))
    fail("structural_tag: the 'format' form is not supported (the 'structures' and 'triggers' form "
         "is)");
  if (!spec.contains("structures") || !spec["structures"].is_array() || spec["structures"].empty())
    fail("structural_tag: 'structures' must be a non-empty list");
  if (!spec.contains("triggers") || !spec["triggers"].is_array() || spec["triggers"].empty())
    fail("structural_tag: 'triggers' must be a non-empty list");
  struct Structure {
    std::string begin, end, rule;
  };
  std::vector<Structure> structures;
  std::string rules;
  for (size_t i = 0; i < spec["structures"].size(); ++i) {
    const ojson& st = spec["structures"][i];
    const std::string where = fmt::format("structures[{}]", i);
    if (!st.is_object()) fail("structural_tag: {} must be an object", where);
    for (const char* key : {"begin", "end"})
      if (!st.contains(key) || !st[key].is_string())
        fail("structural_tag: {} needs a string '{}'", where, key);
    const ojson schema = st.contains("schema") ? st["schema"] : ojson::object();
    const std::string prefix = fmt::format("tag{}-", i);
    rules += SchemaConverter(schema, limits, prefix).convert(false);
    structures.push_back(
        {st["begin"].get<std::string>(), st["end"].get<std::string>(), prefix + "root"});
    if (structures.back().begin.empty()) fail("structural_tag: {}.begin is empty", where);
  }
  std::vector<std::vector<char32_t>> triggers;
  for (size_t i = 0; i < spec["triggers"].size(); ++i) {
    const ojson& t = spec["triggers"][i];
    if (!t.is_string() || t.get<std::string>().empty())
      fail("structural_tag: triggers[{}] must be a non-empty string", i);
    triggers.push_back(code_points(t.get<std::string>(), fmt::format("triggers[{}]", i)));
  }
  for (size_t i = 0; i < structures.size(); ++i) {
    bool found = false;
    for (const auto& t : triggers) found |= structures[i].begin.starts_with(utf8_of(t));
    if (!found)
      fail("structural_tag: structures[{}].begin '{}' starts with none of the triggers", i,
           structures[i].begin);
  }
  // Free text is text that holds no trigger: a state per proper prefix of a trigger (the longest
  // suffix of the text that is one). Completing a trigger enters a structure whose begin starts
  // with it: the rest of its begin, its schema's JSON, its end, then free text again.
  std::vector<std::vector<char32_t>> states = {{}};
  auto state_of = [&](const std::vector<char32_t>& p) -> int {
    for (size_t k = 0; k < states.size(); ++k)
      if (states[k] == p) return static_cast<int>(k);
    return -1;
  };
  for (const auto& t : triggers)
    for (size_t n = 1; n < t.size(); ++n) {
      std::vector<char32_t> p(t.begin(), t.begin() + static_cast<ptrdiff_t>(n));
      if (state_of(p) < 0) states.push_back(p);
    }
  std::set<char32_t> alphabet;
  for (const auto& t : triggers) alphabet.insert(t.begin(), t.end());
  auto klass = [](char32_t c) {
    return c < 0x80 && std::isalnum(static_cast<int>(c))
               ? std::string(1, static_cast<char>(c))
               : fmt::format("\\u{:04X}", static_cast<uint32_t>(c));
  };
  std::string free_rules;
  for (size_t q = 0; q < states.size(); ++q) {
    std::string others = "[^";
    for (char32_t c : alphabet) {
      if (c > 0xFFFF) fail("structural_tag: triggers may not hold characters beyond U+FFFF");
      others += klass(c);
    }
    others += "]";
    std::string body = "\"\" | " + others + " free-0";
    for (char32_t c : alphabet) {
      std::vector<char32_t> s = states[q];
      s.push_back(c);
      const std::vector<char32_t>* done = nullptr;
      for (const auto& t : triggers)
        if (ends_with(s, t) && (!done || t.size() > done->size())) done = &t;
      const std::string lit = gbnf_literal(utf8_of({c}));
      if (done) {
        // The text ends with trigger `done`: one of the structures it begins follows.
        const std::string trig = utf8_of(*done);
        std::string alts;
        for (const auto& st : structures) {
          if (!st.begin.starts_with(trig)) continue;
          const std::string rest = st.begin.substr(trig.size());
          if (!alts.empty()) alts += " | ";
          alts += (rest.empty() ? std::string() : gbnf_literal(rest) + " ") + st.rule + " " +
                  gbnf_literal(st.end) + " free-0";
        }
        if (alts.empty()) fail("structural_tag: trigger '{}' begins none of the structures", trig);
        body += " | " + lit + " ( " + alts + " )";
      } else {
        int next = -1;
        for (size_t k = 0; k <= s.size() && next < 0; ++k)
          next = state_of(std::vector<char32_t>(s.begin() + static_cast<ptrdiff_t>(k), s.end()));
        body += " | " + lit + " free-" + std::to_string(next);
      }
    }
    free_rules += fmt::format("free-{} ::= {}\n", q, body);
  }
  return "root ::= free-0\n" + free_rules + rules + kJsonPrimitives;
}

std::string json_object_gbnf() { return std::string("root ::= object\n") + kJsonPrimitives; }

std::string regex_to_gbnf(std::string_view pattern, const GrammarLimits& limits) {
  if (pattern.size() > limits.max_text_bytes)
    fail("regex: {} bytes is longer than {} (the grammar size limit)", pattern.size(),
         limits.max_text_bytes);
  return RegexConverter(pattern, limits).convert();
}

}  // namespace atom::grammar
