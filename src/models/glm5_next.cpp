// GLM-5.3-Flash (transformers' modeling_glm5_next.py, Glm5NextForConditionalGeneration), text
// only.
//   * The residual is hc_mult streams joined by hyper-connections (layers/hyper_connection.h,
//     DeepSeek-V4's), one site before the mixer and one before the MLP; the final head is the
//     streams' mean.
//   * Mixers by layer_types: Kimi delta attention (layers/kimi_delta_attention.h) with GLM's safe
//     gate g = linear_lower_bound · sigmoid(exp(A_log) · (f + dt_bias)); or DeepSeek's multi-head
//     latent attention without RoPE (qk_rope_head_dim 0) over the tokens a k-pool indexer picks:
//     its keys kI = LayerNorm(wk(x)) are pooled over windows of index_kpool tokens by a gated
//     softmax (x · index_kpool_compress_gateᵀ + index_kpool_compress_ape, per channel), each
//     complete pool whose last token the query sees is scored Σ_h w_h ReLU(q_h · k_pool) d^-½
//     (q = wq_b(q LoRA), w = weights_proj(x) heads^-½), the top index_topk / index_kpool pools
//     expand to their tokens, and the incomplete tail pool's tokens are always added
//     (index_kpool_always_select_tail). A "shared" layer of indexer_types reuses the previous
//     layer's selection (which must be a full sparse-attention layer, as transformers requires).
//   * MLPs by mlp_layer_types: dense, or DeepSeek-V3's MoE (sigmoid + correction bias, groups,
//     renormalised, scaled, shared experts); every SwiGLU clamped at swiglu_limit.
// Names: model.language_model.* and lm_head; the vision tower (model.visual.*) and the MTP layers
// past num_hidden_layers are skipped unread. Tensor parallelism splits the KDA and MLA heads, the
// dense MLPs and the experts; the k-pool indexer and the hyper-connections are replicated. CPU
// and CUDA.
#include <algorithm>
#include <cmath>

#include "kernels/layer_norm.h"
#include "kernels/linear.h"
#include "kernels/mla.h"
#include "layers/hyper_connection.h"
#include "layers/kimi_delta_attention.h"
#include "models/deepseek.h"

namespace atom {

namespace {

constexpr const char* kLinear = "linear_attention";
constexpr const char* kDsa = "deepseek_sparse_attention";

std::vector<std::string> glm5_next_layer_types(const ModelConfig& c) {
  std::vector<std::string> types;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string t = c.layer_types.empty() ? (i % 4 != 3 ? kLinear : kDsa)
                                          : c.layer_types[static_cast<size_t>(i)];
    types.push_back(t == "full_attention" ? kDsa : t);
  }
  return types;
}

struct KpoolOptions {
  int64_t hidden = 0, q_lora = 0, heads = 0, dim = 0, topk = 0, kpool = 0;
  bool tail = true;
  int64_t width() const { return topk + (tail ? kpool - 1 : 0); }
};

KpoolOptions kpool_options(const ModelConfig& c) {
  const ConfigFields& t = c.text;
  KpoolOptions o;
  o.hidden = c.hidden_size;
  o.q_lora = t.get_int("q_lora_rank", 1536, IntRange{1, 1 << 16});
  o.heads = t.get_int("index_n_heads", 32, IntRange{1, 1 << 12});
  o.dim = t.get_int("index_head_dim", 128, IntRange{1, 1 << 14});
  o.topk = t.get_int("index_topk", 2048, IntRange{1, INT32_MAX});
  o.kpool = t.get_int("index_kpool", 16, IntRange{1, 1 << 16});
  if (o.topk % o.kpool != 0)
    t.bad("index_topk", fmt::format("must be a multiple of index_kpool ({})", o.kpool));
  o.tail = t.get_bool("index_kpool_always_select_tail", true);
  return o;
}

// The k-pool DSA indexer (Glm5NextTextIndexer). Each token's LayerNorm'd key and gate scores are
// cached side by side (a kRows plane, one row of 2 d per token); kernels::kpool_topk pools,
// scores and selects from them.
class KpoolIndexer {
 public:
  KpoolIndexer(LayerContext& ctx, const std::string& prefix, const KpoolOptions& o)
      : ctx_(ctx),
        o_(o),
        wq_b_(ctx, prefix + ".wq_b", o.q_lora, o.heads * o.dim, false),
        wk_(ctx, prefix + ".wk", o.hidden, o.dim, false),
        // Read densely into F32 below, as DeepSeek-V3.2's indexer does.
        weights_proj_(ctx, prefix + ".weights_proj", o.hidden, o.heads, false,
                      LinearStorage::kUnquantized) {
    k_norm_w_ = &ctx.params.add(prefix + ".k_norm.weight", ctx.param_tensor({o.dim}, DType::kF32));
    k_norm_b_ = &ctx.params.add(prefix + ".k_norm.bias", ctx.param_tensor({o.dim}, DType::kF32));
    ape_ = &ctx.params.add(prefix + ".index_kpool_compress_ape",
                           ctx.param_tensor({o.kpool, o.dim}, DType::kF32));
    gate_ = &ctx.params.add(prefix + ".index_kpool_compress_gate",
                            ctx.param_tensor({o.dim, o.hidden}, ctx.weight_dtype));
    cache_index_ = static_cast<int>(ctx.cache_specs->size());
    // In the activation dtype under an FP8 KV cache too: rounding the gate scores to e4m3 moved
    // the fixture's logits by 0.32 (relative) where the latent plane's rounding alone moves them
    // by a few 1e-2.
    ctx.cache_specs->push_back(
        CacheSpec::rows(static_cast<int>(2 * o.dim), 1, ctx.act_dtype, /*keeps_dtype=*/true));
  }

  // out [T, width] I32: the context positions each row attends to, -1 past the last.
  void forward(Step& step, const Tensor& x, const Tensor& q_resid, Tensor& out) {
    const Batch& b = step.batch;
    const int64_t T = x.size(0), D = o_.dim;
    Tensor q = wq_b_.forward(step, q_resid);
    // Each token's (LayerNorm(wk x) | x · gateᵀ) into its row of the plane.
    Tensor rows = step.empty({T, 2 * D}, ctx_.act_dtype);
    Tensor k = rows.narrow(1, 0, D), gate = rows.narrow(1, D, D);
    kernels::layer_norm(k, wk_.forward(step, x), k_norm_w_->data(), k_norm_b_->data(), 1e-6f);
    kernels::linear(gate, x, gate_->data());
    Tensor& plane = step.kv->plane(static_cast<size_t>(cache_index_), CacheKind::kRows);
    kernels::cache_rows_write(plane, rows, b.dev.slot_mapping);
    Tensor weights = step.empty({T, o_.heads}, DType::kF32);
    kernels::linear(weights, x, weights_proj_.weight().data());
    kernels::KpoolArgs a;
    a.num_heads = static_cast<int>(o_.heads);
    a.head_dim = static_cast<int>(D);
    a.pool = static_cast<int>(o_.kpool);
    a.top_k = static_cast<int>(o_.topk);
    a.tail = o_.tail;
    a.scale = 1.0f / std::sqrt(static_cast<float>(D));
    a.weights_scale = 1.0f / std::sqrt(static_cast<float>(o_.heads));
    a.max_query_len = b.max_query_len;
    a.max_context_len = b.max_context_len;
    kernels::AttentionBatch ab{&b.dev.query_start, &b.dev.context_lens, &b.dev.page_indptr,
                               &b.dev.page_indices};
    Tensor workspace;
    const int64_t ws = kernels::kpool_topk_workspace_size(ctx_.device, T, b.num_seqs(), a);
    if (ws > 0) {
      workspace = step.empty({ws}, DType::kF32);
      ab.workspace = &workspace;
    }
    kernels::kpool_topk(out, q, weights, plane, ape_->data(), ab, a);
  }

 private:
  LayerContext& ctx_;
  KpoolOptions o_;
  ReplicatedLinear wq_b_, wk_, weights_proj_;
  Parameter* k_norm_w_;
  Parameter* k_norm_b_;
  Parameter* ape_;
  Parameter* gate_;
  int cache_index_ = -1;
};

class Glm5NextDecoderLayer {
 public:
  Glm5NextDecoderLayer(LayerContext& ctx, const ModelConfig& c, const HyperConnectionOptions& hc,
                       int64_t layer, const std::string& p)
      : input_layernorm_(ctx, p + ".input_layernorm", c.hidden_size, c.rms_norm_eps),
        post_attention_layernorm_(ctx, p + ".post_attention_layernorm", c.hidden_size,
                                  c.rms_norm_eps),
        attn_hc_(ctx, p + ".hc_attn_fn", p + ".hc_attn_base", p + ".hc_attn_scale", hc),
        ffn_hc_(ctx, p + ".hc_ffn_fn", p + ".hc_ffn_base", p + ".hc_ffn_scale", hc) {
    const ConfigFields& t = c.text;
    const auto types = glm5_next_layer_types(c);
    const std::string& type = types.at(static_cast<size_t>(layer));
    const float limit =
        static_cast<float>(t.get_double("swiglu_limit", 10.0, RealRange::positive()));
    if (type == kLinear) {
      kda_ = std::make_unique<KimiDeltaAttention>(ctx, p + ".self_attn", kda_options(c));
    } else {
      MlaOptions m;
      m.hidden = c.hidden_size;
      m.num_heads = c.num_attention_heads;
      m.q_lora_rank = t.get_int("q_lora_rank", 1536, IntRange{1, 1 << 16});
      m.kv_lora_rank = t.get_int("kv_lora_rank", 512, IntRange{1, 1 << 16});
      m.qk_nope_head_dim = t.get_int("qk_nope_head_dim", 256, IntRange{1, 1 << 14});
      m.qk_rope_head_dim = t.get_int("qk_rope_head_dim", 0, IntRange{0, 1 << 14});
      if (m.qk_rope_head_dim != 0)
        t.bad("qk_rope_head_dim", "must be 0 (GLM-5.3's sparse attention has no RoPE)");
      m.v_head_dim = t.get_int("v_head_dim", 256, IntRange{1, 1 << 14});
      m.bias = c.attention_bias;
      m.norm_eps = c.rms_norm_eps;
      m.apply_rope = false;
      m.rope = c.rope;
      m.max_position_embeddings = c.max_position_embeddings;
      mla_ = std::make_unique<MultiHeadLatentAttention>(ctx, p + ".self_attn", m);
      const auto indexers = dsa_indexer_types(c);
      if (indexers.at(static_cast<size_t>(layer)) == "full") {
        indexer_ = std::make_unique<KpoolIndexer>(ctx, p + ".self_attn.indexer", kpool_options(c));
      } else if (layer == 0 || types.at(static_cast<size_t>(layer - 1)) != kDsa ||
                 indexers.at(static_cast<size_t>(layer - 1)) != "full") {
        t.bad("indexer_types", fmt::format("layer {} is 'shared' but layer {} is not a full "
                                           "sparse-attention layer whose selection it could reuse",
                                           layer, layer - 1));
      }
    }
    mlp_ = deepseek_v32_family_mlp(ctx, c, layer, p + ".mlp", 1, 1, limit);
  }

  // streams [T, hc, hidden] in place; topk: the selection of the last full sparse layer.
  void forward(Step& step, Tensor& streams, Tensor& topk) {
    HyperConnection::Mix m = attn_hc_.mix(step, streams);
    Tensor x = input_layernorm_.forward(step, m.input);
    Tensor a;
    if (kda_) {
      a = kda_->forward(step, x);
    } else {
      auto pr = mla_->project(step, x);
      if (indexer_) indexer_->forward(step, x, pr.q_resid, topk);
      a = mla_->attend(step, pr, topk);
    }
    HyperConnection::write_back(m, a, streams);
    m = ffn_hc_.mix(step, streams);
    Tensor f = mlp_->forward(step, post_attention_layernorm_.forward(step, m.input));
    HyperConnection::write_back(m, f, streams);
  }

 private:
  static KimiDeltaAttentionOptions kda_options(const ModelConfig& c) {
    const ConfigFields& t = c.text;
    const auto& j = t.obj();
    const nlohmann::json* la =
        j.contains("linear_attn_config") && j["linear_attn_config"].is_object()
            ? &j["linear_attn_config"]
            : nullptr;
    auto from_la = [&](const char* key, int64_t fallback) {
      return la && la->contains(key) && (*la)[key].is_number_integer() ? (*la)[key].get<int64_t>()
                                                                       : fallback;
    };
    KimiDeltaAttentionOptions o;
    o.hidden = c.hidden_size;
    o.num_heads = static_cast<int>(
        t.get_int("linear_num_heads", from_la("num_heads", 64), IntRange{1, 1 << 12}));
    o.head_dim = static_cast<int>(
        t.get_int("linear_head_dim", from_la("head_dim", 128), IntRange{1, 1 << 12}));
    o.conv_kernel = static_cast<int>(
        t.get_int("linear_conv_kernel_dim", from_la("short_conv_kernel_size", 4), IntRange{1, 64}));
    o.eps = c.rms_norm_eps;
    // linear_lower_bound (null: Kimi's softplus gate); linear_attn_config's gate_lower_bound.
    double lb = -5.0;
    if (j.contains("linear_lower_bound"))
      lb = j["linear_lower_bound"].is_null()
               ? 0.0
               : t.get_double("linear_lower_bound", RealRange{-HUGE_VAL, 0.0, false, true});
    else if (la && la->contains("gate_lower_bound") && (*la)["gate_lower_bound"].is_number())
      lb = (*la)["gate_lower_bound"].get<double>();
    o.gate_lower_bound = static_cast<float>(lb);
    return o;
  }

  RMSNorm input_layernorm_, post_attention_layernorm_;
  HyperConnection attn_hc_, ffn_hc_;
  std::unique_ptr<KimiDeltaAttention> kda_;
  std::unique_ptr<MultiHeadLatentAttention> mla_;
  std::unique_ptr<KpoolIndexer> indexer_;
  std::unique_ptr<FeedForward> mlp_;
};

class Glm5NextForConditionalGeneration : public Model {
 public:
  Glm5NextForConditionalGeneration(const ModelConfig& c, const ModelOptions& o)
      : Model(c, o), kpool_(kpool_options(c)) {
    LayerContext& x = ctx();
    const ConfigFields& t = c.text;
    if (c.num_key_value_heads != c.num_attention_heads)
      t.bad("num_key_value_heads",
            fmt::format("must equal num_attention_heads ({})", c.num_attention_heads));
    hc_.hidden = c.hidden_size;
    hc_.hc_mult = static_cast<int>(t.get_int("hc_mult", 4, IntRange{1, 64}));
    hc_.sinkhorn_iters = static_cast<int>(t.get_int("hc_sinkhorn_iters", 20, IntRange{1, 1000}));
    hc_.hc_eps = static_cast<float>(t.get_double("hc_eps", 1e-6, RealRange::non_negative()));
    hc_.norm_eps = static_cast<float>(c.rms_norm_eps);
    // Pipeline parallelism: a stage builds its layers, the first the embedding, the last the
    // norm and head; the others are missing modules (never read). Stages hand on the streams and
    // the last sparse layer's selection (a stage may begin with a shared layer).
    const PipelineStage& st = x.stage;
    const std::string root = "model.language_model";
    if (st.first())
      embed_ = std::make_unique<VocabParallelEmbedding>(x, root + ".embed_tokens", c.vocab_size,
                                                        c.hidden_size);
    else
      x.params.add_missing_module(root + ".embed_tokens");
    layers_ = make_layers<Glm5NextDecoderLayer>(
        x, c.num_hidden_layers, root + ".layers", [&](int64_t i, const std::string& prefix) {
          return std::make_unique<Glm5NextDecoderLayer>(x, c, hc_, i, prefix);
        });
    head_ = std::make_unique<HyperHead>(x, hc_);
    if (st.last()) {
      norm_ = std::make_unique<RMSNorm>(x, root + ".norm", c.hidden_size, c.rms_norm_eps);
      lm_head_ = std::make_unique<ParallelLMHead>(x, "lm_head", c.vocab_size, c.hidden_size);
    } else {
      x.params.add_missing_module(root + ".norm");
      x.params.add_missing_module("lm_head");
    }
  }

  bool splits_into_stages() const override { return true; }

  Tensor forward(Step& step) override {
    const PipelineStage& st = stage();
    const int64_t T = step.batch.num_tokens();
    Tensor streams = st.first()
                         ? hc_streams_from_embedding(
                               step, embed_->forward(step, step.batch.dev.token_ids), hc_.hc_mult)
                         : hc_streams_from_stage(step, hc_.hc_mult, hc_.hidden);
    Tensor topk = step.empty({T, kpool_.width()}, DType::kI32);  // outlives the layers' scratch
    if (!st.first()) {
      const auto& extra = step.pp_in->extra;
      ATOM_CHECK(
          extra.size() == 1 && extra[0].shape() == topk.shape() && extra[0].dtype() == DType::kI32,
          "GLM-5.3: the previous pipeline stage handed on {} tensors, not the selection {}",
          extra.size(), topk.str());
      topk = extra[0];  // the step's own copy (Step::pp_in)
    }
    for (int64_t i = st.first_layer; i < st.end_layer; ++i) {
      const Arena::Mark scratch = step.arena.mark();
      layers_[static_cast<size_t>(i)]->forward(step, streams, topk);
      step.arena.release(scratch);
    }
    if (!st.last()) {
      ATOM_CHECK(step.pp_out, "pipeline stage {}: the step takes no tensors for the next stage",
                 st.rank);
      *step.pp_out = {streams, Tensor(), {topk}};
      return Tensor();
    }
    return norm_->forward(step, head_->forward(step, streams));
  }

  Tensor compute_logits(Step& step, const Tensor& hidden) override {
    return logits_for_batch(step, hidden, *lm_head_);
  }
  WeightLoadSpec weight_load_spec() const override {
    WeightLoadSpec s = deepseek_weight_load_spec(*this, deepseek_num_experts(config(), 288), 1);
    s.weights_mapping.prefix.push_back({"model.visual.", std::nullopt});  // text only
    return s;
  }

 private:
  KpoolOptions kpool_;
  HyperConnectionOptions hc_;
  std::unique_ptr<VocabParallelEmbedding> embed_;
  std::vector<std::unique_ptr<Glm5NextDecoderLayer>> layers_;
  std::unique_ptr<HyperHead> head_;
  std::unique_ptr<RMSNorm> norm_;
  std::unique_ptr<ParallelLMHead> lm_head_;
};

ModelSupport glm5_next_support() {
  ModelSupport s;
  s.layer_types = {kLinear, kDsa, "full_attention"};
  s.head_dim = false;
  return s;
}

}  // namespace

ATOM_REGISTER_MODEL_SUPPORTING("Glm5NextForConditionalGeneration", Glm5NextForConditionalGeneration,
                               glm5_next_support());

}  // namespace atom
