// Qwen3NextMTP (the spec's atom/models/qwen3_next_mtp.py): Qwen3-Next's MTP layers, drafting for
// Qwen3NextForCausalLM. Its layer count is num_nextn_predict_layers (as vLLM reads it), else
// mtp_num_hidden_layers (the hub configs' field), else 1; each MTP layer's feed-forward is chosen
// as for the target layer of the same index (the sparse block unless in mlp_only_layers or off
// the decoder_sparse_step).
#include "models/qwen3_next_mtp.h"

namespace atom {

std::optional<std::string> qwen3_next_mtp_rewrite(const std::string& name) {
  if (!name.starts_with("mtp.")) return std::nullopt;  // the target's
  return "model." + name.substr(4);
}

WeightLoadSpec qwen3_next_mtp_weight_load_spec(WeightLoadSpec s) {
  std::erase_if(s.weights_mapping.prefix, [](const auto& p) { return p.first == "mtp."; });
  s.spec_decode = true;
  s.spec_layer_rewrite = [](const std::string& name, int64_t) {
    return qwen3_next_mtp_rewrite(name);
  };
  return s;
}

int64_t qwen3_next_mtp_num_layers(const ModelConfig& c, const std::vector<std::string>& fields) {
  for (const std::string& f : fields) {
    if (!c.text.has(f)) continue;
    const int64_t n = c.text.get_int(f);
    if (n < 1)
      c.text.bad(f, "must be at least 1 for MTP speculative decoding (this checkpoint carries no "
                    "MTP layer)");
    return n;
  }
  return 1;
}

namespace {

class Qwen3NextMTP
    : public Qwen3NextMultiTokenPredictor<qwen3_next_mlp, qwen3_next_weight_load_spec> {
 public:
  Qwen3NextMTP(const ModelConfig& c, const ModelOptions& o)
      : Qwen3NextMultiTokenPredictor(
            c, o,
            qwen3_next_mtp_num_layers(c, {"num_nextn_predict_layers", "mtp_num_hidden_layers"})) {}
};

}  // namespace

ATOM_REGISTER_DRAFTER("Qwen3NextForCausalLM", Qwen3NextMTP);

}  // namespace atom
