// Llama (transformers' modeling_llama.py) and the pieces Llama-like models reuse: the decoder
// layer around any attention module, and the embed -> layers -> norm -> lm_head stack.
#pragma once

#include <memory>
#include <string>
#include <concepts>
#include <type_traits>
#include <vector>

#include "layers/attention.h"
#include "layers/embedding.h"
#include "layers/linear.h"
#include "layers/mlp.h"
#include "layers/norm.h"
#include "layers/rotary.h"
#include "models/model.h"

namespace atom {

// Sliding window of layer `layer`: config.sliding_window when layer_types marks it
// "sliding_attention", else 0.
int llama_layer_window(const ModelConfig& c, int64_t layer);
// What models with llama_layer_window attention implement: full and sliding-window layers.
inline ModelSupport llama_support() {
  ModelSupport s;
  s.layer_types = {"full_attention", "sliding_attention"};
  return s;
}

// The spec's Llama fusion switches, read from the environment (default on, as measured faster;
// "0" turns one off):
// ATOM_LLAMA_ENABLE_AITER_TRITON_FUSED_RMSNORM_QUANT, the decoder layer's two RMSNorms written as
// the FP8 input of the product after them (kernels::rms_norm_fp8) where that product quantises
// its input; ATOM_LLAMA_ENABLE_AITER_TRITON_FUSED_SILU_MUL_QUANT, the MLP's SiLU · up written as
// down_proj's (kernels::glu_fp8). Equal to the unfused ops bit for bit; they apply to every model
// built on LlamaDecoderLayer whose modules take quantised input (input_linear()).
bool llama_fused_rmsnorm_quant();
bool llama_fused_silu_mul_quant();

// A module whose first product may take its input quantised by the op before it: input_linear()
// is that product, or nullptr where the module's own switch is off or its products quantise
// differently.
template <class M>
concept TakesQuantisedInput = requires(M& m, Step& s, const LinearInput& x) {
  { m.input_linear() } -> std::convertible_to<const LinearBase*>;
  m.forward(s, x);
};

class LlamaAttention {
 public:
  // sliding_window < 0: llama_layer_window(c, layer). sinks: a learned sink logit per head,
  // "<prefix>.sinks" (GPT-OSS).
  LlamaAttention(LayerContext& ctx, const ModelConfig& c, int64_t layer, const std::string& prefix,
                 int sliding_window = -1, bool sinks = false);
  Tensor forward(Step& step, const LinearInput& x);
  // The product that reads x, for the norm before it to write its quantised input
  // (ATOM_LLAMA_ENABLE_AITER_TRITON_FUSED_RMSNORM_QUANT); nullptr when the switch is off.
  const LinearBase* input_linear() const { return fuse_input_quant_ ? &qkv_proj_ : nullptr; }

 private:
  bool fuse_input_quant_;
  QKVParallelLinear qkv_proj_;  // hidden -> (Hq + 2 Hk) * D on this rank
  RowParallelLinear o_proj_;    // Hq * D -> hidden (all-reduce)
  RotaryEmbedding rotary_;
  Attention attn_;
  int64_t q_size_, kv_size_;
};

// The dense SwiGLU MLP of a Llama-family layer, sized by the config.
class LlamaMlp : public GatedMlp {
 public:
  LlamaMlp(LayerContext& ctx, const ModelConfig& c, int64_t layer, const std::string& prefix)
      : GatedMlp(ctx, prefix, c.hidden_size, c.intermediate_size, c.mlp_bias) {
    set_fused_act_quant(llama_fused_silu_mul_quant());
    set_fused_input_quant(llama_fused_rmsnorm_quant());
  }
};

// The feed-forward a model picks for each layer (a dense MLP or a mixture of experts) behind one
// type: Choose(ctx, config, layer, prefix) builds it.
template <auto Choose>
class PerLayerMlp : public FeedForward {
 public:
  PerLayerMlp(LayerContext& ctx, const ModelConfig& c, int64_t layer, const std::string& prefix)
      : impl_(Choose(ctx, c, layer, prefix)) {}
  Tensor forward(Step& step, const Tensor& x, const Tensor& out = Tensor()) override {
    return impl_->forward(step, x, out);
  }

 private:
  std::unique_ptr<FeedForward> impl_;
};

// What layers hand on to the layers after them within a step. An attention module that needs it
// (GLM-5's shared top-k selection) declares `struct State` and
// `static State begin_step(Step&, const ModelConfig&)`, and takes `forward(step, x, state)`; the
// model makes one State per step, before the first layer (so it outlives each layer's scratch),
// and passes it to every layer.
template <class A>
concept HasLayerState = requires {
  typename A::State;
};
struct NoLayerState {};
template <class A>
struct LayerStateOf {
  using type = NoLayerState;
};
// A State that pipeline stages can hand on (IntermediateTensors::extra): to_stage() gives its
// tensors, from_stage() fills a fresh State (of begin_step) from the previous stage's.
template <class S>
concept StageCarriedState = requires(S s, const std::vector<Tensor>& t) {
  { s.to_stage() } -> std::same_as<std::vector<Tensor>>;
  s.from_stage(t);
};
template <HasLayerState A>
struct LayerStateOf<A> {
  using type = typename A::State;
};

// input_layernorm -> self_attn -> post_attention_layernorm -> mlp, with the residual kept beside.
// Mlp is built as Mlp(ctx, config, layer, prefix + ".mlp"); Norm is the family's RMSNorm (the
// model's final norm uses it too).
template <class SelfAttention, class Mlp = LlamaMlp,
          kernels::RmsNormKind Norm = kernels::RmsNormKind::kLlama>
class LlamaDecoderLayer {
 public:
  static constexpr kernels::RmsNormKind kNorm = Norm;
  using State = typename LayerStateOf<SelfAttention>::type;
  static State begin_step(Step& step, const ModelConfig& c) {
    if constexpr (HasLayerState<SelfAttention>) {
      return SelfAttention::begin_step(step, c);
    } else {
      return {};
    }
  }

  LlamaDecoderLayer(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                    const std::string& prefix)
      : input_layernorm_(ctx, prefix + ".input_layernorm", c.hidden_size, c.rms_norm_eps, Norm),
        self_attn_(ctx, c, layer, prefix + ".self_attn"),
        post_attention_layernorm_(ctx, prefix + ".post_attention_layernorm", c.hidden_size,
                                  c.rms_norm_eps, Norm),
        mlp_(ctx, c, layer, prefix + ".mlp") {}

  // residual [T, hidden]: the residual stream, updated in place. h: the previous layer's output,
  // not yet added to it (undefined before the first layer). Writes this layer's output, before
  // its residual add, into `out` (not h's buffer).
  void forward(Step& step, const Tensor& h, Tensor& residual, const Tensor& out, State& state) {
    // residual += h first, except before the first layer (the residual stream is x itself).
    const Tensor& x = h.defined() ? h : residual;
    Tensor* add_to = h.defined() ? &residual : nullptr;
    Tensor a;
    if constexpr (HasLayerState<SelfAttention>) {
      a = self_attn_.forward(step, norm_for(step, input_layernorm_, x, add_to, self_attn_), state);
    } else {
      a = self_attn_.forward(step, norm_for(step, input_layernorm_, x, add_to, self_attn_));
    }
    mlp_.forward(step, norm_for(step, post_attention_layernorm_, a, &residual, mlp_), out);
  }

 protected:
  // For a layer that walks the same modules its own way (Kimi's attention residuals).
  RMSNorm& input_layernorm() { return input_layernorm_; }
  SelfAttention& self_attn() { return self_attn_; }
  RMSNorm& post_attention_layernorm() { return post_attention_layernorm_; }
  Mlp& mlp() { return mlp_; }

 private:
  // norm(x) (residual += x first when given) for `next`: quantised for its first product where
  // `next` takes quantised input, asks for it (its switch) and that product quantises its input
  // (a LinearInput either way); a Tensor for any other module.
  template <class Next>
  auto norm_for(Step& step, RMSNorm& norm, const Tensor& x, Tensor* residual, Next& next) {
    if constexpr (TakesQuantisedInput<Next>) {
      if (const LinearBase* l = next.input_linear(); l && l->input_quant())
        return LinearInput(norm.forward_fp8(step, x, residual, *l));
      return LinearInput(residual ? norm.forward(step, x, *residual) : norm.forward(step, x));
    } else {
      return residual ? norm.forward(step, x, *residual) : norm.forward(step, x);
    }
  }

  RMSNorm input_layernorm_;
  SelfAttention self_attn_;
  RMSNorm post_attention_layernorm_;
  Mlp mlp_;
};

// model.embed_tokens -> model.layers.N -> model.norm -> lm_head.
template <class DecoderLayer>
class DecoderOnlyLM : public Model {
 public:
  // Pipeline parallelism: a stage builds only its layers, the first stage the embedding and the
  // last the final norm and head (and the embedding when the head is tied to it); what another
  // stage holds is a missing module (the spec's PPMissingLayer), whose tensors are never read.
  DecoderOnlyLM(const ModelConfig& c, const ModelOptions& o) : Model(c, o) {
    LayerContext& x = ctx();
    const PipelineStage& st = x.stage;
    if (st.first() || (st.last() && c.tie_word_embeddings))
      embed_tokens_ = std::make_unique<VocabParallelEmbedding>(x, "model.embed_tokens",
                                                               c.vocab_size, c.hidden_size);
    else
      x.params.add_missing_module("model.embed_tokens");
    layers_ = make_layers<DecoderLayer>(x, c.num_hidden_layers, "model.layers",
                                        [&](int64_t i, const std::string& prefix) {
                                          return std::make_unique<DecoderLayer>(x, c, i, prefix);
                                        });
    if (st.last()) {
      norm_ = std::make_unique<RMSNorm>(x, "model.norm", c.hidden_size, c.rms_norm_eps,
                                        DecoderLayer::kNorm);
      lm_head_ = c.tie_word_embeddings
                     ? std::make_unique<ParallelLMHead>(x, *embed_tokens_)
                     : std::make_unique<ParallelLMHead>(x, "lm_head", c.vocab_size, c.hidden_size);
    } else {
      x.params.add_missing_module("model.norm");
      x.params.add_missing_module("lm_head");
    }
  }

  // Layers that hand a State to the layers after them (GLM-5's shared selection) are cut between
  // stages when the State can be handed on with the hidden state.
  bool splits_into_stages() const override {
    using S = typename DecoderLayer::State;
    return std::is_same_v<S, NoLayerState> || StageCarriedState<S>;
  }

  // Activations are one layer's, not the model's: each layer's scratch goes back to the arena
  // when the layer ends. Between layers live only the residual stream and the last layer's output,
  // which the layers write into two buffers in turn.
  Tensor forward(Step& step) override {
    const PipelineStage& st = stage();
    Tensor residual, h;
    if (st.first()) {
      residual = embed_tokens_->forward(step, step.batch.dev.token_ids);
    } else {
      ATOM_CHECK(step.pp_in && step.pp_in->residual.defined(),
                 "pipeline stage {}: the step carries no tensors from stage {}", st.rank,
                 st.rank - 1);
      residual = step.pp_in->residual;  // the step's own copy, updated in place
      h = step.pp_in->hidden;
    }
    const Tensor outs[2] = {step.empty(residual.shape(), residual.dtype()),
                            step.empty(residual.shape(), residual.dtype())};
    auto state = DecoderLayer::begin_step(step, config());  // what layers hand on (usually none)
    if constexpr (StageCarriedState<decltype(state)>)
      if (step.pp_in) state.from_stage(step.pp_in->extra);
    for (int64_t i = st.first_layer; i < st.end_layer; ++i) {
      const Arena::Mark scratch = step.arena.mark();
      layers_[static_cast<size_t>(i)]->forward(step, h, residual, outs[i % 2], state);
      h = outs[i % 2];
      step.arena.release(scratch);
    }
    if (!st.last()) {
      ATOM_CHECK(step.pp_out, "pipeline stage {}: the step takes no tensors for stage {}", st.rank,
                 st.rank + 1);
      *step.pp_out = {h, residual, {}};
      if constexpr (StageCarriedState<decltype(state)>) step.pp_out->extra = state.to_stage();
      return Tensor();
    }
    return h.defined() ? norm_->forward(step, h, residual) : norm_->forward(step, residual);
  }

  Tensor compute_logits(Step& step, const Tensor& hidden) override;

 protected:
  ParallelLMHead& lm_head() { return *lm_head_; }
  // For a model that walks the same modules its own way (Kimi's attention residuals).
  std::unique_ptr<VocabParallelEmbedding> embed_tokens_;
  std::vector<std::unique_ptr<DecoderLayer>> layers_;
  std::unique_ptr<RMSNorm> norm_;

 private:
  std::unique_ptr<ParallelLMHead> lm_head_;
};

// Rows of `hidden` named by batch.logits_indices through the LM head.
Tensor logits_for_batch(Step& step, const Tensor& hidden, ParallelLMHead& lm_head);

template <class DecoderLayer>
Tensor DecoderOnlyLM<DecoderLayer>::compute_logits(Step& step, const Tensor& hidden) {
  return logits_for_batch(step, hidden, *lm_head_);
}

}  // namespace atom
