// Helpers shared by the tokenizer tests: reading the reference outputs and printing ids.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace atom::tokenizer::test {

// OUT_DIR/<name>.json written by tests/node/tokenizer_reference.js; fails the test when missing.
nlohmann::json load_reference(const std::string& name);
std::string model_dir(const std::string& model);
std::string ids_str(const std::vector<int32_t>& ids);
// Printable form of a test string for failure messages (escapes controls, cuts long text).
std::string show(const std::string& s);
std::string hex_bytes(const std::string& hex);
std::vector<int32_t> json_ids(const nlohmann::json& j);

}  // namespace atom::tokenizer::test
