// DeepSeekMTP (the spec's atom/models/deepseek_mtp.py): the multi-token-prediction layers a
// DeepSeek checkpoint carries at model.layers.{num_hidden_layers + k}, k <
// num_nextn_predict_layers, as a speculative-decoding drafter. Each
// DeepSeekMultiTokenPredictorLayer:
//
//   x = eh_proj(concat(enorm(embed_tokens(token)), hnorm(hidden)))     [T, 2 hidden] -> [T, hidden]
//   y = shared_head.norm(mtp_block(x))        mtp_block: the family's decoder layer at that index
//   logits = shared_head.head(y)
//
// The norm runs at the end of the layer's forward, not in the head: draft step 0 consumes the
// target's hidden state after its final norm, so steps >= 1 consume this layer's normed output.
// Checkpoint names (rewrite_spec_layer_name): enorm, hnorm, eh_proj, shared_head stay where they
// are; the decoder block's tensors get ".mtp_block."; the layer's own embed_tokens (DeepSeek-V3
// carries one) is the drafter's model.embed_tokens. Without them embed_tokens and
// shared_head.head are the target's model.embed_tokens and lm_head.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/deepseek.h"
#include "models/draft_model.h"

namespace atom {

// rewrite_spec_layer_name for DeepSeek-layout MTP layers (index >= num_hidden_layers); nullopt for
// every other tensor (the target's).
std::optional<std::string> deepseek_mtp_rewrite(const std::string& name, int64_t layer,
                                                int64_t num_hidden_layers);

template <class Block>
class DeepSeekMultiTokenPredictorLayer {
 public:
  DeepSeekMultiTokenPredictorLayer(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                   const std::string& prefix)
      : enorm_(ctx, prefix + ".enorm", c.hidden_size, c.rms_norm_eps, Block::kNorm),
        hnorm_(ctx, prefix + ".hnorm", c.hidden_size, c.rms_norm_eps, Block::kNorm),
        eh_proj_(ctx, prefix + ".eh_proj", 2 * c.hidden_size, c.hidden_size, false),
        mtp_block_(ctx, c, layer, prefix + ".mtp_block"),
        shared_head_norm_(ctx, prefix + ".shared_head.norm", c.hidden_size, c.rms_norm_eps,
                          Block::kNorm),
        shared_head_head_(ctx, prefix + ".shared_head.head", c.vocab_size, c.hidden_size) {}

  // embeds, hidden [T, hidden] -> the normed output [T, hidden].
  Tensor forward(Step& step, const ModelConfig& c, const Tensor& embeds, const Tensor& hidden) {
    Tensor e = enorm_.forward(step, embeds);
    Tensor h = hnorm_.forward(step, hidden);
    Tensor residual = eh_proj_.forward(step, mtp_concat_columns(step, e, h));
    Tensor out = step.empty(residual.shape(), residual.dtype());
    auto state = Block::begin_step(step, c);
    mtp_block_.forward(step, Tensor(), residual, out, state);
    return shared_head_norm_.forward(step, out, residual);  // residual += out; norm
  }
  ParallelLMHead& head() { return shared_head_head_; }

 private:
  RMSNorm enorm_, hnorm_;
  ReplicatedLinear eh_proj_;
  Block mtp_block_;
  RMSNorm shared_head_norm_;
  ParallelLMHead shared_head_head_;
};

// Block: the target family's decoder layer; the checkpoint maps as the target's
// (deepseek_weight_load_spec with these expert and shared-expert defaults).
template <class Block, int64_t kDefaultExperts, int64_t kDefaultShared>
class DeepSeekMTP : public DraftModel {
 public:
  DeepSeekMTP(const ModelConfig& c, const ModelOptions& o) : DraftModel(c, o) {
    const int64_t n = c.text.get_int("num_nextn_predict_layers", 0);
    if (n < 1)
      c.text.bad("num_nextn_predict_layers",
                 "must be at least 1 for MTP speculative decoding (this checkpoint carries no "
                 "MTP layer)");
    LayerContext& x = ctx();
    embed_tokens_ = std::make_unique<VocabParallelEmbedding>(x, "model.embed_tokens", c.vocab_size,
                                                             c.hidden_size);
    embed_tokens_->weight().optional = true;  // the target's unless the MTP layer has its own
    for (int64_t k = 0; k < n; ++k) {
      const int64_t layer = c.num_hidden_layers + k;
      layers_.push_back(std::make_unique<Layer>(x, c, layer, layer_prefix(layer)));
      params().find(layer_prefix(layer) + ".shared_head.head.weight")->optional = true;
    }
  }

  int num_draft_layers() const override { return static_cast<int>(layers_.size()); }

  Tensor forward_draft(Step& step, const Tensor& hidden, int spec_step) override {
    Tensor embeds = embed_tokens_->forward(step, step.batch.dev.token_ids);
    return layer(spec_step).forward(step, config(), embeds, hidden);
  }

  Tensor compute_draft_logits(Step& step, const Tensor& hidden, int spec_step) override {
    return logits_for_batch(step, hidden, layer(spec_step).head());
  }

  std::vector<std::pair<std::string, std::string>> shared_with_target() const override {
    const ModelConfig& c = config();
    const std::string lm_head =
        c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    std::vector<std::pair<std::string, std::string>> s = {
        {"model.embed_tokens.weight", "model.embed_tokens.weight"}};
    for (size_t k = 0; k < layers_.size(); ++k)
      s.push_back(
          {layer_prefix(c.num_hidden_layers + static_cast<int64_t>(k)) + ".shared_head.head.weight",
           lm_head});
    return s;
  }

  WeightLoadSpec weight_load_spec() const override {
    WeightLoadSpec s = deepseek_weight_load_spec(
        *this, deepseek_num_experts(config(), kDefaultExperts), kDefaultShared);
    s.spec_decode = true;
    const int64_t L = config().num_hidden_layers;
    s.spec_layer_rewrite = [L](const std::string& name, int64_t layer) {
      return deepseek_mtp_rewrite(name, layer, L);
    };
    return s;
  }

 private:
  using Layer = DeepSeekMultiTokenPredictorLayer<Block>;
  static std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer); }
  Layer& layer(int spec_step) { return *layers_[static_cast<size_t>(spec_step) % layers_.size()]; }

  std::unique_ptr<VocabParallelEmbedding> embed_tokens_;
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace atom
