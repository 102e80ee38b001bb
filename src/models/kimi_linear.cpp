// Kimi-Linear (transformers' modeling_kimi_linear.py; the backbone of Kimi-K3): Kimi delta
// attention layers (layers/kimi_delta_attention.h) interleaved with multi-head latent attention
// without RoPE (KimiLinearAttention: DeepSeek's MLA whose qk_rope_head_dim channels are split
// off and shared but never rotated; the latent cache), as layer_types says; each followed by a
// dense MLP or by KimiLinearMoE (DeepSeek-V3's router: sigmoid scores plus
// e_score_correction_bias for the choice, top-2-sum groups, renormalised, times
// routed_scaling_factor; beside num_shared_experts shared experts), as mlp_layer_types says.
//
// Kimi-K3 (KimiK3ForConditionalGeneration: this text model under language_model.*, with the
// MoonViT3d vision tower and patchmergerv2 projector of models/moonvit.h when vision_config
// describes them, else skipped unread) is the same modelling file with Moonshot's options on:
//   hidden_act "situ": every MLP and expert computes SiTU (activation_situ_beta, default 1, and
//     activation_situ_linear_beta, default none; kernels/activation.h);
//   mla_use_output_gate: o_proj(attn · sigmoid(g_proj(x)));
//   linear_attn_config.use_full_rank_gate: KDA's output gate is one g_proj; gate_lower_bound:
//     the bounded forget gate lb · sigmoid(exp(A_log) · (f + dt_bias));
//   routed_expert_hidden_size: the latent MoE (experts between routed_expert_down_proj and
//     routed_expert_up_proj, routed_expert_norm when latent_moe_use_norm; layers/moe.h);
//   attn_res_block_size: attention residuals (kernels/attn_res.h) instead of the residual add.
//     Rows of a bank: the embeddings, then the sum of each completed block of
//     attn_res_block_size layers' sublayer outputs, then the current block's running sum; each
//     sublayer's input is the mix of the rows by self_attention_res_{norm,proj} (before the
//     attention) or mlp_res_{norm,proj} (before the MLP), the final norm's that of
//     model.output_attn_res_{norm,proj}. Layers 0, bs, 2 bs, ... start a block after their
//     attention's mix.
//
// Config names: transformers saves its attribute_map's targets (num_experts,
// num_experts_per_token, moe_renormalize, num_expert_group, num_shared_experts) and the hub's
// configs carry linear_attn_config {kda_layers, full_attn_layers (1-indexed), num_heads,
// head_dim, short_conv_kernel_size} and first_k_dense_replace; either is read. Checkpoints
// name MoE blocks block_sparse_moe (transformers writes that name for the dense MLPs too) with
// experts.J.w1/w3/w2.
#include <algorithm>

#include "core/convert.h"
#include "core/env.h"
#include "kernels/attn_res.h"
#include "kernels/elementwise.h"
#include "layers/kimi_delta_attention.h"
#include "models/deepseek.h"
#include "models/moonvit.h"

namespace atom {

namespace {

// The first of `keys` the config has (transformers' attribute_map names and their targets).
int64_t kimi_int(const ConfigFields& t, std::initializer_list<const char*> keys, int64_t fallback) {
  for (const char* k : keys)
    if (t.has(k)) return t.get_int(k);
  return fallback;
}

const nlohmann::json* linear_attn_config(const ConfigFields& t) {
  const auto& j = t.obj();
  auto it = j.find("linear_attn_config");
  return it != j.end() && it->is_object() ? &*it : nullptr;
}

// Whether layer `layer` is KDA ("linear_attention") or MLA ("full_attention"): layer_types;
// else linear_attn_config's 1-indexed kda_layers / full_attn_layers; else transformers' default
// (full attention on every fourth layer after the first).
bool kimi_is_linear_attention(const ModelConfig& c, int64_t layer) {
  const ConfigFields& t = c.text;
  if (!c.layer_types.empty()) {
    const std::string& ty = c.layer_types.at(static_cast<size_t>(layer));
    if (ty != "linear_attention" && ty != "full_attention")
      t.bad("layer_types", fmt::format("layer {} is '{}', expected linear_attention or "
                                       "full_attention",
                                       layer, ty));
    return ty == "linear_attention";
  }
  if (const nlohmann::json* la = linear_attn_config(t);
      la && la->contains("kda_layers") && la->contains("full_attn_layers")) {
    int found = 0;
    bool linear = false;
    for (const char* key : {"kda_layers", "full_attn_layers"})
      for (const auto& v : (*la)[key]) {
        if (!v.is_number_integer() || v.get<int64_t>() < 1 ||
            v.get<int64_t>() > c.num_hidden_layers)
          t.bad("linear_attn_config", fmt::format("{} has {}, expected 1-indexed layers up to {}",
                                                  key, v.dump(), c.num_hidden_layers));
        if (v.get<int64_t>() == layer + 1) {
          ++found;
          linear = std::string(key) == "kda_layers";
        }
      }
    if (found != 1)
      t.bad("linear_attn_config", fmt::format("layer {} (1-indexed) is in {} of kda_layers and "
                                              "full_attn_layers, expected exactly one",
                                              layer + 1, found));
    return linear;
  }
  return !(layer > 0 && layer % 4 == 0);
}

KimiDeltaAttentionOptions kimi_delta_attention_options(const ModelConfig& c) {
  const ConfigFields& t = c.text;
  const nlohmann::json* la = linear_attn_config(t);
  auto field = [&](const char* name, const char* nested, int64_t fallback) {
    if (t.has(name)) return t.get_int(name);
    if (la && la->contains(nested) && (*la)[nested].is_number_integer())
      return (*la)[nested].get<int64_t>();
    return fallback;
  };
  KimiDeltaAttentionOptions o;
  o.hidden = c.hidden_size;
  o.num_heads = static_cast<int>(field("linear_num_heads", "num_heads", 32));
  o.head_dim = static_cast<int>(field("linear_head_dim", "head_dim", 128));
  o.conv_kernel = static_cast<int>(field("linear_conv_kernel_dim", "short_conv_kernel_size", 4));
  if (o.num_heads < 1) t.bad("linear_num_heads", "must be positive");
  if (o.head_dim < 1) t.bad("linear_head_dim", "must be positive");
  if (o.conv_kernel < 1) t.bad("linear_conv_kernel_dim", "must be positive");
  o.eps = c.rms_norm_eps;
  // Kimi-K3: the bounded forget gate and the full-rank output gate.
  if (la && la->contains("gate_lower_bound") && !(*la)["gate_lower_bound"].is_null()) {
    const auto& lb = (*la)["gate_lower_bound"];
    if (!lb.is_number() || !(lb.get<double>() < 0) || !std::isfinite(lb.get<double>()))
      t.bad("linear_attn_config", "gate_lower_bound must be a negative number, got " + lb.dump());
    o.gate_lower_bound = lb.get<float>();
  }
  if (la && la->contains("use_full_rank_gate")) {
    if (!(*la)["use_full_rank_gate"].is_boolean())
      t.bad("linear_attn_config", "use_full_rank_gate must be true or false");
    o.full_rank_output_gate = (*la)["use_full_rank_gate"].get<bool>();
  }
  return o;
}

// The MLPs' and experts' activation: SiLU, or Kimi-K3's SiTU with its constants.
kernels::Glu kimi_activation(const ModelConfig& c) {
  const ConfigFields& t = c.text;
  if (c.hidden_act == "silu") return kernels::Glu::silu();
  if (c.hidden_act != "situ")
    t.bad("hidden_act", "must be silu or situ, got '" + c.hidden_act + "'");
  auto beta = [&](const char* key, double fallback) {
    if (!t.has(key) || t.obj()[key].is_null()) return fallback;
    const double b = t.get_double(key);
    if (!(b > 0) || !std::isfinite(b)) t.bad(key, fmt::format("must be positive, got {}", b));
    return b;
  };
  return kernels::Glu::situ(static_cast<float>(beta("activation_situ_beta", 1.0)),
                            static_cast<float>(beta("activation_situ_linear_beta", 0.0)));
}

// KimiLinearAttention: MLA with no RoPE, softmax scale (qk_nope + qk_rope)^-0.5.
MlaOptions kimi_mla_options(const ModelConfig& c) {
  MlaOptions o = deepseek_mla_options(c, /*interleaved_rope=*/false);
  o.apply_rope = false;
  o.output_gate = c.text.get_bool("mla_use_output_gate", false);
  o.scale = 1.0 / std::sqrt(static_cast<double>(o.qk_nope_head_dim + o.qk_rope_head_dim));
  return o;
}

// The token mixer of a layer: KDA or NoPE MLA, both under self_attn.
class KimiLinearMixer {
 public:
  KimiLinearMixer(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                  const std::string& prefix) {
    if (kimi_is_linear_attention(c, layer))
      kda_ = std::make_unique<KimiDeltaAttention>(ctx, prefix, kimi_delta_attention_options(c));
    else
      mla_ = std::make_unique<MultiHeadLatentAttention>(ctx, prefix, kimi_mla_options(c));
  }
  Tensor forward(Step& step, const Tensor& x) {
    return kda_ ? kda_->forward(step, x) : mla_->forward(step, x);
  }

 private:
  std::unique_ptr<KimiDeltaAttention> kda_;
  std::unique_ptr<MultiHeadLatentAttention> mla_;
};

int64_t kimi_num_experts(const ModelConfig& c) {
  return kimi_int(c.text, {"num_experts", "num_local_experts", "n_routed_experts"}, 256);
}

int64_t kimi_num_shared_experts(const ModelConfig& c) {
  return kimi_int(c.text, {"num_shared_experts", "n_shared_experts"}, 1);
}

// mlp_layer_types ("dense" / "sparse" per layer), else first_k_dense_replace (default 1) dense.
bool kimi_sparse_mlp(const ModelConfig& c, int64_t layer) {
  const ConfigFields& t = c.text;
  if (!t.has("mlp_layer_types")) return layer >= t.get_int("first_k_dense_replace", 1);
  const auto types = t.get_string_list("mlp_layer_types");
  if (static_cast<int64_t>(types.size()) != c.num_hidden_layers)
    t.bad("mlp_layer_types",
          fmt::format("has {} entries for {} layers", types.size(), c.num_hidden_layers));
  const std::string& k = types[static_cast<size_t>(layer)];
  if (k != "dense" && k != "sparse")
    t.bad("mlp_layer_types", "entries must be 'dense' or 'sparse', got '" + k + "'");
  return k == "sparse";
}

// Kimi-K3's latent MoE (routed_expert_hidden_size set).
bool kimi_latent_moe(const ModelConfig& c) {
  return c.text.has("routed_expert_hidden_size") &&
         !c.text.obj()["routed_expert_hidden_size"].is_null();
}

// The routed experts stored MXFP4-packed (compressed-tensors' mxfp4-pack-quantized, Kimi-K3's
// release): the quantization_config's targets name the experts' projections (checked on layer
// 1's expert 0 as atom names it, model.layers.1.mlp.experts.0.w1; an MXFP4 group targets every
// layer's experts alike).
bool kimi_mxfp4_experts(const ModelConfig& c) {
  return c.quantization && c.quantization->method == "compressed-tensors" &&
         c.quantization->mxfp4_packed("model.layers.1.mlp.experts.0.w1");
}

std::unique_ptr<FeedForward> kimi_linear_mlp(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                             const std::string& prefix) {
  const ConfigFields& t = c.text;
  const kernels::Glu act = kimi_activation(c);
  if (!kimi_sparse_mlp(c, layer))
    return std::make_unique<GatedMlp>(ctx, prefix, c.hidden_size, c.intermediate_size, false,
                                      /*reduce_results=*/true, act);
  SparseMoeOptions o;
  o.experts.activation = act;
  if (kimi_mxfp4_experts(c)) {
    // Packed on CUDA (W4A16), dequantised at load on the CPU.
    o.experts.quant = ExpertQuant::kMxfp4;
    o.experts.stacked_formats = fused_moe_mxfp4_pack_formats();  // one buffer per layer
  }
  // Kimi-K3's latent MoE.
  if (kimi_latent_moe(c)) {
    o.latent_hidden = t.get_int("routed_expert_hidden_size");
    if (o.latent_hidden < 1) t.bad("routed_expert_hidden_size", "must be positive or null");
    o.latent_norm = t.get_bool("latent_moe_use_norm", false);
    o.latent_norm_eps = c.rms_norm_eps;
    // The shared experts (on the full hidden size) on a second CUDA stream beside the routed
    // ones, as the spec's switch says; off by default.
    o.shared_overlap = env_bool("ATOM_K3_SHARED_EXPERT_OVERLAP", false);
  }
  o.hidden = c.hidden_size;
  o.num_experts = kimi_num_experts(c);
  if (o.num_experts < 1) t.bad("num_experts", "must be positive");
  o.moe_intermediate = t.get_int("moe_intermediate_size");
  if (o.moe_intermediate < 1) t.bad("moe_intermediate_size", "must be positive");
  o.router.scoring = kernels::RouterScoring::kSigmoid;
  o.router.top_k =
      static_cast<int>(kimi_int(t, {"num_experts_per_token", "num_experts_per_tok"}, 8));
  if (o.router.top_k < 1 || o.router.top_k > o.num_experts)
    t.bad("num_experts_per_token", fmt::format("must be in [1, {}]", o.num_experts));
  o.router.n_group = static_cast<int>(kimi_int(t, {"num_expert_group", "n_group"}, 1));
  o.router.topk_group = static_cast<int>(kimi_int(t, {"topk_group"}, 1));
  const int G = o.router.n_group, keep = o.router.topk_group;
  if (G < 1 || o.num_experts % G != 0)
    t.bad("num_expert_group", fmt::format("must divide num_experts ({})", o.num_experts));
  if (keep < 1 || keep > G || (G > 1 && keep * (o.num_experts / G) < o.router.top_k))
    t.bad("topk_group", fmt::format("must be in [1, num_expert_group = {}] and keep at least "
                                    "num_experts_per_token experts",
                                    G));
  o.router.group_score = kernels::GroupScore::kTop2Sum;
  o.router.renormalize = t.has("moe_renormalize") ? t.get_bool("moe_renormalize", true)
                                                  : t.get_bool("norm_topk_prob", true);
  o.router.routed_scaling_factor = static_cast<float>(t.get_double("routed_scaling_factor", 1.0));
  o.correction_bias = true;
  const int64_t shared = kimi_num_shared_experts(c);
  if (shared < 0) t.bad("num_shared_experts", "must be >= 0");
  o.shared_intermediate = shared * o.moe_intermediate;
  o.fuse_shared = ctx.fuse_shared_experts && o.latent_hidden == 0;
  return std::make_unique<SparseMoeBlock>(ctx, prefix, o);
}

// attn_res_block_size (Kimi-K3): 0 when the config has none.
int64_t kimi_attn_res_block(const ModelConfig& c) {
  const ConfigFields& t = c.text;
  if (!t.has("attn_res_block_size") || t.obj()["attn_res_block_size"].is_null()) return 0;
  const int64_t bs = t.get_int("attn_res_block_size");
  if (bs < 1) t.bad("attn_res_block_size", "must be positive or null");
  if (1 + (c.num_hidden_layers + bs - 1) / bs > kernels::kAttnResMaxRows)
    t.bad("attn_res_block_size",
          fmt::format("{} blocks of {} layers: at most {} rows are mixed",
                      (c.num_hidden_layers + bs - 1) / bs, bs, kernels::kAttnResMaxRows - 1));
  return bs;
}

// A mix site of the attention residuals: "<base>_norm.weight" [H] and "<base>_proj.weight"
// [1, H], folded after loading into the one score vector the mix reads.
class AttnResSite {
 public:
  AttnResSite(LayerContext& ctx, const std::string& base, int64_t hidden, double eps)
      : eps_(static_cast<float>(eps)) {
    norm_ = &ctx.params.add(base + "_norm.weight", ctx.param_tensor({hidden}, DType::kF32));
    proj_ = &ctx.params.add(base + "_proj.weight", ctx.param_tensor({1, hidden}, DType::kF32));
    w_ = ctx.param_tensor({hidden}, DType::kF32);
    ctx.params.add_post_load([this] {
      Tensor n = tensor_cast_cpu(norm_->data(), DType::kF32),
             p = tensor_cast_cpu(proj_->data(), DType::kF32);
      for (int64_t c = 0; c < n.numel(); ++c) n.ptr<float>()[c] *= p.ptr<float>()[c];
      tensor_assign(w_, n);
    });
  }
  // out = the mix of the bank's first n rows.
  void mix(Tensor& out, const Tensor& bank, int64_t n) const {
    kernels::attn_res(out, bank, n, w_, eps_);
  }

 private:
  float eps_;
  Parameter* norm_;
  Parameter* proj_;
  Tensor w_;
};

// input_layernorm -> self_attn -> post_attention_layernorm -> mlp, with the residual add
// (LlamaDecoderLayer's forward) or, under attention residuals, over the bank.
class KimiDecoderLayer : public LlamaDecoderLayer<KimiLinearMixer, PerLayerMlp<kimi_linear_mlp>> {
 public:
  KimiDecoderLayer(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                   const std::string& prefix)
      : LlamaDecoderLayer(ctx, c, layer, prefix), layer_(layer), block_(kimi_attn_res_block(c)) {
    if (block_ > 0) {
      attn_site_ = std::make_unique<AttnResSite>(ctx, prefix + ".self_attention_res", c.hidden_size,
                                                 c.rms_norm_eps);
      mlp_site_ =
          std::make_unique<AttnResSite>(ctx, prefix + ".mlp_res", c.hidden_size, c.rms_norm_eps);
    }
  }
  // bank [T, B, H] F32 with n rows in use, the last the current block's running sum; x: scratch
  // [T, H] in the activation dtype.
  void forward_attn_res(Step& step, Tensor& bank, int64_t& n, Tensor& x) {
    attn_site_->mix(x, bank, n);
    const bool starts_block = layer_ % block_ == 0;
    if (starts_block) ++n;  // the running sum becomes a completed block
    Tensor cur = bank.select(1, n - 1);
    Tensor a = self_attn().forward(step, input_layernorm().forward(step, x));
    if (starts_block) {
      kernels::cast(cur, a);
    } else {
      kernels::add(cur, cur, a);
    }
    mlp_site_->mix(x, bank, n);
    Tensor m = mlp().forward(step, post_attention_layernorm().forward(step, x));
    kernels::add(cur, cur, m);
  }

 private:
  int64_t layer_, block_;
  std::unique_ptr<AttnResSite> attn_site_, mlp_site_;
};

class KimiLinearForCausalLM : public DecoderOnlyLM<KimiDecoderLayer> {
 public:
  KimiLinearForCausalLM(const ModelConfig& c, const ModelOptions& o)
      : DecoderOnlyLM(c, o), block_(kimi_attn_res_block(c)) {
    if (block_ > 0) {
      if (stage().last())
        output_site_ = std::make_unique<AttnResSite>(ctx(), "model.output_attn_res", c.hidden_size,
                                                     c.rms_norm_eps);
      else
        for (const char* m : {"model.output_attn_res_norm", "model.output_attn_res_proj"})
          ctx().params.add_missing_module(m);
    }
  }

  Tensor forward(Step& step) override {
    if (block_ == 0) return DecoderOnlyLM::forward(step);
    const PipelineStage& st = stage();
    const int64_t T = step.batch.num_tokens(), H = config().hidden_size;
    // Rows: the embeddings and one per block.
    const int64_t B = 1 + (config().num_hidden_layers + block_ - 1) / block_;
    Tensor bank;
    if (st.first()) {
      bank = step.empty({T, B, H}, DType::kF32);
      Tensor row0 = bank.select(1, 0);
      kernels::cast(row0, embed_tokens_->forward(step, step.batch.dev.token_ids));
    } else {
      const Tensor* in = step.pp_in ? &step.pp_in->hidden : nullptr;
      ATOM_CHECK(in && in->defined() && in->dim() == 3 && in->size(0) == T && in->size(1) == B &&
                     in->size(2) == H && in->dtype() == DType::kF32,
                 "attention residuals: the previous pipeline stage handed on {}, not the "
                 "[{}, {}, {}] F32 bank",
                 in && in->defined() ? in->str() : std::string("nothing"), T, B, H);
      bank = *in;  // the step's own copy
    }
    // Rows in use at the stage's first layer: the embeddings and the blocks begun before it.
    int64_t n = 1 + (st.first_layer + block_ - 1) / block_;
    Tensor x = step.empty({T, H}, ctx().act_dtype);
    for (int64_t i = st.first_layer; i < st.end_layer; ++i) {
      const Arena::Mark scratch = step.arena.mark();
      layers_[static_cast<size_t>(i)]->forward_attn_res(step, bank, n, x);
      step.arena.release(scratch);
    }
    if (!st.last()) {
      ATOM_CHECK(step.pp_out, "pipeline stage {}: the step takes no tensors for stage {}", st.rank,
                 st.rank + 1);
      *step.pp_out = {bank, Tensor(), {}};
      return Tensor();
    }
    output_site_->mix(x, bank, n);
    return norm_->forward(step, x);
  }

  std::vector<std::string> quantization_methods() const override {
    return {"compressed-tensors"};  // MXFP4-packed experts (Kimi-K3), FP8 linears
  }

  WeightLoadSpec weight_load_spec() const override {
    const int64_t E = kimi_num_experts(config());
    const bool latent = kimi_latent_moe(config());
    WeightLoadSpec s =
        deepseek_weight_load_spec(*this, E, kimi_num_shared_experts(config()), !latent);
    // First: the hub's block_sparse_moe is transformers' mlp (then DeepSeek's renames).
    s.weights_mapping.substr.insert(s.weights_mapping.substr.begin(),
                                    {".block_sparse_moe.", ".mlp."});
    const bool fused = !latent && fuse_shared_experts() && kimi_num_shared_experts(config()) > 0;
    // MXFP4-packed experts (Kimi-K3's release): experts.J.w1.weight_packed / weight_scale.
    if (kimi_mxfp4_experts(config()))
      for (auto& m : fused_moe_mxfp4_pack_mapping("w1", "w2", "w3", E))
        s.expert_mapping.push_back(m);
    else
      for (auto& m : fused_moe_expert_mapping("w1", "w2", "w3", fused ? E + 1 : E))
        s.expert_mapping.push_back(m);
    // Kimi-K3's checkpoints: the text model under language_model.*; the vision tower and its
    // projector are not read.
    s.weights_mapping.prefix.push_back({"language_model.model.", "model."});
    s.weights_mapping.prefix.push_back({"language_model.lm_head.", "lm_head."});
    s.weights_mapping.prefix.push_back({"vision_tower.", std::nullopt});
    s.weights_mapping.prefix.push_back({"mm_projector.", std::nullopt});
    return s;
  }

 private:
  int64_t block_;
  std::unique_ptr<AttnResSite> output_site_;
};

// KDA ("linear_attention") and NoPE MLA ("full_attention") layers.
// Kimi-K3 with its vision tower (vision_tower.*, mm_projector.*: MoonViT3d and patchmergerv2)
// when vision_config describes one (vt_hidden_size); a config without it loads the text model
// alone, the tower's tensors skipped.
class KimiK3ForConditionalGeneration : public KimiLinearForCausalLM {
 public:
  KimiK3ForConditionalGeneration(const ModelConfig& c, const ModelOptions& o)
      : KimiLinearForCausalLM(c, o) {
    const nlohmann::json& root = c.root.obj();
    tower_ = root.contains("vision_config") && root["vision_config"].is_object() &&
             root["vision_config"].contains("vt_hidden_size");
    if (tower_) vision_ = moonvit_on_leader(ctx(), c);
  }
  VisionEncoder* vision_encoder() override { return vision_.get(); }
  WeightLoadSpec weight_load_spec() const override {
    WeightLoadSpec s = KimiLinearForCausalLM::weight_load_spec();
    if (tower_) {
      auto& p = s.weights_mapping.prefix;
      p.erase(std::remove_if(p.begin(), p.end(),
                             [](const auto& r) {
                               return r.first == "vision_tower." || r.first == "mm_projector.";
                             }),
              p.end());
    }
    return s;
  }

 private:
  std::unique_ptr<MoonVit> vision_;  // on the group's leader rank only
  bool tower_ = false;               // the config describes a tower (on any rank)
};

ModelSupport kimi_linear_support() {
  ModelSupport s;
  s.layer_types = {"linear_attention", "full_attention"};
  s.activations = {"silu", "situ"};
  return s;
}

}  // namespace

ATOM_REGISTER_MODEL_SUPPORTING("KimiLinearForCausalLM", KimiLinearForCausalLM,
                               kimi_linear_support());
// Kimi-K3's text model, and with its vision tower.
ATOM_REGISTER_MODEL_SUPPORTING("KimiK3ForCausalLM", KimiLinearForCausalLM, kimi_linear_support());
ATOM_REGISTER_MODEL_SUPPORTING("KimiK3ForConditionalGeneration", KimiK3ForConditionalGeneration,
                               kimi_linear_support());

}  // namespace atom
