// Manifold-constrained hyper-connections (mHC; DeepSeek-V4 and GLM-5.3, transformers'
// DeepseekV4HyperConnection / DeepseekV4HyperHead): the residual is hc_mult streams [T, hc, D]
// instead of one. At each site (attention, feed-forward) the streams are collapsed into the
// sublayer's input and the sublayer's output is written back into every stream:
//   f    = x.flatten() · rsqrt(mean(x²) + norm_eps)          (unweighted, fp32, over hc·D)
//   m    = f · fnᵀ                                             (fn [(2 + hc) hc, hc D])
//   pre  = sigmoid(m[0:hc] scale0 + base[0:hc]) + eps
//   post = 2 sigmoid(m[hc:2hc] scale1 + base[hc:2hc])
//   comb = softmax_row(m[2hc:].view(hc, hc) scale2 + base[2hc:]) + eps, then Sinkhorn: columns,
//          then (iters - 1) times rows and columns normalised (each sum + eps)
//   in   = Σ_j pre_j x_j ;  y = sublayer(norm(in))
//   x'_k = post_k y + Σ_j comb[j, k] x_j
// DeepSeek-V4.1's single-pass form collapses a site's input by the previous site's pre (stream 0
// alone before the first) and carries its own on (mix()'s `carried`, collapse()).
// The final head collapses the streams once more: by learned weights (DeepSeek-V4's hc_head:
// sigmoid(f · fnᵀ · scale + base) + eps) or by their mean (GLM-5.3).
// The maps are kernels (kernels/hyper_connection.h, CPU and CUDA); the streams are F32 on every
// backend, the sublayers' inputs and outputs in the activation dtype.
#pragma once

#include <string>

#include "layers/context.h"

namespace atom {

struct HyperConnectionOptions {
  int64_t hidden = 0;
  int hc_mult = 4;
  int sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;  // the unweighted RMSNorm over the flattened streams
};

// One mHC site. Its parameters are named by the model (the checkpoints' names differ:
// "layers.N.hc_attn_fn" in DeepSeek's release, "layers.N.attn_hc.fn" in transformers' modules).
class HyperConnection {
 public:
  HyperConnection(LayerContext& ctx, const std::string& fn, const std::string& base,
                  const std::string& scale, const HyperConnectionOptions& o);

  struct Mix {
    Tensor input;  // [T, D] in the activation dtype: the streams collapsed by pre
    Tensor post;   // [T, hc]
    Tensor comb;   // [T, hc, hc]
    Tensor pre;    // [T, hc] F32, the site's pre: only in the single-pass form (carried)
  };
  // streams [T, hc, D] F32. DeepSeek-V4.1's single-pass form: `carried` [T, hc] F32 (the previous
  // site's pre) collapses the streams into the input, and the site's own pre is returned in
  // Mix::pre for the next site.
  Mix mix(Step& step, const Tensor& streams, const Tensor* carried = nullptr) const;
  // streams[t, k] = post[t, k] y[t] + Σ_j comb[t, j, k] streams[t, j], in place; y [T, D].
  static void write_back(const Mix& m, const Tensor& y, Tensor& streams);
  // Σ_j pre[t, j] streams[t, j] -> [T, D] in `dtype` (pre [T, hc] F32): DeepSeek-V4.1's last
  // collapse, by the last site's pre.
  static Tensor collapse(Step& step, const Tensor& streams, const Tensor& pre, DType dtype);

 private:
  HyperConnectionOptions o_;
  DType act_dtype_;
  Parameter* fn_;
  Parameter* base_;
  Parameter* scale_;
};

// The streams a model's first layer starts from: every one of the hc streams the embedding e
// [T, D] -> [T, hc, D] F32. Under pipeline parallelism a later stage starts from the previous
// stage's streams instead (hc_streams_from_stage), and a stage before the last hands its own on.
Tensor hc_streams_from_embedding(Step& step, const Tensor& e, int64_t hc);
// The previous stage's streams (Step::pp_in's hidden, the step's own copy, which the layers
// update in place), checked to be [T, hc, D] F32.
Tensor hc_streams_from_stage(Step& step, int64_t hc, int64_t hidden);

// The final collapse of the streams, before the model's norm.
class HyperHead {
 public:
  // Learned weights (DeepSeek-V4: "<fn>" [hc, hc D], "<base>" [hc], "<scale>" [1]).
  HyperHead(LayerContext& ctx, const std::string& fn, const std::string& base,
            const std::string& scale, const HyperConnectionOptions& o);
  // The mean of the streams (GLM-5.3).
  HyperHead(LayerContext& ctx, const HyperConnectionOptions& o);
  // streams [T, hc, D] -> [T, D] in the activation dtype.
  Tensor forward(Step& step, const Tensor& streams) const;

 private:
  HyperConnectionOptions o_;
  DType act_dtype_;
  Parameter* fn_ = nullptr;  // null: the mean
  Parameter* base_ = nullptr;
  Parameter* scale_ = nullptr;
};

}  // namespace atom
