// libFuzzer harness: untrusted image bytes (PNG, JPEG) through probe_image and decode_image, and
// what decodes through the Kimi-K2.5 processor with a small patch budget. Bad input must be an
// atom::Error.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.h"
#include "vision/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> bytes(data, size);
  try {
    atom::vision::probe_image(bytes);
  } catch (const atom::Error&) {
  }
  try {
    atom::vision::RgbImage im = atom::vision::decode_image(bytes);
    atom::vision::ProcessorParams p;
    p.in_patch_limit = 64;
    atom::vision::preprocess_image(im, p);
  } catch (const atom::Error&) {
  }
  return 0;
}
