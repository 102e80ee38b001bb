#include "loader/quantization.h"

#include <regex>

#include "core/error.h"
#include "loader/hf_config.h"

namespace atom {

namespace {
// transformers' fnmatch-style patterns: "*" matches any run of characters.
bool glob_match(const std::string& pattern, const std::string& s) {
  size_t p = 0, i = 0, star = std::string::npos, mark = 0;
  while (i < s.size()) {
    if (p < pattern.size() && pattern[p] == s[i]) {
      ++p;
      ++i;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = i;
    } else if (star != std::string::npos) {
      p = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}
}  // namespace

std::string LinearQuant::str() const {
  if (!fp8) return "unquantised";
  std::string s = "fp8 ";
  switch (scales) {
    case Fp8Scales::kBlock:
      s += fmt::format("{}x{} blocks", block_n, block_k);
      break;
    case Fp8Scales::kChannel:
      s += "per channel";
      break;
    case Fp8Scales::kTensor:
      s += "per tensor";
      break;
  }
  switch (inputs) {
    case Fp8Inputs::kBlockDynamic:
      s += fmt::format(", dynamic 1x{} activations", block_k);
      break;
    case Fp8Inputs::kTokenDynamic:
      s += ", dynamic per-token activations";
      break;
    case Fp8Inputs::kTensorStatic:
      s += ", static per-tensor activations";
      break;
    case Fp8Inputs::kNone:
      s += ", weight only";
      break;
  }
  return s;
}

bool QuantizationConfig::excludes(const std::string& module) const {
  for (const auto& m : not_converted) {
    if (m.starts_with("re:")) {
      if (std::regex_search(module, std::regex(m.substr(3)))) return true;
    } else if (m.find('*') != std::string::npos) {
      if (glob_match(m, module) || glob_match(m + ".*", module)) return true;
    } else if (module == m || module.starts_with(m + ".")) {
      return true;
    }
  }
  return false;
}

namespace {
// Whether a quantisation group's target names `module`.
bool target_hits(const std::string& t, const std::string& module) {
  if (t == "Linear") return true;
  if (t.starts_with("re:"))  // compressed-tensors: re.match, anchored at the start
    return std::regex_search(module, std::regex(t.substr(3)),
                             std::regex_constants::match_continuous);
  return module == t || module.starts_with(t + ".");
}
}  // namespace

LinearQuant QuantizationConfig::linear(const std::string& module) const {
  if (linear_groups.empty() || excludes(module)) return {};
  for (const auto& g : linear_groups)
    for (const auto& t : g.targets)
      if (target_hits(t, module)) return g.quant;
  return {};
}

bool QuantizationConfig::mxfp4_packed(const std::string& module) const {
  if (mxfp4_pack_targets.empty() || excludes(module)) return false;
  for (const auto& t : mxfp4_pack_targets)
    if (target_hits(t, module)) return true;
  return false;
}

LinearQuant QuantizationConfig::linear_fused(const std::string& layer,
                                             const std::vector<std::string>& parts) const {
  ATOM_CHECK(!parts.empty(), "{}: a fused layer without parts", layer);
  const LinearQuant first = linear(parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    const LinearQuant q = linear(parts[i]);
    if (!(q == first))
      fail("{}: fused from {} and {}, which quantization_config stores differently ({}: {}; {}: "
           "{}); atom needs the parts of one layer stored alike",
           layer, parts[0], parts[i], parts[0], first.str(), parts[i], q.str());
  }
  return first;
}

namespace {
void parse_fp8(const ConfigFields& q, QuantizationConfig& c) {
  if (q.has("fmt") && q.get_string("fmt") != "e4m3")
    q.bad("fmt", "is '" + q.get_string("fmt") + "'; atom reads e4m3 FP8 weights only");
  // DeepSeek's releases (V3.1 on, V4, V4.1) name their scales' format: ue8m0, powers of two
  // (stored as F8_E8M0 bytes or as F32 values). The scale tensor's dtype says how to read it.
  if (q.has("scale_fmt") && q.get_string("scale_fmt") != "ue8m0")
    q.bad("scale_fmt", "is '" + q.get_string("scale_fmt") +
                           "'; atom reads FP8 scales as floats or ue8m0 (E8M0 exponents)");
  const std::string act = q.get_string("activation_scheme", "dynamic");
  if (act != "dynamic" && act != "static")
    q.bad("activation_scheme", "is '" + act + "', not dynamic or static");
  LinearQuant l;
  l.fp8 = true;
  if (q.has("weight_block_size")) {
    const auto b = q.get_int_list("weight_block_size");
    if (b.size() != 2 || b[0] < 1 || b[1] < 1 || b[0] > (1 << 20) || b[1] > (1 << 20))
      q.bad("weight_block_size", "must be two positive block sizes [rows, columns]");
    if (act != "dynamic")
      q.bad("activation_scheme", "is static; block-scaled fp8 (weight_block_size) quantises "
                                 "activations dynamically");
    l.scales = Fp8Scales::kBlock;
    l.block_n = static_cast<int>(b[0]);
    l.block_k = static_cast<int>(b[1]);
    l.inputs = Fp8Inputs::kBlockDynamic;
  } else {
    l.scales = Fp8Scales::kTensor;
    l.inputs = act == "dynamic" ? Fp8Inputs::kTokenDynamic : Fp8Inputs::kTensorStatic;
  }
  c.linear_groups.push_back({{"Linear"}, l});
}

// One compressed-tensors quantisation args object ({num_bits, type, strategy, dynamic, ...}) must
// be 8-bit float; returns its strategy.
std::string ct_fp8_args(const ConfigFields& a, const std::string& what) {
  const int64_t bits = a.get_int("num_bits");
  const std::string type = a.get_string("type", "int");
  if (bits != 8 || type != "float")
    a.bad("num_bits", fmt::format("and type give {}-bit {} {}; atom reads 8-bit float (FP8) "
                                  "compressed-tensors only",
                                  bits, type, what));
  if (a.has("group_size") || a.has("block_structure"))
    a.bad(a.has("group_size") ? "group_size" : "block_structure",
          "is set: group- and block-wise " + what + " are not supported (channel or tensor)");
  return a.get_string("strategy");
}

// An mxfp4-pack-quantized group's weights: 4-bit float in groups of 32 (e8m0 scales).
void ct_mxfp4_args(const ConfigFields& g) {
  if (!g.has("weights") || !g.obj()["weights"].is_object())
    g.bad("weights", "must be an object (the weights' quantisation)");
  const ConfigFields w(g.obj()["weights"], g.where() + ".weights");
  if (w.get_int("num_bits") != 4 || w.get_string("type", "int") != "float")
    w.bad("num_bits", "and type must give 4-bit float (MXFP4) in an mxfp4-pack-quantized group");
  if (w.get_string("strategy", "group") != "group" || w.get_int("group_size", 32) != 32)
    w.bad("group_size", "must be 32 with strategy group (MXFP4)");
  if (g.has("input_activations") && !g.obj()["input_activations"].is_null())
    g.bad("input_activations", "is set; atom reads MXFP4 weights with unquantised activations");
}

// A quantisation group's targets: not empty, every "re:" pattern a valid regular expression.
std::vector<std::string> group_targets(const ConfigFields& g) {
  std::vector<std::string> targets = g.get_string_list("targets");
  if (targets.empty()) g.bad("targets", "is empty");
  for (const auto& t : targets)
    if (t.starts_with("re:")) {
      try {
        std::regex r(t.substr(3));
      } catch (const std::regex_error&) {
        g.bad("targets", "holds an invalid regular expression '" + t + "'");
      }
    }
  return targets;
}

const char* const kFloatQuantized = "float-quantized";
const char* const kMxfp4PackQuantized = "mxfp4-pack-quantized";

void parse_compressed_tensors(const ConfigFields& q, QuantizationConfig& c) {
  const std::string fmt_all = q.get_string("format", kFloatQuantized);
  if (fmt_all != kFloatQuantized && fmt_all != kMxfp4PackQuantized)
    q.bad("format", "is '" + fmt_all +
                        "'; atom reads float-quantized (FP8) and "
                        "mxfp4-pack-quantized compressed-tensors");
  if (!q.has("config_groups") || !q.obj()["config_groups"].is_object() ||
      q.obj()["config_groups"].empty())
    q.bad("config_groups", "must be an object of quantisation groups");
  for (const auto& [name, gj] : q.obj()["config_groups"].items()) {
    const ConfigFields g(gj, q.where() + " config_groups." + name);
    if (!gj.is_object()) q.bad("config_groups", "entry '" + name + "' must be an object");
    const std::string fmt = g.get_string("format", fmt_all);
    if (fmt != kFloatQuantized && fmt != kMxfp4PackQuantized)
      g.bad("format", "is '" + fmt + "'; atom reads float-quantized and mxfp4-pack-quantized");
    if (fmt == kMxfp4PackQuantized) {
      ct_mxfp4_args(g);
      for (auto& t : group_targets(g)) c.mxfp4_pack_targets.push_back(std::move(t));
      continue;
    }
    if (!g.has("weights") || !g.obj()["weights"].is_object())
      g.bad("weights", "must be an object (the weights' quantisation)");
    const ConfigFields w(g.obj()["weights"], g.where() + ".weights");
    LinearQuant l;
    l.fp8 = true;
    const std::string ws = ct_fp8_args(w, "weights");
    if (ws == "channel") {
      l.scales = Fp8Scales::kChannel;
    } else if (ws == "tensor") {
      l.scales = Fp8Scales::kTensor;
    } else {
      w.bad("strategy", "is '" + ws + "'; atom reads FP8 weights per channel or per tensor");
    }
    if (w.get_bool("dynamic", false)) w.bad("dynamic", "is true; FP8 weights have stored scales");
    l.inputs = Fp8Inputs::kNone;
    if (g.has("input_activations")) {
      const ConfigFields a(g.obj()["input_activations"], g.where() + ".input_activations");
      if (!a.obj().is_object()) g.bad("input_activations", "must be an object or null");
      const std::string as = ct_fp8_args(a, "activations");
      if (a.get_bool("dynamic", false)) {
        // Per token (a dynamic per-tensor scheme is computed per token too: a finer scale).
        if (as != "token" && as != "tensor")
          a.bad("strategy", "is '" + as + "'; dynamic FP8 activations are per token");
        l.inputs = Fp8Inputs::kTokenDynamic;
      } else {
        if (as != "tensor")
          a.bad("strategy", "is '" + as + "'; static FP8 activations are per tensor (input_scale)");
        l.inputs = Fp8Inputs::kTensorStatic;
      }
    }
    if (g.has("output_activations")) g.bad("output_activations", "is set; not supported");
    c.linear_groups.push_back({group_targets(g), l});
  }
}
}  // namespace

std::optional<QuantizationConfig> quantization_config_parse(const ConfigFields& root) {
  if (!root.has("quantization_config")) return std::nullopt;
  const nlohmann::json& j = root.obj()["quantization_config"];
  if (!j.is_object()) root.bad("quantization_config", "must be an object");
  const ConfigFields q(j, root.where() + " (quantization_config)");
  QuantizationConfig c;
  c.raw = j;
  c.method = q.get_string("quant_method");
  for (const char* key : {"modules_to_not_convert", "ignore", "ignored_layers"}) {
    if (!q.has(key)) continue;
    for (const auto& m : q.get_string_list(key)) {
      if (m.starts_with("re:")) {
        try {
          std::regex r(m.substr(3));
        } catch (const std::regex_error& e) {
          q.bad(key, "holds an invalid regular expression '" + m + "'");
        }
      }
      c.not_converted.push_back(m);
    }
  }
  if (c.method == "fp8") {
    parse_fp8(q, c);
  } else if (c.method == "compressed-tensors") {
    parse_compressed_tensors(q, c);
  } else if (c.method == "fbgemm_fp8") {
    LinearQuant l;
    l.fp8 = true;
    l.scales = Fp8Scales::kChannel;
    l.inputs = Fp8Inputs::kTokenDynamic;  // activation_scale_ub (a clamp of the scale) unused
    c.linear_groups.push_back({{"Linear"}, l});
  }
  return c;
}

}  // namespace atom
