// Tuning of the CUDA kernels: which variant each op runs (benchmarks and tests compare them; the
// defaults suit the H200, docs/cuda.md). There is no mutable global: the defaults are read from
// the ATOM_* environment variables once, on first use, and never change after; a caller that
// wants other values owns a CudaTuning and makes it current on its own thread for a scope
// (CudaTuningScope, as CudaStreamGuard does for streams). The CUDA entry points read
// cuda_tuning(): the calling thread's innermost scope's values, else the defaults. Plain data, no
// CUDA: it builds (and is tested) in CPU-only builds too.
#pragma once

#include <cstdint>

namespace atom::kernels::cuda {

enum class PrefillAttention {
  kAuto,    // wgmma for head_dim 64/128, else the mma.sync kernel
  kMma,     // the mma.sync (FlashAttention-2 style) kernel
  kSimple,  // the FP32 one-warp-per-head kernel (also for decode)
};

// kAuto: skinny for M <= 4 where it applies, else the wgmma GEMM where it applies, else the
// general kernel. kNoSkinny: as kAuto without the skinny kernel. kGeneral: the general kernel
// always.
enum class Fp8Path { kAuto, kNoSkinny, kGeneral };

// The FP8 wgmma GEMM's variant: kTma, 128 x 256 tiles loaded by the bulk tensor copy engine
// (linear_fp8_gemm_tma.cu); kCpAsync, 128 x 128 tiles loaded with cp.async (linear_fp8_gemm.cu),
// with K split over several CTAs per tile when the tiles are fewer than the SMs; kAuto, by the
// measured waves of each (linear_fp8.cpp, tma_wins).
enum class Fp8Tiles { kAuto, kTma, kCpAsync };

// cuBLASLt's FP8 matmul for the products it supports (linear_fp8_cublaslt.cpp): kAuto where the
// measured rule says it is faster (linear_fp8.cpp, cublaslt_wins), kOn wherever it applies,
// kOff never.
enum class Fp8CublasLt { kAuto, kOn, kOff };

// The largest decode-path threshold of fused_moe (its decode kernels' limit).
inline constexpr int kMoeDecodeMaxRowsCap = 512;

struct CudaTuning {
  // ---- paged attention (attention.cpp, attention_wgmma.cu)
  // ATOM_ATTENTION_BACKEND = auto | mma | simple.
  PrefillAttention attention_backend = PrefillAttention::kAuto;
  // 16-row MMA atoms per warp of the mma.sync prefill kernel: 0 picks by shape, 1 or 2 force
  // (ATOM_ATTENTION_M_ATOMS).
  int attention_m_atoms = 0;
  // Warpgroups per CTA of the wgmma prefill kernel: 2 (128 rows, 128-key tiles) or 1 (64 rows,
  // 64-key tiles, two CTAs per SM); ATOM_WGMMA_WARPGROUPS.
  int wgmma_warpgroups = 2;
  // K/V pipeline of the wgmma prefill kernel (BF16/F16 caches): 0 the serial loop (each GEMM
  // waited before the softmax that follows), 2 or 3 the overlapped loop (the next tile's Q Kᵀ and
  // the P V product in flight during the softmax) with that many K/V stages, 4 that loop
  // warp-specialized (a producer warpgroup gathers K/V into mbarrier stages), 5 that with
  // ping-pong of the two computing warpgroups, 6 that with two row tiles per CTA (the longest and
  // the shortest of a (sequence, kv head)); one warpgroup uses 2 for 3 to 6. ATOM_WGMMA_PIPELINE.
  int wgmma_pipeline = 6;
  // CTA order of the wgmma kernel: -1 longest row tiles first across all (sequence, kv head)s
  // for grids of at most four waves, within each (sequence, kv head) otherwise; 0 always within;
  // 1 always across (tests).
  int wgmma_order_across = -1;
  // Split decode: the last CTA of a sequence merges the partials, or, when false, a separate
  // combine kernel does.
  bool attention_merge_in_kernel = true;
  // Split decode: each split of a sequence covers at least this many 64-key tiles, 1 to 16
  // (ATOM_ATTENTION_SPLIT_MIN_TILES; fewer: more CTAs for short contexts, each merge costing a
  // ticket and a pass over the partials).
  int attention_split_min_tiles = 4;

  // ---- linear (linear.cpp, linear_skinny.cu)
  // Products with at most this many rows (capped at 4, the kernel's limit) use the skinny kernel
  // (linear_skinny.cu) instead of cuBLASLt; 0 sends everything to cuBLASLt
  // (ATOM_SKINNY_GEMM_MAX_M). On the H200 (Llama-3.1-8B decode step, docs/performance.md) skinny
  // with K split over warps takes 4.26-4.28 ms at batch 1 (cuBLASLt 4.93-4.95 before the split)
  // and 4.55 at batch 2 (cuBLASLt 4.76-4.77), but 5.26 at batch 3 (4.75) and 6.11 at batch 4
  // (4.82); fusing the RMSNorms into it was slower (branch fused-skinny-decode-experiment).
  int skinny_max_m = 2;
  // Skinny products with fewer output columns than this (and K >= 1,024) split K over the warps
  // of a block (ATOM_SKINNY_SPLIT_MAX_N; default every product: on the H200, Llama-3.1-8B
  // batch-1 decode step, 4.24 ms splitting all, 4.41-4.43 splitting N < 8,192 only, 4.81
  // splitting none).
  int64_t skinny_split_max_n = int64_t{1} << 40;
  // linear_rope_kv: the decode q/k/v projection, RoPE and cache write in one kernel
  // (ATOM_FUSE_QKV_ROPE).
  bool fuse_qkv_rope = true;
  // rope_kv_cache_write with per-head q/k norms (Qwen3's q_norm and k_norm): the norms in the
  // RoPE + cache-write kernel instead of two rms_norm kernels before it (ATOM_FUSE_QK_NORM_ROPE).
  bool fuse_qk_norm_rope = true;

  // ---- FP8 linear (linear_fp8.cpp)
  Fp8Path fp8_path = Fp8Path::kAuto;     // ATOM_FP8_GEMM_PATH = auto | no_skinny | general
  Fp8Tiles fp8_tiles = Fp8Tiles::kAuto;  // ATOM_FP8_GEMM_TILES = auto | tma | cp_async
  // ATOM_FP8_GEMM_CUBLASLT = auto | on | off.
  Fp8CublasLt fp8_cublaslt = Fp8CublasLt::kAuto;
  // Weight rows per block of the FP8 skinny kernel, 2 or 4; 0: 4 at M = 1, else 2
  // (ATOM_FP8_SKINNY_ROWS).
  int fp8_skinny_rows = 0;
  // The activation quantisation in one pass with 16-byte loads where the shapes allow it
  // (linear_fp8.cu); off: the two-pass kernel everywhere (ATOM_FP8_QUANT_ONE_PASS=0).
  bool fp8_quant_one_pass = true;
  // 1x128-group calls of M >= 1,024 rows with M % 4 != 0 (which cuBLASLt cannot run) cut into
  // cuBLASLt's rows and a 1-3 row tail (linear_fp8.cpp); off: atom's GEMM for the whole call
  // (ATOM_FP8_CUBLASLT_SPLIT=0).
  bool fp8_cublaslt_split = true;

  // ---- MLA (mla.cpp)
  // The FP32 one-block-per-head kernel instead of the wgmma kernel (ATOM_MLA_BACKEND=simple).
  bool mla_simple = false;
  // The wgmma kernel's loop: 0 runs each tile's Q Kᵀ, softmax and P V in turn; 1 issues the next
  // tile's Q Kᵀ behind the P V without waiting (ptxas serializes its wgmmas, warning C7515, and it
  // measured no faster; ATOM_MLA_PIPELINE).
  int mla_pipeline = 0;

  // ---- fused_moe (moe.cpp)
  // fused_moe takes the decode path (fused_moe.cu: two kernels streaming each active slot's
  // weights once into mma.sync tiles of its tokens) when T * K is at most this (0 to
  // kMoeDecodeMaxRowsCap), else the counting sort and the wgmma grouped GEMMs, which also read
  // each active slot's weights once while a slot has at most a tile of rows. 0: the grouped GEMMs
  // always. ATOM_MOE_DECODE_MAX_ROWS; default 8 (docs/performance.md: the decode kernels win at
  // one token of top-8 and at Mixtral's few large experts, the GEMMs from two tokens of
  // Qwen3-30B-A3B's 128 small experts on).
  int moe_decode_max_rows = 8;
  // The same threshold for MXFP4 experts, whose decode kernels read a quarter of the bytes (so
  // the grouped GEMMs' per-k-step expansion and barriers weigh more).
  // ATOM_MOE_DECODE_MAX_ROWS_MXFP4; default 256 (gpt-oss-20b's and -120b's experts on the H200: the
  // decode kernels win at every batch measured, 1 to 64 tokens of top-4; docs/performance.md).
  int moe_decode_max_rows_mxfp4 = 256;
  // The same threshold for FP8 experts (W8A16: half the bytes of BF16, the same per-k-step
  // expansion in the grouped GEMMs as MXFP4). ATOM_MOE_DECODE_MAX_ROWS_FP8; default 64.
  int moe_decode_max_rows_fp8 = 64;
  // k steps (128 elements of each of a lane's two weight rows) the decode kernels load per group:
  // 2 or 4 (ATOM_MOE_DECODE_DEPTH).
  int moe_decode_depth = 2;
  // Rows per tile of the grouped GEMMs: 64, 128, or 0 for the default (128 from 8,192 routed rows
  // on, where the weights' traffic through L2 binds, else 64); ATOM_MOE_GEMM_TILE_ROWS.
  int moe_gemm_tile_rows = 0;
  // The per-slot dense path (moe_dense.h: rows gathered by slot, each slot's two products through
  // cuBLASLt, outside graph capture, SiLU·mul experts without biases, from
  // kMoeDenseMinRoutedRows routed rows) is taken when the routed rows per slot in use average at
  // least this; 0: never. ATOM_MOE_DENSE_MIN_ROWS; default 256 (docs/performance.md: Mixtral's
  // prefill, eight large experts, against the grouped GEMMs).
  int moe_dense_min_rows = 256;
  // ... and only with at most this many slots in use (ATOM_MOE_DENSE_MAX_SLOTS; default 16). Many
  // small experts run faster on the grouped GEMMs at any rows per slot: on the H200, 8,192-token
  // prefill of Qwen3-30B-A3B (128 slots, 512 rows each) 165.8 ms grouped against 184.2 dense,
  // DeepSeek-V2-Lite 261.7 against 271.9; Mixtral (8 slots) 102 against 200 ms at 2,048.
  int moe_dense_max_slots = 16;

  // The defaults overridden by the environment (errors name a malformed variable).
  static CudaTuning from_env();
  // Values out of range mapped as the environment's are (warpgroups other than 1 to 2, an
  // unknown pipeline to 6, decode rows clamped, ...); CudaTuningScope applies it.
  CudaTuning normalized() const;
  bool operator==(const CudaTuning&) const;  // every field (defaulted in the .cpp: .cu is C++17)
};

// The environment's tuning, read once (thread-safe) and immutable after.
const CudaTuning& default_cuda_tuning();
// The calling thread's current tuning: its innermost CudaTuningScope's, else the default.
const CudaTuning& cuda_tuning();

// The calling thread's tuning with `change` applied to a copy, for a scope:
//   const CudaTuningScope s(cuda_tuning_with([](CudaTuning& t) { t.skinny_max_m = 4; }));
template <typename F>
CudaTuning cuda_tuning_with(F&& change) {
  CudaTuning t = cuda_tuning();
  change(t);
  return t;
}

// Makes a copy of `t` (normalized) the calling thread's tuning for the scope's lifetime; other
// threads are not affected. Scopes nest.
class CudaTuningScope {
 public:
  explicit CudaTuningScope(const CudaTuning& t);
  ~CudaTuningScope();
  CudaTuningScope(const CudaTuningScope&) = delete;
  CudaTuningScope& operator=(const CudaTuningScope&) = delete;

 private:
  CudaTuning tuning_;
  const CudaTuning* prev_;
};

}  // namespace atom::kernels::cuda
