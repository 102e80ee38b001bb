// The launchers of atom's CUDA kernels. Arguments are plain pointers, sizes and strides: the .cu
// files include no fmt (nvcc rejects fmt's consteval format strings), so shape checks and error
// messages live in the entry points (kernels/cuda/*.cpp), which then call these. Every launcher
// enqueues on `stream` and returns without synchronising; the caller checks cudaGetLastError.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_tuning.h"

namespace atom::kernels::cuda {

enum class Elem : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

inline int elem_bytes(Elem e) { return e == Elem::kF32 ? 4 : 2; }

// A 2-D view whose rows may be strided and whose columns are contiguous.
struct Mat {
  void* data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t stride = 0;  // elements between rows
  Elem type = Elem::kF32;
};

// ---- elementwise.cu
void launch_add(Mat out, Mat a, Mat b, cudaStream_t s);
// out = a + sigmoid(gate[r]) * b; gate [R, 1]
void launch_add_gated(Mat out, Mat a, Mat b, Mat gate, cudaStream_t s);
void launch_cast(Mat out, Mat x, cudaStream_t s);
void launch_add_bias(Mat out, const void* bias, Elem bias_type, cudaStream_t s);
// out[r] = x[idx[r]] (same element type: rows are copied as bytes)
void launch_gather_rows(Mat out, Mat x, const int32_t* idx, cudaStream_t s);
// out[t] = table[ids[t] - vocab_start] when in [0, table_rows), else zeros. table [rows, out.cols]
void launch_embedding(Mat out, const int32_t* ids, const void* table, Elem table_type,
                      int64_t table_rows, int64_t vocab_start, cudaStream_t s);
// out [M, I] = silu(x[:, :I]) * x[:, I:]
// kernels::attn_res over blocks [T, B, D] F32 (n rows; n <= kAttnResLaunchMaxRows).
constexpr int kAttnResLaunchMaxRows = 64;
void launch_attn_res(Mat out, const float* blocks, int64_t T, int64_t B, int64_t D, int n,
                     const float* w, float eps, cudaStream_t s);
// out = moe_act_times(g, u, act, alpha, limit) (device_common.cuh) of x = [g | u].
void launch_glu(Mat out, Mat x, int act, float alpha, float limit, cudaStream_t s);
// data[i] = lo + (hi - lo) * random_uniform(seed, i), i < n, in `type`
void launch_fill_uniform(void* data, Elem type, int64_t n, uint64_t seed, float lo, float hi,
                         cudaStream_t s);
// The same values as e4m3 codes (f32_to_f8e4m3).
void launch_fill_uniform_f8(uint8_t* data, int64_t n, uint64_t seed, float lo, float hi,
                            cudaStream_t s);

// ---- hyper_connection.cu (kernels/hyper_connection.h)
inline constexpr int kHcLaunchMaxStreams = 16;
// One block per token: with fn, m = rsqrt(mean(x²) + norm_eps) x · fnᵀ; mix (post set): pre,
// post and the Sinkhorn'd comb from m, out = Σ_j pre_j x_j; head: out = Σ_j w_j x_j with
// w = sigmoid(m scale0 + base) + hc_eps, or the mean without fn.
struct HcLaunch {
  const float* x = nullptr;  // streams [T, hc, D]
  int64_t tokens = 0, dim = 0;
  int hc = 0;
  const float* fn = nullptr;  // [rows, hc D] or null (the mean)
  const float* base = nullptr;
  const float* scale = nullptr;
  int rows = 0;           // (2 + hc) hc for a mix, hc for a head
  Mat out;                // [T, D]
  float* post = nullptr;  // [T, hc]: set for a mix
  float* comb = nullptr;  // [T, hc, hc]
  int sinkhorn_iters = 1;
  float hc_eps = 0.0f, norm_eps = 0.0f;
  // DeepSeek-V4.1's single-pass form: the collapse by these [T, hc] weights (the previous site's
  // pre) rather than the computed ones, which go to pre_out [T, hc] (each may be null).
  const float* by = nullptr;
  float* pre_out = nullptr;
};
void launch_hc_collapse(const HcLaunch& a, cudaStream_t s);
// x[t, k] = post[t, k] y[t] + Σ_j comb[t, j, k] x[t, j], in place.
void launch_hc_write_back(float* x, int64_t tokens, int hc, int64_t dim, Mat y, const float* post,
                          const float* comb, cudaStream_t s);
// x[t, j] = e[t] for every stream j.
void launch_hc_expand(float* x, int64_t tokens, int hc, int64_t dim, Mat e, cudaStream_t s);

// ---- rms_norm.cu
// out = rmsnorm(x) over groups of `dim` columns; residual (may be null) += x first.
void launch_rms_norm(Mat out, Mat x, const Mat* residual, const void* w, Elem w_type, int64_t dim,
                     float eps, int kind, cudaStream_t s);  // kind: kernels::RmsNormKind

// ---- rope.cu
struct RopeLaunch {
  Mat q, k;                  // [T, Hq * head_dim], [T, Hk * head_dim]
  const int32_t* positions;  // [T]
  const float* inv_freq;     // [rot_dim / 2]
  int head_dim = 0, rot_dim = 0;
  float scale = 1.0f;
  bool interleaved = false;
  // Optional fused cache write: k_cache/v_cache [num_slots, Hk * head_dim] of q's type, or
  // e4m3 codes of x / scale (KvFp8).
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int64_t num_slots = 0;
  Mat v;                                  // [T, Hk * head_dim]
  const int32_t* slot_mapping = nullptr;  // [T]
  bool cache_fp8 = false;
  float k_scale = 1.0f, v_scale = 1.0f;
  // Optional per-head RMSNorm of q and k before the rotation (kernels::QkNorm): weights
  // [head_dim] of norm_type, kernels::RmsNormKind norm_kind. In the vectorised kernel where it
  // applies, else as two rms_norm launches first.
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  Elem norm_type = Elem::kF32;
  float norm_eps = 0.0f;
  int norm_kind = 0;
};
void launch_rope(const RopeLaunch& a, cudaStream_t s);
// An FP8 (e4m3) cache: it holds round_to_e4m3(x / scale), saturating at +-448.
struct KvFp8 {
  bool on = false;
  float k_scale = 1.0f, v_scale = 1.0f;
};
// k_cache/v_cache [num_slots, width] contiguous (width = Hk * D); k, v [T, width]; the caches
// have k's type, or fp8.on and e4m3 codes.
void launch_kv_cache_write(void* k_cache, void* v_cache, int64_t num_slots, Mat k, Mat v,
                           const int32_t* slot_mapping, KvFp8 fp8, cudaStream_t s);

// ---- sampling.cu
void launch_argmax(int32_t* ids, Mat logits, cudaStream_t s);
// rows: [R] SamplingRow (kernels/sampling.h)
void launch_sample(int32_t* ids, Mat logits, const void* rows, cudaStream_t s);
// logits [R, V] F32 in place: -inf where bit t of masks[index[r]] ([num_masks, words]) is clear
void launch_mask_logits(Mat logits, const uint64_t* masks, int64_t words, int64_t num_masks,
                        const int32_t* index, cudaStream_t s);

// ---- linear_skinny.cu
// out [M, N] = x [M, K] · w [N, K]ᵀ (+ bias) for small M; x and w share type (BF16 or F16),
// K % 8 == 0, x rows and w 16-byte aligned. silu_mul_pairs: w is [gate; up] (n / 2 rows each)
// and out [M, n / 2] = silu(gate) * up, each product rounded to x's type first.
struct SkinnyRope {
  bool on = false;
  int q_heads = 0, kv_heads = 0, head_dim = 0;  // w's rows: q heads, k heads, v heads
  const int32_t* positions = nullptr;           // [M]
  const float* inv_freq = nullptr;              // [head_dim / 2]
  float scale = 1.0f;
  void* k_cache = nullptr;  // [num_slots, kv_heads * head_dim] of x's type, or null
  void* v_cache = nullptr;
  const int32_t* slot_mapping = nullptr;  // [M]
  int64_t num_slots = 0;
};
// rope.on: w is a [q; k; v] projection (n = (q_heads + 2 kv_heads) head_dim); q and k are rotated
// (half-split over the whole head, as launch_rope) and k, v written to the cache slots.
// early_loads: of the kSkinnyEarlyLoadsAll 16-byte weight loads per row a lane has in flight, how
// many it issues before the PDL wait (the rest right after it).
inline constexpr int kSkinnyEarlyLoadsAll = 4;
void launch_linear_skinny(Mat out, Mat x, const void* w, int64_t n, int64_t k, const void* bias,
                          Elem bias_type, cudaStream_t s, bool silu_mul_pairs = false,
                          const SkinnyRope& rope = {}, int early_loads = kSkinnyEarlyLoadsAll);

// ---- linear_heads.cu
// out[m, h * out_hs + n] = sum_k x[m, h * x_hs + k] * w[h * w_hs + n * k_stride + k] for
// m < M <= kLinearHeadsMaxM, n < N, h < heads; x and w share out's type (BF16/F16), K % 8 == 0,
// 16-byte aligned rows and head offsets.
inline constexpr int kLinearHeadsMaxM = 8;
void launch_linear_heads(Mat out, Mat x, const void* w, int heads, int64_t n, int64_t k,
                         int64_t out_hs, int64_t x_hs, int64_t w_hs, cudaStream_t s);
// ---- attention.cu / attention_simple.cu
struct AttnLaunch {
  const void* q = nullptr;  // [T, Hq * D]
  int64_t q_stride = 0;
  void* out = nullptr;  // [T, Hq * D]
  int64_t out_stride = 0;
  const void* k_cache = nullptr;  // [pages, block_size, Hk, D]
  const void* v_cache = nullptr;
  const int32_t* query_start = nullptr;   // [S + 1]
  const int32_t* context_lens = nullptr;  // [S]
  const int32_t* page_indptr = nullptr;   // [S + 1]
  const int32_t* page_indices = nullptr;
  const float* sinks = nullptr;  // [Hq] or null
  float* part_o = nullptr;       // [splits, T * Hq, D] partial outputs when num_splits > 1
  float* part_ml = nullptr;      // [splits, T * Hq, 2] running max (log2 units) and sum
  // [num_seqs * num_kv_heads] zeroed tickets: with them, the last CTA of a split sequence merges
  // the partials itself (and re-zeroes its ticket); without, launch_attention_combine does.
  int* counters = nullptr;
  int64_t num_tokens = 0;
  int num_seqs = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0, block_size = 0;
  int block_shift = -1;  // log2(block_size) when a power of two, else -1
  int window = 0;        // 0: full
  int num_splits = 1;
  int split_min_tiles = 4;  // each split covers at least this many key tiles (decode_splits)
  int max_query_len = 0;    // upper bound
  float scale = 1.0f;
  float softcap = 0.0f;
  Elem type = Elem::kBF16;
  // The wgmma prefill kernel's CudaTuning (kernels/cuda_tuning.h): CTA shape, 2 (128 rows) or 1
  // (64 rows); K/V pipeline; CTA order (-1 by grid size, 0 within, 1 across).
  int wgmma_warpgroups = 2;
  int wgmma_pipeline = 6;
  int wgmma_order_across = -1;
  // FP8 (e4m3) caches: values read as code * scale (kernels/attention.h, KvScales).
  bool kv_fp8 = false;
  float k_scale = 1.0f, v_scale = 1.0f;
  // wgmma prefill: order the CTAs longest first across all (sequence, kv head)s instead of within
  // each (set by its launcher for grids of a few waves; attention_wgmma.cu).
  bool longest_first_across = false;
};
// Tensor-core flash attention (mma.sync): BF16/F16, head_dim 64, 128 or 256, 16-byte aligned
// rows. Prefill mode: m_atoms (1 or 2; 2 needs head_dim <= 128) 16-row MMA tiles per warp, no
// splits. Decode mode (rows of a sequence's kv-head group <= kDecodeRows): the four warps share
// the rows and split every key tile; num_splits > 1 splits long contexts across CTAs.
inline constexpr int kDecodeRows = 16;
bool flash_attention_supported(const AttnLaunch& a);
void launch_flash_attention(const AttnLaunch& a, int m_atoms, cudaStream_t s);
void launch_flash_decode(const AttnLaunch& a, cudaStream_t s);
// Rows of query heads each prefill-mode CTA covers.
int flash_attention_block_rows(int m_atoms);
// Merges decode-mode split partials into out (and applies sinks).
void launch_attention_combine(const AttnLaunch& a, cudaStream_t s);
// The same two modes over an FP8 cache (attention_fp8.cu; supported where
// flash_attention_supported holds): K and V are converted to FP16 in registers as they are read
// from shared memory and the MMAs run in FP16 (q is scaled by scale * k_scale and rounded to
// FP16). Prefill mode uses one 16-row atom per warp.
void launch_flash_fp8_attention(const AttnLaunch& a, cudaStream_t s);
void launch_flash_fp8_decode(const AttnLaunch& a, cudaStream_t s);
// Hopper prefill kernel (wgmma, two warpgroups of 64 rows, 128-key tiles): BF16/F16, head_dim
// 64 or 128, 16-byte aligned rows, no splits. FP8 caches: tiles are converted to q's type in
// shared memory before the MMAs (two warpgroups only).
// Streaming multiprocessors of the current device (cached per device; attention.cpp).
int sm_count();
bool wgmma_attention_supported(const AttnLaunch& a);
void launch_wgmma_attention(const AttnLaunch& a, cudaStream_t s);
// One warp per (token, head), FP32 math: any dtype (FP8 caches too), any head_dim <= 256.
void launch_attention_simple(const AttnLaunch& a, cudaStream_t s);

// ---- moe_route.cu
// One warp per token: scores, optional group limit, top-k with the CPU reference's tie and NaN
// rules (kernels/moe.h), then the fused shared slots.
struct MoeRouteLaunch {
  int32_t* ids = nullptr;  // [T, top_k + num_shared]
  float* weights = nullptr;
  const float* logits = nullptr;  // [T, E], rows `logits_stride` apart
  int64_t logits_stride = 0;
  const float* bias = nullptr;  // [E] or null
  int64_t num_tokens = 0;
  int num_experts = 0;
  int scoring = 0;  // RouterScoring: 0 softmax, 1 sigmoid, 2 top-k then softmax, 3 sqrt-softplus
  int top_k = 0;
  bool renormalize = false;
  int n_group = 1, topk_group = 1;
  int group_score = 0;  // GroupScore: 0 top-2 sum, 1 max
  float scale = 1.0f;
  int num_shared = 0, shared_first = 0;
  int local_first = 0, local_count = -1;   // RouterArgs' expert-parallel range
  const int32_t* replicas = nullptr;       // [E, max_replicas], or null
  const int32_t* replica_count = nullptr;  // [E]
  int max_replicas = 0;
  unsigned long long* expert_load = nullptr;  // [E], or null
  const int32_t* fixed_ids = nullptr;         // [T, top_k] given choices (hash routing), or null
};
inline constexpr int kMoeRouteMaxExperts = 1024, kMoeRouteMaxTopK = 16;
void launch_moe_route(const MoeRouteLaunch& a, cudaStream_t s);

// ---- fused_moe.cu, fused_moe_gemm.cu
// out [T, H] = sum_j weights[t, j] * (w2[e] * act(w13[e] * x[t] + b13[e]) + b2[e]),
// e = ids[t, j] (slots outside [0, S) add nothing); act: silu(gate) * up, or GPT-OSS's clamped
// SwiGLU. x, w13, w2 and the biases share `type` (BF16/F16); H % 8 == 0, I % 8 == 0, x rows and
// the weights 16-byte aligned. Decode-sized T*K (CudaTuning::moe_decode_max_rows): two kernels that
// read each active expert's weights once (tensor cores on the tokens of an expert, weights streamed
// from HBM into registers); larger: a counting sort by slot, two persistent wgmma grouped GEMMs and
// a combine. Nothing depends on per-expert counts on the host (CUDA-graph safe).
struct MoeLaunch {
  Mat out;                       // [T, H]
  Mat x;                         // [T, H]
  const void* w13 = nullptr;     // [S, 2I, H]
  const void* w2 = nullptr;      // [S, H, I]
  const int32_t* ids = nullptr;  // [T, K]
  const float* weights = nullptr;
  int64_t T = 0, H = 0, I = 0;
  int K = 0, S = 0;
  Elem type = Elem::kBF16;
  void* workspace = nullptr;
  bool decode = false;        // the decode path (needs T * K <= kMoeDecodeMaxRowsCap)
  int gemm_tile_rows = 64;    // the grouped GEMMs' rows per tile: 64 or 128
  int decode_depth = 2;       // the decode kernels' k steps per load group: 2 or 4
  const void* b13 = nullptr;  // [S, 2I] or null
  const void* b2 = nullptr;   // [S, H] or null
  // kernels::MoeActivation: 0 silu(gate) * up; 1 GPT-OSS's (clamp(up) + 1) * g * sigmoid(alpha g),
  // g = min(gate, limit); 2 silu(min(gate, limit)) * clamp(up, -limit, limit); 3 SiTU with beta
  // in alpha and linear_beta in limit.
  int act = 0;
  float alpha = 1.702f, limit = 7.0f;
};
inline constexpr int kMoeMaxSlots = 2048;  // kMoeDecodeMaxRowsCap: kernels/cuda_tuning.h
// Workspace bytes for the path(s) T * K rows may take (both, where either may).
int64_t moe_workspace_bytes(int64_t T, int K, int S, int64_t H, int64_t I, int elem_bytes);
void launch_fused_moe(const MoeLaunch& a, cudaStream_t s);

// ---- mla.cu, mla_wgmma.cu (multi-head latent attention, the sparse-attention indexer)
// RoPE of each head's last rope_dim q channels and of kv's k_pe (channels [L, L + R)), then kv's
// row written to cache [num_slots, L + R] (cache_type) at slot_mapping[t] (< 0: skipped).
struct MlaRopeLaunch {
  Mat q, kv;                 // [T, H (nope + R)], [T, L + R]
  const int32_t* positions;  // [T]
  const float* inv_freq;     // [R / 2]
  int num_heads = 0, nope_dim = 0, rope_dim = 0, latent_dim = 0;
  float scale = 1.0f;
  bool interleaved = false;
  void* cache = nullptr;
  Elem cache_type = Elem::kBF16;
  int64_t num_slots = 0;
  const int32_t* slot_mapping = nullptr;
};
void launch_mla_rope_cache_write(const MlaRopeLaunch& a, cudaStream_t s);
// rows [T, W] to cache [num_slots, W] (cache_type) at slot_mapping[t] (< 0: skipped).
void launch_cache_rows_write(void* cache, Elem cache_type, int64_t num_slots, Mat rows,
                             const int32_t* slot_mapping, cudaStream_t s);
// LayerNorm over each row (fp32, biased variance); b may be null.
void launch_layer_norm(Mat out, Mat x, const void* w, const void* b, Elem w_type, float eps,
                       cudaStream_t s);
// Absorbed latent attention (kernels/mla.h): per (token, head), keys and values read from the
// paged latent plane cache [pages, block_size, 1, L + R] (the value: its first L channels).
struct MlaLaunch {
  const void* q = nullptr;  // [T, H (L + R)]
  int64_t q_stride = 0;
  void* out = nullptr;  // [T, H L]
  int64_t out_stride = 0;
  Elem type = Elem::kBF16;  // q's and out's
  const void* cache = nullptr;
  Elem cache_type = Elem::kBF16;
  int block_size = 0;
  const int32_t* query_start = nullptr;   // [S + 1]
  const int32_t* context_lens = nullptr;  // [S]
  const int32_t* page_indptr = nullptr;   // [S + 1]
  const int32_t* page_indices = nullptr;
  const int32_t* topk = nullptr;  // [T, top_k] or null (dense)
  int top_k = 0;
  int64_t num_tokens = 0;
  int num_seqs = 0, num_heads = 0, latent_dim = 0, rope_dim = 0, max_query_len = 0;
  float scale = 1.0f;
  // Context splits (fast kernel): partial outputs [splits, T H, L] and (max in log2 units, sum)
  // [splits, T H, 2], merged by a second kernel; num_splits 1: written straight to out.
  int num_splits = 1;
  float* part_o = nullptr;
  float* part_ml = nullptr;
  int pipeline = 0;  // the wgmma kernel's loop: 0 serial, 1 overlapped (mla_wgmma.cu)
};
// One block per (token, head), FP32 math: any float dtypes, L <= 512, L + R <= 1024.
inline constexpr int kMlaSimpleMaxLatent = 512, kMlaSimpleMaxWidth = 1024;
void launch_mla_attention_simple(const MlaLaunch& a, cudaStream_t s);
// The wgmma kernel: L 512, R 64, BF16/F16 q, out and cache, 16-byte aligned rows. A CTA of two
// warpgroups takes 64 query rows (dense: packed (token, head) rows of one sequence; sparse: the
// heads of one token) over 64-key tiles.
inline constexpr int kMlaFastLatent = 512, kMlaFastRope = 64, kMlaFastRows = 64, kMlaFastKeys = 64,
                     kMlaMaxSplits = 32;
bool mla_fast_supported(const MlaLaunch& a);
// CTAs of one split (the grid's x * y).
int64_t mla_fast_ctas(const MlaLaunch& a);
void launch_mla_attention_fast(const MlaLaunch& a, cudaStream_t s);
// The lightning indexer's scores of every visible position, then each token's top_k.
struct IndexerLaunch {
  int32_t* topk = nullptr;  // [T, top_k]
  const void* q = nullptr;  // [T, Hi D]
  int64_t q_stride = 0;
  Elem q_type = Elem::kBF16;
  const float* weights = nullptr;  // [T, Hi]
  int64_t weights_stride = 0;
  const void* cache = nullptr;  // [pages, block_size, 1, D]
  Elem cache_type = Elem::kBF16;
  int block_size = 0;
  const int32_t* query_start = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* page_indptr = nullptr;
  const int32_t* page_indices = nullptr;
  int64_t num_tokens = 0;
  int num_seqs = 0, num_heads = 0, head_dim = 0, top_k = 0, max_context_len = 0;
  float scale = 1.0f, weights_scale = 1.0f;
  float* scores = nullptr;  // scratch [T, max_context_len]
  // The k-pool indexer (pool > 1): a token at context index i sees the (i + 1) / pool pools
  // complete by i, whose keys are pooled [num_seqs, max_context_len, D] F32 (max_context_len
  // counting pools); cache is not read.
  int pool = 1;
  const float* pooled = nullptr;
  // DeepSeek-V4.1's quantised plane (kernels::IndexKeyFormat: 0 plain, 1 fp8, 2 fp4): cache U8
  // rows of key_width bytes, key_scales fp4's [.., head_dim / 32] E8M0 bytes.
  int key_format = 0;
  int key_width = 0;
  const uint8_t* key_scales = nullptr;
  bool large_position_first = false;
  // Candidate blocks of cand_block rows: cand_in [T, cand_in_count] restricts the choice,
  // cand_out [T, cand_out_count] receives them (block_max: scratch [T, max_blocks]).
  int cand_block = 0;
  const int32_t* cand_in = nullptr;
  int cand_in_count = 0;
  int32_t* cand_out = nullptr;
  int cand_out_count = 0;
  float* block_max = nullptr;
  int max_blocks = 0;
};
// DeepSeek-V4.1's Engram gate (kernels/engram.h): streams [T, hc, H] += sigmoid(g) v per stream.
struct EngramLaunch {
  float* streams = nullptr;
  Mat kv;  // [T, (hc + 1) H]
  const float* k_weight = nullptr;
  const float* q_weight = nullptr;
  int64_t tokens = 0, hidden = 0;
  int hc = 0;
  float eps = 0.0f;
};
void launch_engram_gate(const EngramLaunch& a, cudaStream_t s);
// DeepSeek-V4.1's index plane store (kernels/index_plane.h): key e [D] F32 rotated at
// positions[e], quantised into row rows[e] (-1: none) of plane (fp8: D + 4 bytes a row; fp4: D / 2,
// with scales D / 32).
struct IndexStoreLaunch {
  uint8_t* plane = nullptr;
  uint8_t* scales = nullptr;
  const float* keys = nullptr;
  const int32_t* rows = nullptr;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int64_t num_keys = 0;
  int head_dim = 0, rot_dim = 0;
  float attention_factor = 1.0f;
  bool fp4 = false;
  int ratio = 1;  // positions a row: keys stored at window ends (kernels/index_plane.h)
};
void launch_index_plane_store(const IndexStoreLaunch& a, cudaStream_t s);
inline constexpr int kIndexerMaxTopK = 4096, kIndexerMaxHeadDim = 256, kIndexerMaxHeads = 128;
void launch_indexer_topk(const IndexerLaunch& a, cudaStream_t s);
// The k-pool indexer: each complete pool's key into a.pooled (from the rows cache a.cache of
// 2 D wide rows and ape [pool, D] F32), the pools' scores and top_k (pools) as
// launch_indexer_topk, then out [T, width] (kernels::kpool_topk's layout).
void launch_kpool_topk(const IndexerLaunch& a, const float* ape, float* pooled, int32_t* out,
                       int width, bool tail, cudaStream_t s);

}  // namespace atom::kernels::cuda
