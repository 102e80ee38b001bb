// DeepSeek-V4's attention on CUDA (layers/compressed_kv.h, models/deepseek_v4.cpp): the per-head
// norm and RoPE of the shared-key/value MQA, the window compressor that pools tokens into the
// rows of a compressed plane, the sink attention over the sliding window plus compressed rows,
// and the hash layers' expert ids. The CPU computes the same in the model and layer code (in
// F32, loop by loop, as transformers' modelling file reads); these are the GPU's forms, tested
// against it (tests/gpu/models: the model on the GPU against the CPU).
#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

// The batch fields these kernels read (device views of layers/batch.h's fields).
struct CompressedBatch {
  const Tensor* query_start = nullptr;   // [S + 1]
  const Tensor* context_lens = nullptr;  // [S]
  const Tensor* page_indptr = nullptr;   // [S + 1]
  const Tensor* page_indices = nullptr;
  const Tensor* state_slots = nullptr;  // [S] (window_pool only)
  const Tensor* positions = nullptr;    // [T] (heads_norm_rope only)
  int block_size = 16;                  // tokens a page
  // [T] or empty (window_pool only): a verification row's slot that receives the windows in
  // progress after that row (-1 none).
  const Tensor* rollback_slots = nullptr;
};

// Per head h < heads of x [T, heads * head_dim] (rows may be strided; F32/BF16/F16), in place:
// with `norm`, x_h · rsqrt(mean(x_h²) + norm_eps) (no weight); then RoPE on interleaved pairs of
// the last rot_dim channels at positions[t] (inverse: the conjugate rotation), cos and sin times
// attention_factor; inv_freq [rot_dim / 2] F32. As layers/compressed_kv.h's rope_tail.
struct HeadsRopeArgs {
  int heads = 1;
  int head_dim = 0;
  int rot_dim = 0;
  float attention_factor = 1.0f;
  bool norm = false;
  float norm_eps = 1e-6f;
  bool inverse = false;
};

// The window compressor's pooling (WindowCompressor::forward): every new token of each sequence
// into its window's online softmax (state [slots, overlap ? 2 : 1, 3, D] F32 at state_slots[s];
// cleared at position 0; a sequence of slot -1, a decode graph's padding, is left alone; after a
// row with rollback_slots[t] >= 0 the state is also written to that slot), and
// each window a token completes written to its row of `plane`
// [num_pages, rows_per_page, 1, D] (the row of window w in the page of its last token):
// the pooled values through the weighted RMSNorm (norm_w [D] F32), then RoPE on the last rot_dim
// channels at position w * ratio (inv_freq [rot_dim / 2] F32, times attention_factor).
//   kv, gate [T, (overlap ? 2 : 1) D] (rows may be strided; gate undefined: no gate)
//   ape [ratio, (overlap ? 2 : 1) D] F32 or undefined (no position bias)
//   scratch [T, D] F32: the pooled values of the windows the step completes; with keep_latent,
//   at the end, each completing token's row holds its entry after the norm and before RoPE
//   (DeepSeek-V4.1 projects its index key from it); other rows are undefined.
struct WindowPoolArgs {
  int head_dim = 0;
  int ratio = 1;
  bool overlap = false;
  int rot_dim = 0;
  float attention_factor = 1.0f;
  float norm_eps = 1e-6f;
  bool keep_latent = false;
};

// Attention of each new token (context index i of its sequence, heads of head_dim with the
// shared key/value rows) over the raw rows max(0, i - window + 1) .. i of `raw` [num_pages,
// block_size, 1, D] and, with `entries` [num_pages, rows_per_page, 1, D] (one row per ratio
// tokens), either every complete entry (i + 1) / ratio (topk undefined) or those topk [T, K] I32
// names (-1: unused), with one sink logit per head (sinks [heads] F32):
//   out_h = Σ_k softmax([sink_h, scale · q_h · key_k])_k key_k    (the sink's share dropped)
// out, q [T, heads * D] (rows may be strided), of the cache's dtype.
struct SinkAttentionArgs {
  int heads = 0;
  int head_dim = 0;
  int window = 1;
  int ratio = 0;  // tokens an entry; 0: no entries
  float scale = 1.0f;
  int max_query_len = 0;
};

namespace cuda {
void heads_norm_rope(Tensor& x, const Tensor& inv_freq, const CompressedBatch& b,
                     const HeadsRopeArgs& a);
void window_pool(Tensor& plane, Tensor& state, Tensor& scratch, const Tensor& kv,
                 const Tensor& gate, const Tensor& ape, const Tensor& norm_w,
                 const Tensor& inv_freq, const CompressedBatch& b, const WindowPoolArgs& a);
void sink_attention(Tensor& out, const Tensor& q, const Tensor& raw, const Tensor& entries,
                    const Tensor& topk, const Tensor& sinks, const CompressedBatch& b,
                    const SinkAttentionArgs& a);
// out[t] = table[token_ids[t]] ([T, K] I32 from [vocab, K] I32; an id outside the table: -1s).
void gather_table_rows(Tensor& out, const Tensor& token_ids, const Tensor& table);
}  // namespace cuda

inline void heads_norm_rope(Tensor& x, const Tensor& inv_freq, const CompressedBatch& b,
                            const HeadsRopeArgs& a) {
  ATOM_CHECK(!x.device().is_cpu(), "heads_norm_rope: CUDA only (the CPU's is rope_tail)");
  check_same_device("heads_norm_rope", x.device(), {&inv_freq, b.positions});
  ATOM_KERNEL_CUDA("heads_norm_rope", cuda::heads_norm_rope(x, inv_freq, b, a));
}

inline void window_pool(Tensor& plane, Tensor& state, Tensor& scratch, const Tensor& kv,
                        const Tensor& gate, const Tensor& ape, const Tensor& norm_w,
                        const Tensor& inv_freq, const CompressedBatch& b, const WindowPoolArgs& a) {
  ATOM_CHECK(!plane.device().is_cpu(),
             "window_pool: CUDA only (the CPU's is WindowCompressor::forward)");
  check_same_device("window_pool", plane.device(),
                    {&state, &scratch, &kv, &gate, &ape, &norm_w, &inv_freq, b.query_start,
                     b.context_lens, b.page_indptr, b.page_indices, b.state_slots});
  ATOM_KERNEL_CUDA("window_pool",
                   cuda::window_pool(plane, state, scratch, kv, gate, ape, norm_w, inv_freq, b, a));
}

inline void sink_attention(Tensor& out, const Tensor& q, const Tensor& raw, const Tensor& entries,
                           const Tensor& topk, const Tensor& sinks, const CompressedBatch& b,
                           const SinkAttentionArgs& a) {
  ATOM_CHECK(!out.device().is_cpu(),
             "sink_attention: CUDA only (the CPU's is deepseek_v4_sink_attention)");
  check_same_device("sink_attention", out.device(),
                    {&q, &raw, &entries, &topk, &sinks, b.query_start, b.context_lens,
                     b.page_indptr, b.page_indices});
  ATOM_KERNEL_CUDA("sink_attention", cuda::sink_attention(out, q, raw, entries, topk, sinks, b, a));
}

inline void gather_table_rows(Tensor& out, const Tensor& token_ids, const Tensor& table) {
  ATOM_CHECK(!out.device().is_cpu(), "gather_table_rows: CUDA only");
  check_same_device("gather_table_rows", out.device(), {&token_ids, &table});
  ATOM_KERNEL_CUDA("gather_table_rows", cuda::gather_table_rows(out, token_ids, table));
}

}  // namespace atom::kernels
