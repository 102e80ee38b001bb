// Qwen3NextMTP and Qwen3_5MTP (the spec's atom/models/qwen3_next_mtp.py and qwen3_5_mtp.py): the
// multi-token-prediction layers the Qwen3-Next and Qwen3.5 checkpoints carry under mtp.*, as a
// speculative-decoding drafter. The checkpoint's names map with weights_mapping
// {"mtp.": "model."} (mtp.fc -> model.fc, mtp.layers.k -> model.layers.k, ...); every other
// tensor is the target's and is not read. The predictor (Qwen3_5MultiTokenPredictor):
//
//   x = fc(concat(pre_fc_norm_embedding(embed_tokens(token)), pre_fc_norm_hidden(hidden)))
//   y = norm(layers[k % n](x))          the family's decoder layer, full attention only (no gated
//                                       delta net, whatever layer_types says: no recurrent state)
//   logits = lm_head(y)                 one top-level head for every layer
//
// Every norm is the family's zero-centred RMSNorm (1 + w). embed_tokens and lm_head are the
// target's (shared) unless the checkpoint carries the drafter's own (mtp.embed_tokens). As for
// DeepSeekMTP the final norm runs in forward_draft: draft step 0 reads the target's hidden state
// after its final norm, steps >= 1 this drafter's normed output.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/draft_model.h"
#include "models/qwen3_next.h"

namespace atom {

// rewrite_spec_layer_name of the Qwen hybrids (after the target's weights_mapping): mtp.X ->
// model.X; nullopt for every other tensor (the target's).
std::optional<std::string> qwen3_next_mtp_rewrite(const std::string& name);

// The drafter's checkpoint names: the target's spec with mtp.* kept (the target drops them) and
// renamed by qwen3_next_mtp_rewrite.
WeightLoadSpec qwen3_next_mtp_weight_load_spec(WeightLoadSpec target_spec);

// The number of MTP layers the config names: the first of `fields` present (at least 1), else 1
// (vLLM's default).
int64_t qwen3_next_mtp_num_layers(const ModelConfig& c, const std::vector<std::string>& fields);

// Mlp: the family's per-layer feed-forward, built for MTP layer k as for layer k;
// TargetSpec(spec, num_experts): the target family's checkpoint names.
template <auto Mlp, WeightLoadSpec (*TargetSpec)(WeightLoadSpec, int64_t)>
class Qwen3NextMultiTokenPredictor : public DraftModel {
 public:
  using Layer = Qwen3NextDecoderLayer<PerLayerMlp<Mlp>, false>;

  Qwen3NextMultiTokenPredictor(const ModelConfig& c, const ModelOptions& o, int64_t num_layers)
      : DraftModel(c, o) {
    LayerContext& x = ctx();
    embed_tokens_ = std::make_unique<VocabParallelEmbedding>(x, "model.embed_tokens", c.vocab_size,
                                                             c.hidden_size);
    embed_tokens_->weight().optional = true;  // the target's unless mtp.embed_tokens exists
    pre_fc_norm_embedding_ = std::make_unique<RMSNorm>(x, "model.pre_fc_norm_embedding",
                                                       c.hidden_size, c.rms_norm_eps, Layer::kNorm);
    pre_fc_norm_hidden_ = std::make_unique<RMSNorm>(x, "model.pre_fc_norm_hidden", c.hidden_size,
                                                    c.rms_norm_eps, Layer::kNorm);
    fc_ =
        std::make_unique<ReplicatedLinear>(x, "model.fc", 2 * c.hidden_size, c.hidden_size, false);
    for (int64_t k = 0; k < num_layers; ++k)
      layers_.push_back(std::make_unique<Layer>(x, c, k, "model.layers." + std::to_string(k),
                                                /*linear_attention=*/false));
    norm_ = std::make_unique<RMSNorm>(x, "model.norm", c.hidden_size, c.rms_norm_eps, Layer::kNorm);
    if (c.tie_word_embeddings) {
      lm_head_ = std::make_unique<ParallelLMHead>(x, *embed_tokens_);
    } else {
      lm_head_ = std::make_unique<ParallelLMHead>(x, "lm_head", c.vocab_size, c.hidden_size);
      params().find("lm_head.weight")->optional = true;  // the target's
    }
  }

  int num_draft_layers() const override { return static_cast<int>(layers_.size()); }

  Tensor forward_draft(Step& step, const Tensor& hidden, int spec_step) override {
    Tensor e = pre_fc_norm_embedding_->forward(
        step, embed_tokens_->forward(step, step.batch.dev.token_ids));
    Tensor h = pre_fc_norm_hidden_->forward(step, hidden);
    Tensor residual = fc_->forward(step, mtp_concat_columns(step, e, h));
    Tensor out = step.empty(residual.shape(), residual.dtype());
    auto state = Layer::begin_step(step, config());
    layers_[static_cast<size_t>(spec_step) % layers_.size()]->forward(step, Tensor(), residual, out,
                                                                      state);
    return norm_->forward(step, out, residual);  // residual += out; norm
  }

  Tensor compute_draft_logits(Step& step, const Tensor& hidden, int) override {
    return logits_for_batch(step, hidden, *lm_head_);
  }

  std::vector<std::pair<std::string, std::string>> shared_with_target() const override {
    std::vector<std::pair<std::string, std::string>> s = {
        {"model.embed_tokens.weight", "model.embed_tokens.weight"}};
    if (!config().tie_word_embeddings) s.push_back({"lm_head.weight", "lm_head.weight"});
    return s;
  }

  WeightLoadSpec weight_load_spec() const override {
    return qwen3_next_mtp_weight_load_spec(
        TargetSpec(Model::weight_load_spec(), config().text.get_int("num_experts", 0)));
  }

 private:
  std::unique_ptr<VocabParallelEmbedding> embed_tokens_;
  std::unique_ptr<RMSNorm> pre_fc_norm_embedding_, pre_fc_norm_hidden_;
  std::unique_ptr<ReplicatedLinear> fc_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<RMSNorm> norm_;
  std::unique_ptr<ParallelLMHead> lm_head_;
};

}  // namespace atom
