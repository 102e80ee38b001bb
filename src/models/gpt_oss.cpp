// GPT-OSS (transformers' modular_gpt_oss.py; gpt-oss-20b and gpt-oss-120b): attention with bias
// on q/k/v/o and a learned sink logit per head, a sliding window on the layers layer_types marks,
// YaRN RoPE; every layer a mixture of experts whose router has a bias and takes the top k logits
// before its softmax, and whose experts carry biases and the clamped SwiGLU
// ((up + 1) * gate * sigmoid(1.702 gate), both clamped to swiglu_limit). GPT-OSS's RMSNorm
// multiplies by its weight before the cast.
//
// Checkpoints stack each layer's experts: transformers' BF16 layout holds gate_up_proj
// [E, H, 2I] (x @ W, gate and up interleaved column by column) and down_proj [E, I, H]; OpenAI's
// MXFP4 layout (quant_method mxfp4) holds gate_up_proj_blocks [E, 2I, H/32, 16] (two e2m1 values
// a byte, the low nibble first) with gate_up_proj_scales [E, 2I, H/32] (e8m0), and likewise
// down_proj_{blocks,scales} [E, H, I/32, ...]. Both are converted here, expert by expert, into
// FusedMoE's layout (gate rows, then up rows). MXFP4 experts (ExpertQuant::kMxfp4) stay packed
// on CUDA, where the fused expert kernels expand them as they load them (W4A16), and are
// dequantised at load on the CPU, exactly as transformers' convert_moe_packed_tensors.
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "core/convert.h"
#include "layers/moe.h"
#include "models/llama.h"

namespace atom {

namespace {

// Llama's attention with a sink logit per head ("self_attn.sinks").
class GptOssAttention : public LlamaAttention {
 public:
  GptOssAttention(LayerContext& ctx, const ModelConfig& c, int64_t layer, const std::string& prefix)
      : LlamaAttention(ctx, c, layer, prefix, -1, /*sinks=*/true) {}
};

// Rows [0, n) and [n, 2n) of the result are the even and odd rows of `t` [2n, cols]: gate and up,
// interleaved in GPT-OSS's checkpoints, in FusedMoE's halves.
Tensor deinterleave_rows(const Tensor& t) {
  const Tensor c = t.contiguous();
  const int64_t n = c.size(0) / 2, row = c.size(1) * (dtype_bits(c.dtype()) / 8);
  Tensor out = Tensor::empty(c.shape(), c.dtype());
  const char* src = static_cast<const char*>(c.data());
  char* dst = static_cast<char*>(out.data());
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * row, src + (2 * i) * row, row);
    std::memcpy(dst + (n + i) * row, src + (2 * i + 1) * row, row);
  }
  return out;
}

// deinterleave_rows of MXFP4 blocks [2n, groups, 16].
Tensor deinterleave_rows_3d(const Tensor& t) {
  if (t.dim() != 3) fail("GPT-OSS MXFP4 blocks {} must be [rows, groups, 16]", t.str());
  const Tensor c = t.contiguous();
  return deinterleave_rows(c.view({c.size(0), c.size(1) * c.size(2)})).view(c.shape());
}

// [rows, cols] -> [cols, rows], any element size.
Tensor transpose_2d(const Tensor& t) {
  const Tensor c = t.contiguous();
  const int64_t R = c.size(0), C = c.size(1), es = dtype_bits(c.dtype()) / 8;
  Tensor out = Tensor::empty({C, R}, c.dtype());
  const char* src = static_cast<const char*>(c.data());
  char* dst = static_cast<char*>(out.data());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t col = 0; col < C; ++col)
      std::memcpy(dst + (col * R + r) * es, src + (r * C + col) * es, es);
  return out;
}

void expect_experts(const Tensor& t, int64_t E, const char* what) {
  if (t.dim() < 2 || t.size(0) != E)
    fail("GPT-OSS {} {} does not hold {} experts", what, t.str(), E);
}

// An MXFP4 projection's blocks and scales arrive as two tensors, in either order and on any
// loader thread: the first is kept until its partner comes.
struct Mxfp4Pair {
  std::mutex mu;
  Tensor blocks, scales;  // owned copies
  // Returns both once the second has arrived (and forgets them), else undefined tensors.
  std::pair<Tensor, Tensor> add(const Tensor& t, bool is_blocks) {
    std::lock_guard<std::mutex> lock(mu);
    (is_blocks ? blocks : scales) = t.clone();
    if (!blocks.defined() || !scales.defined()) return {};
    auto r = std::make_pair(blocks, scales);
    blocks = scales = Tensor();
    return r;
  }
};

std::map<std::string, FusedMoEStackedFormat> gpt_oss_formats() {
  std::map<std::string, FusedMoEStackedFormat> f;
  // BF16: gate_up_proj [E, H, 2I] (x @ W, interleaved columns) -> [2I, H] per expert.
  f["gpt_oss_gate_up"] = [](FusedMoEWriter& w, const Tensor& t, int) {
    expect_experts(t, w.num_experts(), "gate_up_proj");
    for (int64_t e = 0; e < w.num_experts(); ++e)
      w.gate_up_expert(e, deinterleave_rows(transpose_2d(t.select(0, e))));
  };
  f["gpt_oss_down"] = [](FusedMoEWriter& w, const Tensor& t, int) {  // [E, I, H] -> [H, I]
    expect_experts(t, w.num_experts(), "down_proj");
    for (int64_t e = 0; e < w.num_experts(); ++e) w.down_expert(e, transpose_2d(t.select(0, e)));
  };
  f["gpt_oss_gate_up_bias"] = [](FusedMoEWriter& w, const Tensor& t, int) {  // [E, 2I] interleaved
    expect_experts(t, w.num_experts(), "gate_up_proj_bias");
    if (t.dim() != 2)
      fail("GPT-OSS gate_up_proj_bias {} must be [experts, 2 * intermediate]", t.str());
    const Tensor c = t.contiguous();
    Tensor out = Tensor::empty(c.shape(), c.dtype());
    for (int64_t e = 0; e < c.size(0); ++e) {
      Tensor dst = out.select(0, e);
      dst.copy_from(deinterleave_rows(c.select(0, e).view({c.size(1), 1})).view({c.size(1)}));
    }
    w.gate_up_bias(out);
  };
  auto gate_up = std::make_shared<Mxfp4Pair>(), down = std::make_shared<Mxfp4Pair>();
  auto mx_gate_up = [gate_up](FusedMoEWriter& w, const Tensor& t, bool is_blocks) {
    auto [b, s] = gate_up->add(t, is_blocks);
    if (!b.defined()) return;
    expect_experts(b, w.num_experts(), "gate_up_proj_blocks");
    expect_experts(s, w.num_experts(), "gate_up_proj_scales");
    for (int64_t e = 0; e < w.num_experts(); ++e)  // [2I, H/32, 16], [2I, H/32] interleaved rows
      w.gate_up_mxfp4_expert(e, deinterleave_rows_3d(b.select(0, e)),
                             deinterleave_rows(s.select(0, e)));
  };
  auto mx_down = [down](FusedMoEWriter& w, const Tensor& t, bool is_blocks) {
    auto [b, s] = down->add(t, is_blocks);
    if (!b.defined()) return;
    expect_experts(b, w.num_experts(), "down_proj_blocks");
    expect_experts(s, w.num_experts(), "down_proj_scales");
    for (int64_t e = 0; e < w.num_experts(); ++e)  // [H, I/32, 16], [H, I/32]
      w.down_mxfp4_expert(e, b.select(0, e), s.select(0, e));
  };
  f["mxfp4_gate_up_blocks"] = [mx_gate_up](FusedMoEWriter& w, const Tensor& t, int) {
    mx_gate_up(w, t, true);
  };
  f["mxfp4_gate_up_scales"] = [mx_gate_up](FusedMoEWriter& w, const Tensor& t, int) {
    mx_gate_up(w, t, false);
  };
  f["mxfp4_down_blocks"] = [mx_down](FusedMoEWriter& w, const Tensor& t, int) {
    mx_down(w, t, true);
  };
  f["mxfp4_down_scales"] = [mx_down](FusedMoEWriter& w, const Tensor& t, int) {
    mx_down(w, t, false);
  };
  return f;
}

std::unique_ptr<FeedForward> gpt_oss_mlp(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                         const std::string& prefix) {
  SparseMoeOptions o;
  o.hidden = c.hidden_size;
  o.num_experts = c.text.get_int("num_local_experts");
  if (o.num_experts < 1) c.text.bad("num_local_experts", "must be positive");
  o.moe_intermediate = c.intermediate_size;
  o.router.scoring = kernels::RouterScoring::kTopKThenSoftmax;
  o.router.top_k = static_cast<int>(c.text.get_int("num_experts_per_tok"));
  if (o.router.top_k < 1 || o.router.top_k > o.num_experts)
    c.text.bad("num_experts_per_tok", fmt::format("must be in [1, {}]", o.num_experts));
  o.gate_name = "router";
  o.router_bias = true;
  o.experts.bias = true;
  o.experts.activation.kind = kernels::MoeActivation::kSwigluOai;
  o.experts.activation.alpha = 1.702f;
  o.experts.activation.limit = static_cast<float>(c.text.get_double("swiglu_limit", 7.0));
  if (!(o.experts.activation.limit > 0)) c.text.bad("swiglu_limit", "must be positive");
  o.experts.stacked_formats = gpt_oss_formats();  // one set of MXFP4 pairs per layer
  // MXFP4 experts stay packed on CUDA (W4A16) and are dequantised at load on the CPU.
  if (c.quantization && c.quantization->method == "mxfp4" &&
      !c.quantization->excludes(prefix_join(prefix, "experts")))
    o.experts.quant = ExpertQuant::kMxfp4;
  return std::make_unique<SparseMoeBlock>(ctx, prefix, o);
}

class GptOssForCausalLM
    : public DecoderOnlyLM<LlamaDecoderLayer<GptOssAttention, PerLayerMlp<gpt_oss_mlp>,
                                             kernels::RmsNormKind::kGptOss>> {
 public:
  using DecoderOnlyLM::DecoderOnlyLM;

  std::vector<std::string> quantization_methods() const override { return {"mxfp4"}; }

  WeightLoadSpec weight_load_spec() const override {
    WeightLoadSpec s = Model::weight_load_spec();
    s.expert_mapping = {
        {"experts.w13_weight", "experts.gate_up_proj", -1, "gpt_oss_gate_up"},
        {"experts.w2_weight", "experts.down_proj", -1, "gpt_oss_down"},
        {"experts.w13_bias", "experts.gate_up_proj_bias", -1, "gpt_oss_gate_up_bias"},
        {"experts.w2_bias", "experts.down_proj_bias", -1, "down_bias"},
        {"experts.w13_weight", "experts.gate_up_proj_blocks", -1, "mxfp4_gate_up_blocks"},
        {"experts.w13_weight", "experts.gate_up_proj_scales", -1, "mxfp4_gate_up_scales"},
        {"experts.w2_weight", "experts.down_proj_blocks", -1, "mxfp4_down_blocks"},
        {"experts.w2_weight", "experts.down_proj_scales", -1, "mxfp4_down_scales"},
    };
    // An MXFP4 projection needs both of its tensors: a missing one is named before any data is
    // read.
    s.check_names = [](const std::vector<std::string>& names) {
      std::set<std::string> all(names.begin(), names.end());
      for (const auto& n : names)
        for (const auto& [have, need] :
             {std::pair<std::string, std::string>{"_blocks", "_scales"}, {"_scales", "_blocks"}})
          if (n.ends_with(have) && !all.count(n.substr(0, n.size() - have.size()) + need))
            fail("MXFP4 tensor '{}' has no '{}'", n, n.substr(0, n.size() - have.size()) + need);
    };
    return s;
  }
};

}  // namespace

ATOM_REGISTER_MODEL_SUPPORTING("GptOssForCausalLM", GptOssForCausalLM, llama_support());

}  // namespace atom
