#include "models/moonvit.h"

#include <cmath>
#include <array>
#include <cstddef>
#include <functional>

#include "core/convert.h"
#include "core/env.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "kernels/layer_norm.h"
#include "kernels/linear.h"
#include "kernels/rms_norm.h"
#ifdef ATOM_HAVE_CUDA
#include "core/cuda_stream.h"
#endif

namespace atom {

namespace {

// The first of `keys` present in `f`, else `fallback`.
int64_t int_of(const ConfigFields& f, std::initializer_list<const char*> keys, int64_t fallback,
               IntRange range = {}) {
  for (const char* k : keys)
    if (f.has(k)) return f.get_int(k, range);
  return fallback;
}

double double_of(const ConfigFields& f, std::initializer_list<const char*> keys, double fallback) {
  for (const char* k : keys)
    if (f.has(k)) return f.get_double(k, RealRange{0.0, 1.0});
  return fallback;
}

float cubic1(float x, float A) { return ((A + 2) * x - (A + 3)) * x * x + 1; }
float cubic2(float x, float A) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; }

// torch's bicubic source taps for output index `dst` of `out` over `in` (align_corners=False).
void cubic_taps(int64_t dst, int64_t in, int64_t out, int64_t idx[4], float wt[4]) {
  const float A = -0.75f;
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  const float real = scale * (static_cast<float>(dst) + 0.5f) - 0.5f;
  const float fl = std::floor(real);
  const float t = real - fl;
  wt[0] = cubic2(t + 1.0f, A);
  wt[1] = cubic1(t, A);
  wt[2] = cubic1(1.0f - t, A);
  wt[3] = cubic2(2.0f - t, A);
  for (int k = 0; k < 4; ++k)
    idx[k] = std::min<int64_t>(std::max<int64_t>(static_cast<int64_t>(fl) - 1 + k, 0), in - 1);
}

Tensor f32(const Tensor& t) {
  return t.dtype() == DType::kF32 ? t : tensor_cast_cpu(t, DType::kF32);
}

}  // namespace

MoonVitConfig MoonVitConfig::parse(const ModelConfig& c) {
  ATOM_CHECK(c.root.obj().contains("vision_config") && c.root.obj()["vision_config"].is_object(),
             "{}: vision_config is missing or not an object", c.path);
  const ConfigFields v(c.root.obj()["vision_config"], c.path + " vision_config");
  MoonVitConfig m;
  const IntRange positive{1, 1 << 20};
  m.patch_size = int_of(v, {"patch_size"}, 14, IntRange{1, 64});
  m.hidden = int_of(v, {"vt_hidden_size", "hidden_size"}, 1152, positive);
  m.heads = int_of(v, {"vt_num_attention_heads", "num_attention_heads"}, 16, IntRange{1, 1024});
  m.layers = int_of(v, {"vt_num_hidden_layers", "num_hidden_layers"}, 27, IntRange{1, 1024});
  m.intermediate = int_of(v, {"vt_intermediate_size", "intermediate_size"}, 4304, positive);
  m.pos_h = int_of(v, {"init_pos_emb_height", "pos_emb_height"}, 64, IntRange{1, 4096});
  m.pos_w = int_of(v, {"init_pos_emb_width", "pos_emb_width"}, 64, IntRange{1, 4096});
  m.pos_t = int_of(v, {"init_pos_emb_time", "pos_emb_time"}, 4, IntRange{1, 4096});
  m.qkv_hidden = int_of(v, {"qkv_hidden_size"}, m.hidden, positive);
  if (m.qkv_hidden % m.heads != 0 || m.head_dim() % 4 != 0) {
    // The field that sets the attention's width, in the names the config uses.
    const char* width = v.has("qkv_hidden_size")  ? "qkv_hidden_size"
                        : v.has("vt_hidden_size") ? "vt_hidden_size"
                                                  : "hidden_size";
    const char* heads =
        v.has("vt_num_attention_heads") ? "vt_num_attention_heads" : "num_attention_heads";
    v.bad(width, std::string("must be ") + heads +
                     " heads of a width divisible by 4 (the 2D rotary embedding), got " +
                     std::to_string(m.qkv_hidden) + " over " + std::to_string(m.heads));
  }
  // K3's defaults with its projector, K2.5's with patchmerger; each field overrides.
  const std::string projector = v.get_string("mm_projector_type", "patchmerger");
  if (projector != "patchmerger" && projector != "patchmergerv2")
    v.bad("mm_projector_type",
          "must be patchmerger (Kimi-K2.5) or patchmergerv2 (Kimi-K3), got '" + projector + "'");
  m.projector_v2 = projector == "patchmergerv2";
  const std::string norm = v.get_string("norm_type", m.projector_v2 ? "rmsnorm" : "layernorm");
  if (norm != "rmsnorm" && norm != "layernorm")
    v.bad("norm_type", "must be rmsnorm or layernorm, got '" + norm + "'");
  m.rms_norm = norm == "rmsnorm";
  m.attn_bias = v.get_bool("attn_bias", !m.projector_v2);
  m.mlp_bias = v.get_bool("linear_bias", !m.projector_v2);
  m.patch_bias = v.get_bool("patch_embed_proj_bias", !m.projector_v2);
  const std::string interp =
      v.get_string("pos_emb_interpolation_mode", m.projector_v2 ? "bilinear" : "bicubic");
  if (interp != "bilinear" && interp != "bicubic")
    v.bad("pos_emb_interpolation_mode", "must be bilinear or bicubic, got '" + interp + "'");
  m.bilinear = interp == "bilinear";
  if (m.rms_norm) {
    // nn.RMSNorm(eps=None): the machine epsilon of the dtype the tower runs in, the checkpoint's.
    const double machine = c.dtype == DType::kBF16  ? 0.0078125
                           : c.dtype == DType::kF16 ? 0.0009765625
                                                    : 1.1920928955078125e-07;
    m.norm_eps =
        v.has("rms_norm_eps") ? v.get_double("rms_norm_eps", RealRange{0.0, 1.0}) : machine;
  }
  if (v.has("mlp_type") && v.get_string("mlp_type") != "mlp2")
    v.bad("mlp_type", "only mlp2 (fc0 -> gelu_tanh -> fc1) is implemented");
  if (v.has("pos_emb_type") && v.get_string("pos_emb_type") != "divided_fixed")
    v.bad("pos_emb_type", "only divided_fixed is implemented");
  if (v.has("merge_kernel_size")) {
    const auto k = v.get_int_list("merge_kernel_size");
    if (k.size() != 2 || k[0] != 2 || k[1] != 2)
      v.bad("merge_kernel_size", "only the 2x2 merge is implemented");
  }
  const std::string act = v.get_string("hidden_act", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh" && act != "gelu_tanh")
    v.bad("hidden_act", "must be gelu_pytorch_tanh (or gelu_tanh), got '" + act + "'");
  if (v.has("merge_type") && v.get_string("merge_type") != "sd2_tpool")
    v.bad("merge_type", "only sd2_tpool is implemented, got '" + v.get_string("merge_type") + "'");
  m.projector_eps = c.root.has("projection_layer_norm_eps")
                        ? c.root.get_double("projection_layer_norm_eps", RealRange{0.0, 1.0})
                        : double_of(v, {"projector_ln_eps"}, 1e-5);
  const int64_t proj_hidden = int_of(c.root, {"projection_hidden_size"}, m.hidden, positive);
  if (proj_hidden != m.hidden)
    c.root.bad("projection_hidden_size", "must be the vision width " + std::to_string(m.hidden));
  if (int_of(v, {"mm_hidden_size"}, m.hidden, positive) != m.hidden)
    v.bad("mm_hidden_size", "must be the vision width " + std::to_string(m.hidden));
  m.text_hidden = c.hidden_size;
  if (int_of(v, {"text_hidden_size"}, m.text_hidden, positive) != m.text_hidden)
    v.bad("text_hidden_size",
          "must be the text model's hidden_size " + std::to_string(m.text_hidden));
  m.image_token_id = int_of(c.root, {"image_token_id", "media_placeholder_token_id"}, -1,
                            IntRange{0, c.vocab_size - 1});
  if (m.image_token_id < 0)
    c.root.bad("image_token_id", "is missing (or media_placeholder_token_id)");
  return m;
}

struct MoonVit::Block {
  Parameter *norm0_w, *norm0_b, *norm1_w, *norm1_b;
  std::unique_ptr<ReplicatedLinear> wqkv, wo, fc0, fc1;
};

namespace {
// src [H, W, C] F32 resized to [h, w, C] by a separable filter: taps(dst, in, out, idx, wt) gives
// output index dst's N source indices (clamped) and weights along an axis.
template <int N, class Taps>
Tensor separable_resize_hwc(const char* what, const Tensor& src, int64_t h, int64_t w, Taps taps) {
  ATOM_CHECK(src.dim() == 3 && src.dtype() == DType::kF32 && src.device().is_cpu(),
             "{}: src must be F32 [H, W, C] on the CPU, got {}", what, src.str());
  ATOM_CHECK(h > 0 && w > 0, "{}: size {}x{}", what, h, w);
  const int64_t H = src.size(0), W = src.size(1), C = src.size(2);
  const Tensor s = src.contiguous();
  const float* in = s.ptr<float>();
  Tensor out = Tensor::zeros({h, w, C}, DType::kF32);
  float* o = out.ptr<float>();
#pragma omp parallel for
  for (int64_t y = 0; y < h; ++y) {
    int64_t iy[N], ix[N];
    float wy[N], wx[N];
    taps(y, H, h, iy, wy);
    for (int64_t x = 0; x < w; ++x) {
      taps(x, W, w, ix, wx);
      float* dst = o + (y * w + x) * C;
      for (int a = 0; a < N; ++a)
        for (int b = 0; b < N; ++b) {
          const float k = wy[a] * wx[b];
          const float* row = in + (iy[a] * W + ix[b]) * C;
          for (int64_t ch = 0; ch < C; ++ch) dst[ch] += k * row[ch];
        }
    }
  }
  return out;
}

// torch's linear taps: source index (dst + 0.5) * in / out - 0.5, below 0 clamped to 0.
void linear_taps(int64_t dst, int64_t in, int64_t out, int64_t idx[2], float wt[2]) {
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  const float real = std::max(scale * (static_cast<float>(dst) + 0.5f) - 0.5f, 0.0f);
  idx[0] = std::min(static_cast<int64_t>(real), in - 1);
  idx[1] = std::min(idx[0] + 1, in - 1);
  wt[1] = real - static_cast<float>(idx[0]);
  wt[0] = 1.0f - wt[1];
}
}  // namespace

Tensor bicubic_resize_hwc(const Tensor& src, int64_t h, int64_t w) {
  return separable_resize_hwc<4>("bicubic_resize_hwc", src, h, w, cubic_taps);
}

Tensor bilinear_resize_hwc(const Tensor& src, int64_t h, int64_t w) {
  return separable_resize_hwc<2>("bilinear_resize_hwc", src, h, w, linear_taps);
}

namespace {
// x [rows, dim] F32 normalised: LayerNorm (w, b) or RMSNorm (w).
void vit_norm(Tensor& out, const Tensor& x, const Parameter* w, const Parameter* b, bool rms,
              float eps) {
  if (rms)
    kernels::rms_norm(out, x, nullptr, w->data(), eps);
  else
    kernels::layer_norm(out, x, w->data(), b->data(), eps);
}

// The model's context for the tower: unquantised and unsplit, on the model's device, in F32 on
// the CPU and in the activations' dtype (BF16) on CUDA.
// A CUDA model's tower runs on its GPU (tests/kernels/encoder_test.cpp, GpuKimiK25.*);
// ATOM_VISION_CUDA=0 keeps it on the CPU in F32 instead.
LayerContext tower_ctx(const LayerContext& model) {
  LayerContext c = model;
  if (!model.device.is_cpu() && !env_bool("ATOM_VISION_CUDA", true)) c.device = Device::cpu();
  const DType t = c.device.is_cpu() ? DType::kF32 : model.act_dtype;
  c.weight_dtype = t;
  c.act_dtype = t;
  c.tp_rank = 0;
  c.tp_size = 1;
  c.quant = nullptr;
  c.fp8_resident = false;
  c.expert_parallel = false;
  return c;
}

// A host tensor on `device` (itself on the CPU).
Tensor upload(const Tensor& host, Device device) {
  return device.is_cpu() ? host : host.to(device);
}
}  // namespace

MoonVit::MoonVit(const LayerContext& model, MoonVitConfig cfg, const std::string& tower,
                 const std::string& projector)
    : ctx_(tower_ctx(model)), cfg_(std::move(cfg)), state_(std::make_unique<DeviceState>()) {
  LayerContext& ctx = ctx_;
  const int64_t D = cfg_.hidden, p = cfg_.patch_size;
  auto param = [&](const std::string& name, Shape shape) {
    return &ctx.params.add(name, Tensor::zeros(std::move(shape), ctx.weight_dtype, ctx.device));
  };
  const int64_t Q = cfg_.qkv_hidden;
  const bool ln = !cfg_.rms_norm;
  patch_w_ = param(tower + ".patch_embed.proj.weight", {D, 3, p, p});
  if (cfg_.patch_bias) patch_b_ = param(tower + ".patch_embed.proj.bias", {D});
  // The position grid is resized on the host, per image: it stays there in F32.
  pos_emb_ = &ctx.params.add(tower + ".patch_embed.pos_emb.weight",
                             Tensor::zeros({cfg_.pos_h, cfg_.pos_w, D}, DType::kF32));
  for (int64_t i = 0; i < cfg_.layers; ++i) {
    const std::string b = tower + ".encoder.blocks." + std::to_string(i);
    auto blk = std::make_unique<Block>();
    blk->norm0_w = param(b + ".norm0.weight", {D});
    blk->norm0_b = ln ? param(b + ".norm0.bias", {D}) : nullptr;
    blk->norm1_w = param(b + ".norm1.weight", {D});
    blk->norm1_b = ln ? param(b + ".norm1.bias", {D}) : nullptr;
    blk->wqkv = std::make_unique<ReplicatedLinear>(ctx, b + ".wqkv", D, 3 * Q, cfg_.attn_bias);
    blk->wo = std::make_unique<ReplicatedLinear>(ctx, b + ".wo", Q, D, cfg_.attn_bias);
    blk->fc0 = std::make_unique<ReplicatedLinear>(ctx, b + ".mlp.fc0", D, cfg_.intermediate,
                                                  cfg_.mlp_bias);
    blk->fc1 = std::make_unique<ReplicatedLinear>(ctx, b + ".mlp.fc1", cfg_.intermediate, D,
                                                  cfg_.mlp_bias);
    blocks_.push_back(std::move(blk));
  }
  final_w_ = param(tower + ".encoder.final_layernorm.weight", {D});
  final_b_ = ln ? param(tower + ".encoder.final_layernorm.bias", {D}) : nullptr;
  const bool v2 = cfg_.projector_v2;
  if (v2) {
    post_norm_w_ = param(projector + ".post_norm.weight", {cfg_.text_hidden});
  } else {
    pre_norm_w_ = param(projector + ".pre_norm.weight", {D});
    pre_norm_b_ = param(projector + ".pre_norm.bias", {D});
  }
  proj0_ = std::make_unique<ReplicatedLinear>(ctx, projector + ".proj.0", 4 * D, 4 * D, !v2);
  proj2_ =
      std::make_unique<ReplicatedLinear>(ctx, projector + ".proj.2", 4 * D, cfg_.text_hidden, !v2);
}

MoonVit::~MoonVit() = default;

int64_t MoonVit::tokens_for(const ImageGrid& g) const {
  return (g.h / cfg_.merge_h) * (g.w / cfg_.merge_w);  // a video's frames are averaged
}

std::string MoonVit::unavailable() const { return ""; }

std::unique_ptr<MoonVit> moonvit_on_leader(LayerContext& ctx, const ModelConfig& c) {
  const MoonVitConfig cfg = MoonVitConfig::parse(c);  // every rank checks the config
  if (ctx.tp_rank == 0 && (ctx.stage.first() || ctx.stage.last()))
    return std::make_unique<MoonVit>(ctx, cfg, "vision_tower", "mm_projector");
  ctx.params.add_missing_module("vision_tower");
  ctx.params.add_missing_module("mm_projector");
  return nullptr;
}

void MoonVit::check_grids(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) const {
  const int64_t p = cfg_.patch_size;
  ATOM_CHECK(pixel_values.dim() == 4 && pixel_values.size(1) == 3 && pixel_values.size(2) == p &&
                 pixel_values.size(3) == p && pixel_values.dtype() == DType::kF32,
             "MoonViT: pixel_values must be F32 [patches, 3, {}, {}], got {}", p, p,
             pixel_values.str());
  ATOM_CHECK(!grids.empty(), "MoonViT: no images");
  int64_t total = 0;
  for (size_t i = 0; i < grids.size(); ++i) {
    const ImageGrid& g = grids[i];
    ATOM_CHECK(g.t >= 1 && g.t <= cfg_.pos_t,
               "MoonViT: image {} has {} frames; the tower takes 1 to {} (init_pos_emb_time)", i,
               g.t, cfg_.pos_t);
    ATOM_CHECK(g.h > 0 && g.w > 0 && g.h % cfg_.merge_h == 0 && g.w % cfg_.merge_w == 0 &&
                   g.h <= 4096 && g.w <= 4096,
               "MoonViT: image {}'s grid {}x{} is not a positive multiple of the 2x2 merge", i, g.h,
               g.w);
    total += g.num_patches();
  }
  ATOM_CHECK(total == pixel_values.size(0),
             "MoonViT: the grids give {} patches, pixel_values has {}", total,
             pixel_values.size(0));
}

namespace {
// The tower's positional inputs, built on the host: the resized position grid plus, for a
// video's frames, the fixed time table ([P, D] F32); and the 2D rotary angles' cos and sin per
// patch and channel pair ([P, head_dim / 2] F32 each).
struct Positions {
  Tensor pos, cos, sin;
};

Positions positions(const MoonVitConfig& cfg,
                    const std::function<Tensor(const ImageGrid&)>& grid_of,
                    const std::vector<ImageGrid>& grids, int64_t P) {
  const int64_t D = cfg.hidden, hd = cfg.head_dim(), pairs = hd / 2, nf = hd / 4;
  Positions r{Tensor::empty({P, D}, DType::kF32), Tensor::empty({P, pairs}, DType::kF32),
              Tensor::empty({P, pairs}, DType::kF32)};
  std::vector<float> freqs(static_cast<size_t>(nf));  // 10000^(-4i / head_dim)
  for (int64_t i = 0; i < nf; ++i)
    freqs[static_cast<size_t>(i)] = static_cast<float>(
        std::pow(10000.0, -static_cast<double>(4 * i) / static_cast<double>(hd)));
  float* pos = r.pos.ptr<float>();
  float* cosv = r.cos.ptr<float>();
  float* sinv = r.sin.ptr<float>();
  int64_t row = 0;
  for (const ImageGrid& g : grids) {
    const Tensor grid = grid_of(g);
    const float* ps = grid.ptr<float>();
    const int64_t hw = g.h * g.w;
    for (int64_t f = 0; f < g.t; ++f) {
      float* dst = pos + (row + f * hw) * D;
      std::copy(ps, ps + hw * D, dst);
      if (g.t > 1) {
        // A video's frame f: the fixed time table's row f (sin | cos).
        std::vector<float> te(static_cast<size_t>(D));
        for (int64_t k = 0; k < D / 2; ++k) {
          const double ang =
              static_cast<double>(f) *
              std::pow(10000.0, -static_cast<double>(k) / (static_cast<double>(D) / 2));
          te[static_cast<size_t>(k)] = static_cast<float>(std::sin(ang));
          te[static_cast<size_t>(k + D / 2)] = static_cast<float>(std::cos(ang));
        }
        for (int64_t n = 0; n < hw; ++n)
          for (int64_t k = 0; k < D; ++k) dst[n * D + k] += te[static_cast<size_t>(k)];
      }
      for (int64_t y = 0; y < g.h; ++y)
        for (int64_t x = 0; x < g.w; ++x) {
          const int64_t n = row + f * hw + y * g.w + x;
          for (int64_t i = 0; i < nf; ++i) {
            const float fi = freqs[static_cast<size_t>(i)];
            const float ax = static_cast<float>(x) * fi, ay = static_cast<float>(y) * fi;
            cosv[n * pairs + 2 * i] = std::cos(ax);
            sinv[n * pairs + 2 * i] = std::sin(ax);
            cosv[n * pairs + 2 * i + 1] = std::cos(ay);
            sinv[n * pairs + 2 * i + 1] = std::sin(ay);
          }
        }
    }
    row += g.num_patches();
  }
  return r;
}

// Columns padded for CUDA's GEMMs: rows of 16 bytes (the patch's 3 · 14 · 14 = 588 values are
// not); the CPU takes any width.
int64_t padded_cols(int64_t cols, Device device) {
  return device.is_cpu() ? cols : (cols + 7) / 8 * 8;
}

// src [R, C] on the host as [R, cols] of `dtype` (zeros past C).
Tensor host_padded(const Tensor& src, int64_t cols, DType dtype) {
  const Tensor f = tensor_cast_cpu(src, DType::kF32);
  const int64_t R = f.size(0), C = f.size(1);
  Tensor p = Tensor::zeros({R, cols}, DType::kF32);
  for (int64_t r = 0; r < R; ++r)
    std::copy(f.ptr<float>() + r * C, f.ptr<float>() + (r + 1) * C, p.ptr<float>() + r * cols);
  return dtype == DType::kF32 ? p : tensor_cast_cpu(p, dtype);
}
}  // namespace

namespace {
Tensor bias_of(LinearBase& l) { return l.bias() ? l.bias()->data() : Tensor(); }

// x += l(in): one GEMM accumulating into x where the backend has it (kernels::linear_accumulate),
// else the product into a step tensor and an add.
void residual_linear(Step& step, Tensor& x, LinearBase& l, const Tensor& in, bool fused) {
  if (fused && kernels::linear_accumulate(x, in, l.weight().data(), bias_of(l))) return;
  const Tensor y = l.forward(step, in);
  kernels::add(x, x, y);
}
}  // namespace

// The stream a tower on CUDA runs on: its own, so that encoding an image on a server thread
// overlaps the engine's steps instead of queueing behind them.
struct MoonVit::DeviceState {
#ifdef ATOM_HAVE_CUDA
  std::unique_ptr<CudaStream> stream;
#endif
  Tensor patch_w;  // patch_embed.proj.weight [D, padded patch values] on the device
  // The position grid resized to the last few image sizes (h, w), on the host in F32.
  std::vector<std::pair<std::pair<int64_t, int64_t>, Tensor>> grids;
  // The positional inputs of the last few grids (t, h, w), on the tower's device: pos in the
  // activations' dtype, cos and sin in F32. Built on the host (the resize, a video's time table,
  // the rotary angles: tens of milliseconds for a 1024x1024 image) once per size.
  struct Tables {
    std::array<int64_t, 3> thw;
    Tensor pos, cos, sin;
    int64_t bytes() const { return pos.nbytes() + cos.nbytes() + sin.nbytes(); }
  };
  std::vector<Tables> tables;
  int64_t table_bytes = 0;
};

const Tensor& MoonVit::resized_grid(const ImageGrid& g) {
  auto& cache = state_->grids;
  for (auto& [hw, t] : cache)
    if (hw == std::pair{g.h, g.w}) return t;
  const Tensor& src = pos_emb_->data();
  Tensor t = (g.h == cfg_.pos_h && g.w == cfg_.pos_w) ? src
             : cfg_.bilinear                          ? bilinear_resize_hwc(src, g.h, g.w)
                                                      : bicubic_resize_hwc(src, g.h, g.w);
  if (cache.size() >= 8) cache.erase(cache.begin());
  cache.emplace_back(std::pair{g.h, g.w}, std::move(t));
  return cache.back().second;
}

Tensor MoonVit::tower(Step& step, const Tensor& pixel_values, const std::vector<ImageGrid>& grids) {
  const int64_t D = cfg_.hidden, P = pixel_values.size(0), H = cfg_.heads, hd = cfg_.head_dim();
  const int64_t Q = cfg_.qkv_hidden;
  const Device dev = ctx_.device;
  const DType at = ctx_.act_dtype;
  const float eps = static_cast<float>(cfg_.norm_eps);
  // Patch embedding: the convolution is a linear map of each patch's 3 · p · p values.
  const int64_t K = cfg_.patch_values(), Kp = padded_cols(K, dev);
  if (!state_->patch_w.defined())
    state_->patch_w = upload(host_padded(patch_w_->data().view({D, K}), Kp, at), dev);
  Tensor x = step.arena.alloc({P, D}, at);
  {
    const Tensor flat = pixel_values.contiguous().view({P, K});
    Tensor pix = flat;
    if (!dev.is_cpu()) {
      // F32 up as they are, then cast into zero-padded rows of the activations' dtype on the
      // device (the padding must be zeros: the weight's padded columns are, and 0 * NaN is not).
      // (In the step's arena, as everything this call's kernels read: the arena outlives the
      // stream's synchronisation, a tensor freed earlier could be handed to another stream.)
      Tensor up = step.arena.alloc({P, K}, DType::kF32);
      up.copy_from(flat);
      pix = step.arena.alloc({P, Kp}, at);
      pix.zero_();
      Tensor body = pix.narrow(1, 0, K);
      kernels::cast(body, up);
    }
    kernels::linear(x, pix, state_->patch_w, patch_b_ ? patch_b_->data() : Tensor());
  }
  const int64_t pairs = hd / 2;
  auto tables_of = [&](const ImageGrid& g) -> const DeviceState::Tables& {
    const std::array<int64_t, 3> thw{g.t, g.h, g.w};
    auto& cache = state_->tables;
    for (const auto& e : cache)
      if (e.thw == thw) return e;
    const Positions host = positions(
        cfg_, [&](const ImageGrid& gg) { return resized_grid(gg); }, {g}, g.num_patches());
    DeviceState::Tables e{thw,
                          upload(at == DType::kF32 ? host.pos : tensor_cast_cpu(host.pos, at), dev),
                          upload(host.cos, dev), upload(host.sin, dev)};
    const int64_t bytes = e.bytes();
    // At most eight sizes and 256 MiB, oldest out first; never the tables of this call's own
    // grids, which its kernels may not have read yet.
    for (size_t i = 0; i < cache.size() &&
                       (cache.size() >= 8 || state_->table_bytes + bytes > (int64_t{256} << 20));) {
      bool mine = false;
      for (const ImageGrid& o : grids) mine = mine || cache[i].thw == std::array{o.t, o.h, o.w};
      if (mine) {
        ++i;
        continue;
      }
      state_->table_bytes -= cache[i].bytes();
      cache.erase(cache.begin() + static_cast<std::ptrdiff_t>(i));
    }
    state_->table_bytes += bytes;
    cache.push_back(std::move(e));
    return cache.back();
  };
  Tensor cosv, sinv;
  if (grids.size() == 1) {
    const DeviceState::Tables& e = tables_of(grids[0]);
    kernels::add(x, x, e.pos);
    cosv = e.cos;
    sinv = e.sin;
  } else {
    // Several images: their tables copied (on the device) into one of each.
    Tensor pos = step.arena.alloc({P, D}, at);
    cosv = step.arena.alloc({P, pairs}, DType::kF32);
    sinv = step.arena.alloc({P, pairs}, DType::kF32);
    int64_t row = 0;
    for (const ImageGrid& g : grids) {
      const int64_t n = g.num_patches();
      const DeviceState::Tables& e = tables_of(g);
      pos.narrow(0, row, n).copy_from(e.pos);
      cosv.narrow(0, row, n).copy_from(e.cos);
      sinv.narrow(0, row, n).copy_from(e.sin);
      row += n;
    }
    kernels::add(x, x, pos);
  }
  std::vector<int64_t> starts{0};
  for (const ImageGrid& g : grids) starts.push_back(starts.back() + g.num_patches());
  kernels::EncoderAttention attn_args{static_cast<int>(H), static_cast<int>(hd),
                                      1.0f / std::sqrt(static_cast<float>(hd))};

  Tensor h = step.arena.alloc({P, D}, at);
  Tensor attn = step.arena.alloc({P, Q}, at);
  // ATOM_VISION_EPILOGUES=0: the RoPE, GELU and the residual adds as their own kernels on CUDA
  // too (the unfused path, for comparison).
  static const bool fused = env_bool("ATOM_VISION_EPILOGUES", true);
  // The RoPE inside the attention: on the CPU always (the same rotation, in place); on CUDA in the
  // pass that pads the heads for the flash kernel unless ATOM_VISION_FUSED_ROPE=0 (then
  // rotate_pairs in place and the plain copies; 28.98 against 31.98 ms at 1024², H100).
  static const bool fused_rope = env_bool("ATOM_VISION_FUSED_ROPE", true);
  const bool rope_inside = fused && (dev.is_cpu() || fused_rope);
  if (rope_inside) {
    attn_args.rope_cos = &cosv;
    attn_args.rope_sin = &sinv;
  }
  for (auto& blk : blocks_) {
    const Arena::Mark m = step.arena.mark();
    vit_norm(h, x, blk->norm0_w, blk->norm0_b, cfg_.rms_norm, eps);
    Tensor qkv = blk->wqkv->forward(step, h);
    // The 2D RoPE of q and k inside the attention (on CUDA's flash path, in the pass that pads
    // the heads), or first.
    if (!rope_inside) {
      Tensor qk = qkv.narrow(1, 0, 2 * Q);
      kernels::rotate_pairs(qk, cosv, sinv, static_cast<int>(hd));
    }
    kernels::encoder_attention(attn, qkv, starts, attn_args, step.arena);
    // x += wo(attn); f = gelu_tanh(fc0(h)); x += fc1(f): in the GEMMs' epilogues where the
    // backend has them (CUDA), else as separate ops.
    residual_linear(step, x, *blk->wo, attn, fused);
    vit_norm(h, x, blk->norm1_w, blk->norm1_b, cfg_.rms_norm, eps);
    Tensor f = step.arena.alloc({P, blk->fc0->out_per_rank()}, at);
    if (!fused || !kernels::linear_gelu(f, h, blk->fc0->weight().data(), bias_of(*blk->fc0))) {
      blk->fc0->forward(step, h, f);
      kernels::gelu(f, f, /*tanh_approx=*/true);
    }
    residual_linear(step, x, *blk->fc1, f, fused);
    step.arena.release(m);
  }
  Tensor out = step.arena.alloc({P, D}, at);
  vit_norm(out, x, final_w_, final_b_, cfg_.rms_norm, eps);
  return out;
}

template <class F>
Tensor MoonVit::on_device(DType out_dtype, F&& body) {
  std::lock_guard<std::mutex> lock(mu_);
  Batch batch;
  Arena arena(ctx_.device);
  Step step{batch, arena};
#ifdef ATOM_HAVE_CUDA
  if (!ctx_.device.is_cpu()) {
    if (!state_->stream) state_->stream = std::make_unique<CudaStream>(ctx_.device.index);
    CudaStreamGuard guard(state_->stream->get());
    Tensor y = body(step);
    if (y.dtype() != out_dtype || !y.is_contiguous()) {
      // Converted on the device: the copy back is then the whole conversion.
      Tensor f = step.arena.alloc(y.shape(), out_dtype);
      kernels::cast(f, y);
      y = f;
    }
    Tensor r = y.to(Device::cpu());
    state_->stream->synchronize();
    return r;
  }
#endif
  return tensor_cast_cpu(body(step), out_dtype);
}

Tensor MoonVit::encode_hidden(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) {
  check_grids(pixel_values, grids);
  return on_device(DType::kF32, [&](Step& step) { return tower(step, f32(pixel_values), grids); });
}

Tensor MoonVit::encode(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) {
  check_grids(pixel_values, grids);
  // In the tower's dtype: F32 on the CPU, the activations' (BF16) from a GPU, whose features
  // then come back at half the bytes and go to the embedding rows without a conversion.
  return on_device(ctx_.act_dtype, [&](Step& step) {
    const Tensor x = tower(step, f32(pixel_values), grids);
    const int64_t D = cfg_.hidden;
    const Device dev = ctx_.device;
    int64_t tokens = 0;
    for (const ImageGrid& g : grids) tokens += tokens_for(g);
    // The 2x2 merge: merged token (i, j) gathers patches (2i + a, 2j + b) in (a, b) order, each
    // averaged over a video's frames.
    Tensor merged = step.arena.alloc({tokens * 4, D}, x.dtype());
    int64_t row = 0, tok = 0;
    for (const ImageGrid& g : grids) {
      const int64_t n = tokens_for(g) * 4;
      Tensor idx = Tensor::empty({n * g.t}, DType::kI32);
      int32_t* ix = idx.ptr<int32_t>();
      for (int64_t i = 0; i < g.h / 2; ++i)
        for (int64_t j = 0; j < g.w / 2; ++j)
          for (int64_t a = 0; a < 2; ++a)
            for (int64_t b = 0; b < 2; ++b)
              for (int64_t f = 0; f < g.t; ++f)
                *ix++ = static_cast<int32_t>(row + f * g.h * g.w + (2 * i + a) * g.w + (2 * j + b));
      Tensor dst = merged.narrow(0, tok * 4, n);
      Tensor didx = idx;
      if (!dev.is_cpu()) {
        didx = step.arena.alloc(idx.shape(), DType::kI32);
        didx.copy_from(idx);
      }
      kernels::gather_mean_rows(dst, x, didx, static_cast<int>(g.t));
      row += g.num_patches();
      tok += tokens_for(g);
    }
    const float peps = static_cast<float>(cfg_.projector_eps);
    if (!cfg_.projector_v2) vit_norm(merged, merged, pre_norm_w_, pre_norm_b_, false, peps);
    Tensor u = proj0_->forward(step, merged.view({tokens, 4 * D}));
    kernels::gelu(u, u, /*tanh_approx=*/false);
    Tensor out = proj2_->forward(step, u);
    if (cfg_.projector_v2) {
      Tensor normed = step.arena.alloc(out.shape(), out.dtype());
      vit_norm(normed, out, post_norm_w_, nullptr, true, peps);
      return normed;
    }
    return out;
  });
}

}  // namespace atom
