// Speculative decoding with the checkpoint's MTP drafter on the GPU, through the engine
// (LLMEngine: scheduler, verification steps of K + 1 tokens per sequence from CUDA graphs, the
// drafter's graphs, acceptance on the host): decode tokens/s at each batch size without
// speculation and with K draft tokens at each forced acceptance rate (random weights accept
// nothing, so --spec-decode-acceptance-rate decides acceptance; the work per step is the real
// one), the speedup over the plain run, the drafter's time per output token, and the fraction of
// the hardware limit: the bytes a step must read (weights, the experts a step's tokens touch under
// uniform routing, the KV cache; for speculation the target's verification step and K drafter
// steps) over the measured bandwidth, per output token.
//   cuda_spec_bench --model DIR [--load-format dummy] [--batch 1,32] [--k 1,2,3]
//                   [--rates 0.6,0.8,1.0] [--prompt 128] [--new 256]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "engine/llm_engine.h"
#include "engine/spec_decode.h"
#include "models/draft_model.h"
#include "models/loading.h"

using namespace atom;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<double> double_list(const std::string& s) {
  std::vector<double> r;
  size_t p = 0;
  while (p < s.size()) {
    const size_t c = s.find(',', p);
    r.push_back(std::atof(s.substr(p, c == std::string::npos ? std::string::npos : c - p).c_str()));
    if (c == std::string::npos) break;
    p = c + 1;
  }
  return r;
}

// Bytes a decode step reads from a model's parameters: all but the input embedding, and of the
// experts those the step's tokens touch (uniform routing).
struct ReadBytes {
  double dense = 0, expert_slot = 0;
  int moe_layers = 0, slots = 0, top_k = 0;
  double step(int tokens) const {
    if (slots == 0) return dense;
    const double distinct =
        slots * (1.0 - std::pow(1.0 - static_cast<double>(top_k) / slots, tokens));
    return dense + moe_layers * distinct * expert_slot;
  }
};

ReadBytes read_bytes(Model& m) {
  ReadBytes r;
  for (const auto& [name, p] : m.params().all()) {
    if (name.ends_with("embed_tokens.weight")) continue;  // a lookup (never tied here)
    const Tensor& w = p->data();
    if (name.ends_with("experts.w13_weight") || name.ends_with("experts.w2_weight")) {
      r.slots = static_cast<int>(w.size(0));
      if (name.ends_with("w13_weight")) ++r.moe_layers;
      r.expert_slot += static_cast<double>(w.nbytes() / w.size(0));
      continue;
    }
    r.dense += static_cast<double>(w.nbytes());
  }
  if (r.moe_layers > 0) {
    r.expert_slot /= r.moe_layers;
    r.top_k = static_cast<int>(m.config().text.get_int("num_experts_per_tok"));
  }
  return r;
}

// The engine's MTP proposer with the time spent in it (each call ends with the drafts on the
// host, so wall time is the drafter's share of the step).
class TimedProposer : public DraftProposer {
 public:
  explicit TimedProposer(std::unique_ptr<MtpProposer> p) : p_(std::move(p)) {}
  void propose(const Tensor& hidden, std::span<const DraftRequest> reqs, int block_size,
               std::vector<std::vector<int32_t>>& drafts) override {
    const double t = now();
    p_->propose(hidden, reqs, block_size, drafts);
    seconds += now() - t;
    ++calls;
  }
  double seconds = 0;
  int64_t calls = 0;
  const MtpProposer& inner() const { return *p_; }

 private:
  std::unique_ptr<MtpProposer> p_;
};

struct Result {
  double tok_s = 0;    // decode tokens per second (after every request's first token)
  double step_ms = 0;  // per engine step while decoding
  double draft_ms_per_token = 0;
  double accept = 0, mean_len = 0;
  int64_t graph_steps = 0, steps = 0, draft_graph_steps = 0;
};

Result run(Model& target, DraftModel* drafter, int B, int K, double rate, int prompt, int max_new) {
  EngineConfig c;
  c.max_model_len = prompt + max_new + 16;
  c.max_num_seqs = B;
  c.max_num_batched_tokens = std::max(2048, B * prompt);
  c.gpu_memory_utilization = 0.8;  // the drafter's caches come on top of the target's
  if (K > 0) {
    c.speculative_method = "mtp";
    c.num_speculative_tokens = K;
    c.spec_decode_acceptance_rate = rate;
  }
  LLMEngine e(target, c, {}, {}, K > 0 ? drafter : nullptr);
  TimedProposer* timed = nullptr;
  if (K > 0) {
    MtpProposerOptions po;
    po.graphs = !c.enforce_eager;
    po.max_model_len = e.kv_plan().max_model_len;
    po.max_num_seqs = B;
    po.num_speculative_tokens = K;
    auto p = std::make_unique<TimedProposer>(std::make_unique<MtpProposer>(
        *drafter, e.kv_plan().num_blocks, e.kv_plan().block_size, e.kv_plan().kv_cache_dtype, po));
    timed = p.get();
    e.set_proposer(std::move(p));
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> id(3, static_cast<int32_t>(target.vocab_size() - 1));
  SamplingParams sp;
  sp.temperature = 0;
  sp.ignore_eos = true;
  sp.max_tokens = max_new;
  for (int i = 0; i < B; ++i) {
    std::vector<int32_t> p(static_cast<size_t>(prompt));
    for (auto& t : p) t = id(rng);
    e.add_request("r" + std::to_string(i), p, sp);
  }
  int64_t tokens = 0, tokens0 = 0, steps0 = 0, graph0 = 0;
  double t0 = 0, draft0 = 0;
  bool timing = false;
  int64_t step = 0;
  while (e.has_unfinished()) {
    const StepOutput out = e.step();
    tokens += static_cast<int64_t>(out.tokens.size());
    ++step;
    // Timing starts once every request has its first token and two more steps ran (warm-up).
    if (!timing && tokens >= B && step >= 3) {
      timing = true;
      t0 = now();
      tokens0 = tokens;
      steps0 = step;
      graph0 = e.runner().graph_steps();
      draft0 = timed ? timed->seconds : 0;
    }
  }
  const double t1 = now();
  Result r;
  const double dt = t1 - t0;
  const int64_t n = tokens - tokens0;
  r.tok_s = n / dt;
  r.steps = step - steps0;
  r.step_ms = 1e3 * dt / std::max<int64_t>(1, r.steps);
  r.graph_steps = e.runner().graph_steps() - graph0;
  if (timed) {
    r.draft_ms_per_token = 1e3 * (timed->seconds - draft0) / std::max<int64_t>(1, n);
    r.draft_graph_steps = timed->inner().graph_steps();
    const EngineStats s = e.stats();
    r.accept = static_cast<double>(s.spec_num_accepted_tokens) /
               std::max<int64_t>(1, s.spec_num_draft_tokens);
    r.mean_len = 1.0 + static_cast<double>(s.spec_num_accepted_tokens) /
                           std::max<int64_t>(1, s.spec_num_drafts);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, load = "dummy";
  std::vector<int> batches = {1, 32}, ks = {1, 2, 3};
  std::vector<double> rates = {0.6, 0.8, 1.0};
  int prompt = 128, max_new = 256;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--model")
      model_dir = next();
    else if (a == "--load-format")
      load = next();
    else if (a == "--batch")
      batches = bench::int_list(next());
    else if (a == "--k")
      ks = bench::int_list(next());
    else if (a == "--rates")
      rates = double_list(next());
    else if (a == "--prompt")
      prompt = std::atoi(next().c_str());
    else if (a == "--new")
      max_new = std::atoi(next().c_str());
  }
  if (model_dir.empty()) {
    std::fprintf(stderr, "usage: cuda_spec_bench --model DIR [--load-format dummy]\n");
    return 2;
  }
  try {
    ModelOptions mo;
    mo.device = Device::cuda(0);
    const double t_load = now();
    LoadedModel lm = model_load(model_dir, mo, load_format_parse(load));
    Model& target = *lm.model;
    LoadedDrafter ld = drafter_load(model_dir, target, mo, load_format_parse(load));
    CUDA_CHECK(cudaDeviceSynchronize());
    const ReadBytes tb = read_bytes(target), db = read_bytes(*ld.model);
    const ModelConfig& c = target.config();
    const double kv_per_token =
        static_cast<double>(c.num_hidden_layers) *
        (c.text.get_int("kv_lora_rank") + c.text.get_int("qk_rope_head_dim")) * 2.0;
    std::printf("model %s: target reads %.2f GB per batch-1 step, the MTP drafter %.2f GB (its LM "
                "head shared); loaded in %.1f s\n",
                model_dir.c_str(), tb.step(1) / 1e9, db.step(1) / 1e9, now() - t_load);
    std::printf("\n%-30s %10s %9s %8s %8s %10s %11s %9s\n", "case", "tok/s", "step ms", "speedup",
                "accept", "mean len", "draft ms/t", "% limit");
    for (int B : batches) {
      const double ctx = prompt + max_new / 2.0;
      const Result base = run(target, nullptr, B, 0, 0, prompt, max_new);
      const double base_limit = (tb.step(B) + B * ctx * kv_per_token) / bench::kBandwidth / B;
      std::printf(
          "%-30s %10.1f %9.3f %8s %8s %10s %11s %8.1f%%   (%lld of %lld steps from graphs)\n",
          fmt::format("batch {} plain", B).c_str(), base.tok_s, base.step_ms, "1.00", "-", "-", "-",
          100.0 * base_limit * base.tok_s, static_cast<long long>(base.graph_steps),
          static_cast<long long>(base.steps));
      std::fflush(stdout);
      for (int K : ks)
        for (double rate : rates) {
          const Result r = run(target, ld.model.get(), B, K, rate, prompt, max_new);
          // Per output token: a verification step of B (K + 1) tokens and K drafter steps (the
          // first over up to K + 1 rows per sequence, the others over one), for mean_len tokens
          // per sequence.
          const double step_bytes = tb.step(B * (K + 1)) + B * ctx * kv_per_token +
                                    db.step(B * (K + 1)) + (K - 1) * db.step(B) +
                                    K * B * ctx * kv_per_token / c.num_hidden_layers;
          const double limit = step_bytes / bench::kBandwidth / (B * r.mean_len);
          std::printf("%-30s %10.1f %9.3f %8.2f %8.2f %10.2f %11.4f %8.1f%%   (%lld of %lld "
                      "steps from graphs, %lld drafter graph steps)\n",
                      fmt::format("batch {} K={} rate {:.1f}", B, K, rate).c_str(), r.tok_s,
                      r.step_ms, r.tok_s / base.tok_s, r.accept, r.mean_len, r.draft_ms_per_token,
                      100.0 * limit * r.tok_s, static_cast<long long>(r.graph_steps),
                      static_cast<long long>(r.steps), static_cast<long long>(r.draft_graph_steps));
          std::fflush(stdout);
        }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
