// DeepSeek-V4 (transformers' modeling_deepseek_v4.py; DeepSeek-V4-Flash and -Pro), text only.
//   * The residual is hc_mult streams joined by manifold-constrained hyper-connections
//     (layers/hyper_connection.h), one site before the attention and one before the MoE, and a
//     learned head (hc_head) collapsing them before the final norm.
//   * Attention is shared-key/value multi-query attention: one head_dim-wide row per token
//     (wkv, RMSNorm, RoPE), read as both key and value, attended by num_attention_heads query
//     heads (q LoRA: wq_a, q_norm, wq_b, then an unweighted RMSNorm per head) over a sliding
//     window, with a learned sink logit per head. RoPE acts on interleaved pairs of the last
//     qk_rope_head_dim channels, with the "main" table on sliding layers and the "compress" one
//     (YaRN, attention factor 1) on compressed layers; the output's rope channels are rotated
//     back (−sin) at the query's position. The output projection is grouped: o_groups groups of
//     heads each through its own wo_a block to o_lora_rank, then wo_b.
//   * Compressed layers also attend to entries pooled from windows of tokens
//     (layers/compressed_kv.h): heavily compressed ones (HCA, windows of 128) to every complete
//     entry; compressed sparse ones (CSA, windows of 4, overlapping) to the top index_topk entries
//     a Lightning Indexer picks: its own compressor at index_head_dim, queries wq_b(q_lora) over
//     index_n_heads heads with RoPE, score Σ_h w_h ReLU(q_h · k) index_head_dim^-½ with
//     w = weights_proj(x) index_n_heads^-½. An entry is visible once its window is complete.
//   * Every layer is a mixture of experts with sqrt(softplus) scores, a correction bias for the
//     choice, no groups, renormalised and scaled weights; the first num_hash_layers choose their
//     experts by the frozen tid2eid table of the input token. Routed and shared experts apply the
//     clamped SwiGLU silu(min(g, limit)) · clamp(u, ±limit).
// Checkpoint names are DeepSeek's own (as transformers also saves them): layers.N.attn.wq_a,
// attn.compressor.wkv, attn.indexer.compressor.ape, hc_attn_fn, ffn.experts.J.w1, ffn.gate.bias
// (the correction bias), ffn.gate.tid2eid, with or without the "model." prefix, and embed,
// norm, head, hc_head_{fn,base,scale} at the top. The MTP stages (mtp.*) are not read.
// Tensor parallelism (as transformers' plan for V4): the routed experts are split (slices of
// every expert, or whole experts with --enable-expert-parallel) and their sum all-reduced; the
// attention, compressors and hyper-connections are replicated on every rank, the shared expert
// split like a dense MLP.
// DeepSeek's quantised releases (quantization_config quant_method fp8, weight_block_size [128, 128]
// for V4, [32, 32] for V4.1, scale_fmt ue8m0; expert_dtype fp4 at the top level or in the
// quantization_config) load too: wq_a, wq_b, wkv, wo_a, wo_b, indexer.wq_b and the shared
// expert are FP8 e4m3 "weight" with block scales "scale" beside it (F32, or F8_E8M0 exponents),
// the routed experts FP4 e2m1 "weight" [rows, K/2] I8 (the low nibble first) with F8_E8M0
// "scale" [rows, K/32]; the router, compressors, indexer.weights_proj, embed and head stay BF16.
// The CPU dequantises every one at load to the F32 weights (layers/linear.h's FP8 block path,
// layers/moe.h's MXFP4 path).
// On CUDA the attention runs through kernels/compressed_kv.h (forward_cuda); the CPU dequantises
// FP8/FP4 at load, and CUDA does not yet keep them in their format.
// The mixture of experts, the attention's per-query core, the grouped wo_a and the release names
// are models/deepseek_v4_parts.h, shared with DeepSeek-V4.1 (models/deepseek_v41.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "core/convert.h"
#include "kernels/compressed_kv.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/mla.h"
#include "layers/compressed_kv.h"
#include "layers/embedding.h"
#include "layers/hyper_connection.h"
#include "layers/moe.h"
#include "layers/norm.h"
#include "layers/rotary.h"
#include "models/deepseek_v4_parts.h"
#include "models/llama.h"

namespace atom {

namespace {

constexpr const char* kSliding = "sliding_attention";
constexpr const char* kCsa = "compressed_sparse_attention";
constexpr const char* kHca = "heavily_compressed_attention";

// The config as transformers' DeepseekV4Config reads it, legacy fields folded in.
struct V4Config {
  int64_t hidden, heads, head_dim, rot_dim, q_lora, o_groups, o_lora, window;
  int64_t index_heads, index_head_dim, index_topk;
  std::string index_cache_dtype;
  std::map<std::string, int> rates;  // compress_rates by layer type
  std::vector<std::string> layer_types, mlp_layer_types;
  RopeConfig main_rope, compress_rope;
  HyperConnectionOptions hc;
  int64_t experts, top_k, moe_inter, shared;
  double scaling, limit, eps;
  std::string scoring;
  // The checkpoint's quantisation: FP8 linears (quantization_config), and the routed experts'
  // format (expert_dtype: fp4, or fp8 / absent for the linears' method).
  bool quantized = false, fp4_experts = false;

  explicit V4Config(const ModelConfig& c) {
    const ConfigFields& t = c.text;
    const int64_t L = c.num_hidden_layers;
    hidden = c.hidden_size;
    heads = c.num_attention_heads;
    head_dim = c.head_dim;
    eps = c.rms_norm_eps;
    if (c.num_key_value_heads != 1)
      t.bad("num_key_value_heads", "must be 1 (DeepSeek-V4 shares one key/value head)");
    q_lora = t.get_int("q_lora_rank", 1024, IntRange{1, 1 << 16});
    o_groups = t.get_int("o_groups", 8, IntRange{1, 1 << 10});
    o_lora = t.get_int("o_lora_rank", 1024, IntRange{1, 1 << 16});
    if (heads % o_groups != 0)
      t.bad("o_groups", fmt::format("must divide num_attention_heads ({})", heads));
    window = t.get_int("sliding_window", 128, IntRange{1, INT32_MAX});
    index_heads = t.get_int("index_n_heads", 64, IntRange{1, 1 << 12});
    index_head_dim = t.get_int("index_head_dim", 128, IntRange{2, 1 << 14});
    index_topk = t.get_int("index_topk", 512, IntRange{1, INT32_MAX});
    // The indexer's plane format (the spec's V4 cache: FP8, or FP4 values with E8M0 scales). The
    // CPU reference keeps the plane in F32 whichever is named (transformers' values); another
    // value is refused here, before any weight is read.
    index_cache_dtype = t.get_string("index_cache_dtype", "fp8");
    if (index_cache_dtype != "fp8" && index_cache_dtype != "fp4")
      t.bad("index_cache_dtype", "must be 'fp8' or 'fp4', got '" + index_cache_dtype + "'");
    // partial_rotary_factor, else the legacy qk_rope_head_dim, else 64 / 512.
    double prf = 64.0 / 512.0;
    if (t.has("partial_rotary_factor"))
      prf = t.get_double("partial_rotary_factor", RealRange{0.0, 1.0, true, false});
    else if (t.has("qk_rope_head_dim"))
      prf = static_cast<double>(t.get_int("qk_rope_head_dim", IntRange{0, 1 << 14})) /
            static_cast<double>(head_dim);
    rot_dim = static_cast<int64_t>(static_cast<double>(head_dim) * prf);
    if (rot_dim % 2 != 0 || rot_dim > index_head_dim)
      t.bad("partial_rotary_factor",
            fmt::format("gives {} rotary channels, which must be even and fit index_head_dim {}",
                        rot_dim, index_head_dim));
    rates = {{kCsa, 4}, {kHca, 128}};
    if (t.has("compress_rates")) {
      const auto& cr = t.obj()["compress_rates"];
      if (!cr.is_object()) t.bad("compress_rates", "must be an object");
      for (auto it = cr.begin(); it != cr.end(); ++it) {
        if (it.key() != kCsa && it.key() != kHca)
          t.bad("compress_rates", "has an unknown layer type '" + it.key() + "'");
        if (!it.value().is_number_integer() || it.value().get<int64_t>() < 1 ||
            it.value().get<int64_t>() > (1 << 16))
          t.bad("compress_rates", "entries must be integers in [1, 65536]");
        rates[it.key()] = it.value().get<int>();
      }
    }
    if (t.has("compress_rate_csa"))
      rates[kCsa] = static_cast<int>(t.get_int("compress_rate_csa", IntRange{1, 1 << 16}));
    if (t.has("compress_rate_hca"))
      rates[kHca] = static_cast<int>(t.get_int("compress_rate_hca", IntRange{1, 1 << 16}));
    if (!c.layer_types.empty()) {
      layer_types = c.layer_types;
    } else if (t.has("compress_ratios")) {
      for (int64_t r : t.get_int_list("compress_ratios")) {
        if (r == 0)
          layer_types.push_back(kSliding);
        else if (r == rates[kCsa])
          layer_types.push_back(kCsa);
        else if (r == rates[kHca])
          layer_types.push_back(kHca);
        else
          t.bad("compress_ratios", fmt::format("entry {} is neither 0 nor a compress rate", r));
      }
      layer_types.resize(std::min<size_t>(layer_types.size(), static_cast<size_t>(L)));
    } else {  // transformers' default: two HCA layers, then CSA and HCA in turn
      for (int64_t i = 0; i < L; ++i)
        layer_types.push_back(i < 2 ? kHca : ((i - 2) % 2 ? kCsa : kHca));
    }
    if (static_cast<int64_t>(layer_types.size()) != L)
      t.bad("compress_ratios", fmt::format("gives {} layers for {}", layer_types.size(), L));
    if (t.has("mlp_layer_types")) {
      mlp_layer_types = t.get_string_list("mlp_layer_types");
    } else {
      const int64_t hash = t.get_int("num_hash_layers", 3, IntRange{0, INT32_MAX});
      for (int64_t i = 0; i < L; ++i) mlp_layer_types.push_back(i < hash ? "hash_moe" : "moe");
    }
    if (static_cast<int64_t>(mlp_layer_types.size()) < L)
      t.bad("mlp_layer_types",
            fmt::format("has {} entries for {} layers", mlp_layer_types.size(), L));
    mlp_layer_types.resize(static_cast<size_t>(L));
    for (const auto& m : mlp_layer_types)
      if (m != "hash_moe" && m != "moe")
        t.bad("mlp_layer_types", "entries must be 'hash_moe' or 'moe', got '" + m + "'");
    // RoPE: rope_parameters {main, compress}, else rope_theta (main) and compress_rope_theta with
    // rope_scaling (compress); YaRN's attention factor is 1 unless given.
    auto mi = c.rope_by_layer_type.find("main"), ci = c.rope_by_layer_type.find("compress");
    if (mi != c.rope_by_layer_type.end() && ci != c.rope_by_layer_type.end()) {
      main_rope = mi->second;
      compress_rope = ci->second;
    } else {
      main_rope = RopeConfig{};
      main_rope.theta = t.get_double("rope_theta", 10000.0, RealRange::positive());
      compress_rope = c.rope;
      compress_rope.theta = t.get_double("compress_rope_theta", 160000.0, RealRange::positive());
    }
    if (compress_rope.type == "yarn" && !compress_rope.attention_factor)
      compress_rope.attention_factor = 1.0;
    hc.hidden = hidden;
    hc.hc_mult = static_cast<int>(t.get_int("hc_mult", 4, IntRange{1, 64}));
    hc.sinkhorn_iters = static_cast<int>(t.get_int("hc_sinkhorn_iters", 20, IntRange{1, 1000}));
    hc.hc_eps = static_cast<float>(t.get_double("hc_eps", 1e-6, RealRange::non_negative()));
    hc.norm_eps = static_cast<float>(eps);
    experts = t.get_int("n_routed_experts", 256, IntRange{1, 1 << 16});
    top_k = t.get_int("num_experts_per_tok", 6, IntRange{1, 1 << 10});
    if (top_k > experts) t.bad("num_experts_per_tok", "exceeds n_routed_experts");
    moe_inter = t.get_int("moe_intermediate_size", 2048, IntRange{1, 1 << 22});
    shared = t.get_int("n_shared_experts", 1, IntRange{0, 1 << 10});
    scaling = t.get_double("routed_scaling_factor", 1.5, RealRange::positive());
    limit = t.get_double("swiglu_limit", 10.0, RealRange::positive());
    scoring = t.get_string("scoring_func", "sqrtsoftplus");
    if (scoring != "sqrtsoftplus" && scoring != "sigmoid" && scoring != "softmax")
      t.bad("scoring_func",
            "must be 'sqrtsoftplus', 'sigmoid' or 'softmax', got '" + scoring + "'");
    // expert_dtype: V4 states it at the top level, V4.1 in its quantization_config. Without a
    // quantization_config the checkpoint is full precision, whatever it says.
    quantized = c.quantization.has_value();
    std::string expert_dtype;
    auto read_expert_dtype = [&](const ConfigFields& f) {
      if (!f.has("expert_dtype")) return;
      expert_dtype = f.get_string("expert_dtype");
      if (expert_dtype != "fp4" && expert_dtype != "fp8")
        f.bad("expert_dtype", "must be 'fp4' or 'fp8', got '" + expert_dtype + "'");
    };
    read_expert_dtype(t);
    if (quantized)
      read_expert_dtype(ConfigFields(c.quantization->raw, t.where() + " (quantization_config)"));
    fp4_experts = quantized && expert_dtype == "fp4";
  }

  int rate(const std::string& layer_type) const { return rates.at(layer_type); }
};

std::vector<float> inv_freq_of(const RopeConfig& r, int64_t rot_dim, int64_t max_pos,
                               float* attention_factor) {
  const RopeTables t = rope_tables(r, static_cast<int>(rot_dim), max_pos);
  *attention_factor = t.attention_factor;
  return t.inv_freq;
}

// x · rsqrt(mean(x²) + eps), in place over n values (transformers' unweighted RMSNorm).
void rms_unweighted(float* x, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= r;
}

void check_cpu_f32(const Tensor& t, const char* what) { deepseek_v4_check_cpu_f32(t, what); }

float dot(const float* a, const float* b, int64_t n) { return deepseek_v4_dot(a, b, n); }

class DeepseekV4Attention {
 public:
  DeepseekV4Attention(LayerContext& ctx, const ModelConfig& c, const V4Config& v, int64_t layer,
                      const std::string& prefix)
      : v_(v),
        type_(v.layer_types.at(static_cast<size_t>(layer))),
        wq_a_(ctx, prefix + ".wq_a", v.hidden, v.q_lora, false),
        q_norm_(ctx, prefix + ".q_norm", v.q_lora, v.eps),
        wq_b_(ctx, prefix + ".wq_b", v.q_lora, v.heads * v.head_dim, false),
        wkv_(ctx, prefix + ".wkv", v.hidden, v.head_dim, false),
        kv_norm_(ctx, prefix + ".norm", v.head_dim, v.eps),
        wo_a_(ctx, prefix + ".wo_a", v.heads * v.head_dim / v.o_groups, v.o_groups * v.o_lora,
              false, LinearStorage::kDequantize),
        wo_b_(ctx, prefix + ".wo_b", v.o_groups * v.o_lora, v.hidden, false) {
    ATOM_CHECK(!ctx.device.is_cpu() || ctx.act_dtype == DType::kF32,
               "{}: DeepSeek-V4 on the CPU computes in F32, not {}", prefix,
               dtype_name(ctx.act_dtype));
    ATOM_CHECK(ctx.device.is_cpu() || v.head_dim <= 512,
               "{}: head_dim {}: the CUDA attention kernel takes heads up to 512 wide", prefix,
               v.head_dim);
    const bool compressed = type_ != kSliding;
    inv_freq_ = inv_freq_of(compressed ? v.compress_rope : v.main_rope, v.rot_dim,
                            c.max_position_embeddings, &attention_factor_);
    if (!ctx.device.is_cpu() && v.rot_dim > 0)
      inv_freq_dev_ = inv_freq_tensor(inv_freq_, ctx.device);
    sinks_ = &ctx.params.add(prefix + ".attn_sink", ctx.param_tensor({v.heads}, DType::kF32));
    // The CPU's grouped product reads wo_a's weight directly, in F32 (a BF16 checkpoint's weight
    // is kept BF16 by the linear; an FP8 one is dequantised to F32).
    if (ctx.device.is_cpu())
      ctx.params.add_post_load([this] {
        const Tensor& w = wo_a_.weight().data();
        wo_a_f32_ = w.dtype() == DType::kF32 ? w : tensor_cast_cpu(w, DType::kF32);
      });
    raw_index_ = static_cast<int>(ctx.cache_specs->size());
    ctx.cache_specs->push_back(CacheSpec::rows(static_cast<int>(v.head_dim), 1, ctx.act_dtype));
    if (!compressed) return;
    WindowCompressorOptions o;
    o.hidden = v.hidden;
    o.head_dim = v.head_dim;
    o.ratio = v.rate(type_);
    o.overlap = type_ == kCsa;
    o.rot_dim = v.rot_dim;
    o.inv_freq = inv_freq_;
    o.attention_factor = attention_factor_;
    o.norm_eps = static_cast<float>(v.eps);
    compressor_ = std::make_unique<WindowCompressor>(ctx, prefix + ".compressor", o);
    if (type_ != kCsa) return;
    o.head_dim = v.index_head_dim;
    index_compressor_ = std::make_unique<WindowCompressor>(ctx, prefix + ".indexer.compressor", o);
    index_wq_b_ = std::make_unique<ReplicatedLinear>(ctx, prefix + ".indexer.wq_b", v.q_lora,
                                                     v.index_heads * v.index_head_dim, false);
    index_weights_ =
        std::make_unique<ReplicatedLinear>(ctx, prefix + ".indexer.weights_proj", v.hidden,
                                           v.index_heads, false, LinearStorage::kUnquantized);
  }

  Tensor forward(Step& step, const Tensor& x) {
    if (!x.device().is_cpu()) return forward_cuda(step, x);
    const Batch& b = step.batch;
    const int64_t T = x.size(0), H = v_.heads, D = v_.head_dim, R = v_.rot_dim;
    const float eps = static_cast<float>(v_.eps);
    Tensor q_res = q_norm_.forward(step, wq_a_.forward(step, x));
    Tensor q = wq_b_.forward(step, q_res);
    Tensor kv = kv_norm_.forward(step, wkv_.forward(step, x));
    check_cpu_f32(q, "queries");
    check_cpu_f32(kv, "keys");
    const Tensor& raw = step.kv->plane(static_cast<size_t>(raw_index_), CacheKind::kRows);
    check_cpu_f32(raw, "the key/value cache");
    // Rotate q (per head, after its unweighted norm) and the shared key; store the key.
    for (int s = 0; s < b.num_seqs(); ++s) {
      const PagedRows rows = paged_rows(b, s, 1);
      const auto [q0, q1, start] = seq_rows(b, s);
      for (int64_t i = q0; i < q1; ++i) {
        const int64_t pos = b.positions[static_cast<size_t>(i)];
        for (int64_t h = 0; h < H; ++h) {
          float* qh = q.ptr<float>() + (i * H + h) * D;
          rms_unweighted(qh, D, eps);
          rope_tail(qh, D, R, pos, inv_freq_, attention_factor_);
        }
        float* k = kv.ptr<float>() + i * D;
        rope_tail(k, D, R, pos, inv_freq_, attention_factor_);
        std::copy(k, k + D, rows.row(raw, start + (i - q0)));
      }
    }
    if (compressor_) compressor_->forward(step, x);
    Tensor iq, iw;
    if (index_compressor_) {
      index_compressor_->forward(step, x);
      iq = index_wq_b_->forward(step, q_res);
      iw = index_weights_->forward(step, x);
      check_cpu_f32(iq, "indexer queries");
      for (int64_t i = 0; i < T; ++i)
        for (int64_t h = 0; h < v_.index_heads; ++h)
          rope_tail(iq.ptr<float>() + (i * v_.index_heads + h) * v_.index_head_dim,
                    v_.index_head_dim, R, b.positions[static_cast<size_t>(i)], inv_freq_,
                    attention_factor_);
    }
    Tensor o = step.empty({T, H * D}, DType::kF32);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const float* sinks = sinks_->data().ptr<float>();
    for (int s = 0; s < b.num_seqs(); ++s) {
      const PagedRows raw_rows = paged_rows(b, s, 1);
      const auto [q0, q1, start] = seq_rows(b, s);
      for (int64_t i = q0; i < q1; ++i) {
        const int64_t p = start + (i - q0);
        std::vector<const float*> keys;
        for (int64_t k = std::max<int64_t>(0, p - v_.window + 1); k <= p; ++k)
          keys.push_back(raw_rows.row(raw, k));
        if (compressor_) {
          const int r = compressor_->ratio();
          const PagedRows erows = paged_rows(b, s, r);
          const Tensor& ent = compressor_->entries(step);
          const int64_t n = (p + 1) / r;  // complete windows
          for (int64_t w : index_compressor_ ? select(step, b, s, i, p, iq, iw) : all(n))
            keys.push_back(erows.row(ent, w));
        }
        for (int64_t h = 0; h < H; ++h) {
          float* oh = o.ptr<float>() + (i * H + h) * D;
          deepseek_v4_sink_attention(q.ptr<float>() + (i * H + h) * D, keys, D, sinks[h], scale,
                                     oh);
          rope_tail(oh, D, R, b.positions[static_cast<size_t>(i)], inv_freq_, attention_factor_,
                    /*inverse=*/true);
        }
      }
    }
    // Grouped output projection: group g's heads through wo_a's block g, then wo_b.
    Tensor a = deepseek_v4_grouped_wo_a(step, o, wo_a_f32_, v_.o_groups, v_.o_lora);
    return wo_b_.forward(step, a);
  }

  // The same on CUDA (kernels/compressed_kv.h): the heads normalised and rotated in place, the
  // key row rotated into the raw plane, the compressors' pooling, the Lightning Indexer's top-k
  // over the index entries (kernels::indexer_topk over rows of r tokens), the sink attention over
  // the window and the entries, the output rotated back, the grouped wo_a as per-group products.
  Tensor forward_cuda(Step& step, const Tensor& x) {
    const Batch& b = step.batch;
    const int64_t T = x.size(0), H = v_.heads, D = v_.head_dim, R = v_.rot_dim;
    const float eps = static_cast<float>(v_.eps);
    const kernels::CompressedBatch cb = deepseek_v4_compressed_batch(b);
    Tensor q_res = q_norm_.forward(step, wq_a_.forward(step, x));
    Tensor q = wq_b_.forward(step, q_res);
    Tensor kv = kv_norm_.forward(step, wkv_.forward(step, x));
    kernels::HeadsRopeArgs ra;
    ra.heads = static_cast<int>(H);
    ra.head_dim = static_cast<int>(D);
    ra.rot_dim = static_cast<int>(R);
    ra.attention_factor = attention_factor_;
    ra.norm = true;
    ra.norm_eps = eps;
    kernels::heads_norm_rope(q, inv_freq_dev_, cb, ra);
    ra.heads = 1;
    ra.norm = false;
    kernels::heads_norm_rope(kv, inv_freq_dev_, cb, ra);
    Tensor& raw = step.kv->plane(static_cast<size_t>(raw_index_), CacheKind::kRows);
    kernels::cache_rows_write(raw, kv, b.dev.slot_mapping);
    if (compressor_) compressor_->forward(step, x);
    Tensor topk;
    if (index_compressor_) {
      index_compressor_->forward(step, x);
      Tensor iq = index_wq_b_->forward(step, q_res);
      kernels::HeadsRopeArgs ia = ra;
      ia.heads = static_cast<int>(v_.index_heads);
      ia.head_dim = static_cast<int>(v_.index_head_dim);
      kernels::heads_norm_rope(iq, inv_freq_dev_, cb, ia);
      Tensor iw = step.empty({T, v_.index_heads}, DType::kF32);
      kernels::linear(iw, x, index_weights_->weight().data());
      const int r = index_compressor_->ratio();
      kernels::IndexerArgs a;
      a.num_heads = static_cast<int>(v_.index_heads);
      a.head_dim = static_cast<int>(v_.index_head_dim);
      a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(v_.index_head_dim)));
      a.weights_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(v_.index_heads)));
      a.top_k = static_cast<int>(v_.index_topk);
      a.max_query_len = b.max_query_len;
      a.max_context_len = std::max(1, b.max_context_len / r);
      a.entry_tokens = r;
      ATOM_CHECK(b.block_size % r == 0,
                 "DeepSeek-V4 on CUDA: the indexer's windows of {} tokens need pages of a "
                 "multiple of {} tokens, not {}",
                 r, r, b.block_size);
      kernels::AttentionBatch ab{&b.dev.query_start, &b.dev.context_lens, &b.dev.page_indptr,
                                 &b.dev.page_indices};
      Tensor workspace =
          step.empty({std::max<int64_t>(1, kernels::indexer_topk_workspace_size(x.device(), T, a))},
                     DType::kF32);
      ab.workspace = &workspace;
      topk = step.empty({T, v_.index_topk}, DType::kI32);
      kernels::indexer_topk(topk, iq, iw, index_compressor_->entries(step), ab, a);
    }
    Tensor o = step.empty({T, H * D}, q.dtype());
    kernels::SinkAttentionArgs sa;
    sa.heads = static_cast<int>(H);
    sa.head_dim = static_cast<int>(D);
    sa.window = static_cast<int>(v_.window);
    sa.ratio = compressor_ ? compressor_->ratio() : 0;
    sa.scale = 1.0f / std::sqrt(static_cast<float>(D));
    sa.max_query_len = b.max_query_len;
    kernels::sink_attention(o, q, raw, compressor_ ? compressor_->entries(step) : Tensor(), topk,
                            sinks_->data(), cb, sa);
    ra.heads = static_cast<int>(H);
    ra.inverse = true;
    kernels::heads_norm_rope(o, inv_freq_dev_, cb, ra);
    // Grouped output projection: group g's heads through rows [g o_lora, (g + 1) o_lora) of wo_a.
    Tensor a = deepseek_v4_grouped_wo_a(step, o, wo_a_.weight().data(), v_.o_groups, v_.o_lora);
    return wo_b_.forward(step, a);
  }

 private:
  static std::vector<int64_t> all(int64_t n) {
    std::vector<int64_t> w(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) w[static_cast<size_t>(i)] = i;
    return w;
  }

  // The Lightning Indexer's choice for the query of row i (position p) of sequence s: the top
  // index_topk complete entries by Σ_h w_h ReLU(q_h · k) d^-½ (ties: the lower entry first).
  std::vector<int64_t> select(Step& step, const Batch& b, int s, int64_t i, int64_t p,
                              const Tensor& iq, const Tensor& iw) const {
    const int r = index_compressor_->ratio();
    const int64_t n = (p + 1) / r, NH = v_.index_heads, DI = v_.index_head_dim;
    if (n <= v_.index_topk) return all(n);
    const PagedRows rows = paged_rows(b, s, r);
    const Tensor& ent = index_compressor_->entries(step);
    const float sm = 1.0f / std::sqrt(static_cast<float>(DI));
    const float ws = 1.0f / std::sqrt(static_cast<float>(NH));
    std::vector<std::pair<float, int64_t>> score(static_cast<size_t>(n));
    for (int64_t w = 0; w < n; ++w) {
      const float* k = rows.row(ent, w);
      float acc = 0;
      for (int64_t h = 0; h < NH; ++h) {
        const float qk = dot(iq.ptr<float>() + (i * NH + h) * DI, k, DI);
        acc += (std::max(qk, 0.0f) * sm) * (iw.ptr<float>()[i * NH + h] * ws);
      }
      score[static_cast<size_t>(w)] = {acc, w};
    }
    std::partial_sort(score.begin(), score.begin() + v_.index_topk, score.end(),
                      [](const auto& x, const auto& y) {
                        return x.first > y.first || (x.first == y.first && x.second < y.second);
                      });
    std::vector<int64_t> out;
    for (int64_t k = 0; k < v_.index_topk; ++k) out.push_back(score[static_cast<size_t>(k)].second);
    return out;
  }

  const V4Config& v_;
  std::string type_;
  ReplicatedLinear wq_a_;
  RMSNorm q_norm_;
  ReplicatedLinear wq_b_, wkv_;
  RMSNorm kv_norm_;
  ReplicatedLinear wo_a_;  // [o_groups * o_lora, heads * head_dim / o_groups]: group g's rows
  Tensor wo_a_f32_;        // its weight in F32 (the weight itself unless that is BF16)
  ReplicatedLinear wo_b_;
  Parameter* sinks_;
  std::vector<float> inv_freq_;
  Tensor inv_freq_dev_;  // CUDA: inv_freq_ on the device
  float attention_factor_ = 1.0f;
  int raw_index_ = -1;
  std::unique_ptr<WindowCompressor> compressor_, index_compressor_;
  std::unique_ptr<ReplicatedLinear> index_wq_b_, index_weights_;
};

DeepseekV4MoeOptions moe_options(const ModelConfig& c, const V4Config& v, int64_t layer) {
  DeepseekV4MoeOptions o;
  o.hidden = v.hidden;
  o.vocab = c.vocab_size;
  o.experts = v.experts;
  o.top_k = v.top_k;
  o.moe_inter = v.moe_inter;
  o.shared = v.shared;
  o.scaling = v.scaling;
  o.limit = v.limit;
  o.scoring = v.scoring;
  o.fp4_experts = v.fp4_experts;
  o.hash = v.mlp_layer_types.at(static_cast<size_t>(layer)) == "hash_moe";
  return o;
}

class DeepseekV4DecoderLayer {
 public:
  DeepseekV4DecoderLayer(LayerContext& ctx, const ModelConfig& c, const V4Config& v, int64_t i,
                         const std::string& p)
      : attn_norm_(ctx, p + ".attn_norm", v.hidden, v.eps),
        ffn_norm_(ctx, p + ".ffn_norm", v.hidden, v.eps),
        attn_hc_(ctx, p + ".hc_attn_fn", p + ".hc_attn_base", p + ".hc_attn_scale", v.hc),
        ffn_hc_(ctx, p + ".hc_ffn_fn", p + ".hc_ffn_base", p + ".hc_ffn_scale", v.hc),
        attn_(ctx, c, v, i, p + ".attn"),
        ffn_(ctx, moe_options(c, v, i), p + ".ffn") {}

  // streams [T, hc, hidden], updated in place.
  void forward(Step& step, Tensor& streams) {
    HyperConnection::Mix m = attn_hc_.mix(step, streams);
    Tensor a = attn_.forward(step, attn_norm_.forward(step, m.input));
    HyperConnection::write_back(m, a, streams);
    m = ffn_hc_.mix(step, streams);
    Tensor f = ffn_.forward(step, ffn_norm_.forward(step, m.input));
    HyperConnection::write_back(m, f, streams);
  }

 private:
  RMSNorm attn_norm_, ffn_norm_;
  HyperConnection attn_hc_, ffn_hc_;
  DeepseekV4Attention attn_;
  DeepseekV4Moe ffn_;
};

class DeepseekV4ForCausalLM : public Model {
 public:
  // Pipeline parallelism: a stage builds its layers, the first the embedding, the last the
  // hyper-connection head, norm and head; the others are missing modules (never read). Stages
  // hand on the streams.
  DeepseekV4ForCausalLM(const ModelConfig& c, const ModelOptions& o) : Model(c, o), v_(c) {
    LayerContext& x = ctx();
    // The shared expert's parts by DeepSeek's names (their quantisation is looked up by them).
    x.packed_modules = {{"w1", "gate_up_proj", "0"}, {"w3", "gate_up_proj", "1"}};
    const PipelineStage& st = x.stage;
    if (st.first())
      embed_ = std::make_unique<VocabParallelEmbedding>(x, "model.embed_tokens", c.vocab_size,
                                                        c.hidden_size);
    else
      x.params.add_missing_module("model.embed_tokens");
    layers_ = make_layers<DeepseekV4DecoderLayer>(
        x, c.num_hidden_layers, "model.layers", [&](int64_t i, const std::string& prefix) {
          return std::make_unique<DeepseekV4DecoderLayer>(x, c, v_, i, prefix);
        });
    if (st.last()) {
      hc_head_ = std::make_unique<HyperHead>(x, "model.hc_head.hc_fn", "model.hc_head.hc_base",
                                             "model.hc_head.hc_scale", v_.hc);
      norm_ = std::make_unique<RMSNorm>(x, "model.norm", c.hidden_size, c.rms_norm_eps);
      head_ = std::make_unique<ParallelLMHead>(x, "head", c.vocab_size, c.hidden_size);
    } else {
      for (const char* m : {"model.hc_head", "model.norm", "head"}) x.params.add_missing_module(m);
    }
  }

  bool splits_into_stages() const override { return true; }

  Tensor forward(Step& step) override {
    const PipelineStage& st = stage();
    Tensor streams = st.first()
                         ? hc_streams_from_embedding(
                               step, embed_->forward(step, step.batch.dev.token_ids), v_.hc.hc_mult)
                         : hc_streams_from_stage(step, v_.hc.hc_mult, v_.hidden);
    for (int64_t i = st.first_layer; i < st.end_layer; ++i) {
      const Arena::Mark scratch = step.arena.mark();
      layers_[static_cast<size_t>(i)]->forward(step, streams);
      step.arena.release(scratch);
    }
    if (!st.last()) {
      ATOM_CHECK(step.pp_out, "pipeline stage {}: the step takes no tensors for the next stage",
                 st.rank);
      *step.pp_out = {streams, Tensor(), {}};
      return Tensor();
    }
    return norm_->forward(step, hc_head_->forward(step, streams));
  }

  Tensor compute_logits(Step& step, const Tensor& hidden) override {
    return logits_for_batch(step, hidden, *head_);
  }

  std::vector<std::string> quantization_methods() const override { return {"fp8"}; }

  WeightLoadSpec weight_load_spec() const override {
    WeightLoadSpec s = Model::weight_load_spec();
    deepseek_v4_release_names(s, v_.experts, v_.fp4_experts, v_.quantized);
    return s;
  }

 private:
  V4Config v_;
  std::unique_ptr<VocabParallelEmbedding> embed_;
  std::vector<std::unique_ptr<DeepseekV4DecoderLayer>> layers_;
  std::unique_ptr<HyperHead> hc_head_;
  std::unique_ptr<RMSNorm> norm_;
  std::unique_ptr<ParallelLMHead> head_;
};

}  // namespace

namespace {
ModelSupport deepseek_v4_support() {
  ModelSupport s;
  s.layer_types = {kSliding, kCsa, kHca};
  return s;
}
}  // namespace

ATOM_REGISTER_MODEL_SUPPORTING("DeepseekV4ForCausalLM", DeepseekV4ForCausalLM,
                               deepseek_v4_support());

}  // namespace atom
