// The images of a vision reference (tests/fixtures/references/NAME.safetensors, written by
// tools/moonvit_reference.py or tools/make_vision_fixture.py): pixel_values [P, 3, p, p] and
// grid_thw [I, 3], the images' patches one after the other.
#pragma once

#include <string>
#include <vector>

#include "common/fixtures.h"
#include "vision/image.h"

namespace atom::test {

struct ReferenceImages {
  Tensor pixel_values;                   // all images' patches, an owned copy
  std::vector<vision::ImageGrid> grids;  // one per image
  // Image i's patches (a view of pixel_values).
  Tensor patches(size_t i) const {
    int64_t row = 0;
    for (size_t j = 0; j < i; ++j) row += grids[j].num_patches();
    return pixel_values.narrow(0, row, grids[i].num_patches());
  }
};

inline ReferenceImages reference_images(const SafetensorsFile& f) {
  ReferenceImages r;
  r.pixel_values = f.tensor("pixel_values").clone();
  const Tensor g = f.tensor("grid_thw").clone();
  for (int64_t i = 0; i < g.size(0); ++i)
    r.grids.push_back(
        {g.ptr<int64_t>()[i * 3], g.ptr<int64_t>()[i * 3 + 1], g.ptr<int64_t>()[i * 3 + 2]});
  return r;
}

inline ReferenceImages reference_images(const std::string& name) {
  return reference_images(SafetensorsFile(
      source_dir() + "/tests/fixtures/references/" + name + ".safetensors", /*use_mmap=*/true));
}

}  // namespace atom::test
