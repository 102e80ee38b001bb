// DeepSeek-V4.1 (DeepseekV41ForCausalLM; ROCm/ATOM's atom/models/deepseek_v41/, no transformers
// model), text only, on the CPU in F32. It is DeepSeek-V4 (models/deepseek_v4.cpp, whose mixture
// of experts, attention core, grouped output projection and release names it shares through
// models/deepseek_v4_parts.h) with:
//   * CSA2 (models/deepseek_v41_config.h resolves each layer's role once): compress_ratios 0 is
//     the sliding window only; 1 or 2 adds compressed rows. A FULL layer owns a compressor (groups
//     of `ratio` tokens, no overlap, no position bias: norm(Σ_j softmax_j(wgate x_j) wkv x_j), or
//     norm(wkv x) for ratio 1; the main row is that latent with RoPE at the group's first
//     position) and the index keys rope(k_norm(indexer.wk(latent))); FULL and REINDEX layers score
//     their top-k (Σ_h w_h ReLU(q_h · k), w = weights_proj(x) index_head_dim^-½ index_n_heads^-½,
//     q = rope(indexer.wq_b(q_norm(wq_a x)))) over their KV owner's keys; REUSE layers take their
//     top-k owner's rows. The candidate source keeps candidate_topk_blocks blocks per query and
//     the REINDEX layers after it score only inside them (kernels::indexer_topk's candidates). A
//     query at position p sees (p + 1) / ratio rows.
//   * Attention as V4's but without the per-head query norm: keys are the chosen compressed rows
//     of the KV owner, then the sliding window; the window RoPE (rope_theta) on window-only
//     layers, the compress RoPE (compress_rope_theta, YaRN without an attention factor) on the
//     others.
//   * Single-pass mHC (HyperConnection::pre / collapse): each site predicts its mixes from the
//     residual, collapses the residual by the previous site's pre (the embedding's stream 0
//     before the first), writes back with its own post and comb, and carries its pre on; the last
//     pre collapses the streams before the final norm (no hc_head).
//   * Engram (layers/engram.h) on engram_layer_ids, before the attention site: each stream j
//     gains sigmoid(gate_j) v from the n-gram hash rows of the token and its predecessors, their
//     ids first mapped through the compressed vocabulary of the tokenizer beside config.json
//     (tokenizer/engram_vocab.h; none: the ids as they are) and kept in a per-token plane of the
//     paged cache, so decode, chunked prefill and prefix caching see the history; eps
//     rms_norm_eps.
//   * The MoE is V4's (no hash layers); gate.bias_vl (the image tokens' routing bias) is not read.
// The vision tower's tensors (vision.*, aligner.*, image_start/end/newline) and the DSpark draft
// stages (mtp.*, the drafter's) are skipped unread; an image request is refused by the engine (a
// text model).
// The index plane is stored as index_cache_dtype says (layers/compressed_kv.h): fp8 (default),
// e4m3 codes with a ue8m0 F32 scale per key; fp4, E2M1 codes and an E8M0 scale per 32 elements
// in two planes; the scorer reads the keys back from those bytes and rounds the query as
// ROCm/ATOM's scorers do (fp8: e4m3 with an F32 scale per (token, head); fp4: as the keys).
// Speculative decoding: DSpark (models/dspark.h) reads the streams after its target layers,
// averaged (hands_over_layer_outputs); one rank only (the engine refuses it over several).
// Tensor parallelism as V4's (models/deepseek_v4.cpp): the attention, compressors, indexers,
// Engram and hyper-connections are replicated on every rank (so every rank holds every layer's
// cache rows and the CSA2 reads of other layers' rows work as on one rank), the routed experts
// split (slices, or whole experts with --enable-expert-parallel), the shared expert split like a
// dense MLP, one all-reduce (DeepseekV4Moe). Pipeline parallelism: a stage builds its layers,
// the first the embedding, the last the norm and head; it hands on the streams and the last
// site's pre. A layer reading another's rows (kv_source_layer_ids, index_source_layer_ids,
// candidate_source_layer_id) must find that layer on its own stage: a partition that puts a
// source on an earlier stage is refused at load (v41_check_stages; no cache rows cross stages).
// On CUDA the same in the activations' dtype through kernels (forward_cuda): the index plane's
// store and scores, the indexer's candidates, Engram's gate and the single-pass
// hyper-connections are the ops the CPU path calls too.
// Not done: the FP8 rounding of window keys and activations (native FP8 / FP4 weights are
// dequantised at load, also on CUDA).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>

#include "core/convert.h"
#include "kernels/compressed_kv.h"
#include "kernels/elementwise.h"
#include "kernels/mla.h"
#include "layers/compressed_kv.h"
#include "layers/embedding.h"
#include "layers/engram.h"
#include "layers/hyper_connection.h"
#include "layers/norm.h"
#include "layers/rotary.h"
#include "models/deepseek_v41_config.h"
#include "models/deepseek_v4_parts.h"
#include "models/llama.h"
#include "tokenizer/engram_vocab.h"

namespace atom {

namespace {

// The text fields the model reads beyond DeepseekV41Config.
struct V41Options {
  DeepseekV41Config cfg;
  int64_t candidate_source = -1, candidate_block = 0, candidate_blocks = 0;
  RopeConfig window_rope, compress_rope;
  HyperConnectionOptions hc;
  DeepseekV4MoeOptions moe;
  std::optional<EngramConfig> engram;
  std::optional<tokenizer::CompressedVocab> vocab;  // Engram's, from the checkpoint's tokenizer

  explicit V41Options(const ModelConfig& c) : cfg(DeepseekV41Config::parse(c)) {
    const ConfigFields& t = cfg.text;
    candidate_source = t.get_int("candidate_source_layer_id", IntRange{-1, INT32_MAX});
    if (candidate_source >= 0) {
      candidate_block = t.get_int("candidate_block_size", IntRange{1, INT32_MAX});
      candidate_blocks = t.get_int("candidate_topk_blocks", IntRange{1, INT32_MAX});
    }
    window_rope = RopeConfig{};
    window_rope.theta = t.get_double("rope_theta", 10000.0, RealRange::positive());
    compress_rope = c.rope;
    compress_rope.theta = t.get_double("compress_rope_theta", 160000.0, RealRange::positive());
    if (compress_rope.type == "yarn" && !compress_rope.attention_factor)
      compress_rope.attention_factor = 1.0;
    hc = deepseek_v41_hc_options(cfg);
    moe = deepseek_v41_moe_options(cfg);
    moe.fp4_experts = cfg.quantized;  // expert_dtype fp4, checked by the config
    if (!cfg.engram_layer_ids.empty()) engram = EngramConfig::parse(t);
    // Engram hashes compressed ids: the tokenizer beside config.json, when there is one, gives
    // them (tokenizer/engram_vocab.h); without one the ids are hashed as they are.
    const std::filesystem::path config_path(c.path);
    if (engram && config_path.has_parent_path() &&
        std::filesystem::exists(config_path.parent_path() / "tokenizer.json")) {
      vocab = tokenizer::engram_compressed_vocab(
          tokenizer::Tokenizer::from_dir(config_path.parent_path()));
      if (vocab->size != engram->compressed_vocab_size)
        t.bad("engram_compressed_vocab_size",
              fmt::format("is {}, but the tokenizer's compressed vocabulary has {} ids",
                          engram->compressed_vocab_size, vocab->size));
    }
  }

  const V41LayerAttention& role(int64_t layer) const {
    return cfg.attention.at(static_cast<size_t>(layer));
  }
};

void check_cpu_f32(const Tensor& t, const char* what) { deepseek_v4_check_cpu_f32(t, what); }

class DeepseekV41Attention;

// The layers' attention modules, so that a layer reaches its KV, top-k and candidate owners
// (earlier layers of the same step).
using AttentionTable = std::vector<DeepseekV41Attention*>;

class DeepseekV41Attention {
 public:
  DeepseekV41Attention(LayerContext& ctx, const ModelConfig& c, const V41Options& v, int64_t layer,
                       const std::string& prefix, const AttentionTable& table)
      : v_(v),
        role_(v.role(layer)),
        table_(table),
        fp4_(v.cfg.index_cache_dtype == "fp4"),
        wq_a_(ctx, prefix + ".wq_a", v.cfg.hidden, v.cfg.q_lora, false),
        q_norm_(ctx, prefix + ".q_norm", v.cfg.q_lora, v.cfg.eps),
        wq_b_(ctx, prefix + ".wq_b", v.cfg.q_lora, v.cfg.heads * v.cfg.head_dim, false),
        wkv_(ctx, prefix + ".wkv", v.cfg.hidden, v.cfg.head_dim, false),
        kv_norm_(ctx, prefix + ".kv_norm", v.cfg.head_dim, v.cfg.eps),
        wo_a_(ctx, prefix + ".wo_a", v.cfg.heads * v.cfg.head_dim / v.cfg.o_groups,
              v.cfg.o_groups * v.cfg.o_lora, false, LinearStorage::kDequantize),
        wo_b_(ctx, prefix + ".wo_b", v.cfg.o_groups * v.cfg.o_lora, v.cfg.hidden, false) {
    ATOM_CHECK(!ctx.device.is_cpu() || ctx.act_dtype == DType::kF32,
               "{}: DeepSeek-V4.1 on the CPU computes in F32, not {}", prefix,
               dtype_name(ctx.act_dtype));
    ATOM_CHECK(ctx.device.is_cpu() || v.cfg.head_dim <= 512,
               "{}: head_dim {}: the CUDA attention kernel takes heads up to 512 wide", prefix,
               v.cfg.head_dim);
    const RopeTables rt = rope_tables(role_.ratio ? v.compress_rope : v.window_rope,
                                      static_cast<int>(v.cfg.rope_dim), c.max_position_embeddings);
    inv_freq_ = rt.inv_freq;
    attention_factor_ = rt.attention_factor;
    inv_freq_t_ = inv_freq_tensor(inv_freq_, ctx.device);
    sinks_ = &ctx.params.add(prefix + ".attn_sink", ctx.param_tensor({v.cfg.heads}, DType::kF32));
    if (ctx.device.is_cpu())
      ctx.params.add_post_load([this] {
        const Tensor& w = wo_a_.weight().data();
        wo_a_f32_ = w.dtype() == DType::kF32 ? w : tensor_cast_cpu(w, DType::kF32);
      });
    raw_index_ = static_cast<int>(ctx.cache_specs->size());
    ctx.cache_specs->push_back(CacheSpec::rows(static_cast<int>(v.cfg.head_dim), 1, ctx.act_dtype));
    if (role_.owns_compressor()) {
      WindowCompressorOptions o;
      o.hidden = v.cfg.hidden;
      o.head_dim = v.cfg.head_dim;
      o.ratio = role_.ratio;
      o.overlap = false;
      o.position_bias = false;
      o.gated = role_.ratio > 1;
      o.rot_dim = v.cfg.rope_dim;
      o.inv_freq = inv_freq_;
      o.attention_factor = attention_factor_;
      o.norm_eps = static_cast<float>(v.cfg.eps);
      compressor_ = std::make_unique<WindowCompressor>(ctx, prefix + ".compressor", o);
      index_wk_ = std::make_unique<ReplicatedLinear>(ctx, prefix + ".indexer.wk", v.cfg.head_dim,
                                                     v.cfg.index_head_dim, false,
                                                     LinearStorage::kUnquantized);
      index_k_norm_ = std::make_unique<RMSNorm>(ctx, prefix + ".indexer.k_norm",
                                                v.cfg.index_head_dim, v.cfg.eps);
      // The index keys, stored as index_cache_dtype says (layers/compressed_kv.h): fp8, a row of
      // e4m3 codes and its F32 scale; fp4, a plane of E2M1 codes and one of E8M0 scales. Bytes,
      // whatever --kv-cache-dtype says.
      const int di = static_cast<int>(v.cfg.index_head_dim);
      index_plane_ = static_cast<int>(ctx.cache_specs->size());
      if (fp4_) {
        ctx.cache_specs->push_back(CacheSpec::rows(di / 2, role_.ratio, DType::kU8, true));
        index_scale_plane_ = static_cast<int>(ctx.cache_specs->size());
        ctx.cache_specs->push_back(CacheSpec::rows(di / 32, role_.ratio, DType::kU8, true));
      } else {
        ctx.cache_specs->push_back(CacheSpec::rows(static_cast<int>(index_fp8_row_bytes(di)),
                                                   role_.ratio, DType::kU8, true));
      }
    }
    if (role_.owns_indexer()) {
      index_wq_b_ =
          std::make_unique<ReplicatedLinear>(ctx, prefix + ".indexer.wq_b", v.cfg.q_lora,
                                             v.cfg.index_heads * v.cfg.index_head_dim, false);
      index_weights_ =
          std::make_unique<ReplicatedLinear>(ctx, prefix + ".indexer.weights_proj", v.cfg.hidden,
                                             v.cfg.index_heads, false, LinearStorage::kUnquantized);
    }
  }

  // This step's top-k (and candidate) tensors, in the step's scratch before the layers' (they
  // are read by later layers of the step).
  void begin_step(Step& step, int64_t T) {
    if (role_.owns_indexer()) topk_ = step.empty({T, v_.cfg.index_topk}, DType::kI32);
    if (role_.produces_candidates())
      candidates_ = step.empty({T, v_.candidate_blocks}, DType::kI32);
  }

  Tensor forward(Step& step, const Tensor& x) {
    if (!x.device().is_cpu()) return forward_cuda(step, x);
    const Batch& b = step.batch;
    const int64_t T = x.size(0), H = v_.cfg.heads, D = v_.cfg.head_dim, R = v_.cfg.rope_dim;
    Tensor q_res = q_norm_.forward(step, wq_a_.forward(step, x));
    Tensor q = wq_b_.forward(step, q_res);
    Tensor kv = kv_norm_.forward(step, wkv_.forward(step, x));
    check_cpu_f32(q, "queries");
    check_cpu_f32(kv, "keys");
    const Tensor& raw = step.kv->plane(static_cast<size_t>(raw_index_), CacheKind::kRows);
    check_cpu_f32(raw, "the key/value cache");
    for (int s = 0; s < b.num_seqs(); ++s) {
      const PagedRows rows = paged_rows(b, s, 1);
      const auto [q0, q1, start] = seq_rows(b, s);
      for (int64_t i = q0; i < q1; ++i) {
        const int64_t pos = b.positions[static_cast<size_t>(i)];
        for (int64_t h = 0; h < H; ++h)
          rope_tail(q.ptr<float>() + (i * H + h) * D, D, R, pos, inv_freq_, attention_factor_);
        float* k = kv.ptr<float>() + i * D;
        rope_tail(k, D, R, pos, inv_freq_, attention_factor_);
        std::copy(k, k + D, rows.row(raw, start + (i - q0)));
      }
    }
    if (compressor_) compress(step, x);
    choose_rows(step, x, q_res);
    Tensor o = step.empty({T, H * D}, DType::kF32);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const float* sinks = sinks_->data().ptr<float>();
    const DeepseekV41Attention* kv_owner = role_.ratio ? &owner(role_.kv_owner) : nullptr;
    for (int s = 0; s < b.num_seqs(); ++s) {
      const PagedRows raw_rows = paged_rows(b, s, 1);
      const auto [q0, q1, start] = seq_rows(b, s);
      for (int64_t i = q0; i < q1; ++i) {
        const int64_t p = start + (i - q0);
        std::vector<const float*> keys;
        if (kv_owner) {
          const PagedRows erows = paged_rows(b, s, role_.ratio);
          const Tensor& ent = kv_owner->compressor_->entries(step);
          const int32_t* chosen = topk_.ptr<int32_t>() + i * topk_.size(1);
          for (int64_t k = 0; k < topk_.size(1); ++k)
            if (chosen[k] >= 0) keys.push_back(erows.row(ent, chosen[k]));
        }
        for (int64_t k = std::max<int64_t>(0, p - v_.cfg.window + 1); k <= p; ++k)
          keys.push_back(raw_rows.row(raw, k));
        for (int64_t h = 0; h < H; ++h) {
          float* oh = o.ptr<float>() + (i * H + h) * D;
          deepseek_v4_sink_attention(q.ptr<float>() + (i * H + h) * D, keys, D, sinks[h], scale,
                                     oh);
          rope_tail(oh, D, R, b.positions[static_cast<size_t>(i)], inv_freq_, attention_factor_,
                    /*inverse=*/true);
        }
      }
    }
    Tensor a = deepseek_v4_grouped_wo_a(step, o, wo_a_f32_, v_.cfg.o_groups, v_.cfg.o_lora);
    return wo_b_.forward(step, a);
  }

 private:
  const DeepseekV41Attention& owner(int64_t layer) const {
    const DeepseekV41Attention* a = table_.at(static_cast<size_t>(layer));
    ATOM_CHECK(a, "DeepSeek-V4.1: layer {} reads layer {}, which this model does not hold",
               role_.layer, layer);
    return *a;
  }

  Tensor& index_plane(Step& step, bool scales = false) const {
    Tensor& p = step.kv->plane(static_cast<size_t>(scales ? index_scale_plane_ : index_plane_),
                               CacheKind::kRows);
    ATOM_CHECK(p.dtype() == DType::kU8, "DeepSeek-V4.1: the index key cache {} must be bytes",
               p.str());
    return p;
  }

  // The same on CUDA (kernels/compressed_kv.h, kernels/index_plane.h, kernels/mla.h): the heads
  // rotated in place, the key row rotated into the raw plane, the compressor's pooling (its
  // entries' latents kept) and the index keys stored at the step's window ends, the indexer over
  // the KV owner's plane, the sink attention over the window and the chosen rows, the output
  // rotated back, the grouped wo_a.
  Tensor forward_cuda(Step& step, const Tensor& x) {
    const Batch& b = step.batch;
    const int64_t T = x.size(0), H = v_.cfg.heads, D = v_.cfg.head_dim;
    Tensor q_res = q_norm_.forward(step, wq_a_.forward(step, x));
    Tensor q = wq_b_.forward(step, q_res);
    Tensor kv = kv_norm_.forward(step, wkv_.forward(step, x));
    rope_heads(b, q, H, D);
    rope_heads(b, kv, 1, D);
    Tensor& raw = step.kv->plane(static_cast<size_t>(raw_index_), CacheKind::kRows);
    kernels::cache_rows_write(raw, kv, b.dev.slot_mapping);
    if (compressor_) compress_cuda(step, x);
    choose_rows(step, x, q_res);
    Tensor o = step.empty({T, H * D}, q.dtype());
    kernels::SinkAttentionArgs sa;
    sa.heads = static_cast<int>(H);
    sa.head_dim = static_cast<int>(D);
    sa.window = static_cast<int>(v_.cfg.window);
    sa.ratio = role_.ratio;
    sa.scale = 1.0f / std::sqrt(static_cast<float>(D));
    sa.max_query_len = b.max_query_len;
    kernels::sink_attention(
        o, q, raw, role_.ratio ? owner(role_.kv_owner).compressor_->entries(step) : Tensor(),
        role_.ratio ? topk_ : Tensor(), sinks_->data(), deepseek_v4_compressed_batch(b), sa);
    rope_heads(b, o, H, D, /*inverse=*/true);
    Tensor a =
        deepseek_v4_grouped_wo_a(step, o, wo_a_.weight().data(), v_.cfg.o_groups, v_.cfg.o_lora);
    return wo_b_.forward(step, a);
  }

  // CUDA: RoPE (or its inverse) on the last rope_dim channels of each of `heads` rows of `dim`
  // of every token of x, at the token's position.
  void rope_heads(const Batch& b, Tensor& x, int64_t heads, int64_t dim,
                  bool inverse = false) const {
    kernels::HeadsRopeArgs ra;
    ra.heads = static_cast<int>(heads);
    ra.head_dim = static_cast<int>(dim);
    ra.rot_dim = static_cast<int>(v_.cfg.rope_dim);
    ra.attention_factor = attention_factor_;
    ra.inverse = inverse;
    kernels::heads_norm_rope(x, inv_freq_t_, deepseek_v4_compressed_batch(b), ra);
  }

  // The compressor's rows on CUDA, then the index key rope(k_norm(wk(latent))) of every window
  // the step completes (kernels::index_plane_store over the step's tokens: a token ending a
  // window stores its key at its slot's row).
  void compress_cuda(Step& step, const Tensor& x) {
    const Batch& b = step.batch;
    const int64_t T = x.size(0), D = v_.cfg.head_dim, DI = v_.cfg.index_head_dim;
    ATOM_CHECK(b.block_size % role_.ratio == 0,
               "DeepSeek-V4.1 on CUDA: compressed rows of {} tokens need pages of a multiple of "
               "{} tokens, not {}",
               role_.ratio, role_.ratio, b.block_size);
    Tensor latents;
    compressor_->forward(step, x, {}, &latents);
    Tensor lat = step.empty({T, D}, x.dtype());
    kernels::cast(lat, latents);
    Tensor k = index_k_norm_->forward(step, index_wk_->forward(step, lat));
    Tensor keys = step.empty({T, DI}, DType::kF32);
    kernels::cast(keys, k);
    store_index_keys(step, keys, b.dev.slot_mapping, b.dev.positions, role_.ratio);
  }

  // Index keys [n, index_head_dim] F32 rotated and quantised into this layer's plane
  // (kernels::index_plane_store: key e at slot rows[e] and position positions[e], stored when it
  // ends a window of `ratio` positions).
  void store_index_keys(Step& step, const Tensor& keys, const Tensor& rows, const Tensor& positions,
                        int ratio) const {
    Tensor none;
    kernels::IndexStoreArgs a;
    a.format = fp4_ ? kernels::IndexKeyFormat::kFp4 : kernels::IndexKeyFormat::kFp8;
    a.head_dim = static_cast<int>(v_.cfg.index_head_dim);
    a.rot_dim = static_cast<int>(v_.cfg.rope_dim);
    a.attention_factor = attention_factor_;
    a.ratio = ratio;
    kernels::index_plane_store(index_plane(step), fp4_ ? index_plane(step, true) : none, keys, rows,
                               positions, inv_freq_t_, a);
  }

  // The compressor's rows, and for each one the index key rope(k_norm(wk(latent))) at the group's
  // first position.
  void compress(Step& step, const Tensor& x) {
    struct Entry {
      int s;
      int64_t w;
    };
    std::vector<Entry> done;
    std::vector<float> latents;
    compressor_->forward(step, x, [&](int s, int64_t w, const float* latent) {
      done.push_back({s, w});
      latents.insert(latents.end(), latent, latent + v_.cfg.head_dim);
    });
    if (done.empty()) return;
    const int64_t n = static_cast<int64_t>(done.size());
    Tensor lat = step.empty({n, v_.cfg.head_dim}, DType::kF32);
    std::copy(latents.begin(), latents.end(), lat.ptr<float>());
    Tensor keys = index_k_norm_->forward(step, index_wk_->forward(step, lat));
    check_cpu_f32(keys, "index keys");
    // Each key at its row (rows of one position here), rotated at its group's first position.
    const Tensor& plane = index_plane(step);
    Tensor rows = step.empty({n}, DType::kI32), pos = step.empty({n}, DType::kI32);
    for (int64_t e = 0; e < n; ++e) {
      const Entry& d = done[static_cast<size_t>(e)];
      rows.ptr<int32_t>()[e] = static_cast<int32_t>(
          paged_rows(step.batch, d.s, role_.ratio).offset(plane, d.w) / plane.size(3));
      pos.ptr<int32_t>()[e] = static_cast<int32_t>(d.w * role_.ratio);
    }
    store_index_keys(step, keys, rows, pos, 1);
  }

  // The compressed rows each query attends to: this layer's own choice, or its top-k owner's.
  void choose_rows(Step& step, const Tensor& x, const Tensor& q_res) {
    if (!role_.ratio) return;
    if (role_.owns_indexer())
      select(step, x, q_res);
    else
      topk_ = owner(role_.topk_owner).topk_;
  }

  // This layer's top-k rows (and, on the candidate source, its candidate blocks) per query:
  // the indexer (kernels::indexer_topk) over the KV owner's plane as stored, the query rotated
  // here and rounded by the kernel as the scorers take it.
  void select(Step& step, const Tensor& x, const Tensor& q_res) {
    const Batch& b = step.batch;
    const int64_t T = x.size(0), NH = v_.cfg.index_heads, DI = v_.cfg.index_head_dim;
    Tensor iq = index_wq_b_->forward(step, q_res);
    Tensor iw = index_weights_->forward(step, x);
    const bool cpu = x.device().is_cpu();
    if (cpu) {
      check_cpu_f32(iq, "indexer queries");
      for (int64_t i = 0; i < T; ++i)
        for (int64_t h = 0; h < NH; ++h)
          rope_tail(iq.ptr<float>() + (i * NH + h) * DI, DI, v_.cfg.rope_dim,
                    b.positions[static_cast<size_t>(i)], inv_freq_, attention_factor_);
    } else {
      rope_heads(b, iq, NH, DI);
      // The indexer reads F32 weights.
      if (iw.dtype() != DType::kF32) {
        Tensor w32 = step.empty({T, NH}, DType::kF32);
        kernels::cast(w32, iw);
        iw = w32;
      }
    }
    const DeepseekV41Attention& kv_owner = owner(role_.kv_owner);
    const DeepseekV41Attention* cand =
        role_.candidate_source() >= 0 ? &owner(role_.candidate_source()) : nullptr;
    kernels::IndexerArgs a;
    a.num_heads = static_cast<int>(NH);
    a.head_dim = static_cast<int>(DI);
    a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(DI)));
    a.weights_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(NH)));
    a.top_k = static_cast<int>(v_.cfg.index_topk);
    a.max_query_len = b.max_query_len;
    a.max_context_len = std::max(1, b.max_context_len / role_.ratio);
    a.entry_tokens = role_.ratio;
    a.key_format = fp4_ ? kernels::IndexKeyFormat::kFp4 : kernels::IndexKeyFormat::kFp8;
    a.large_position_first = v_.cfg.index_topk_tie_break == "large_position";
    a.candidate_block = static_cast<int>(v_.candidate_block);
    kernels::IndexerPlanes p;
    if (fp4_) p.key_scales = &kv_owner.index_plane(step, true);
    if (cand) p.candidates_in = &cand->candidates_;
    if (role_.produces_candidates()) p.candidates_out = &candidates_;
    kernels::AttentionBatch ab{&b.dev.query_start, &b.dev.context_lens, &b.dev.page_indptr,
                               &b.dev.page_indices};
    Tensor workspace;
    if (!cpu) {
      workspace =
          step.empty({std::max<int64_t>(1, kernels::indexer_topk_workspace_size(x.device(), T, a))},
                     DType::kF32);
      ab.workspace = &workspace;
    }
    kernels::indexer_topk(topk_, iq, iw, kv_owner.index_plane(step), ab, a, p);
  }

  const V41Options& v_;
  const V41LayerAttention& role_;
  const AttentionTable& table_;
  bool fp4_;  // index_cache_dtype: fp4, else fp8
  ReplicatedLinear wq_a_;
  RMSNorm q_norm_;
  ReplicatedLinear wq_b_, wkv_;
  RMSNorm kv_norm_;
  ReplicatedLinear wo_a_;
  Tensor wo_a_f32_;
  ReplicatedLinear wo_b_;
  Parameter* sinks_;
  std::vector<float> inv_freq_;
  float attention_factor_ = 1.0f;
  int raw_index_ = -1, index_plane_ = -1, index_scale_plane_ = -1;
  std::unique_ptr<WindowCompressor> compressor_;
  std::unique_ptr<ReplicatedLinear> index_wk_;
  std::unique_ptr<RMSNorm> index_k_norm_;
  std::unique_ptr<ReplicatedLinear> index_wq_b_, index_weights_;
  Tensor inv_freq_t_;  // inv_freq_ as a tensor where the model is, for the kernels
  // This step's choices per batch row, [T, index_topk] and [T, candidate_topk_blocks] I32 (-1
  // unused), read by the layers after this one in the same step (so not in the step's arena).
  Tensor topk_, candidates_;
};

// One layer's Engram read, with the compressed ids of the tokens before the step (a per-token
// plane of the paged cache, F32: exact up to 2^24 ids) as its n-grams' history.
class DeepseekV41Engram {
 public:
  DeepseekV41Engram(LayerContext& ctx, const V41Options& v, const EngramHash& hash, int64_t layer,
                    const std::string& prefix)
      : v_(v),
        hash_(hash),
        engram_(ctx, prefix, hash, layer, v.cfg.hidden, v.cfg.hc_mult, v.cfg.eps,
                /*fp8_table=*/v.cfg.quantized),
        history_(hash.config().max_ngram_size - 1) {
    ids_index_ = static_cast<int>(ctx.cache_specs->size());
    // F32 whatever the KV cache's dtype: the ids must stay exact.
    ctx.cache_specs->push_back(CacheSpec::rows(1, 1, DType::kF32, /*keeps_dtype=*/true));
  }

  // streams [T, hc, D] += the Engram read. The step's compressed ids go into the plane; each
  // sequence's ids before the step are read back from it (on CUDA: gathered on the device and
  // copied down, the hashing and the table being the host's).
  void forward(Step& step, Tensor& streams) {
    const Batch& b = step.batch;
    const int64_t T = streams.size(0);
    Tensor& ids = step.kv->plane(static_cast<size_t>(ids_index_), CacheKind::kRows);
    ATOM_CHECK(ids.dtype() == DType::kF32 && ids.is_contiguous() && ids.numel() > 0,
               "DeepSeek-V4.1: the Engram id cache {} must be F32", ids.str());
    // Compressed ids (the tokenizer's CompressedVocab; without a tokenizer the ids themselves).
    auto compress = [&](int64_t id) { return v_.vocab ? (*v_.vocab)(id) : id; };
    const int64_t pad = compress(hash_.config().pad_token_id);
    Tensor cur = Tensor::empty({T, 1}, DType::kF32);
    for (int64_t i = 0; i < T; ++i)
      cur.ptr<float>()[i] = static_cast<float>(compress(b.token_ids[static_cast<size_t>(i)]));
    // The history: element offsets of each sequence's last history_ positions before the step.
    std::vector<int32_t> offsets;
    for (int s = 0; s < b.num_seqs(); ++s) {
      const PagedRows rows = paged_rows(b, s, 1);
      const auto [q0, q1, start] = seq_rows(b, s);
      for (int64_t p = std::max<int64_t>(0, start - history_); p < start; ++p)
        offsets.push_back(static_cast<int32_t>(rows.offset(ids, p)));
    }
    std::vector<float> past(offsets.size());
    if (ids.device().is_cpu()) {
      for (size_t k = 0; k < offsets.size(); ++k) past[k] = ids.ptr<float>()[offsets[k]];
      kernels::cache_rows_write(ids, cur, b.dev.slot_mapping);
    } else {
      if (!offsets.empty()) {
        const int64_t n = static_cast<int64_t>(offsets.size());
        Tensor idx_host = Tensor::empty({n}, DType::kI32);
        std::copy(offsets.begin(), offsets.end(), idx_host.ptr<int32_t>());
        Tensor idx = step.empty({n}, DType::kI32);
        idx.copy_from(idx_host);
        Tensor got = step.empty({n, 1}, DType::kF32);
        kernels::gather_rows(got, ids.view({ids.numel(), 1}), idx);
        Tensor got_host = Tensor::empty({n, 1}, DType::kF32);
        got_host.copy_from(got);
        std::copy(got_host.ptr<float>(), got_host.ptr<float>() + n, past.begin());
      }
      Tensor up = step.empty({T, 1}, DType::kF32);
      up.copy_from(cur);
      kernels::cache_rows_write(ids, up, b.dev.slot_mapping);
    }
    Tensor emb = Tensor::empty({T, engram_.width()}, DType::kF32);
    size_t next = 0;
    for (int s = 0; s < b.num_seqs(); ++s) {
      const auto [q0, q1, start] = seq_rows(b, s);
      const int64_t first = std::max<int64_t>(0, start - history_);
      std::vector<int64_t> seq;
      for (int64_t p = first; p < start; ++p) seq.push_back(static_cast<int64_t>(past[next++]));
      for (int64_t i = q0; i < q1; ++i) seq.push_back(static_cast<int64_t>(cur.ptr<float>()[i]));
      engram_.embed(seq, pad, static_cast<size_t>(start - first),
                    std::span<float>(emb.ptr<float>() + q0 * engram_.width(),
                                     static_cast<size_t>((q1 - q0) * engram_.width())));
    }
    engram_.add(step, streams, emb);
  }

 private:
  const V41Options& v_;
  const EngramHash& hash_;
  Engram engram_;
  int64_t history_;
  int ids_index_ = -1;
};

class DeepseekV41DecoderLayer {
 public:
  DeepseekV41DecoderLayer(LayerContext& ctx, const ModelConfig& c, const V41Options& v,
                          const EngramHash* hash, int64_t i, const std::string& p,
                          const AttentionTable& table)
      : attn_norm_(ctx, p + ".attn_norm", v.cfg.hidden, v.cfg.eps),
        ffn_norm_(ctx, p + ".ffn_norm", v.cfg.hidden, v.cfg.eps),
        attn_hc_(ctx, p + ".hc_attn_fn", p + ".hc_attn_base", p + ".hc_attn_scale", v.hc),
        ffn_hc_(ctx, p + ".hc_ffn_fn", p + ".hc_ffn_base", p + ".hc_ffn_scale", v.hc),
        attn_(ctx, c, v, i, p + ".attn", table),
        ffn_(ctx, v.moe, p + ".ffn") {
    if (std::binary_search(v.cfg.engram_layer_ids.begin(), v.cfg.engram_layer_ids.end(), i))
      engram_ = std::make_unique<DeepseekV41Engram>(ctx, v, *hash, i, p + ".engram");
  }

  DeepseekV41Attention& attention() { return attn_; }

  // streams [T, hc, D] and pre [T, hc] (the previous site's), updated in place.
  void forward(Step& step, Tensor& streams, Tensor& pre) {
    if (engram_) engram_->forward(step, streams);
    // Each site collapses the streams by the previous site's pre and hands its own on.
    HyperConnection::Mix m = attn_hc_.mix(step, streams, &pre);
    Tensor a = attn_.forward(step, attn_norm_.forward(step, m.input));
    HyperConnection::write_back(m, a, streams);
    HyperConnection::Mix f = ffn_hc_.mix(step, streams, &m.pre);
    Tensor y = ffn_.forward(step, ffn_norm_.forward(step, f.input));
    HyperConnection::write_back(f, y, streams);
    kernels::cast(pre, f.pre);  // into the step's tensor, which outlives the layer's scratch
  }

 private:
  RMSNorm attn_norm_, ffn_norm_;
  HyperConnection attn_hc_, ffn_hc_;
  DeepseekV41Attention attn_;
  DeepseekV4Moe ffn_;
  std::unique_ptr<DeepseekV41Engram> engram_;
};

// Pipeline parallelism: every layer's sources (its KV owner, top-k owner and candidate source)
// on the stage holding the layer, else an Error naming the layer, the field and both stages. Every
// stage checks every layer, so each refuses the same partition alike. The config makes every
// source lie between the layer's KV owner and the layer, so the KV owner is the first to cross.
void v41_check_stages(const V41Options& v, int64_t layers, int size,
                      const std::vector<int>& partition) {
  if (size == 1) return;
  std::vector<PipelineStage> stages;
  for (int r = 0; r < size; ++r) stages.push_back(pipeline_stage(layers, r, size, partition));
  auto stage_of = [&](int64_t layer) -> const PipelineStage& {
    for (const PipelineStage& s : stages)
      if (s.owns(layer)) return s;
    fail("DeepSeek-V4.1: layer {} is on no pipeline stage", layer);
  };
  for (int64_t i = 0; i < layers; ++i) {
    const V41LayerAttention& a = v.cfg.attention.at(static_cast<size_t>(i));
    const struct {
      int64_t source;
      const char *field, *what;
    } reads[] = {{a.kv_owner, "kv_source_layer_ids", "compressed KV rows"},
                 {a.topk_owner, "index_source_layer_ids", "top-k indices"},
                 {a.candidate_source(), "candidate_source_layer_id", "candidate blocks"}};
    const PipelineStage& mine = stage_of(i);
    for (const auto& r : reads) {
      if (r.source < 0 || r.source == i) continue;
      const PipelineStage& theirs = stage_of(r.source);
      if (theirs.rank == mine.rank) continue;
      fail("DeepSeek-V4.1 under --pipeline-parallel-size {}: layer {} reads the {} of layer {} "
           "(config.json (text_config) {}), which is on pipeline stage {} (layers {}-{}), not on "
           "layer {}'s stage {} (layers {}-{}); stages hand on no cache rows, so choose a "
           "partition (VLLM_PP_LAYER_PARTITION) that keeps every layer on the stage of its "
           "sources",
           size, i, r.what, r.source, r.field, theirs.rank, theirs.first_layer,
           theirs.end_layer - 1, i, mine.rank, mine.first_layer, mine.end_layer - 1);
    }
  }
}

class DeepseekV41ForCausalLM : public Model {
 public:
  // Pipeline parallelism: a stage builds its layers, the first the embedding, the last the norm
  // and head; the others are missing modules (never read).
  DeepseekV41ForCausalLM(const ModelConfig& c, const ModelOptions& o) : Model(c, o), v_(c) {
    LayerContext& x = ctx();
    const PipelineStage& st = x.stage;
    v41_check_stages(v_, c.num_hidden_layers, st.size, o.pp_layer_partition);
    x.packed_modules = {{"w1", "gate_up_proj", "0"}, {"w3", "gate_up_proj", "1"}};
    if (v_.engram) hash_ = std::make_unique<EngramHash>(*v_.engram);
    if (st.first())
      embed_ = std::make_unique<VocabParallelEmbedding>(x, "model.embed_tokens", c.vocab_size,
                                                        c.hidden_size);
    else
      x.params.add_missing_module("model.embed_tokens");
    table_.assign(static_cast<size_t>(c.num_hidden_layers), nullptr);
    layers_ = make_layers<DeepseekV41DecoderLayer>(
        x, c.num_hidden_layers, "model.layers", [&](int64_t i, const std::string& prefix) {
          auto l =
              std::make_unique<DeepseekV41DecoderLayer>(x, c, v_, hash_.get(), i, prefix, table_);
          table_[static_cast<size_t>(i)] = &l->attention();
          return l;
        });
    if (st.last()) {
      norm_ = std::make_unique<RMSNorm>(x, "model.norm", c.hidden_size, c.rms_norm_eps);
      head_ = std::make_unique<ParallelLMHead>(x, "head", c.vocab_size, c.hidden_size);
    } else {
      for (const char* m : {"model.norm", "head"}) x.params.add_missing_module(m);
    }
  }

  // A stage after the first starts from the previous stage's streams and pre (Step::pp_in: the
  // streams as its hidden, the pre [T, hc] its one extra tensor); a stage before the last hands
  // its own on the same way. A speculative verification step runs in one pass: the compressors
  // keep their windows in progress after each row in its rollback slot (WindowCompressor).
  Tensor forward(Step& step) override {
    const PipelineStage& st = stage();
    const int64_t hc = v_.hc.hc_mult;
    Tensor streams, pre;
    if (st.first()) {
      streams =
          hc_streams_from_embedding(step, embed_->forward(step, step.batch.dev.token_ids), hc);
      // The first site collapses by stream 0 alone.
      Tensor first = Tensor::empty({streams.size(0), hc}, DType::kF32);
      for (int64_t t = 0; t < streams.size(0); ++t)
        for (int64_t j = 0; j < hc; ++j) first.ptr<float>()[t * hc + j] = j == 0 ? 1.0f : 0.0f;
      pre = step.empty({streams.size(0), hc}, DType::kF32);
      pre.copy_from(first);
    } else {
      streams = hc_streams_from_stage(step, hc, v_.cfg.hidden);
      ATOM_CHECK(step.pp_in->extra.size() == 1 && step.pp_in->extra[0].defined() &&
                     step.pp_in->extra[0].dim() == 2 &&
                     step.pp_in->extra[0].size(0) == streams.size(0) &&
                     step.pp_in->extra[0].size(1) == hc,
                 "DeepSeek-V4.1 pipeline stage {}: the previous stage handed on no [{}, {}] pre",
                 st.rank, streams.size(0), hc);
      pre = step.pp_in->extra[0];  // the step's own copy (Step::pp_in), updated in place
    }
    for (int64_t i = st.first_layer; i < st.end_layer; ++i)
      table_[static_cast<size_t>(i)]->begin_step(step, streams.size(0));
    for (int64_t i = st.first_layer; i < st.end_layer; ++i) {
      const Arena::Mark scratch = step.arena.mark();
      layers_[static_cast<size_t>(i)]->forward(step, streams, pre);
      step.arena.release(scratch);
      // After the release: the rows a drafter asks for outlive the layer's scratch.
      keep_layer_output(step, i, streams);
    }
    if (!st.last()) {
      ATOM_CHECK(step.pp_out, "pipeline stage {}: the step takes no tensors for the next stage",
                 st.rank);
      *step.pp_out = {streams, Tensor(), {pre}};
      return Tensor();
    }
    return norm_->forward(step, HyperConnection::collapse(step, streams, pre, act_dtype()));
  }

  Tensor compute_logits(Step& step, const Tensor& hidden) override {
    return logits_for_batch(step, hidden, *head_);
  }

  std::vector<std::string> quantization_methods() const override { return {"fp8"}; }
  // DSpark (models/dspark.h) drafts from the streams after its target layers, averaged.
  bool hands_over_layer_outputs() const override { return true; }
  bool splits_into_stages() const override { return true; }
  // The step works with the host (Engram's hashing and tables, the first site's weights copied
  // up): no decode graphs.
  bool runs_in_decode_graphs() const override { return false; }

  WeightLoadSpec weight_load_spec() const override {
    WeightLoadSpec s = Model::weight_load_spec();
    // Text only: the vision tower and the image tokens' routing bias are skipped unread.
    for (const char* p : {"vision.", "aligner.", "image_start", "image_end", "image_newline"})
      s.weights_mapping.prefix.push_back({p, std::nullopt});
    s.weights_mapping.suffix.push_back({".gate.bias_vl", std::nullopt});
    deepseek_v4_release_names(s, v_.cfg.experts, v_.moe.fp4_experts, v_.cfg.quantized);
    return s;
  }

 private:
  V41Options v_;
  std::unique_ptr<EngramHash> hash_;  // before the layers, which hold references to it
  AttentionTable table_;
  std::unique_ptr<VocabParallelEmbedding> embed_;
  std::vector<std::unique_ptr<DeepseekV41DecoderLayer>> layers_;
  std::unique_ptr<RMSNorm> norm_;
  std::unique_ptr<ParallelLMHead> head_;
};

ModelSupport deepseek_v41_support() { return ModelSupport{}; }

}  // namespace

ATOM_REGISTER_MODEL_SUPPORTING("DeepseekV41ForCausalLM", DeepseekV41ForCausalLM,
                               deepseek_v41_support());

}  // namespace atom
