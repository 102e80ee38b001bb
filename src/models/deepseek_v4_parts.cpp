#include "models/deepseek_v4_parts.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "kernels/compressed_kv.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "layers/hyper_connection.h"
#include "models/deepseek_v41_config.h"
#include "models/model.h"

namespace atom {

void deepseek_v4_check_cpu_f32(const Tensor& t, const char* what) {
  ATOM_CHECK(
      t.device().is_cpu() && t.dtype() == DType::kF32 && t.is_contiguous(),
      "DeepSeek-V4: {} {} must be contiguous F32 on the CPU (it runs on the CPU only so far)", what,
      t.str());
}

float deepseek_v4_dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void deepseek_v4_sink_attention(const float* q, const std::vector<const float*>& keys, int64_t D,
                                float sink, float scale, float* out) {
  std::vector<float> logit(keys.size());
  float mx = sink;
  for (size_t k = 0; k < keys.size(); ++k) {
    logit[k] = deepseek_v4_dot(q, keys[k], D) * scale;
    mx = std::max(mx, logit[k]);
  }
  float sum = std::exp(sink - mx);
  for (float& l : logit) sum += (l = std::exp(l - mx));
  std::fill(out, out + D, 0.0f);
  for (size_t k = 0; k < keys.size(); ++k) {
    const float pk = logit[k] / sum;
    for (int64_t d = 0; d < D; ++d) out[d] += pk * keys[k][d];
  }
}

kernels::CompressedBatch deepseek_v4_compressed_batch(const Batch& b) {
  return {&b.dev.query_start, &b.dev.context_lens, &b.dev.page_indptr, &b.dev.page_indices,
          &b.dev.state_slots, &b.dev.positions,    b.block_size};
}

Tensor deepseek_v4_grouped_wo_a(Step& step, const Tensor& o, const Tensor& wo_a, int64_t G,
                                int64_t gout) {
  if (!o.device().is_cpu()) {
    const int64_t T = o.size(0), gin = o.size(1) / G;
    Tensor a = step.empty({T, G * gout}, o.dtype());
    Tensor a0 = a.narrow(1, 0, gout);
    if (!kernels::linear_heads(a0, o.narrow(1, 0, gin), wo_a.narrow(0, 0, gout),
                               static_cast<int>(G), gout, gin, gout * gin))
      for (int64_t g = 0; g < G; ++g) {
        Tensor ag = a.narrow(1, g * gout, gout);
        kernels::linear(ag, o.narrow(1, g * gin, gin), wo_a.narrow(0, g * gout, gout));
      }
    return a;
  }
  deepseek_v4_check_cpu_f32(o, "attention output");
  deepseek_v4_check_cpu_f32(wo_a, "wo_a's weight");
  const int64_t T = o.size(0), gin = o.size(1) / G;
  Tensor a = step.empty({T, G * gout}, DType::kF32);
  const float* wa = wo_a.ptr<float>();
  for (int64_t i = 0; i < T; ++i)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t r = 0; r < gout; ++r)
        a.ptr<float>()[i * G * gout + g * gout + r] =
            deepseek_v4_dot(o.ptr<float>() + i * G * gin + g * gin, wa + (g * gout + r) * gin, gin);
  return a;
}

namespace {

FusedMoEOptions experts_options(const DeepseekV4MoeOptions& v) {
  FusedMoEOptions o;
  o.num_experts = v.experts;
  o.hidden = v.hidden;
  o.intermediate = v.moe_inter;
  o.activation = kernels::Glu::silu_clamped(static_cast<float>(v.limit));
  if (v.fp4_experts) {  // E2M1 values with E8M0 scales per 32: the MXFP4 path
    o.quant = ExpertQuant::kMxfp4;
    o.stacked_formats = fused_moe_mxfp4_pack_formats();  // one buffer per layer
  }
  return o;
}

}  // namespace

DeepseekV4Moe::DeepseekV4Moe(LayerContext& ctx, const DeepseekV4MoeOptions& v,
                             const std::string& prefix)
    : ctx_(ctx),
      o_(v),
      gate_(ctx, prefix + ".gate", v.hidden, v.experts, false, LinearStorage::kUnquantized),
      experts_(ctx, prefix + ".experts", experts_options(v)) {
  args_.scoring = v.scoring == "softmax"   ? kernels::RouterScoring::kSoftmax
                  : v.scoring == "sigmoid" ? kernels::RouterScoring::kSigmoid
                                           : kernels::RouterScoring::kSqrtSoftplus;
  args_.top_k = static_cast<int>(v.top_k);
  args_.renormalize = true;
  args_.routed_scaling_factor = static_cast<float>(v.scaling);
  experts_.bind_router(args_);
  if (v.hash) {
    tid2eid_ = &ctx.params.add(prefix + ".gate.tid2eid",
                               ctx.param_tensor({v.vocab, v.top_k}, DType::kI64));
    // --load-format dummy: every token routed to top_k distinct experts spread over all of them
    // (random bytes would name experts that do not exist).
    tid2eid_->dummy_fill = [E = v.experts, K = v.top_k](Tensor& t, uint64_t seed) {
      Tensor host = Tensor::empty(t.shape(), DType::kI64);
      const int64_t stride = std::max<int64_t>(1, E / K);
      for (int64_t tok = 0; tok < t.size(0); ++tok)
        for (int64_t k = 0; k < K; ++k)
          host.ptr<int64_t>()[tok * K + k] =
              (static_cast<int64_t>((tok * 2654435761u + seed) % static_cast<uint64_t>(E)) +
               k * stride) %
              E;
      t.copy_from(host);
    };
    const std::string name = prefix + ".gate.tid2eid";
    ctx.params.add_post_load([this, name] {
      const Tensor t = tid2eid_->data().device().is_cpu() ? tid2eid_->data()
                                                          : tid2eid_->data().to(Device::cpu());
      table_.resize(static_cast<size_t>(t.numel()));
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int64_t e = t.ptr<int64_t>()[i];
        if (e < 0 || e >= o_.experts)
          fail("{}: token {} routes to expert {}, not one of the {} experts", name, i / o_.top_k, e,
               o_.experts);
        table_[static_cast<size_t>(i)] = static_cast<int32_t>(e);
      }
      if (!ctx_.device.is_cpu()) {  // the checked table as I32 on the device, for the kernels
        Tensor host = Tensor::empty({o_.vocab, o_.top_k}, DType::kI32);
        std::copy(table_.begin(), table_.end(), host.ptr<int32_t>());
        table_dev_ = host.to(ctx_.device);
      }
    });
  } else if (args_.scoring != kernels::RouterScoring::kSoftmax) {
    bias_ = &ctx.params.add(prefix + ".gate.bias", ctx.param_tensor({v.experts}, DType::kF32));
  }
  // The shared expert (w1 / w3 / w2, loaded as gate_up_proj / down_proj): the clamped SwiGLU,
  // left unreduced to join the routed experts' one all-reduce.
  if (v.shared > 0)
    shared_ = std::make_unique<GatedMlp>(
        ctx, prefix + ".shared_experts", v.hidden, v.moe_inter, false,
        /*reduce_results=*/false, kernels::Glu::silu_clamped(static_cast<float>(v.limit)));
}

Tensor DeepseekV4Moe::forward(Step& step, const Tensor& x) {
  const int64_t T = x.size(0), H = o_.hidden;
  const bool cpu = x.device().is_cpu();
  Tensor logits;
  if (cpu) {
    logits = gate_.forward(step, x);
    deepseek_v4_check_cpu_f32(logits, "router logits");
  } else {  // the router takes F32 logits: the GEMM writes them so
    logits = step.empty({T, o_.experts}, DType::kF32);
    kernels::linear(logits, x, gate_.weight().data());
  }
  Tensor ids = step.empty({T, o_.top_k}, DType::kI32);
  Tensor weights = step.empty({T, o_.top_k}, DType::kF32);
  kernels::RouterArgs a = args_;
  Tensor fixed;
  if (o_.hash) {  // the input tokens' rows of tid2eid
    fixed = step.empty({T, o_.top_k}, DType::kI32);
    if (!cpu) {
      kernels::gather_table_rows(fixed, step.batch.dev.token_ids, table_dev_);
    } else {
      for (int64_t i = 0; i < T; ++i) {
        const int64_t tok = step.batch.token_ids[static_cast<size_t>(i)];
        ATOM_CHECK(tok >= 0 && static_cast<size_t>((tok + 1) * o_.top_k) <= table_.size(),
                   "DeepSeek-V4 hash routing: token id {} outside the tid2eid table", tok);
        std::copy_n(table_.data() + tok * o_.top_k, o_.top_k, fixed.ptr<int32_t>() + i * o_.top_k);
      }
    }
    a.fixed_ids = &fixed;
  }
  kernels::moe_route(ids, weights, logits, bias_ ? bias_->data() : Tensor(), a);
  Tensor out = step.empty({T, H}, x.dtype());
  experts_.forward(step, x, ids, weights, out);
  if (shared_) kernels::add(out, out, shared_->forward(step, x));
  // Tensor (or expert) parallelism: one all-reduce of the ranks' partial sums.
  if (ctx_.tp_size > 1) ctx_.comm->all_reduce_sum(out);
  return out;
}

DeepseekV4MoeOptions deepseek_v41_moe_options(const DeepseekV41Config& cfg) {
  const ConfigFields& t = cfg.text;
  DeepseekV4MoeOptions moe;
  moe.hidden = cfg.hidden;
  moe.vocab = cfg.vocab;
  moe.experts = cfg.experts;
  moe.top_k = cfg.top_k;
  moe.moe_inter = cfg.moe_inter;
  moe.shared = 1;
  moe.scaling = t.get_double("routed_scaling_factor", 1.5, RealRange::positive());
  moe.limit = t.get_double("swiglu_limit", 10.0, RealRange::positive());
  moe.scoring = t.get_string("scoring_func", "sqrtsoftplus");
  if (moe.scoring != "sqrtsoftplus")
    t.bad("scoring_func", "must be 'sqrtsoftplus' (DeepSeek-V4.1), got '" + moe.scoring + "'");
  return moe;
}

HyperConnectionOptions deepseek_v41_hc_options(const DeepseekV41Config& cfg) {
  HyperConnectionOptions hc;
  hc.hidden = cfg.hidden;
  hc.hc_mult = static_cast<int>(cfg.hc_mult);
  hc.sinkhorn_iters = static_cast<int>(cfg.hc_sinkhorn_iters);
  hc.hc_eps = static_cast<float>(cfg.hc_eps);
  hc.norm_eps = static_cast<float>(cfg.eps);
  return hc;
}

void deepseek_v4_release_names(WeightLoadSpec& s, int64_t experts, bool fp4_experts, bool quantized,
                               bool draft_stages) {
  // FP4 experts: experts.J.w1.weight (values) and .scale (renamed weight_scale below).
  s.expert_mapping = fp4_experts ? fused_moe_mxfp4_pack_mapping("w1", "w2", "w3", experts, "weight",
                                                                "weight_scale")
                                 : fused_moe_expert_mapping("w1", "w2", "w3", experts);
  // The shared expert's w1 / w3 / w2 feed GatedMlp's gate_up_proj (parts 0, 1) and down_proj
  // (the routed experts' names match the expert mapping first).
  s.packed_modules = {
      {"w1", "gate_up_proj", "0"}, {"w3", "gate_up_proj", "1"}, {"w2", "down_proj", ""}};
  // DeepSeek's release names the top-level tensors without "model." (and embed / hc_head_*).
  s.weights_mapping.prefix.push_back({"mtp.", std::nullopt});
  s.weights_mapping.prefix.push_back({"embed.", "model.embed_tokens."});
  s.weights_mapping.prefix.push_back({"norm.", "model.norm."});
  s.weights_mapping.prefix.push_back({"hc_head_fn", "model.hc_head.hc_fn"});
  s.weights_mapping.prefix.push_back({"hc_head_base", "model.hc_head.hc_base"});
  s.weights_mapping.prefix.push_back({"hc_head_scale", "model.hc_head.hc_scale"});
  s.weights_mapping.prefix.push_back({"layers.", "model.layers."});
  if (!quantized) return;
  // DeepSeek's scale beside each quantised weight: "<module>.scale" is the layers'
  // weight_scale.
  s.weights_mapping.suffix.push_back({".scale", ".weight_scale"});
  // Every quantised module's weight has its scale and every scale its weight: a missing one is
  // named before any data is read.
  // (The routed experts are FP4, or FP8 by the linears' method; V4.1's Engram projection is FP8,
  // and so is a DSpark stage's main_proj, as ROCm/ATOM's checkpoint schema has it.)
  s.check_names = [draft_stages](const std::vector<std::string>& names) {
    static const char* const kFp8[] = {
        ".attn.wq_a",         ".attn.wq_b",    ".attn.wkv",          ".attn.wo_a",
        ".attn.wo_b",         ".indexer.wq_b", ".shared_experts.w1", ".shared_experts.w2",
        ".shared_experts.w3", ".engram.wkv",   ".engram.embed",      ".main_proj"};
    const std::set<std::string> all(names.begin(), names.end());
    for (const auto& n : names) {
      if (n.starts_with("mtp.") != draft_stages) continue;  // the other model's
      if (n.ends_with(".scale")) {
        const std::string w = n.substr(0, n.size() - 6) + ".weight";
        if (!all.count(w)) fail("quantisation scale '{}' has no weight '{}'", n, w);
        continue;
      }
      if (!n.ends_with(".weight")) continue;
      const std::string m = n.substr(0, n.size() - 7);
      bool q = m.find(".ffn.experts.") != std::string::npos;
      for (const char* suffix : kFp8) q = q || m.ends_with(suffix);
      if (q && !all.count(m + ".scale"))
        fail("quantised weight '{}' has no scale '{}.scale' (quantization_config)", n, m);
    }
  };
}

}  // namespace atom
