// DeepSeek-V4.1's index plane on the CPU (kernels/index_plane.h): the keys rotated, quantised
// and stored row by row.
#include "kernels/index_plane.h"

#include <vector>

namespace atom::kernels::cpu {

void index_plane_store(Tensor& plane, Tensor& scales, const Tensor& keys, const Tensor& rows,
                       const Tensor& positions, const Tensor& inv_freq, const IndexStoreArgs& a) {
  index_plane_store_check(plane, scales, keys, rows, positions, inv_freq, a);
  const int64_t n = keys.size(0), D = a.head_dim, R = a.rot_dim;
  const int64_t nrows = plane.size(0) * plane.size(1), width = plane.size(3);
  const bool fp4 = a.format == IndexKeyFormat::kFp4;
  std::vector<float> k(static_cast<size_t>(D));
  for (int64_t e = 0; e < n; ++e) {
    int position = 0;
    const int64_t row =
        index_store_row(rows.ptr<int32_t>(), positions.ptr<int32_t>(), e, a.ratio, &position);
    if (row < 0) continue;
    ATOM_CHECK(row < nrows, "index_plane_store: row {} beyond the plane's {}", row, nrows);
    const float* src = keys.ptr<float>() + e * D;
    std::copy(src, src + D, k.begin());
    float* r = k.data() + (D - R);
    const float pos = static_cast<float>(position);
    for (int64_t i = 0; i < R / 2; ++i) {
      const float ang = pos * inv_freq.ptr<float>()[i];
      const float c = std::cos(ang) * a.attention_factor, s = std::sin(ang) * a.attention_factor;
      const float x0 = r[2 * i], x1 = r[2 * i + 1];
      r[2 * i] = x0 * c - x1 * s;
      r[2 * i + 1] = x1 * c + x0 * s;
    }
    if (fp4)
      index_fp4_store(k.data(), D, plane.ptr<uint8_t>() + row * width,
                      scales.ptr<uint8_t>() + row * (D / 32));
    else
      index_fp8_store(k.data(), D, plane.ptr<uint8_t>() + row * width);
  }
}

}  // namespace atom::kernels::cpu
