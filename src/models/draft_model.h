// Speculative-decoding drafters that ship inside their target's checkpoint (the spec's MTP
// layers: DeepSeekMTP, Qwen3NextMTP, Qwen3_5MTP; DeepSeek-V4.1's DSpark block drafter,
// BlockDraftModel). A drafter is a Model of its own, built from the
// target's config and loaded from the target's checkpoint with spec_decode (the spec's
// rewrite_spec_layer_name: only the MTP layers - DeepSeek's at index >= num_hidden_layers, the
// Qwen hybrids' mtp.* - renamed to the drafter's parameters); the tensors it
// shares with the target (embed_tokens, lm_head) are the target's own when the checkpoint does
// not carry the drafter's. Each target architecture that has one registers it:
//
//   ATOM_REGISTER_DRAFTER("DeepseekV3ForCausalLM", DeepseekV3MTP);
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/loading.h"

namespace atom {

class DraftModel : public Model {
 public:
  using Model::Model;

  // MTP layers the checkpoint carries; draft step k runs layer k % num_draft_layers().
  virtual int num_draft_layers() const = 0;

  // One draft pass over the batch's rows. Row i is (token batch.token_ids[i], hidden[i]) at
  // batch.positions[i]: at step 0 the target's hidden state after its final norm at that position
  // and the token that follows it; at steps >= 1 this drafter's own output of the previous step
  // and the draft token it gave. Writes the drafter's cache through the batch's block table and
  // returns its hidden states after its final norm [T, hidden] (what compute_draft_logits reads
  // and the next step consumes).
  virtual Tensor forward_draft(Step& step, const Tensor& hidden, int spec_step) = 0;
  // Logits [len(batch.logits_indices), vocab] F32 of forward_draft's output: a bare head (the
  // norm ran at the end of forward_draft).
  virtual Tensor compute_draft_logits(Step& step, const Tensor& hidden, int spec_step) = 0;

  // (drafter parameter, target parameter) pairs shared with the target when the checkpoint does
  // not carry the drafter's own tensor.
  virtual std::vector<std::pair<std::string, std::string>> shared_with_target() const = 0;

  Tensor forward(Step&) override;  // an error: a drafter runs through forward_draft
  Tensor compute_logits(Step&, const Tensor&) override;

  // The --speculative-config method this drafter serves ("mtp", or "dspark": BlockDraftModel).
  virtual std::string method() const { return "mtp"; }
  // The target layers whose outputs it drafts from (Step::layer_outputs); empty: the target's
  // final hidden states (MTP).
  virtual std::vector<int64_t> target_layer_outputs() const { return {}; }
};

// A drafter that proposes a whole block of tokens in one pass (DSpark, models/dspark.h) from the
// outputs of some of the target's layers, not step by step from the final hidden states.
class BlockDraftModel : public DraftModel {
 public:
  using DraftModel::DraftModel;

  // Absorbs the target's rows of step.batch: layer_outputs [T, n hidden] F32 (Step::
  // layer_outputs of target_layer_outputs()) at the batch's positions, written to this drafter's
  // cache through the batch's slots.
  virtual void absorb(Step& step, const Tensor& layer_outputs) = 0;

  struct Block {
    std::vector<int32_t> tokens;    // [S width], sequence-major: the drafts
    Tensor base_logits;             // [S width, vocab] F32: the backbone's logits
    Tensor logits;                  // [S width, vocab] F32: what the drafts are the argmax of
    std::vector<float> confidence;  // [S width]: each draft's estimated survival probability
  };
  // One block of `width` drafts per sequence of step.batch, whose one row per sequence is the
  // token the target has just chosen (the anchor) at position p + 1, p the last position the
  // drafter absorbed; context_lens p + 1 (the block writes no cache). Tensors in the step's arena.
  virtual Block draft_block(Step& step, int width) = 0;

  // Errors: a block drafter runs through absorb and draft_block.
  Tensor forward_draft(Step& step, const Tensor& hidden, int spec_step) override;
  Tensor compute_draft_logits(Step& step, const Tensor& hidden, int spec_step) override;
};

// The columns of a [T, A] and b [T, A] side by side: [T, 2A] (gathered rows of a stacked copy,
// on any device): the MTP layers' concat(normed embedding, normed hidden state).
Tensor mtp_concat_columns(Step& step, const Tensor& a, const Tensor& b);

using DraftModelFactory = std::function<std::unique_ptr<DraftModel>(const ModelConfig& config,
                                                                    const ModelOptions& options)>;

// Registers the drafter of a target architecture; a second registration is an error.
void drafter_registry_add(const std::string& target_architecture, DraftModelFactory factory);
// Target architectures with a registered drafter, sorted.
std::vector<std::string> drafter_registry_list();
// The drafter of config.architectures[0]: an error naming the architecture (and those that have
// one) when it has none, or naming the config field when the checkpoint carries no MTP layer.
std::unique_ptr<DraftModel> drafter_create(const ModelConfig& config, const ModelOptions& options);

struct LoadedDrafter {
  std::unique_ptr<DraftModel> model;
  LoadReport report;  // report.checkpoint.shards_skipped: shards without an MTP tensor, unread
  std::vector<std::string> shared;  // drafter parameters that are the target's tensors
};

// Builds target's drafter and loads it from the target's checkpoint in model_dir (or fills it
// with dummy weights), on the target's device and tensor-parallel rank.
LoadedDrafter drafter_load(const std::string& model_dir, Model& target, const ModelOptions& options,
                           LoadFormat format = LoadFormat::kAuto);

class ModelGroup;
// The drafter of a tensor- and pipeline-parallel group: whole (unsharded, options.tp_size 1) on
// the leader's device (rank 0 of the last stage), where the logits and hidden states are
// (engine/tp_runner.h). A tensor it shares with the target (the embedding of the first stage,
// the LM head of the last) is gathered from the vocabulary shards of the tensor-parallel ranks of
// the stage holding it into a copy of its own.
LoadedDrafter drafter_load(const std::string& model_dir, ModelGroup& targets,
                           const ModelOptions& options, LoadFormat format = LoadFormat::kAuto);

}  // namespace atom

#define ATOM_REGISTER_DRAFTER(arch, Class)                                                         \
  static const bool ATOM_MODEL_CONCAT(atom_drafter_registered_, __LINE__) = [] {                   \
    ::atom::drafter_registry_add(arch,                                                             \
                                 [](const ::atom::ModelConfig& c, const ::atom::ModelOptions& o) { \
                                   return std::unique_ptr<::atom::DraftModel>(new Class(c, o));    \
                                 });                                                               \
    return true;                                                                                   \
  }()
