#pragma once

#include <cstdint>
#include <vector>

#include "kernels/dispatch.h"

namespace atom::kernels {

// ids[r] = argmax over logits[r, :] (first index on ties).   ids [R] I32, logits [R, V] F32
namespace cpu {
void argmax(Tensor& ids, const Tensor& logits);
}
namespace cuda {
void argmax(Tensor& ids, const Tensor& logits);
}

inline void argmax(Tensor& ids, const Tensor& logits) {
  check_same_device("argmax", ids.device(), {&logits});
  if (ids.device().is_cpu()) return cpu::argmax(ids, logits);
  ATOM_KERNEL_CUDA("argmax", cuda::argmax(ids, logits));
}

// How one logits row is sampled. A row's token depends only on its logits and on (seed, step):
// never on the other rows of the batch. docs/cuda.md ("Seeded sampling") gives the scheme.
struct SamplingRow {
  float temperature = 0.0f;  // < kGreedyTemperature: greedy (argmax)
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  int32_t top_k = 0;         // <= 0 or >= vocab: off
  uint64_t seed = 0;         // the request's seed
  uint64_t step = 0;         // tokens the request generated before this one
};
static_assert(sizeof(SamplingRow) == 32, "SamplingRow is uploaded as raw bytes");
inline constexpr float kGreedyTemperature = 1e-5f;

// The rows as a U8 tensor [R, sizeof(SamplingRow)] on the CPU, ready for .to(device).
Tensor sampling_rows_tensor(const std::vector<SamplingRow>& rows);

// ids[r] = a token drawn from logits[r] under rows[r]:
//   l = logits / temperature; keep l >= the top_k-th largest l (ties kept), then the smallest
//   set of largest l whose softmax mass reaches top_p (ties kept), then l >= max(l) + log(min_p);
//   return argmax over kept i of l_i + gumbel(seed, step, i)   (first index on ties).
//   ids [R] I32, logits [R, V] F32, rows [R, 32] U8 (sampling_rows_tensor)
namespace cpu {
void sample(Tensor& ids, const Tensor& logits, const Tensor& rows);

// Buffers of sample_row, kept by the caller across rows and steps.
struct SampleScratch {
  std::vector<float> l, e;    // scaled logits, exp(l - max l)
  std::vector<uint32_t> key;  // sampling_key(l)
  std::vector<uint32_t> sel;  // top-k selection
  std::vector<int32_t> cand;  // tokens still kept, in id order
};

// One row of sample() on host F32 logits x[0, V): the CPU reference itself. The engine's CPU
// sampler draws through it too, so a request gets the same token whether its row is sampled by
// sample() or by the CPU sampler (after penalties, which leave the row unchanged when off).
int32_t sample_row(const float* x, int64_t V, const SamplingRow& p, SampleScratch& s);
}  // namespace cpu
namespace cuda {
void sample(Tensor& ids, const Tensor& logits, const Tensor& rows);
}

inline void sample(Tensor& ids, const Tensor& logits, const Tensor& rows) {
  check_same_device("sample", ids.device(), {&logits, &rows});
  if (ids.device().is_cpu()) return cpu::sample(ids, logits, rows);
  ATOM_KERNEL_CUDA("sample", cuda::sample(ids, logits, rows));
}

// Structured output: logits[r, t] = -inf wherever bit t of masks[index[r]] is clear (bit t of a
// mask row: word t / 64, bit t % 64); a row whose index is negative is left as it is. Bits past
// V are ignored.
//   logits [R, V] F32 with contiguous rows (written in place), masks [M, W] U64 contiguous with
//   W >= ceil(V / 64), index [R] I32 in [-1, M)
// The operand checks both devices share; index values are checked by the CPU (the CUDA kernel
// leaves a row whose index is out of range as it is).
inline void check_mask_logits_args(const Tensor& logits, const Tensor& masks, const Tensor& index) {
  ATOM_CHECK(logits.dim() == 2 && logits.dtype() == DType::kF32 &&
                 (logits.size(1) <= 1 || logits.stride(1) == 1),
             "mask_logits: logits must be 2-D F32 with contiguous rows, got {}", logits.str());
  ATOM_CHECK(masks.dim() == 2 && masks.dtype() == DType::kU64 && masks.is_contiguous() &&
                 masks.size(1) * 64 >= logits.size(1),
             "mask_logits: masks must be contiguous U64 [M, >= {}], got {}",
             (logits.size(1) + 63) / 64, masks.str());
  ATOM_CHECK(index.dim() == 1 && index.dtype() == DType::kI32 && index.is_contiguous() &&
                 index.size(0) == logits.size(0),
             "mask_logits: index must be I32 [{}], got {}", logits.size(0), index.str());
}
namespace cpu {
void mask_logits(Tensor& logits, const Tensor& masks, const Tensor& index);
}
namespace cuda {
void mask_logits(Tensor& logits, const Tensor& masks, const Tensor& index);
}

inline void mask_logits(Tensor& logits, const Tensor& masks, const Tensor& index) {
  check_same_device("mask_logits", logits.device(), {&masks, &index});
  check_mask_logits_args(logits, masks, index);
  if (logits.device().is_cpu()) return cpu::mask_logits(logits, masks, index);
  ATOM_KERNEL_CUDA("mask_logits", cuda::mask_logits(logits, masks, index));
}

}  // namespace atom::kernels
