#include "server/tool_parser_util.h"

#include <fmt/format.h>

#include <algorithm>

#include "jinja/py_format.h"
#include "jinja/template.h"

namespace atom::server::parse_util {

size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  if (tag.empty()) return 0;
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.compare(s.size() - n, n, tag.substr(0, n)) == 0) return n;
  return 0;
}

size_t partial_tag_suffix(std::string_view s, std::initializer_list<std::string_view> tags) {
  size_t best = 0;
  for (std::string_view t : tags) best = std::max(best, partial_tag_suffix(s, t));
  return best;
}

bool is_partial(std::string_view s, std::string_view tag) {
  return s.size() < tag.size() && tag.compare(0, s.size(), s) == 0;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

Found find_first(std::string_view s, std::initializer_list<std::string_view> tags, size_t from) {
  Found f;
  int i = 0;
  for (std::string_view t : tags) {
    const size_t p = s.find(t, from);
    if (p != std::string::npos && (!f.found() || p < f.pos)) {
      f.pos = p;
      f.size = t.size();
      f.which = i;
    }
    ++i;
  }
  return f;
}

Taken take_before(std::string& held, std::initializer_list<std::string_view> tags) {
  Taken t;
  t.tag = find_first(held, tags);
  const size_t n = t.tag.found() ? t.tag.pos : held.size() - partial_tag_suffix(held, tags);
  t.text = held.substr(0, n);
  held.erase(0, n);
  if (t.tag.found()) t.tag.pos = 0;
  return t;
}

size_t find_resuming(std::string_view s, std::string_view tag, size_t& from) {
  const size_t p = s.find(tag, from);
  if (p == std::string::npos) {
    from = s.size() >= tag.size() ? s.size() - tag.size() + 1 : 0;
    return p;
  }
  from = 0;
  return p;
}

bool move_leading_space(std::string& from, std::string& to) {
  const size_t lead = from.find_first_not_of(kSpace);
  const size_t n = lead == std::string::npos ? from.size() : lead;
  to += from.substr(0, n);
  from.erase(0, n);
  return !from.empty();
}

bool all_space(std::string_view s) { return s.find_first_not_of(kSpace) == std::string::npos; }

std::string trim(std::string_view s) {
  const size_t a = s.find_first_not_of(kSpace);
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(kSpace);
  return std::string(s.substr(a, b - a + 1));
}

int JsonNesting::step(char c) {
  if (in_string) {
    if (escaped) {
      escaped = false;
    } else if (c == '\\') {
      escaped = true;
    } else if (c == '"') {
      in_string = false;
    }
  } else if (c == '"') {
    in_string = true;
  } else if (c == '{' || c == '[') {
    ++depth;
    return 1;
  } else if (c == '}' || c == ']') {
    --depth;
    return -1;
  }
  return 0;
}

size_t json_scan_value(std::string_view text, JsonScan& scan) {
  for (; scan.pos < text.size(); ++scan.pos)
    if (scan.nesting.step(text[scan.pos]) < 0 && scan.nesting.depth == 0) return ++scan.pos;
  return std::string::npos;
}

std::string py_json_dumps(const nlohmann::ordered_json& value, bool ensure_ascii) {
  jinja::JsonOptions py;
  py.ensure_ascii = ensure_ascii;
  try {
    return jinja::json_dumps(jinja::value_from_json(value), py);
  } catch (const std::exception&) {
    // What Python writes but atom's values cannot hold (integers beyond 64 bits): nlohmann's
    // own text, still JSON. Model output must never make this throw.
    return value.dump(-1, ' ', ensure_ascii, nlohmann::ordered_json::error_handler_t::replace);
  }
}

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += ch;  // bytes of UTF-8 characters pass through, as ensure_ascii=False writes them
        }
    }
  }
  return out;
}

nlohmann::ordered_json json_loads(std::string_view text) {
  // Values nested deeper than this are refused before parsing: writing them back (recursively)
  // could exhaust the stack, and no tool's arguments nest so deep.
  constexpr int kMaxDepth = 512;
  JsonNesting nesting;
  for (const char c : text)
    if (nesting.step(c) > 0 && nesting.depth > kMaxDepth)
      return nlohmann::ordered_json(nlohmann::ordered_json::value_t::discarded);
  return nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr,
                                       /*allow_exceptions=*/false);
}

}  // namespace atom::server::parse_util
