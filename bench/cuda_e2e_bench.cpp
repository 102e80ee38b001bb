// End-to-end benchmark of a model on the GPU through ModelRunner (the engine's entry point):
// prefill throughput at given prompt lengths and decode throughput at given batch sizes
// (decode steps replay CUDA graphs; each step's tokens return to the host, as in serving).
//   cuda_e2e_bench --model DIR [--load-format dummy|auto] [--prefill 2048,8192]
//                  [--batch 1,32,128] [--prompt 128] [--steps 128] [--eager]
//                  [--kv-cache-dtype auto|fp8|bf16]
// Each line prints tokens/s and the fraction of the hardware limit: bytes per decode step
// (weights + KV read) over the measured bandwidth, FLOPs per prefill over the matmul rate.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/log.h"
#include "engine/engine_config.h"
#include "engine/model_runner.h"
#include "models/loading.h"

using namespace atom;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct ModelNumbers {
  double weight_bytes = 0;   // read per decode step: every parameter but the input embedding
                             // and the experts
  double matmul_params = 0;  // parameters in matrix products per token (same set)
  double head_params = 0;    // of which the LM head (prefill computes it for one row only)
  double kv_bytes_per_token = 0;
  int layers = 0, heads = 0, head_dim = 0;
  // Mixtures of experts (FusedMoE's w13/w2 parameters): per layer, slots of expert_slot_params
  // each, top_k of them per token.
  int moe_layers = 0, slots = 0, top_k = 0;
  double expert_slot_params = 0, expert_slot_bytes = 0;  // one slot of one layer

  // Expected distinct experts a batch of B tokens touches per layer when each token picks top_k
  // of `slots` uniformly (dummy weights route close to that).
  double distinct_experts(int B) const {
    if (slots == 0) return 0;
    return slots * (1.0 - std::pow(1.0 - static_cast<double>(top_k) / slots, B));
  }
  double step_bytes(int B) const {
    return weight_bytes + moe_layers * distinct_experts(B) * expert_slot_bytes;
  }
  double token_matmul_params() const {
    return matmul_params + moe_layers * top_k * expert_slot_params;
  }
};

// Sequences of a batch, each owning pages [s * pages_per, (s + 1) * pages_per).
struct Seqs {
  int bs, pages_per;
  std::vector<int> len;
  Batch step(const std::vector<std::vector<int32_t>>& toks, int first, int count) {
    Batch b;
    b.query_start = {0};
    b.page_indptr = {0};
    for (int s = first; s < first + count; ++s) {
      const auto& t = toks[s];
      for (size_t i = 0; i < t.size(); ++i) {
        const int pos = len[s] + static_cast<int>(i);
        b.token_ids.push_back(t[i]);
        b.positions.push_back(pos);
        b.slot_mapping.push_back((s * pages_per) * bs + pos);
      }
      len[s] += static_cast<int>(t.size());
      b.query_start.push_back(b.query_start.back() + static_cast<int>(t.size()));
      b.context_lens.push_back(len[s]);
      for (int p = 0; p < (len[s] + bs - 1) / bs; ++p) b.page_indices.push_back(s * pages_per + p);
      b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
      b.logits_indices.push_back(b.query_start.back() - 1);
      b.state_slots.push_back(s);
    }
    return b;
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, load = "dummy";
  std::vector<int> prefill = {2048, 8192}, batches = {1, 32, 128};
  int prompt = 128, steps = 128;
  bool eager = false;
  std::string kv_dtype = "auto";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--model")
      model_dir = next();
    else if (a == "--load-format")
      load = next();
    else if (a == "--prefill")
      prefill = bench::int_list(next());
    else if (a == "--batch")
      batches = bench::int_list(next());
    else if (a == "--prompt")
      prompt = std::atoi(next().c_str());
    else if (a == "--steps")
      steps = std::atoi(next().c_str());
    else if (a == "--eager")
      eager = true;
    else if (a == "--kv-cache-dtype")
      kv_dtype = next();
  }
  if (model_dir.empty()) {
    std::fprintf(stderr, "usage: cuda_e2e_bench --model DIR [--load-format dummy]\n");
    return 2;
  }
  try {
    ModelOptions mo;
    mo.device = Device::cuda(0);
    const double t0 = now();
    LoadedModel lm = model_load(model_dir, mo, load_format_parse(load));
    Model& model = *lm.model;
    CUDA_CHECK(cudaDeviceSynchronize());
    const ModelConfig& c = model.config();
    ModelNumbers n;
    for (const auto& [name, p] : model.params().all()) {
      if (name.ends_with("embed_tokens.weight") && !c.tie_word_embeddings) continue;
      // An expert's weights (MXFP4: U8 blocks of two weights a byte; FP8: a byte a weight),
      // scales and biases are read only where the expert is routed to. (An FP8 checkpoint's
      // experts dequantised at load keep a [1] placeholder for their scales: not per slot.)
      const bool expert_w =
          name.ends_with("experts.w13_weight") || name.ends_with("experts.w2_weight");
      if ((expert_w || name.ends_with("experts.w13_weight_scale") ||
           name.ends_with("experts.w2_weight_scale") || name.ends_with("experts.w13_bias") ||
           name.ends_with("experts.w2_bias")) &&
          p->data().dim() >= 2) {
        const Tensor& w = p->data();
        n.slots = static_cast<int>(w.size(0));
        if (name.ends_with("w13_weight")) ++n.moe_layers;
        if (expert_w)
          n.expert_slot_params +=
              static_cast<double>(w.numel() / w.size(0)) * (w.dtype() == DType::kU8 ? 2 : 1);
        n.expert_slot_bytes += static_cast<double>(w.nbytes() / w.size(0));
        continue;
      }
      n.weight_bytes += static_cast<double>(p->data().nbytes());
      if (p->data().dim() == 2) n.matmul_params += static_cast<double>(p->data().numel());
      if (name == "lm_head.weight" ||
          (c.tie_word_embeddings && name == "model.embed_tokens.weight"))
        n.head_params += static_cast<double>(p->data().numel());
    }
    if (n.moe_layers > 0) {  // per layer, from the sums over layers
      n.expert_slot_params /= n.moe_layers;
      n.expert_slot_bytes /= n.moe_layers;
      // Kimi-Linear and Kimi-K3 name it num_experts_per_token.
      n.top_k = static_cast<int>(c.text.get_int(
          c.text.has("num_experts_per_tok") ? "num_experts_per_tok" : "num_experts_per_token"));
    }
    n.layers = static_cast<int>(c.num_hidden_layers);
    n.heads = static_cast<int>(c.num_attention_heads);
    n.head_dim = static_cast<int>(c.head_dim);
    const DType kv = kv_cache_dtype_for(model, kv_dtype);
    n.kv_bytes_per_token =
        2.0 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * (dtype_bits(kv) / 8);
    // Multi-head latent attention: one latent row of kv_lora_rank + qk_rope_head_dim per token
    // and layer; the model's attention work counted as the expanded form (q·k over
    // qk_nope + qk_rope, p·v over v_head_dim), which is what prefill needs at least.
    double attn_dims = 2.0 * n.head_dim;  // q·k plus p·v per head and (query, key) pair
    if (c.text.has("kv_lora_rank")) {
      n.kv_bytes_per_token = static_cast<double>(c.num_hidden_layers) *
                             (c.text.get_int("kv_lora_rank") + c.text.get_int("qk_rope_head_dim")) *
                             (dtype_bits(kv) / 8);
      attn_dims =
          static_cast<double>(c.text.get_int("qk_nope_head_dim") +
                              c.text.get_int("qk_rope_head_dim") + c.text.get_int("v_head_dim"));
    }
    std::printf(
        "model %s: %.2f GB of weights read per batch-1 decode step, %.2f B matmul parameters per "
        "token, %s KV cache; loaded in %.1f s\n",
        model_dir.c_str(), n.step_bytes(1) / 1e9, n.token_matmul_params() / 1e9,
        std::string(dtype_name(kv)).c_str(), now() - t0);
    if (n.moe_layers > 0)
      std::printf(
          "  %d MoE layers of %d experts, top-%d, %.1f MB per expert; the decode limits count "
          "the distinct experts a batch touches under uniform routing (batch 32: %.1f)\n",
          n.moe_layers, n.slots, n.top_k, n.expert_slot_bytes / 1e6, n.distinct_experts(32));

    int max_batch = 1, max_prefill = 0;
    for (int b : batches) max_batch = std::max(max_batch, b);
    for (int p : prefill) max_prefill = std::max(max_prefill, p);
    RunnerOptions ro;
    ro.max_model_len = std::max(max_prefill, prompt + steps + 8);
    ro.max_num_seqs = max_batch;
    ro.max_num_batched_tokens = std::max(8192, max_prefill);
    ro.gpu_memory_utilization = 0.9;
    ro.enforce_eager = eager;
    ro.kv_cache_dtype = kv;
    // Recurrent layers (KDA, the gated delta net): a state slot per sequence (sequence s uses
    // slot s). Without them the pool had no slots, and KDA's kernel wrote 4 MiB per sequence and
    // layer past its end: the illegal address at 32 sequences of GLM-5.3.
    ro.num_state_slots = model.state_specs().empty() ? 0 : max_batch;
    ModelRunner runner(model, ro);
    const int bs = runner.block_size();

    std::printf("\n%-44s %12s %12s %10s\n", "case", "time", "tokens/s", "% of limit");
    for (int len : prefill) {
      Seqs sq{bs, (len + bs - 1) / bs, std::vector<int>(1, 0)};
      std::vector<std::vector<int32_t>> toks(1);
      for (int i = 0; i < len; ++i) toks[0].push_back((i * 7919) % static_cast<int>(c.vocab_size));
      std::vector<double> ts;
      for (int rep = 0; rep < 4; ++rep) {
        sq.len[0] = 0;
        Batch b = sq.step(toks, 0, 1);
        const double a = now();
        runner.execute_greedy(b);  // returns after the device finished (token copied to the host)
        ts.push_back(now() - a);
      }
      std::sort(ts.begin() + 1, ts.end());
      const double t = ts[2];  // median of the three after the first
      // Layers for every token, the LM head for the last one, causal attention 4 S^2 d H / 2.
      const double flops =
          2.0 * (n.token_matmul_params() - n.head_params) * len + 2.0 * n.head_params +
          2.0 * n.layers * n.heads * attn_dims * static_cast<double>(len) * len / 2.0;
      std::printf("%-44s %9.2f ms %12.0f %9.1f%%\n", fmt::format("prefill {} tokens", len).c_str(),
                  t * 1e3, len / t, 100.0 * flops / bench::kMatmul / t);
      std::fflush(stdout);
    }

    for (int B : batches) {
      Seqs sq{bs, (prompt + steps + 8 + bs - 1) / bs, std::vector<int>(B, 0)};
      std::vector<std::vector<int32_t>> toks(B);
      for (int s = 0; s < B; ++s)
        for (int i = 0; i < prompt; ++i)
          toks[s].push_back((s * 131 + i * 7919) % static_cast<int>(c.vocab_size));
      const double a = now();
      // Prefill the prompts, at most 8192 tokens per step.
      std::vector<int32_t> next(B);
      const int per = std::max(1, 8192 / prompt);
      for (int s0 = 0; s0 < B; s0 += per) {
        const int cnt = std::min(per, B - s0);
        Batch b = sq.step(toks, s0, cnt);
        const auto ids = runner.execute_greedy(b);
        std::copy(ids.begin(), ids.end(), next.begin() + s0);
      }
      const double prefill_done = now();
      std::vector<std::vector<int32_t>> one(B);
      double t_first = 0;
      const int warm = 3;
      for (int st = 0; st < steps; ++st) {
        if (st == warm) t_first = now();
        for (int s = 0; s < B; ++s) one[s] = {next[s]};
        Batch b = sq.step(one, 0, B);
        next = runner.execute_greedy(b);
      }
      const double end = now();
      const double decode_t = (end - t_first) / (steps - warm);
      const double ctx = prompt + steps / 2.0;
      const double bytes = n.step_bytes(B) + B * ctx * n.kv_bytes_per_token;
      const double flops = 2.0 * n.token_matmul_params() * B;
      const double limit = std::max(bytes / bench::kBandwidth, flops / bench::kMatmul);
      std::printf("%-44s %9.3f ms %12.1f %9.1f%%   (%.2f TB/s)\n",
                  fmt::format("decode batch {} (step, ctx ~{})", B, static_cast<int>(ctx)).c_str(),
                  decode_t * 1e3, B / decode_t, 100.0 * limit / decode_t, bytes / decode_t / 1e12);
      std::printf("%-44s %9.1f ms %12.1f %10s   (prefill %.1f ms incl. graph capture)\n",
                  fmt::format("  generate batch {}: {} prompt + {} new", B, prompt, steps).c_str(),
                  (end - a) * 1e3, B * steps / (end - a), "", (prefill_done - a) * 1e3);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
