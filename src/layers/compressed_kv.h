// Compressed key/value planes (DeepSeek-V4's HCA and CSA, V4.1's CSA2): where their rows live in
// the paged cache, and the compressor that pools each window of tokens into one row.
//
// Geometry (this part imports no model or scheduler code). A CacheKind::kRows plane holds one row
// per `tokens_per_row` tokens of a sequence, paged by the sequence's block table like every other
// kind: the row of window w (tokens [w r, (w + 1) r)) lives in the page holding the window's last
// token, at row (last % block_size) / r. A page's rows therefore depend only on tokens up to the
// page's end, and a window's row is written in the step that computes its last token, into a
// page that step owns; prefix caching shares full pages, preemption recomputes, and freeing
// returns the page, with no per-model code. tokens_per_row 1 is a per-token plane.
//
// The compressor (transformers' DeepseekV4HCACompressor / DeepseekV4CSACompressor and the
// indexer's own): per token C = wkv(x), Z = wgate(x) + ape[t mod r] (per channel); window w's
// entry is Σ_j softmax_j(Z_j) ⊙ C_j over its r tokens (HCA), or over 2r slots for CSA's
// overlapping windows (the first halves Ca of window w - 1's tokens and the second halves Cb of
// window w's; window 0 has only the latter), then the weighted RMSNorm, then RoPE on the last
// rot_dim channels at position w r. The softmax runs online (running max, sum and weighted sum
// per channel) in a per-request state slot: a window's partial sums follow its request across
// steps, chunks, preemption (recomputed) and prefix-cache hits (the state pool's checkpoints).
// DeepSeek-V4.1's CSA2 uses the same pooling without overlap, position bias or (windows of one
// token) gate (WindowCompressorOptions::position_bias, gated).
// On CUDA the pooling is kernels/compressed_kv.h's window_pool (the entry hook is CPU only).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/index_plane.h"
#include "layers/context.h"
#include "layers/linear.h"

namespace atom {

// The rows of one sequence in a kRows plane [num_pages, rows_per_page, 1, width].
struct PagedRows {
  const int32_t* pages = nullptr;  // the sequence's physical pages in order (its block table)
  int block_size = 16;
  int tokens_per_row = 1;

  // Row of window w: in the page of the window's last token.
  float* row(const Tensor& plane, int64_t w) const { return plane.ptr<float>() + offset(plane, w); }
  // The same row of a byte plane (kU8: a quantised format's codes and scales).
  uint8_t* bytes(const Tensor& plane, int64_t w) const {
    return plane.ptr<uint8_t>() + offset(plane, w);
  }
  // Elements from the plane's start to window w's row.
  int64_t offset(const Tensor& plane, int64_t w) const {
    const int64_t last = w * tokens_per_row + tokens_per_row - 1;
    const int64_t page = pages[last / block_size];
    const int64_t r = (last % block_size) / tokens_per_row;
    return (page * plane.size(1) + r) * plane.size(3);
  }
};

// The sequence s of a step's batch as PagedRows of a plane.
inline PagedRows paged_rows(const Batch& b, int s, int tokens_per_row) {
  return {b.page_indices.data() + b.page_indptr[static_cast<size_t>(s)], b.block_size,
          tokens_per_row};
}

// Sequence s of a step: its rows [q0, q1) of the batch, the first of them at cache index start.
struct SeqRows {
  int64_t q0, q1, start;
};
inline SeqRows seq_rows(const Batch& b, int s) {
  const int64_t q0 = b.query_start[static_cast<size_t>(s)];
  const int64_t q1 = b.query_start[static_cast<size_t>(s) + 1];
  return {q0, q1, b.context_lens[static_cast<size_t>(s)] - (q1 - q0)};
}

// RoPE on interleaved pairs of the last rot_dim channels of v (DeepSeek-V4's layout [nope | rope]),
// at `position`; inverse: the conjugate rotation (−sin), which undoes it.
inline void rope_tail(float* v, int64_t width, int64_t rot_dim, int64_t position,
                      const std::vector<float>& inv_freq, float attention_factor,
                      bool inverse = false) {
  float* r = v + (width - rot_dim);
  for (int64_t i = 0; i < rot_dim / 2; ++i) {
    const float a = static_cast<float>(position) * inv_freq[static_cast<size_t>(i)];
    const float c = std::cos(a) * attention_factor;
    const float s = (inverse ? -std::sin(a) : std::sin(a)) * attention_factor;
    const float x0 = r[2 * i], x1 = r[2 * i + 1];
    r[2 * i] = x0 * c - x1 * s;
    r[2 * i + 1] = x1 * c + x0 * s;
  }
}

// DeepSeek-V4.1's index plane (index_cache_dtype): its row formats, the same code on the host and
// the device, are kernels/index_plane.h's.
using kernels::index_fp4_load;
using kernels::index_fp4_round_query;
using kernels::index_fp4_store;
using kernels::index_fp8_load;
using kernels::index_fp8_round_query;
using kernels::index_fp8_row_bytes;
using kernels::index_fp8_store;

struct WindowCompressorOptions {
  int64_t hidden = 0;
  int64_t head_dim = 0;  // width of an entry
  int ratio = 4;         // tokens a window
  bool overlap = false;  // CSA: 2r slots over windows w - 1 (Ca) and w (Cb)
  int64_t rot_dim = 0;   // RoPE on the last rot_dim channels of an entry
  std::vector<float> inv_freq;
  float attention_factor = 1.0f;
  float norm_eps = 1e-6f;
  // DeepSeek-V4.1's CSA2 compressor: no learned position bias (no "<prefix>.ape"; zeros), and
  // windows of one token have no gate (no "<prefix>.wgate"; a softmax over one slot is 1).
  bool position_bias = true;
  bool gated = true;
};

class WindowCompressor {
 public:
  // Parameters "<prefix>.wkv.weight", "<prefix>.wgate.weight" [(overlap ? 2 : 1) D, hidden],
  // "<prefix>.ape" [r, (overlap ? 2 : 1) D], "<prefix>.norm.weight" [D]. Declares its plane of
  // entries (a row per r tokens) and its state (the online softmax of the windows in progress).
  WindowCompressor(LayerContext& ctx, const std::string& prefix, const WindowCompressorOptions& o);

  // Called for every entry a step completes, after it is written: sequence s of the batch, window
  // w, and the entry's D values after the norm and before RoPE (DeepSeek-V4.1's index key is
  // projected from them).
  using EntryHook = std::function<void(int s, int64_t w, const float* latent)>;

  // Adds x's tokens [T, hidden] (the step's rows, sequence after sequence) to their windows and
  // writes the entry of every window they complete. On CUDA, with `latents`: [T, head_dim] F32
  // whose row t, for a token completing a window, is that entry after the norm and before RoPE
  // (the hook's values; other rows undefined), in the step's arena.
  void forward(Step& step, const Tensor& x, const EntryHook& on_entry = {},
               Tensor* latents = nullptr);
  // The entries plane; entries complete before position p (inclusive): (p + 1) / ratio.
  const Tensor& entries(Step& step) const;
  int ratio() const { return o_.ratio; }
  int64_t head_dim() const { return o_.head_dim; }

 private:
  WindowCompressorOptions o_;
  ReplicatedLinear wkv_;
  std::unique_ptr<ReplicatedLinear> wgate_;  // null: not gated
  Parameter* ape_ = nullptr;                 // null: no position bias
  Parameter* norm_;
  Tensor inv_freq_;  // CUDA: inv_freq on the device
  int cache_index_ = -1;
  int state_index_ = -1;
};

}  // namespace atom
