// DeepSeek-V4.1's index plane (index_cache_dtype), as ROCm/ATOM's writer and scorers define it:
//   fp8: a row of D e4m3 codes and one F32 scale (4 bytes, native order) per key: the row is the
//        quantisation block, s = 2^ceil(log2(max(amax, 1e-4) / 448)) (ue8m0), codes =
//        e4m3(clamp(k / s, ±448)), nearest even. D + 4 bytes a row.
//   fp4: two planes, the values (D / 2 bytes a row, two E2M1 codes a byte, the low nibble the even
//        element) and the scales (D / 32 E8M0 bytes a row): a scale per 32 elements,
//        s = 2^ceil(log2(amax / 6)) (amax floored at 6 * 2^-126), codes = e2m1(k / s), nearest
//        even. D must be a multiple of 32.
// The scorer reads the keys back as codes times scales, and rounds the query first: fp8, e4m3
// with one F32 scale per (token, head) row, s = amax / 448 (not a power of two); fp4, the keys'
// arithmetic. The row functions are the same code on the host and the device (ATOM_HD), so the
// CPU and CUDA planes hold the same bytes.
//
// index_plane_store writes new keys [n, D] F32 into a plane U8 [num_pages, rows_per_page, 1,
// D + 4] (fp8) or [.., D / 2] with scales U8 [.., D / 32] (fp4). Key e sits at slot rows[e] (a
// flat index, page * rows_per_page + row; -1: none) and position positions[e]; with
// IndexStoreArgs::ratio r it is stored when it completes a window of r ((position + 1) % r == 0),
// into row slot / r, rotated (RoPE on interleaved pairs of its last rot_dim channels, times
// attention_factor; inv_freq [rot_dim / 2] F32) at the window's first position. r = 1 stores
// every key at its own row and position; a step's tokens with the batch's slot_mapping and
// positions and r the plane's tokens a row (pages a multiple of r) store each window a step
// completes.
#pragma once

#include <cstdint>

#include "kernels/dispatch.h"
#include "kernels/index_plane_rows.h"

namespace atom::kernels {

enum class IndexKeyFormat : int { kPlain = 0, kFp8 = 1, kFp4 = 2 };

struct IndexStoreArgs {
  IndexKeyFormat format = IndexKeyFormat::kFp8;  // kFp8 or kFp4
  int head_dim = 0;                              // D
  int rot_dim = 0;
  float attention_factor = 1.0f;
  int ratio = 1;  // positions a row (index_store_row)
};

// The checks of every backend.
inline void index_plane_store_check(const Tensor& plane, const Tensor& scales, const Tensor& keys,
                                    const Tensor& rows, const Tensor& positions,
                                    const Tensor& inv_freq, const IndexStoreArgs& a) {
  const int64_t D = a.head_dim;
  const bool fp4 = a.format == IndexKeyFormat::kFp4;
  ATOM_CHECK(a.format != IndexKeyFormat::kPlain && D > 0 && (!fp4 || D % 32 == 0) &&
                 a.rot_dim >= 0 && a.rot_dim <= D && a.rot_dim % 2 == 0 && a.ratio >= 1,
             "index_plane_store: keys of {} ({}) with RoPE over {}, rows of {}", D,
             fp4 ? "fp4" : "fp8", a.rot_dim, a.ratio);
  const int64_t width = fp4 ? D / 2 : index_fp8_row_bytes(D);
  ATOM_CHECK(plane.dtype() == DType::kU8 && plane.is_contiguous() && plane.dim() == 4 &&
                 plane.size(2) == 1 && plane.size(3) == width,
             "index_plane_store: plane {} must be U8 [pages, rows, 1, {}]", plane.str(), width);
  if (fp4)
    ATOM_CHECK(scales.defined() && scales.dtype() == DType::kU8 && scales.is_contiguous() &&
                   scales.dim() == 4 && scales.size(0) == plane.size(0) &&
                   scales.size(1) == plane.size(1) && scales.size(3) == D / 32,
               "index_plane_store: fp4 scales {} must be U8 [{}, {}, 1, {}]",
               scales.defined() ? scales.str() : std::string("missing"), plane.size(0),
               plane.size(1), D / 32);
  const int64_t n = keys.dim() == 2 ? keys.size(0) : -1;
  ATOM_CHECK(keys.dtype() == DType::kF32 && keys.is_contiguous() && keys.dim() == 2 &&
                 keys.size(1) == D && rows.dtype() == DType::kI32 && rows.numel() == n &&
                 positions.dtype() == DType::kI32 && positions.numel() == n,
             "index_plane_store: keys {} rows {} positions {}: F32 [n, {}] and I32 [n]", keys.str(),
             rows.str(), positions.str(), D);
  ATOM_CHECK(a.rot_dim == 0 || (inv_freq.dtype() == DType::kF32 &&
                                inv_freq.numel() == a.rot_dim / 2 && inv_freq.is_contiguous()),
             "index_plane_store: inv_freq {} for {} rotary channels",
             inv_freq.defined() ? inv_freq.str() : std::string("missing"), a.rot_dim);
}

namespace cpu {
void index_plane_store(Tensor& plane, Tensor& scales, const Tensor& keys, const Tensor& rows,
                       const Tensor& positions, const Tensor& inv_freq, const IndexStoreArgs& a);
}
namespace cuda {
void index_plane_store(Tensor& plane, Tensor& scales, const Tensor& keys, const Tensor& rows,
                       const Tensor& positions, const Tensor& inv_freq, const IndexStoreArgs& a);
}

inline void index_plane_store(Tensor& plane, Tensor& scales, const Tensor& keys, const Tensor& rows,
                              const Tensor& positions, const Tensor& inv_freq,
                              const IndexStoreArgs& a) {
  check_same_device("index_plane_store", plane.device(),
                    {&scales, &keys, &rows, &positions, &inv_freq});
  if (plane.device().is_cpu())
    return cpu::index_plane_store(plane, scales, keys, rows, positions, inv_freq, a);
  ATOM_KERNEL_CUDA("index_plane_store",
                   cuda::index_plane_store(plane, scales, keys, rows, positions, inv_freq, a));
}

}  // namespace atom::kernels
