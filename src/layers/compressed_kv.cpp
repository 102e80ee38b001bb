#include "layers/compressed_kv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/half.h"
#include "kernels/compressed_kv.h"
#include "layers/rotary.h"

namespace atom {

namespace {

// One window's online softmax-weighted sum per channel: [3, D] = running max, sum of exp, sum
// of exp · C.
struct Pool {
  float* m;
  float* s;
  float* a;
  int64_t D;
  Pool(float* base, int64_t d) : m(base), s(base + d), a(base + 2 * d), D(d) {}
  void clear() {
    std::fill(m, m + D, -std::numeric_limits<float>::infinity());
    std::fill(s, s + D, 0.0f);
    std::fill(a, a + D, 0.0f);
  }
  void add(const float* z, const float* c) {
    for (int64_t d = 0; d < D; ++d) {
      const float mx = std::max(m[d], z[d]);
      const float keep = std::exp(m[d] - mx), e = std::exp(z[d] - mx);
      s[d] = s[d] * keep + e;
      a[d] = a[d] * keep + e * c[d];
      m[d] = mx;
    }
  }
};

}  // namespace

WindowCompressor::WindowCompressor(LayerContext& ctx, const std::string& prefix,
                                   const WindowCompressorOptions& o)
    : o_(o),
      // Unquantised in every checkpoint (DeepSeek's FP8 releases keep the compressors BF16).
      wkv_(ctx, prefix + ".wkv", o.hidden, (o.overlap ? 2 : 1) * o.head_dim, false,
           LinearStorage::kUnquantized) {
  ATOM_CHECK(o.gated || o.ratio == 1, "{}: a compressor without a gate pools windows of 1, not {}",
             prefix, o.ratio);
  if (o.gated)
    wgate_ = std::make_unique<ReplicatedLinear>(ctx, prefix + ".wgate", o.hidden,
                                                (o.overlap ? 2 : 1) * o.head_dim, false,
                                                LinearStorage::kUnquantized);
  ATOM_CHECK(o.ratio >= 1 && o.head_dim >= 2 && o.rot_dim >= 0 && o.rot_dim <= o.head_dim &&
                 o.rot_dim % 2 == 0,
             "{}: a compressor of windows of {} into entries of {} with RoPE over {}", prefix,
             o.ratio, o.head_dim, o.rot_dim);
  if (!ctx.device.is_cpu() && o.rot_dim > 0) {  // the kernels' RoPE table on the device
    ATOM_CHECK(o.inv_freq.size() == static_cast<size_t>(o.rot_dim / 2),
               "{}: {} inverse frequencies for {} rotary channels", prefix, o.inv_freq.size(),
               o.rot_dim);
    inv_freq_ = inv_freq_tensor(o.inv_freq, ctx.device);
  }
  const int64_t width = (o.overlap ? 2 : 1) * o.head_dim;
  if (o.position_bias)
    ape_ = &ctx.params.add(prefix + ".ape", ctx.param_tensor({o.ratio, width}, DType::kF32));
  norm_ = &ctx.params.add(prefix + ".norm.weight", ctx.param_tensor({o.head_dim}, DType::kF32));
  ATOM_CHECK(ctx.cache_specs && ctx.state_specs, "{}: layer context collects no cache specs",
             prefix);
  cache_index_ = static_cast<int>(ctx.cache_specs->size());
  ctx.cache_specs->push_back(CacheSpec::rows(static_cast<int>(o.head_dim), o.ratio, ctx.act_dtype));
  state_index_ = static_cast<int>(ctx.state_specs->size());
  // rollback_rows: a verification step keeps the state after each row (forward's keep_after).
  ctx.state_specs->push_back({{o.overlap ? 2 : 1, 3, o.head_dim}, DType::kF32, true});
}

const Tensor& WindowCompressor::entries(Step& step) const {
  const Tensor& plane = step.kv->plane(static_cast<size_t>(cache_index_), CacheKind::kRows);
  // The CPU reads and writes the rows as floats, CUDA in the activations' dtype: another cache
  // dtype (--kv-cache-dtype fp8) is an error here, never a write past the plane.
  ATOM_CHECK(plane.is_contiguous() && (plane.device().is_cpu() ? plane.dtype() == DType::kF32
                                                               : plane.dtype() == DType::kBF16 ||
                                                                     plane.dtype() == DType::kF16 ||
                                                                     plane.dtype() == DType::kF32),
             "compressed attention: the entries plane {} must be F32 on the CPU and BF16/F16/F32 "
             "on CUDA (the KV cache dtype must be the activations')",
             plane.str());
  return plane;
}

void WindowCompressor::forward(Step& step, const Tensor& x, const EntryHook& on_entry,
                               Tensor* latents) {
  const Batch& b = step.batch;
  Tensor kv = wkv_.forward(step, x);
  Tensor gate = wgate_ ? wgate_->forward(step, x) : Tensor();
  const Tensor& plane = entries(step);
  Tensor& state = step.kv->state.at(static_cast<size_t>(state_index_));
  if (!plane.device().is_cpu()) {
    ATOM_CHECK(!on_entry, "compressed attention: the entry hook runs on the CPU only");
    kernels::CompressedBatch cb{&b.dev.query_start,  &b.dev.context_lens,        &b.dev.page_indptr,
                                &b.dev.page_indices, &b.dev.state_slots,         &b.dev.positions,
                                b.block_size,        &b.dev.state_rollback_slots};
    kernels::WindowPoolArgs a;
    a.head_dim = static_cast<int>(o_.head_dim);
    a.ratio = o_.ratio;
    a.overlap = o_.overlap;
    a.rot_dim = static_cast<int>(o_.rot_dim);
    a.attention_factor = o_.attention_factor;
    a.norm_eps = o_.norm_eps;
    a.keep_latent = latents != nullptr;
    Tensor scratch = step.empty({x.size(0), o_.head_dim}, DType::kF32);
    Tensor out = plane;  // the plane's storage, written by the kernel
    kernels::window_pool(out, state, scratch, kv, gate, ape_ ? ape_->data() : Tensor(),
                         norm_->data(), inv_freq_, cb, a);
    if (latents) *latents = scratch;
    return;
  }
  const int64_t D = o_.head_dim, width = (o_.overlap ? 2 : 1) * D, r = o_.ratio;
  const int64_t slot_floats = (o_.overlap ? 2 : 1) * 3 * D;
  const float* ape = ape_ ? ape_->data().ptr<float>() : nullptr;
  const float* nw = norm_->data().ptr<float>();
  std::vector<float> z(static_cast<size_t>(width)), latent;
  for (int s = 0; s < b.num_seqs(); ++s) {
    const auto [q0, q1, start] = seq_rows(b, s);
    float* st =
        state.ptr<float>() + int64_t{b.state_slots.at(static_cast<size_t>(s))} * slot_floats;
    Pool cur(st, D), next(st + 3 * D, D);  // next: CSA only
    const PagedRows rows = paged_rows(b, s, o_.ratio);
    // Window p / r is complete: its entry, normalised and rotated, into its row; the next
    // window begins.
    auto complete_window = [&](int64_t p) {
      float* e = rows.row(plane, p / r);
      double ss = 0;
      for (int64_t d = 0; d < D; ++d) {
        e[d] = cur.a[d] / cur.s[d];
        ss += static_cast<double>(e[d]) * e[d];
      }
      const float inv =
          1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(D)) + o_.norm_eps);
      for (int64_t d = 0; d < D; ++d) e[d] = nw[d] * (e[d] * inv);
      if (on_entry) {
        latent.assign(e, e + D);
        rope_tail(e, D, o_.rot_dim, (p / r) * r, o_.inv_freq, o_.attention_factor);
        on_entry(s, p / r, latent.data());
      } else {
        rope_tail(e, D, o_.rot_dim, (p / r) * r, o_.inv_freq, o_.attention_factor);
      }
      if (o_.overlap) {
        std::copy(next.m, next.m + 3 * D, cur.m);
        next.clear();
      } else {
        cur.clear();
      }
    };
    for (int64_t i = q0; i < q1; ++i) {
      const int64_t p = start + (i - q0), j = p % r;
      if (p == 0) {  // a new request: no window in progress
        cur.clear();
        if (o_.overlap) next.clear();
      }
      const float* c = kv.ptr<float>() + i * width;
      const float* g = wgate_ ? gate.ptr<float>() + i * width : nullptr;
      for (int64_t k = 0; k < width; ++k)
        z[k] = (g ? g[k] : 0.0f) + (ape ? ape[j * width + k] : 0.0f);
      if (o_.overlap) {
        cur.add(z.data() + D, c + D);  // Cb: this window's entry
        next.add(z.data(), c);         // Ca: the next window's
      } else {
        cur.add(z.data(), c);
      }
      if (j == r - 1) complete_window(p);
      // A speculative verification row with a rollback slot: the windows in progress after it
      // into that slot, so the engine can resume from any accepted row.
      if (!b.state_rollback_slots.empty()) {
        const int32_t to = b.state_rollback_slots[static_cast<size_t>(i)];
        if (to >= 0)
          std::copy(st, st + slot_floats, state.ptr<float>() + int64_t{to} * slot_floats);
      }
    }
  }
}

}  // namespace atom
