#include "reference_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace atom::test {

nlohmann::ordered_json load_reference(const std::string& name) {
  std::string path = std::string(ATOM_CHAT_TEMPLATE_REF_DIR) + "/" + name;
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "missing " << path
                  << ": it is written by the chat_template_reference test (run the tests through "
                     "ctest, or: /usr/bin/python3 tests/chat_template/reference.py . "
                  << ATOM_CHAT_TEMPLATE_REF_DIR << ")";
    return nlohmann::ordered_json::array();
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

std::tm fixed_now() {
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 4;
  tm.tm_hour = 15;
  tm.tm_min = 30;
  tm.tm_sec = 5;
  tm.tm_wday = 5;  // a Friday
  tm.tm_yday = 184;
  tm.tm_isdst = -1;
  return tm;
}

std::string visible(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (c < 0x20 || c == 0x7f)
          out += fmt::format("\\x{:02x}", c);
        else
          out += static_cast<char>(c);
    }
  }
  return out;
}

std::string first_difference(const std::string& expected, const std::string& actual) {
  if (expected == actual) return "";
  size_t i = 0;
  while (i < expected.size() && i < actual.size() && expected[i] == actual[i]) ++i;
  // Back up to a UTF-8 boundary so the excerpts stay readable.
  while (i > 0 && i < expected.size() && (static_cast<unsigned char>(expected[i]) & 0xC0) == 0x80)
    --i;
  size_t line = 1, col = 1;
  for (size_t k = 0; k < i; ++k) {
    if (expected[k] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  size_t from = i > 60 ? i - 60 : 0;
  while (from > 0 && (static_cast<unsigned char>(expected[from]) & 0xC0) == 0x80) --from;
  auto excerpt = [&](const std::string& s) {
    if (from >= s.size()) return std::string("«end»");
    std::string head = s.substr(from, i - std::min(i, from));
    std::string tail = i < s.size() ? s.substr(i, 80) : std::string("«end»");
    return visible(head) + " ⟦HERE⟧ " + visible(tail);
  };
  return fmt::format("first difference at byte {} (line {}, column {}); expected {} bytes, got {}\n"
                     "  jinja2: ...{}\n"
                     "  atom:   ...{}",
                     i, line, col, expected.size(), actual.size(), excerpt(expected),
                     excerpt(actual));
}

}  // namespace atom::test
