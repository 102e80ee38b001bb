// Tuning knobs of the CUDA fused_moe op, for benchmarks and tests.
#pragma once

namespace atom::kernels::cuda {

// fused_moe takes the decode path (fused_moe.cu: two kernels streaming each active slot's
// weights once into mma.sync tiles of its tokens) when T * K is at most this (capped at
// kMoeDecodeMaxRowsCap, 512), else the counting sort and the wgmma grouped GEMMs, which also
// read each active slot's weights once while a slot has at most a tile of rows. 0: the grouped
// GEMMs always. Default: ATOM_MOE_DECODE_MAX_ROWS, else 8 (docs/performance.md: the decode
// kernels win at one token of top-8 and at Mixtral's few large experts, the GEMMs from two
// tokens of Qwen3-30B-A3B's 128 small experts on).
int fused_moe_decode_max_rows();
void fused_moe_set_decode_max_rows(int rows);
// The same threshold for MXFP4 experts, whose decode kernels read a quarter of the bytes (so the
// grouped GEMMs' per-k-step expansion and barriers weigh more). Default:
// ATOM_MOE_DECODE_MAX_ROWS_MXFP4, else 256 (gpt-oss-20b's and -120b's experts on the H200: the
// decode kernels win at every batch measured, 1 to 64 tokens of top-4; docs/performance.md).
int fused_moe_decode_max_rows_mxfp4();
void fused_moe_set_decode_max_rows_mxfp4(int rows);

// k steps (128 elements of each of a lane's two weight rows) the decode kernels load per group:
// 2 or 4. Default: ATOM_MOE_DECODE_DEPTH, else 2.
int fused_moe_decode_depth();
void fused_moe_set_decode_depth(int steps);

// Rows per tile of the grouped GEMMs: 64, 128, or 0 for the default (128 from 8,192 routed rows
// on, where the weights' traffic through L2 binds, else 64). Default: ATOM_MOE_GEMM_TILE_ROWS,
// else 0.
int fused_moe_gemm_tile_rows();
void fused_moe_set_gemm_tile_rows(int rows);

}  // namespace atom::kernels::cuda
