// Pieces shared by fused_moe.cu (the decode path, the counting sort, the combine and the
// launcher) and fused_moe_gemm.cu (the grouped GEMMs of larger batches).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace atom::kernels::cuda::moe {

// Rows of a grouped-GEMM tile (64 or 128, MoeLaunch::gemm_tile_rows): each slot's rows are
// padded to a multiple of it in the sorted order, and every tile holds rows of one slot.
inline constexpr int kMinTileRows = 64, kMaxTileRows = 128;

// The sorted order and tile table the counting sort writes (device pointers), and the operands
// of one grouped GEMM.
struct GemmArgs {
  const void* a = nullptr;  // w13: x [T, H] (rows a_stride apart); w2: act [P, I]
  int64_t a_stride = 0;
  const void* w = nullptr;  // w13 [S, 2I, H] or w2 [S, H, I]
  void* out = nullptr;      // w13: act [P, I]; w2: y [T * K, H] (unweighted expert outputs)
  const int* sorted_rows = nullptr;  // [P]: row t * K + j of each sorted position, -1 padding
  // [MT]; tile t holds sorted positions [t, t + 1) * tile_rows_cap
  const int* tile_expert = nullptr;
  const int* tile_rows = nullptr;  // [MT] rows in use (<= tile_rows_cap)
  const int* num_tiles = nullptr;  // [1]
  int64_t H = 0, I = 0;
  int K = 0;
  int max_tiles = 0;  // the table's capacity (grid bound)
  int tile_rows_cap = kMinTileRows;
  // GPT-OSS's experts (the kernels' extended epilogue runs when any of these is set):
  const void* bias = nullptr;  // w13: [S, 2I] added to gate | up; w2: [S, H] added to y; or null
  bool swiglu_oai = false;     // w13: the clamped SwiGLU instead of silu(gate) * up
  float alpha = 1.702f, limit = 7.0f;
};

// act = silu(gate) * up (or the clamped SwiGLU, after the bias) of each sorted row (persistent
// wgmma kernel, tile_rows_cap x 256 tiles).
void launch_moe_gemm_w13(const GemmArgs& g, Elem type, cudaStream_t s);
// y[row] = w2[e] * act (+ the bias) of each sorted row.
void launch_moe_gemm_w2(const GemmArgs& g, Elem type, cudaStream_t s);

}  // namespace atom::kernels::cuda::moe
