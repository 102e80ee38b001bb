// DSpark, DeepSeek-V4.1's block drafter (models/dspark.h), on the CPU in F32.
#include "models/dspark.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <regex>
#include <set>

#include "core/convert.h"
#include "layers/compressed_kv.h"
#include "layers/embedding.h"
#include "layers/hyper_connection.h"
#include "layers/norm.h"
#include "layers/rotary.h"
#include "loader/checkpoint.h"
#include "models/deepseek_v41_config.h"
#include "models/deepseek_v4_parts.h"
#include "models/draft_model.h"

namespace atom {

namespace {

// The mtp.N stages the checkpoint beside config.json carries (the definition counts them in the
// index when the config does not say): 0 when there is no checkpoint to look at.
int64_t count_checkpoint_stages(const ModelConfig& c) {
  const std::filesystem::path dir = std::filesystem::path(c.path).parent_path();
  if (c.path.empty() || !std::filesystem::is_directory(dir)) return 0;
  std::set<int64_t> stages;
  static const std::regex kStage(R"(^mtp\.(\d+)\.)");
  for (const auto& [path, header] : Checkpoint(dir.string()).headers())
    for (const auto& e : header.entries) {
      std::smatch m;
      if (std::regex_search(e.name, m, kStage)) stages.insert(std::stoll(m[1].str()));
    }
  return stages.empty() ? 0 : *stages.rbegin() + 1;
}

}  // namespace

DSparkConfig DSparkConfig::parse(const ModelConfig& c, int64_t layers, int64_t vocab) {
  const ConfigFields& t = c.text;
  if (!t.has("dspark_block_size"))
    t.bad("dspark_block_size",
          "is missing: this checkpoint carries no DSpark stages (speculative decoding with "
          "method 'dspark' needs them)");
  DSparkConfig d;
  d.block_size = t.get_int("dspark_block_size", IntRange{1, 64});
  d.noise_token_id = t.get_int("dspark_noise_token_id", IntRange{0, vocab - 1});
  d.markov_rank = t.get_int("dspark_markov_rank", IntRange{1, INT32_MAX});
  d.target_layer_ids = t.get_int_list("dspark_target_layer_ids");
  if (d.target_layer_ids.empty()) t.bad("dspark_target_layer_ids", "must name target layers");
  for (int64_t l : d.target_layer_ids)
    if (l < 0 || l >= layers)
      t.bad("dspark_target_layer_ids",
            fmt::format("names layer {}, outside the target's {} layers", l, layers));
  d.num_stages = t.has("dspark_num_layers") ? t.get_int("dspark_num_layers", IntRange{1, 64})
                                            : count_checkpoint_stages(c);
  if (d.num_stages < 1)
    t.bad("dspark_num_layers", "is missing and the checkpoint has no mtp.N stages to count");
  return d;
}

namespace {

struct DSparkOptions {
  DeepseekV41Config cfg;
  DSparkConfig d;
  std::vector<float> inv_freq;
  float attention_factor = 1.0f;
  HyperConnectionOptions hc;
  DeepseekV4MoeOptions moe;

  explicit DSparkOptions(const ModelConfig& c)
      : cfg(DeepseekV41Config::parse(c)), d(DSparkConfig::parse(c, cfg.layers, cfg.vocab)) {
    const ConfigFields& t = cfg.text;
    RopeConfig rope;
    rope.theta = t.get_double("rope_theta", 10000.0, RealRange::positive());
    const RopeTables rt = rope_tables(rope, static_cast<int>(cfg.rope_dim), cfg.max_positions);
    inv_freq = rt.inv_freq;
    attention_factor = rt.attention_factor;
    hc = deepseek_v41_hc_options(cfg);
    moe = deepseek_v41_moe_options(cfg);
    // The stages' own mixture (the released config's dspark_n_routed_experts and
    // dspark_num_experts_per_tok, from which ROCm/ATOM builds the draft MoE), else the target's.
    moe.experts = t.get_int("dspark_n_routed_experts", cfg.experts, IntRange{1, 1 << 16});
    moe.top_k = t.get_int("dspark_num_experts_per_tok", std::min(cfg.top_k, moe.experts),
                          IntRange{1, moe.experts});
    // DeepSeek's native format quantises the stages as the target's layers: FP4 routed experts
    // (expert_dtype fp4, checked by the config), FP8 linears (the layers' own storage).
    moe.fp4_experts = cfg.quantized;
  }
};

void check_f32(const Tensor& t, const char* what) { deepseek_v4_check_cpu_f32(t, what); }

void rms_unweighted(float* x, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= r;
}

// One stage's attention: its context rows in a cache plane (absorb), the block's queries over
// them and the block.
class DSparkAttention {
 public:
  DSparkAttention(LayerContext& ctx, const DSparkOptions& v, const std::string& prefix)
      : v_(v),
        wq_a_(ctx, prefix + ".wq_a", v.cfg.hidden, v.cfg.q_lora, false),
        q_norm_(ctx, prefix + ".q_norm", v.cfg.q_lora, v.cfg.eps),
        wq_b_(ctx, prefix + ".wq_b", v.cfg.q_lora, v.cfg.heads * v.cfg.head_dim, false),
        wkv_(ctx, prefix + ".wkv", v.cfg.hidden, v.cfg.head_dim, false),
        kv_norm_(ctx, prefix + ".kv_norm", v.cfg.head_dim, v.cfg.eps),
        wo_a_(ctx, prefix + ".wo_a", v.cfg.heads * v.cfg.head_dim / v.cfg.o_groups,
              v.cfg.o_groups * v.cfg.o_lora, false, LinearStorage::kDequantize),
        wo_b_(ctx, prefix + ".wo_b", v.cfg.o_groups * v.cfg.o_lora, v.cfg.hidden, false) {
    ATOM_CHECK(ctx.device.is_cpu() && ctx.act_dtype == DType::kF32,
               "{}: DSpark runs on the CPU backend (F32) only so far", prefix);
    sinks_ = &ctx.params.add(prefix + ".attn_sink", ctx.param_tensor({v.cfg.heads}, DType::kF32));
    ctx.params.add_post_load([this] {
      const Tensor& w = wo_a_.weight().data();
      wo_a_f32_ = w.dtype() == DType::kF32 ? w : tensor_cast_cpu(w, DType::kF32);
    });
    plane_ = static_cast<int>(ctx.cache_specs->size());
    ctx.cache_specs->push_back(CacheSpec::rows(static_cast<int>(v.cfg.head_dim), 1, ctx.act_dtype));
  }

  // rope(kv_norm(wkv main)) of the batch's rows at their positions, into the plane.
  void absorb(Step& step, const Tensor& main) {
    const Batch& b = step.batch;
    const int64_t D = v_.cfg.head_dim;
    Tensor kv = kv_norm_.forward(step, wkv_.forward(step, main));
    check_f32(kv, "context keys");
    const Tensor& plane = step.kv->plane(static_cast<size_t>(plane_), CacheKind::kRows);
    check_f32(plane, "the context cache");
    for (int s = 0; s < b.num_seqs(); ++s) {
      const PagedRows rows = paged_rows(b, s, 1);
      const auto [q0, q1, start] = seq_rows(b, s);
      for (int64_t i = q0; i < q1; ++i) {
        float* k = kv.ptr<float>() + i * D;
        rope_tail(k, D, v_.cfg.rope_dim, b.positions[static_cast<size_t>(i)], v_.inv_freq,
                  v_.attention_factor);
        std::copy(k, k + D, rows.row(plane, start + (i - q0)));
      }
    }
  }

  // x [S W, hidden]: the blocks of step.batch's sequences (W rows each at anchor position + k).
  Tensor forward(Step& step, const Tensor& x, int64_t W) {
    const Batch& b = step.batch;
    const int64_t H = v_.cfg.heads, D = v_.cfg.head_dim, R = v_.cfg.rope_dim;
    const float eps = static_cast<float>(v_.cfg.eps);
    Tensor q = wq_b_.forward(step, q_norm_.forward(step, wq_a_.forward(step, x)));
    Tensor kv = kv_norm_.forward(step, wkv_.forward(step, x));
    check_f32(q, "queries");
    check_f32(kv, "keys");
    const Tensor& plane = step.kv->plane(static_cast<size_t>(plane_), CacheKind::kRows);
    Tensor o = step.empty({x.size(0), H * D}, DType::kF32);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const float* sinks = sinks_->data().ptr<float>();
    for (int s = 0; s < b.num_seqs(); ++s) {
      const int64_t row0 = static_cast<int64_t>(s) * W;
      const int64_t p = b.positions[static_cast<size_t>(b.query_start[static_cast<size_t>(s)])] - 1;
      for (int64_t k = 0; k < W; ++k) {
        const int64_t i = row0 + k, pos = p + 1 + k;
        for (int64_t h = 0; h < H; ++h) {
          float* qh = q.ptr<float>() + (i * H + h) * D;
          rms_unweighted(qh, D, eps);
          rope_tail(qh, D, R, pos, v_.inv_freq, v_.attention_factor);
        }
        rope_tail(kv.ptr<float>() + i * D, D, R, pos, v_.inv_freq, v_.attention_factor);
      }
      // The context rows of the window [p - window + 1, p], then the whole block.
      const PagedRows rows = paged_rows(b, s, 1);
      std::vector<const float*> keys;
      for (int64_t j = std::max<int64_t>(0, p - v_.cfg.window + 1); j <= p; ++j)
        keys.push_back(rows.row(plane, j));
      for (int64_t k = 0; k < W; ++k) keys.push_back(kv.ptr<float>() + (row0 + k) * D);
      for (int64_t k = 0; k < W; ++k) {
        const int64_t i = row0 + k;
        for (int64_t h = 0; h < H; ++h) {
          float* oh = o.ptr<float>() + (i * H + h) * D;
          deepseek_v4_sink_attention(q.ptr<float>() + (i * H + h) * D, keys, D, sinks[h], scale,
                                     oh);
          rope_tail(oh, D, R, p + 1 + k, v_.inv_freq, v_.attention_factor, /*inverse=*/true);
        }
      }
    }
    Tensor a = deepseek_v4_grouped_wo_a(step, o, wo_a_f32_, v_.cfg.o_groups, v_.cfg.o_lora);
    return wo_b_.forward(step, a);
  }

 private:
  const DSparkOptions& v_;
  ReplicatedLinear wq_a_;
  RMSNorm q_norm_;
  ReplicatedLinear wq_b_, wkv_;
  RMSNorm kv_norm_;
  ReplicatedLinear wo_a_;
  Tensor wo_a_f32_;
  ReplicatedLinear wo_b_;
  Parameter* sinks_;
  int plane_ = -1;
};

// One stage: a DeepSeek-V4 decoder layer (mHC sites collapsing by their own pre) with the block
// attention.
class DSparkStage {
 public:
  DSparkStage(LayerContext& ctx, const DSparkOptions& v, const std::string& p)
      : attn_norm_(ctx, p + ".attn_norm", v.cfg.hidden, v.cfg.eps),
        ffn_norm_(ctx, p + ".ffn_norm", v.cfg.hidden, v.cfg.eps),
        attn_hc_(ctx, p + ".hc_attn_fn", p + ".hc_attn_base", p + ".hc_attn_scale", v.hc),
        ffn_hc_(ctx, p + ".hc_ffn_fn", p + ".hc_ffn_base", p + ".hc_ffn_scale", v.hc),
        attn_(ctx, v, p + ".attn"),
        ffn_(ctx, v.moe, p + ".ffn") {}

  DSparkAttention& attention() { return attn_; }

  void forward(Step& step, Tensor& streams, int64_t W) {
    HyperConnection::Mix m = attn_hc_.mix(step, streams);
    HyperConnection::write_back(m, attn_.forward(step, attn_norm_.forward(step, m.input), W),
                                streams);
    m = ffn_hc_.mix(step, streams);
    HyperConnection::write_back(m, ffn_.forward(step, ffn_norm_.forward(step, m.input)), streams);
  }

 private:
  RMSNorm attn_norm_, ffn_norm_;
  HyperConnection attn_hc_, ffn_hc_;
  DSparkAttention attn_;
  DeepseekV4Moe ffn_;
};

class DeepseekV41DSpark : public BlockDraftModel {
 public:
  DeepseekV41DSpark(const ModelConfig& c, const ModelOptions& o) : BlockDraftModel(c, o), v_(c) {
    LayerContext& x = ctx();
    ATOM_CHECK(x.tp_size == 1, "DSpark runs on one rank (the leader's device)");
    x.packed_modules = {{"w1", "gate_up_proj", "0"}, {"w3", "gate_up_proj", "1"}};
    const DeepseekV41Config& f = v_.cfg;
    embed_ = std::make_unique<VocabParallelEmbedding>(x, "model.embed_tokens", f.vocab, f.hidden);
    embed_->weight().optional = true;  // the target's
    for (int64_t i = 0; i < v_.d.num_stages; ++i)
      stages_.push_back(std::make_unique<DSparkStage>(x, v_, stage(i)));
    const std::string first = stage(0), last = stage(v_.d.num_stages - 1);
    const int64_t n = static_cast<int64_t>(v_.d.target_layer_ids.size());
    main_proj_ =
        std::make_unique<ReplicatedLinear>(x, first + ".main_proj", n * f.hidden, f.hidden, false);
    main_norm_ = std::make_unique<RMSNorm>(x, first + ".main_norm", f.hidden, f.eps);
    hc_head_ = std::make_unique<HyperHead>(x, last + ".hc_head_fn", last + ".hc_head_base",
                                           last + ".hc_head_scale", v_.hc);
    norm_ = std::make_unique<RMSNorm>(x, last + ".norm", f.hidden, f.eps);
    head_ = std::make_unique<ParallelLMHead>(x, "head", f.vocab, f.hidden);
    params().find("head.weight")->optional = true;  // the target's
    w1_ = &x.params.add(last + ".markov_head.markov_w1.weight",
                        x.param_tensor({f.vocab, v_.d.markov_rank}, DType::kF32));
    w2_ = &x.params.add(last + ".markov_head.markov_w2.weight",
                        x.param_tensor({f.vocab, v_.d.markov_rank}, DType::kF32));
    proj_ = &x.params.add(last + ".confidence_head.proj.weight",
                          x.param_tensor({1, f.hidden + v_.d.markov_rank}, DType::kF32));
  }

  // DeepSeek's native format (the target's, models/deepseek_v41.cpp), dequantised at load on the
  // CPU: the stages' wq_a, wq_b, wkv, wo_a, wo_b, shared expert and main_proj FP8 e4m3 in 32 x 32
  // blocks with F8_E8M0 scales, the routed experts FP4 e2m1 with an F8_E8M0 scale per 32 along
  // K; the routers, norms, hyper-connections and the Markov and confidence heads as stored.
  std::vector<std::string> quantization_methods() const override { return {"fp8"}; }
  int num_draft_layers() const override { return static_cast<int>(v_.d.num_stages); }
  std::string method() const override { return "dspark"; }
  std::vector<int64_t> target_layer_outputs() const override { return v_.d.target_layer_ids; }

  std::vector<std::pair<std::string, std::string>> shared_with_target() const override {
    return {{"model.embed_tokens.weight", "model.embed_tokens.weight"},
            {"head.weight", "head.weight"}};
  }

  WeightLoadSpec weight_load_spec() const override {
    WeightLoadSpec s = Model::weight_load_spec();
    deepseek_v4_release_names(s, v_.moe.experts, v_.moe.fp4_experts, v_.cfg.quantized,
                              /*draft_stages=*/true);
    std::erase_if(s.weights_mapping.prefix, [](const auto& p) { return p.first == "mtp."; });
    // The released checkpoint names the Markov tables after the modules that once held them.
    s.weights_mapping.substr.emplace_back(".markov_head.embed.", ".markov_head.markov_w1.");
    s.weights_mapping.substr.emplace_back(".markov_head.head.", ".markov_head.markov_w2.");
    s.spec_decode = true;
    s.spec_layer_rewrite = [](const std::string& name, int64_t) -> std::optional<std::string> {
      if (!name.starts_with("mtp.")) return std::nullopt;  // the target's
      return name;
    };
    return s;
  }

  void absorb(Step& step, const Tensor& outputs) override {
    check_f32(outputs, "target layer outputs");
    ATOM_CHECK(outputs.size(0) == step.batch.num_tokens(),
               "DSpark: {} rows of target layer outputs for a batch of {}", outputs.size(0),
               step.batch.num_tokens());
    Tensor main = main_norm_->forward(step, main_proj_->forward(step, outputs));
    for (auto& s : stages_) s->attention().absorb(step, main);
  }

  Block draft_block(Step& step, int width) override {
    const Batch& b = step.batch;
    const int S = b.num_seqs();
    const int64_t W = width, V = v_.cfg.vocab, r = v_.d.markov_rank, Dm = v_.cfg.hidden;
    ATOM_CHECK(W >= 1 && b.num_tokens() == S, "DSpark: a block of {} for {} rows of {} sequences",
               W, b.num_tokens(), S);
    Tensor ids = step.empty({S * W}, DType::kI32);
    for (int s = 0; s < S; ++s)
      for (int64_t k = 0; k < W; ++k)
        ids.ptr<int32_t>()[s * W + k] = k == 0 ? b.token_ids[static_cast<size_t>(s)]
                                               : static_cast<int32_t>(v_.d.noise_token_id);
    Tensor streams = hc_streams_from_embedding(step, embed_->forward(step, ids), v_.cfg.hc_mult);
    for (auto& st : stages_) st->forward(step, streams, W);
    Tensor h = hc_head_->forward(step, streams);  // before the norm: the confidence head's
    check_f32(h, "the block's hidden states");
    Block out;
    out.base_logits = head_->forward(step, norm_->forward(step, h));
    check_f32(out.base_logits, "the block's logits");
    out.logits = step.empty({S * W, V}, DType::kF32);
    const float* w1 = w1_->data().ptr<float>();
    const float* w2 = w2_->data().ptr<float>();
    const float* proj = proj_->data().ptr<float>();
    for (int s = 0; s < S; ++s) {
      int32_t prev = b.token_ids[static_cast<size_t>(s)];
      for (int64_t k = 0; k < W; ++k) {
        const int64_t i = s * W + k;
        const float* e = w1 + static_cast<int64_t>(prev) * r;
        const float* u = out.base_logits.ptr<float>() + i * V;
        float* l = out.logits.ptr<float>() + i * V;
        for (int64_t t = 0; t < V; ++t) l[t] = u[t] + deepseek_v4_dot(e, w2 + t * r, r);
        const float c =
            deepseek_v4_dot(proj, h.ptr<float>() + i * Dm, Dm) + deepseek_v4_dot(proj + Dm, e, r);
        out.confidence.push_back(1.0f / (1.0f + std::exp(-c)));
        prev = static_cast<int32_t>(std::max_element(l, l + V) - l);
        out.tokens.push_back(prev);
      }
    }
    return out;
  }

 private:
  static std::string stage(int64_t i) { return "mtp." + std::to_string(i); }

  DSparkOptions v_;
  std::unique_ptr<VocabParallelEmbedding> embed_;
  std::vector<std::unique_ptr<DSparkStage>> stages_;
  std::unique_ptr<ReplicatedLinear> main_proj_;
  std::unique_ptr<RMSNorm> main_norm_;
  std::unique_ptr<HyperHead> hc_head_;
  std::unique_ptr<RMSNorm> norm_;
  std::unique_ptr<ParallelLMHead> head_;
  Parameter *w1_ = nullptr, *w2_ = nullptr, *proj_ = nullptr;
};

}  // namespace

ATOM_REGISTER_DRAFTER("DeepseekV41ForCausalLM", DeepseekV41DSpark);

}  // namespace atom
