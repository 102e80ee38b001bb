// Qwen3_5MTP (the spec's atom/models/qwen3_5_mtp.py): Qwen3.5's and Qwen3.5-MoE's MTP layers,
// drafting for their targets. Its layer count is the text config's mtp_num_hidden_layers (1 when
// absent); the MTP layers' feed-forward is the variant's (dense SwiGLU, or the sparse block with
// its sigmoid-gated shared expert). The target's names (model.language_model.*, the vision tower)
// map as the target maps them and are not read.
#include "models/qwen3_next_mtp.h"

namespace atom {

namespace {

template <auto Mlp>
class Qwen3_5MTPOf : public Qwen3NextMultiTokenPredictor<Mlp, qwen3_5_weight_load_spec> {
 public:
  Qwen3_5MTPOf(const ModelConfig& c, const ModelOptions& o)
      : Qwen3NextMultiTokenPredictor<Mlp, qwen3_5_weight_load_spec>(
            c, o, qwen3_next_mtp_num_layers(c, {"mtp_num_hidden_layers"})) {}
};

using Qwen3_5MTP = Qwen3_5MTPOf<qwen3_5_mlp>;
using Qwen3_5MoeMTP = Qwen3_5MTPOf<qwen3_5_moe_mlp>;

}  // namespace

ATOM_REGISTER_DRAFTER("Qwen3_5ForConditionalGeneration", Qwen3_5MTP);
ATOM_REGISTER_DRAFTER("Qwen3_5ForCausalLM", Qwen3_5MTP);
ATOM_REGISTER_DRAFTER("Qwen3_5MoeForConditionalGeneration", Qwen3_5MoeMTP);
ATOM_REGISTER_DRAFTER("Qwen3_5MoeForCausalLM", Qwen3_5MoeMTP);

}  // namespace atom
