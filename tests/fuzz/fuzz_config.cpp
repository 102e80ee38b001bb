// libFuzzer harness: config.json and generation_config.json as the loader parses them. Text that
// is not JSON is not the parser's business; any JSON must parse or be an atom::Error.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    atom::model_config_parse(j, "config.json");
  } catch (const atom::Error&) {
  }
  try {
    atom::generation_config_parse(j, "generation_config.json");
  } catch (const atom::Error&) {
  }
  return 0;
}
