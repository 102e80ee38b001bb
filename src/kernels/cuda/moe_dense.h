// fused_moe's per-slot dense path (kernels in fused_moe.cu, the products through cuBLASLt in
// moe.cpp): large prefills whose slots each hold many rows, outside graph capture.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace atom::kernels::cuda {

// From this many routed rows the workspace also holds the per-slot dense path's chunk buffers.
inline constexpr int64_t kMoeDenseMinRoutedRows = 1024;
// Rows of a dense-path chunk: about 32 MB of gathered rows and gate | up products, 256 to 4096
// rows (a multiple of 64), at most the routed rows rounded up to 64.
inline int64_t moe_dense_chunk_rows(int64_t R, int64_t H, int64_t I, int elem_bytes) {
  const int64_t fit = (int64_t{32} << 20) / ((H + 2 * I) * elem_bytes);
  const int64_t c = fit < 256 ? 256 : fit > 4096 ? 4096 : fit / 64 * 64;
  const int64_t r = (R + 63) / 64 * 64;
  return c < r ? c : r;
}
// The per-slot dense path (prefill, outside graph capture; moe.cpp runs the products through
// cuBLASLt): the counting sort's tables and the workspace's buffers. Slot e's rows are sorted
// positions [tile_first(e) * tile, + count), tile_first and count from the tables.
struct MoeDense {
  int* sorted_rows = nullptr;  // [P] routed row (t * K + j) of each sorted position
  int* tile_expert = nullptr;  // [max_tiles]
  int* tile_rows = nullptr;    // [max_tiles]
  int* num_tiles = nullptr;    // [1]
  int64_t max_tiles = 0;
  int tile = 64;            // rows per tile of the sorted order
  void* act = nullptr;      // [P, I] activations, sorted order
  void* y = nullptr;        // [T * K, H] expert outputs by routed row
  void* x_chunk = nullptr;  // [chunk_rows, H]
  void* h_chunk = nullptr;  // [chunk_rows, 2I]
  int64_t chunk_rows = 0;
};
// Sorts the routing into the workspace (m.gemm_tile_rows rows a tile); needs T * K >=
// kMoeDenseMinRoutedRows (the chunk buffers).
MoeDense moe_dense_begin(const MoeLaunch& m, cudaStream_t s);
// x_chunk[i] = x[token of sorted position first + i], i < n (zeros at padding positions).
void moe_dense_gather(const MoeLaunch& m, const MoeDense& d, int64_t first, int64_t n,
                      cudaStream_t s);
// y[routed row of sorted position first + i] = x_chunk[i] (w2's outputs), i < n (padding
// positions skipped).
void moe_dense_scatter(const MoeLaunch& m, const MoeDense& d, int64_t first, int64_t n,
                       cudaStream_t s);
// out = the routing-weighted sum of each token's rows of y.
void moe_dense_combine(const MoeLaunch& m, const MoeDense& d, cudaStream_t s);

}  // namespace atom::kernels::cuda
