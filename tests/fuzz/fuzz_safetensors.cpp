// libFuzzer harness: a safetensors file's header (the 8-byte length, the JSON, dtypes, shapes,
// offsets) as safetensors_parse_header validates it. Bad input must be an atom::Error.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "loader/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    atom::safetensors_parse_header("fuzz.safetensors", data, size, size);
  } catch (const atom::Error&) {
  }
  return 0;
}
