// quantization_config from config.json: the method a checkpoint's weights are stored in, and the
// modules it leaves unquantised. A model states which methods it reads (Model::
// quantization_methods); any other is an error naming it before a weight is read.
//
// The config resolves into a per-layer method (LinearQuant): for one linear module, by its
// checkpoint name, whether its weight is stored as FP8 and with which scales and activation
// scheme. The FP8 methods:
//   fp8                 weight_block_size [bn, bk]: weight [N, K] F8_E4M3 with weight_scale_inv
//                       [ceil(N / bn), ceil(K / bk)] (partial edge blocks), activations 1×bk
//                       groups, dynamic; without weight_block_size, one weight_scale per tensor
//                       and activation_scheme dynamic or static (input_scale). scale_fmt: absent
//                       or ue8m0 (scales stored as F8_E8M0 exponents, 2^(b - 127), or as floats).
//   compressed-tensors  config_groups.*.weights {num_bits 8, type float, strategy channel
//                       (weight_scale [N, 1]) | tensor ([1])}, input_activations dynamic (per
//                       token), static per tensor (input_scale [1]) or absent (weight-only);
//                       targets "Linear", module names or "re:" patterns; `ignore`.
//   fbgemm_fp8          weight_scale [N, 1] per channel, per-token dynamic activations;
//                       `modules_to_not_convert`.
// Any other scheme (int4 compressed-tensors, strategy group/block, num_bits 4, e5m2) is an error
// naming it when the config is parsed.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace atom {

class ConfigFields;

enum class Fp8Scales : uint8_t { kTensor, kChannel, kBlock };
enum class Fp8Inputs : uint8_t {
  kBlockDynamic,  // per row and group of block_k columns
  kTokenDynamic,  // per row
  kTensorStatic,  // the checkpoint's input_scale
  kNone,          // weight-only
};

// How one linear module's weight is stored in the checkpoint.
struct LinearQuant {
  bool fp8 = false;  // false: full precision (the checkpoint's float dtype)
  Fp8Scales scales = Fp8Scales::kBlock;
  int block_n = 0, block_k = 0;  // kBlock
  Fp8Inputs inputs = Fp8Inputs::kNone;
  bool operator==(const LinearQuant&) const = default;
  // "unquantised", "fp8 block 128x128, dynamic 1x128 activations", ...
  std::string str() const;
};

struct QuantizationConfig {
  std::string method;  // quant_method: "mxfp4", "fp8", "compressed-tensors", ...
  // modules_to_not_convert / ignore / ignored_layers: exact module names, prefixes of them,
  // transformers' "*" globs, or "re:" regular expressions.
  std::vector<std::string> not_converted;
  nlohmann::json raw;  // the whole object, for the method's own fields

  // The FP8 schemes of the linear modules, first match wins: targets "Linear" (every linear
  // module), module names (and prefixes) or "re:" patterns. Empty for methods without FP8 linears
  // (mxfp4 quantises experts only).
  struct LinearGroup {
    std::vector<std::string> targets;
    LinearQuant quant;
  };
  std::vector<LinearGroup> linear_groups;
  // compressed-tensors' mxfp4-pack-quantized groups' targets (4-bit e2m1 weights in groups of 32
  // with e8m0 scales: weight_packed, weight_scale). atom reads them on mixture-of-experts experts.
  std::vector<std::string> mxfp4_pack_targets;

  // True when `module` (a dotted checkpoint-side name, e.g. "model.layers.0.self_attn.q_proj") is
  // left unquantised.
  bool excludes(const std::string& module) const;
  // The method of linear module `module` (its checkpoint name).
  LinearQuant linear(const std::string& module) const;
  // Whether `module` is stored MXFP4-packed (mxfp4_pack_targets, unless excluded).
  bool mxfp4_packed(const std::string& module) const;
  // The method of a layer fused from checkpoint modules `parts` (q/k/v_proj into qkv_proj): every
  // part must be stored the same way; otherwise an error naming `layer` and the parts.
  LinearQuant linear_fused(const std::string& layer, const std::vector<std::string>& parts) const;
};

// Reads root.quantization_config; nullopt when absent or null. An FP8 method's unsupported scheme
// is an error naming the field.
std::optional<QuantizationConfig> quantization_config_parse(const ConfigFields& root);

}  // namespace atom
