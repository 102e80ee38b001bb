// MoonViT, Kimi-K2.5's vision tower, and its patchmerger projector (transformers'
// models/kimi_k25/modeling_kimi_k25.py: Kimi_K25VisionModel, Kimi_K25MultimodalProjection; the
// checkpoint's own names, which vLLM's kimi_k25_vit.py keeps); and Kimi-K3's MoonViT3d with its
// patchmergerv2 (Moonshot's modeling_kimi_k3.py as ROCm/ATOM's kimi_k3_vl.py ports it): the same
// tower with RMSNorms and no biases (norm_type, attn_bias, linear_bias, patch_embed_proj_bias),
// the position grid resized bilinearly (pos_emb_interpolation_mode), an optional qkv width
// (qkv_hidden_size), and a projector proj.0 -> GELU -> proj.2 without biases, then an RMSNorm
// (post_norm) on the text width. K2.5's:
//   - patch_embed.proj: a stride-14 convolution over pre-cut patches [P, 3, 14, 14], i.e. a
//     linear map of each patch's 588 values; plus patch_embed.pos_emb.weight, a learned
//     [pos_h, pos_w, D] grid resized to each image's (h, w) patches by bicubic interpolation
//     (torch's F.interpolate, align_corners=False, A = -0.75, borders clamped);
//   - encoder.blocks.N: pre-norm LayerNorm blocks, x += wo(attn(rope(wqkv(norm0(x))))),
//     x += mlp.fc1(gelu_tanh(mlp.fc0(norm1(x)))); attention is non-causal within each image and
//     never across images; the 2D rotary embedding turns q and k's channel pairs (2m, 2m+1) as
//     complex numbers, pair 2i by the patch's column times freq_i and pair 2i+1 by its row times
//     freq_i, freq_i = 10000^(-4i / head_dim), i < head_dim / 4;
//   - encoder.final_layernorm, then the 2x2 merge: merged token (i, j) of an image is the four
//     patches (2i + a, 2j + b), a, b in {0, 1}, in that order, averaged over a video's frames;
//   - a video (t > 1 frames, at most pos_t): every frame gets the resized grid plus a fixed time
//     embedding (sin | cos of frame · 10000^(-k / (D / 2))), its frames attend to each other (one
//     sequence of t·h·w patches), and it gives (h / 2)·(w / 2) tokens as an image does;
//   - mm_projector: pre_norm (LayerNorm over D, each of the four) -> [4D] -> proj.0 -> GELU (erf)
//     -> proj.2 -> the text width.
// The tower runs on tensor rank 0: on the CPU in fp32, on a CUDA model's GPU in the activations'
// dtype (BF16) on a stream of its own (kernels/encoder.h: non-causal flash attention, or two
// batched cuBLAS GEMMs around a softmax; ATOM_VISION_CUDA=0 keeps a CUDA model's tower on the
// CPU). The position grid is resized and the positional tables built on the host, once per image
// size (cached on the tower's device). Its features come back to the CPU in the tower's dtype and
// reach the text model's embedding rows through the batch.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "layers/context.h"
#include "layers/linear.h"
#include "loader/hf_config.h"
#include "vision/image.h"

namespace atom {

// One image (or video) of a batch: t frames of h x w patches (the image processor's grid).
using vision::ImageGrid;

struct MoonVitConfig {
  int64_t patch_size = 14;
  int64_t hidden = 0, heads = 0, layers = 0, intermediate = 0;
  int64_t qkv_hidden = 0;  // the attention's width (qkv_hidden_size; default hidden)
  bool rms_norm = false;   // RMSNorm (K3) or LayerNorm with bias (K2.5), in the blocks and final
  bool attn_bias = true, mlp_bias = true, patch_bias = true;
  bool bilinear = false;      // the position grid's resize: bilinear (K3) or bicubic (K2.5)
  bool projector_v2 = false;  // patchmergerv2 (K3) or patchmerger (K2.5)
  int64_t pos_h = 64, pos_w = 64;
  int64_t pos_t = 4;  // the most frames a video may have (init_pos_emb_time / pos_emb_time)
  int64_t merge_h = 2, merge_w = 2;
  double norm_eps = 1e-5;
  double projector_eps = 1e-5;
  int64_t text_hidden = 0;
  int64_t image_token_id = -1;
  int64_t head_dim() const { return qkv_hidden / heads; }
  int64_t patch_values() const { return 3 * patch_size * patch_size; }

  // From config.json: vision_config in the hub's names (vt_hidden_size, init_pos_emb_height,
  // ...) or transformers' (hidden_size, pos_emb_height, ...); the projector's eps and the image
  // token from the top level (projection_layer_norm_eps / image_token_id, or the hub's
  // vision_config.projector_ln_eps / media_placeholder_token_id). mm_projector_type
  // patchmergerv2 selects K3's defaults (RMSNorms at vision_config.rms_norm_eps, else
  // nn.RMSNorm's default in the checkpoint's dtype: 2^-7 for bf16; no biases; bilinear), each
  // field overriding. An unsupported variant is an error naming the field.
  static MoonVitConfig parse(const ModelConfig& c);
};

// What a model that takes images exposes to whoever feeds it (Model::vision_encoder).
class VisionEncoder {
 public:
  virtual ~VisionEncoder() = default;
  // pixel_values [P, 3, patch, patch] F32 on the CPU, the images' patches one image after the
  // other (grids[i].num_patches() rows each) -> [sum(patches) / merge, text hidden] on the CPU:
  // the rows that replace each image's placeholder tokens, in order; F32 from a tower on the
  // CPU, the activations' dtype (BF16) from one on a GPU.
  virtual Tensor encode(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) = 0;
  // The same up to the tower's last hidden state (after final_layernorm), [P, D] F32.
  virtual Tensor encode_hidden(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) = 0;
  // Placeholder tokens one image takes in the prompt.
  virtual int64_t tokens_for(const ImageGrid& g) const = 0;
  virtual int64_t image_token_id() const = 0;
  // Why this model cannot run its tower where it is loaded ("" when it can).
  virtual std::string unavailable() const = 0;
};

class MoonVit : public VisionEncoder {
 public:
  // Parameters at `tower` (vision_tower) and `projector` (mm_projector), in the model's registry
  // on its device, unquantised and unsplit whatever `model` says: F32 on the CPU, the
  // activations' dtype on CUDA; the position grid on the CPU in F32.
  MoonVit(const LayerContext& model, MoonVitConfig cfg, const std::string& tower,
          const std::string& projector);
  ~MoonVit() override;
  Tensor encode(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) override;
  Tensor encode_hidden(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) override;
  int64_t tokens_for(const ImageGrid& g) const override;
  int64_t image_token_id() const override { return cfg_.image_token_id; }
  std::string unavailable() const override;
  const MoonVitConfig& config() const { return cfg_; }

 private:
  struct Block;
  struct DeviceState;
  void check_grids(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) const;
  Tensor tower(Step& step, const Tensor& pixel_values, const std::vector<ImageGrid>& grids);
  // The position grid resized to g's (h, w) (bicubic or bilinear), on the host in F32; cached.
  const Tensor& resized_grid(const ImageGrid& g);
  // body(step) on the tower's device (its own stream on CUDA), one call at a time; its result
  // comes back on the CPU in out_dtype (converted on the device).
  template <class F>
  Tensor on_device(DType out_dtype, F&& body);
  LayerContext ctx_;  // the model's, unquantised, in F32 on the CPU and BF16 on CUDA
  MoonVitConfig cfg_;
  std::unique_ptr<DeviceState> state_;
  std::mutex mu_;
  Parameter* patch_w_;            // [D, 3, p, p] F32
  Parameter* patch_b_ = nullptr;  // [D] F32 (patch_bias)
  Parameter* pos_emb_;            // [pos_h, pos_w, D] F32
  std::vector<std::unique_ptr<Block>> blocks_;
  Parameter *final_w_, *final_b_;
  Parameter *pre_norm_w_ = nullptr, *pre_norm_b_ = nullptr;  // patchmerger
  Parameter* post_norm_w_ = nullptr;                         // patchmergerv2
  std::unique_ptr<ReplicatedLinear> proj0_, proj2_;
};

// The tower of a model that takes images (vision_tower.*, mm_projector.*), built on the ranks
// whose model an engine may hold (ModelGroup::model(): the first rank a process holds, which is
// tensor rank 0 of the first or, on a head node over several, of the last pipeline stage); on
// every other rank its modules are declared missing (their tensors are not read) and null comes
// back, so a group holds one or two copies of the tower, not one per rank.
std::unique_ptr<MoonVit> moonvit_on_leader(LayerContext& ctx, const ModelConfig& c);

// torch.nn.functional.interpolate(mode="bicubic", align_corners=False) of src [H, W, C] F32 to
// [h, w, C] (the cubic convolution with A = -0.75, source indices clamped to the borders).
Tensor bicubic_resize_hwc(const Tensor& src, int64_t h, int64_t w);
// The same with mode="bilinear" (source coordinates below 0 clamped to 0, as torch's).
Tensor bilinear_resize_hwc(const Tensor& src, int64_t h, int64_t w);

}  // namespace atom
