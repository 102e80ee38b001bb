// Rotary position embedding for every rope type a checkpoint may name, with transformers'
// inverse-frequency formulas (default, linear, llama3, yarn).
#pragma once

#include <vector>

#include "kernels/attention.h"
#include "kernels/rope.h"
#include "layers/context.h"
#include "loader/hf_config.h"

namespace atom {

struct RopeTables {
  std::vector<float> inv_freq;    // [rot_dim / 2]
  float attention_factor = 1.0f;  // multiplies cos and sin
};

// rot_dim = int(head_dim * partial_rotary_factor); max_position_embeddings feeds yarn defaults.
RopeTables rope_tables(const RopeConfig& rope, int rot_dim, int64_t max_position_embeddings);

// An inv_freq table as the kernels take it: F32 [inv_freq.size()] on `device`.
Tensor inv_freq_tensor(const std::vector<float>& inv_freq, Device device);

class RotaryEmbedding {
 public:
  RotaryEmbedding(LayerContext& ctx, int head_dim, const RopeConfig& rope,
                  int64_t max_position_embeddings, bool interleaved = false);
  // q [T, Hq * head_dim], k [T, Hk * head_dim], rotated in place at step.batch positions.
  void forward(Step& step, Tensor& q, Tensor& k) const;
  // forward() and then writes k (rotated) and v [T, Hk * head_dim] to the cache slots of
  // step.batch, in one kernel on CUDA (scales: FP8 caches only, kernels/attention.h); with
  // `norm`, q's and k's per-head norms first (kernels/rope.h).
  void forward_and_cache(Step& step, Tensor& q, Tensor& k, const Tensor& v, Tensor& k_cache,
                         Tensor& v_cache, kernels::KvScales scales = {},
                         const kernels::QkNorm* norm = nullptr) const;
  int rot_dim() const { return rot_dim_; }
  int head_dim() const { return head_dim_; }
  bool interleaved() const { return interleaved_; }
  float scale() const { return scale_; }
  const Tensor& inv_freq() const { return inv_freq_; }

 private:
  int head_dim_, rot_dim_;
  bool interleaved_;
  float scale_;
  Tensor inv_freq_;  // [rot_dim / 2] F32 on the model's device
};

}  // namespace atom
