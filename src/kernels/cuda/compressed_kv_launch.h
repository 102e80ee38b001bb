// The launchers of compressed_kv.cu (kernels/compressed_kv.h: DeepSeek-V4's attention on CUDA).
#pragma once

#include "kernels/cuda/launch.h"

namespace atom::kernels::cuda {

struct CkvBatch {
  const int32_t* query_start = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* page_indptr = nullptr;
  const int32_t* page_indices = nullptr;
  const int32_t* state_slots = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* rollback_slots = nullptr;  // [T] or null
  int num_seqs = 0;
  int block_size = 16;
};

struct HeadsRopeLaunch {
  Mat x;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int heads = 1, head_dim = 0, rot_dim = 0;
  float attention_factor = 1.0f, norm_eps = 1e-6f;
  int norm = 0, inverse = 0;
};
void launch_heads_norm_rope(const HeadsRopeLaunch& a, cudaStream_t s);

struct WindowPoolLaunch {
  CkvBatch b;
  void* plane = nullptr;  // [pages, rows_per_page, 1, D]
  Elem plane_type = Elem::kBF16;
  int rows_per_page = 1;
  float* state = nullptr;    // [slots, overlap ? 2 : 1, 3, D]
  float* scratch = nullptr;  // [T, D]
  Mat kv, gate;              // gate.data null: no gate
  const float* ape = nullptr;
  const float* norm_w = nullptr;
  const float* inv_freq = nullptr;
  int head_dim = 0, ratio = 1, overlap = 0, rot_dim = 0;
  float attention_factor = 1.0f, norm_eps = 1e-6f;
  int64_t num_tokens = 0;
  bool keep_latent = false;  // a completing token's scratch row: the entry before its RoPE
};
void launch_window_pool(const WindowPoolLaunch& a, cudaStream_t s);

struct SinkAttentionLaunch {
  CkvBatch b;
  Mat out, q;
  const void* raw = nullptr;      // [pages, block_size, 1, D]
  const void* entries = nullptr;  // [pages, entry_rows_per_page, 1, D] or null
  Elem cache_type = Elem::kBF16;
  int entry_rows_per_page = 1;
  const int32_t* topk = nullptr;  // [T, top_k] or null: every complete entry
  int top_k = 0;
  const float* sinks = nullptr;
  int heads = 0, head_dim = 0, window = 1, ratio = 0;
  float scale = 1.0f;
  int64_t num_tokens = 0;
};
inline constexpr int kSinkMaxHeadDim = 512;
void launch_sink_attention(const SinkAttentionLaunch& a, cudaStream_t s);

void launch_gather_table_rows(int32_t* out, const int32_t* ids, const int32_t* table,
                              int64_t num_tokens, int64_t vocab, int k, cudaStream_t s);

}  // namespace atom::kernels::cuda
