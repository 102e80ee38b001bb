#include "models/moonvit.h"

#include <cmath>

#include "core/convert.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/layer_norm.h"
#include "kernels/linear.h"
#include "kernels/rms_norm.h"

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

float gelu_tanh(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
}

float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f)); }

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
  if (m.qkv_hidden % m.heads != 0 || m.head_dim() % 4 != 0)
    v.bad("hidden_size", "must be num_attention_heads heads of a width divisible by 4 (the 2D "
                         "rotary embedding), got " +
                             std::to_string(m.qkv_hidden) + " over " + std::to_string(m.heads));
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
    v.bad("hidden_act", "must be gelu_pytorch_tanh, got '" + act + "'");
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

LayerContext cpu_f32(const LayerContext& model) {
  LayerContext c = model;
  c.device = Device::cpu();
  c.weight_dtype = DType::kF32;
  c.act_dtype = DType::kF32;
  c.tp_rank = 0;
  c.tp_size = 1;
  c.quant = nullptr;
  c.fp8_resident = false;
  c.expert_parallel = false;
  return c;
}
}  // namespace

MoonVit::MoonVit(const LayerContext& model, MoonVitConfig cfg, const std::string& tower,
                 const std::string& projector)
    : ctx_(cpu_f32(model)), cfg_(std::move(cfg)) {
  LayerContext& ctx = ctx_;
  const int64_t D = cfg_.hidden, p = cfg_.patch_size;
  auto f32_param = [&](const std::string& name, Shape shape) {
    return &ctx.params.add(name, Tensor::zeros(std::move(shape), DType::kF32, ctx.device));
  };
  const int64_t Q = cfg_.qkv_hidden;
  const bool ln = !cfg_.rms_norm;
  patch_w_ = f32_param(tower + ".patch_embed.proj.weight", {D, 3, p, p});
  if (cfg_.patch_bias) patch_b_ = f32_param(tower + ".patch_embed.proj.bias", {D});
  pos_emb_ = f32_param(tower + ".patch_embed.pos_emb.weight", {cfg_.pos_h, cfg_.pos_w, D});
  for (int64_t i = 0; i < cfg_.layers; ++i) {
    const std::string b = tower + ".encoder.blocks." + std::to_string(i);
    auto blk = std::make_unique<Block>();
    blk->norm0_w = f32_param(b + ".norm0.weight", {D});
    blk->norm0_b = ln ? f32_param(b + ".norm0.bias", {D}) : nullptr;
    blk->norm1_w = f32_param(b + ".norm1.weight", {D});
    blk->norm1_b = ln ? f32_param(b + ".norm1.bias", {D}) : nullptr;
    blk->wqkv = std::make_unique<ReplicatedLinear>(ctx, b + ".wqkv", D, 3 * Q, cfg_.attn_bias);
    blk->wo = std::make_unique<ReplicatedLinear>(ctx, b + ".wo", Q, D, cfg_.attn_bias);
    blk->fc0 = std::make_unique<ReplicatedLinear>(ctx, b + ".mlp.fc0", D, cfg_.intermediate,
                                                  cfg_.mlp_bias);
    blk->fc1 = std::make_unique<ReplicatedLinear>(ctx, b + ".mlp.fc1", cfg_.intermediate, D,
                                                  cfg_.mlp_bias);
    blocks_.push_back(std::move(blk));
  }
  final_w_ = f32_param(tower + ".encoder.final_layernorm.weight", {D});
  final_b_ = ln ? f32_param(tower + ".encoder.final_layernorm.bias", {D}) : nullptr;
  const bool v2 = cfg_.projector_v2;
  if (v2) {
    post_norm_w_ = f32_param(projector + ".post_norm.weight", {cfg_.text_hidden});
  } else {
    pre_norm_w_ = f32_param(projector + ".pre_norm.weight", {D});
    pre_norm_b_ = f32_param(projector + ".pre_norm.bias", {D});
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

Tensor MoonVit::tower(Step& step, const Tensor& pixel_values, const std::vector<ImageGrid>& grids) {
  const int64_t D = cfg_.hidden, P = pixel_values.size(0), H = cfg_.heads, hd = cfg_.head_dim();
  const int64_t Q = cfg_.qkv_hidden;
  const float eps = static_cast<float>(cfg_.norm_eps);
  // Patch embedding: the convolution is a linear map of each patch's 3 * p * p values.
  Tensor x = Tensor::empty({P, D}, DType::kF32);
  {
    Tensor pix = pixel_values.contiguous().view({P, cfg_.patch_values()});
    Tensor w = patch_w_->data().view({D, cfg_.patch_values()});
    kernels::linear(x, pix, w, patch_b_ ? patch_b_->data() : Tensor());
  }
  // Learned position grid, resized to each image.
  {
    int64_t row = 0;
    for (const ImageGrid& g : grids) {
      Tensor pos = (g.h == cfg_.pos_h && g.w == cfg_.pos_w) ? pos_emb_->data()
                   : cfg_.bilinear ? bilinear_resize_hwc(pos_emb_->data(), g.h, g.w)
                                   : bicubic_resize_hwc(pos_emb_->data(), g.h, g.w);
      const float* ps = pos.ptr<float>();
      for (int64_t f = 0; f < g.t; ++f) {
        float* xs = x.ptr<float>() + (row + f * g.h * g.w) * D;
        for (int64_t i = 0; i < g.h * g.w * D; ++i) xs[i] += ps[i];
        if (g.t == 1) continue;
        // A video's frame f: the fixed time table's row f (sin | cos).
        std::vector<float> te(static_cast<size_t>(D));
        for (int64_t k = 0; k < D / 2; ++k) {
          const double a =
              static_cast<double>(f) *
              std::pow(10000.0, -static_cast<double>(k) / (static_cast<double>(D) / 2));
          te[static_cast<size_t>(k)] = static_cast<float>(std::sin(a));
          te[static_cast<size_t>(k + D / 2)] = static_cast<float>(std::cos(a));
        }
        for (int64_t n = 0; n < g.h * g.w; ++n)
          for (int64_t k = 0; k < D; ++k) xs[n * D + k] += te[static_cast<size_t>(k)];
      }
      row += g.num_patches();
    }
  }
  // The 2D rotary angles' cos and sin per patch and channel pair.
  const int64_t pairs = hd / 2, nf = hd / 4;
  std::vector<float> cosv(static_cast<size_t>(P * pairs)), sinv(cosv.size());
  std::vector<float> freqs(static_cast<size_t>(nf));  // 10000^(-4i / head_dim)
  for (int64_t i = 0; i < nf; ++i)
    freqs[static_cast<size_t>(i)] = static_cast<float>(
        std::pow(10000.0, -static_cast<double>(4 * i) / static_cast<double>(hd)));
  {
    int64_t row = 0;
    for (const ImageGrid& g : grids) {
      for (int64_t f = 0; f < g.t; ++f)
        for (int64_t r = 0; r < g.h; ++r)
          for (int64_t c = 0; c < g.w; ++c) {
            const int64_t n = row + f * g.h * g.w + r * g.w + c;
            for (int64_t i = 0; i < nf; ++i) {
              const float fi = freqs[static_cast<size_t>(i)];
              const float ax = static_cast<float>(c) * fi, ay = static_cast<float>(r) * fi;
              cosv[n * pairs + 2 * i] = std::cos(ax);
              sinv[n * pairs + 2 * i] = std::sin(ax);
              cosv[n * pairs + 2 * i + 1] = std::cos(ay);
              sinv[n * pairs + 2 * i + 1] = std::sin(ay);
            }
          }
      row += g.num_patches();
    }
  }
  std::vector<int64_t> starts{0};
  for (const ImageGrid& g : grids) starts.push_back(starts.back() + g.num_patches());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  Tensor h = Tensor::empty({P, D}, DType::kF32);
  Tensor attn = Tensor::empty({P, Q}, DType::kF32);
  for (auto& blk : blocks_) {
    const Arena::Mark m = step.arena.mark();
    vit_norm(h, x, blk->norm0_w, blk->norm0_b, cfg_.rms_norm, eps);
    Tensor qkv = blk->wqkv->forward(step, h).contiguous();
    float* q = qkv.ptr<float>();
    // Rotate q and k.
#pragma omp parallel for
    for (int64_t n = 0; n < P; ++n) {
      for (int part = 0; part < 2; ++part) {
        float* v = q + n * 3 * Q + part * Q;
        for (int64_t head = 0; head < H; ++head) {
          float* e = v + head * hd;
          for (int64_t m2 = 0; m2 < pairs; ++m2) {
            const float c = cosv[n * pairs + m2], s = sinv[n * pairs + m2];
            const float re = e[2 * m2], im = e[2 * m2 + 1];
            e[2 * m2] = re * c - im * s;
            e[2 * m2 + 1] = re * s + im * c;
          }
        }
      }
    }
    // Non-causal attention within each image.
    float* out = attn.ptr<float>();
    ParallelErrors errors;
    for (size_t img = 0; img + 1 < starts.size(); ++img) {
      const int64_t s0 = starts[img], len = starts[img + 1] - s0;
#pragma omp parallel for collapse(2)
      for (int64_t head = 0; head < H; ++head)
        for (int64_t i = 0; i < len; ++i)
          errors.guard([&] {
            std::vector<float> p(static_cast<size_t>(len));
            const float* qi = q + (s0 + i) * 3 * Q + head * hd;
            float mx = -INFINITY;
            for (int64_t j = 0; j < len; ++j) {
              const float* kj = q + (s0 + j) * 3 * Q + Q + head * hd;
              float dot = 0;
              for (int64_t d = 0; d < hd; ++d) dot += qi[d] * kj[d];
              p[j] = dot * scale;
              mx = std::max(mx, p[j]);
            }
            float sum = 0;
            for (int64_t j = 0; j < len; ++j) sum += (p[j] = std::exp(p[j] - mx));
            float* o = out + (s0 + i) * Q + head * hd;
            for (int64_t d = 0; d < hd; ++d) o[d] = 0;
            for (int64_t j = 0; j < len; ++j) {
              const float* vj = q + (s0 + j) * 3 * Q + 2 * Q + head * hd;
              const float pj = p[j] / sum;
              for (int64_t d = 0; d < hd; ++d) o[d] += pj * vj[d];
            }
          });
    }
    errors.rethrow();
    Tensor a = blk->wo->forward(step, attn);
    {
      float* xs = x.ptr<float>();
      const float* as = a.ptr<float>();
      for (int64_t i = 0; i < P * D; ++i) xs[i] += as[i];
    }
    vit_norm(h, x, blk->norm1_w, blk->norm1_b, cfg_.rms_norm, eps);
    Tensor f = blk->fc0->forward(step, h).contiguous();
    {
      float* fs = f.ptr<float>();
      for (int64_t i = 0; i < f.numel(); ++i) fs[i] = gelu_tanh(fs[i]);
    }
    Tensor y = blk->fc1->forward(step, f);
    {
      float* xs = x.ptr<float>();
      const float* ys = y.ptr<float>();
      for (int64_t i = 0; i < P * D; ++i) xs[i] += ys[i];
    }
    step.arena.release(m);
  }
  vit_norm(x, x, final_w_, final_b_, cfg_.rms_norm, eps);
  return x;
}

Tensor MoonVit::encode_hidden(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) {
  check_grids(pixel_values, grids);
  Batch batch;
  Arena arena(Device::cpu());
  Step step{batch, arena};
  return tower(step, f32(pixel_values), grids);
}

Tensor MoonVit::encode(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) {
  check_grids(pixel_values, grids);
  Batch batch;
  Arena arena(Device::cpu());
  Step step{batch, arena};
  const Tensor x = tower(step, f32(pixel_values), grids);
  const int64_t D = cfg_.hidden;
  int64_t tokens = 0;
  for (const ImageGrid& g : grids) tokens += tokens_for(g);
  // The 2x2 merge: merged token (i, j) gathers patches (2i + a, 2j + b) in (a, b) order.
  Tensor merged = Tensor::empty({tokens * 4, D}, DType::kF32);
  {
    const float* xs = x.ptr<float>();
    float* ms = merged.ptr<float>();
    int64_t row = 0, tok = 0;
    for (const ImageGrid& g : grids) {
      const float inv_t = 1.0f / static_cast<float>(g.t);
      for (int64_t i = 0; i < g.h / 2; ++i)
        for (int64_t j = 0; j < g.w / 2; ++j, ++tok)
          for (int64_t a = 0; a < 2; ++a)
            for (int64_t b = 0; b < 2; ++b) {
              float* dst = ms + (tok * 4 + a * 2 + b) * D;
              std::fill(dst, dst + D, 0.0f);
              for (int64_t f = 0; f < g.t; ++f) {
                const float* src = xs + (row + f * g.h * g.w + (2 * i + a) * g.w + (2 * j + b)) * D;
                for (int64_t k = 0; k < D; ++k) dst[k] += src[k];
              }
              if (g.t > 1)
                for (int64_t k = 0; k < D; ++k) dst[k] *= inv_t;
            }
      row += g.num_patches();
    }
  }
  const float peps = static_cast<float>(cfg_.projector_eps);
  if (!cfg_.projector_v2) vit_norm(merged, merged, pre_norm_w_, pre_norm_b_, false, peps);
  Tensor u = proj0_->forward(step, merged.view({tokens, 4 * D})).contiguous();
  {
    float* us = u.ptr<float>();
    for (int64_t i = 0; i < u.numel(); ++i) us[i] = gelu_erf(us[i]);
  }
  Tensor out = proj2_->forward(step, u).clone();
  if (cfg_.projector_v2) vit_norm(out, out, post_norm_w_, nullptr, true, peps);
  return out;
}

}  // namespace atom
