// The engine's host cost per step, without a model: LLMEngine drives a model whose forward pass
// and LM head cost next to nothing (a tiny vocabulary, no layers), so a step's time is what the
// engine itself spends: scheduling, batch building, the runner's upload and sampling plan, and
// output processing. On the GPU the same work runs while (or before) the device computes.
//   engine_overhead_bench [--prompts 512] [--input-len 1000] [--output-len 1000]
//                         [--max-num-seqs 256] [--max-num-batched-tokens 8192]
//                         [--blocks 36000] [--vocab 32] [--temperature 0]
// Prints the mean and percentiles of pure decode steps at full batch, and the run's average.
// --blocks defaults to about what an H200 holds for Llama-3.1-8B at gpu_memory_utilization 0.9
// (2 MiB per 16-token block).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/llm_engine.h"

using namespace atom;

namespace {

// No layers: hidden states are a placeholder, and the logits of a row favour (its token + 1),
// so greedy decoding walks the vocabulary.
class NullModel : public Model {
 public:
  explicit NullModel(const ModelConfig& c) : Model(c, ModelOptions{}) {}
  Tensor forward(Step& step) override {
    return step.empty({std::max(1, step.batch.num_tokens()), 1}, DType::kF32);
  }
  Tensor compute_logits(Step& step, const Tensor&) override {
    const Batch& b = step.batch;
    const int64_t R = static_cast<int64_t>(b.logits_indices.size()), V = vocab_size();
    Tensor logits = step.empty({R, V}, DType::kF32);
    float* p = logits.ptr<float>();
    std::memset(p, 0, static_cast<size_t>(R * V) * sizeof(float));
    for (int64_t r = 0; r < R; ++r) p[r * V + (b.token_ids[b.logits_indices[r]] + 1) % V] = 4.0f;
    return logits;
  }
};

int arg_int(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return def;
}

double arg_double(int argc, char** argv, const char* name, double def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atof(argv[i + 1]);
  return def;
}

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q / 100.0 * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  const int prompts = arg_int(argc, argv, "--prompts", 512);
  const int input_len = arg_int(argc, argv, "--input-len", 1000);
  const int output_len = arg_int(argc, argv, "--output-len", 1000);
  ModelConfig mc;
  mc.architectures = {"AtomNullForCausalLM"};
  mc.vocab_size = arg_int(argc, argv, "--vocab", 32);
  mc.max_position_embeddings = 131072;
  NullModel model(mc);
  EngineConfig c;
  c.max_num_seqs = arg_int(argc, argv, "--max-num-seqs", 256);
  c.max_num_batched_tokens = arg_int(argc, argv, "--max-num-batched-tokens", 8192);
  c.num_gpu_blocks_override = arg_int(argc, argv, "--blocks", 36000);
  LLMEngine engine(model, c);

  SamplingParams p;
  p.temperature = arg_double(argc, argv, "--temperature", 0.0);
  p.max_tokens = output_len;
  p.ignore_eos = true;
  std::mt19937 rng(1);
  for (int i = 0; i < prompts; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(input_len));
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(mc.vocab_size));
    engine.add_request("r" + std::to_string(i), std::move(prompt), p);
  }
  std::vector<double> full;  // pure decode steps with max_num_seqs sequences
  int64_t steps = 0, tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (engine.has_unfinished()) {
    const auto a = std::chrono::steady_clock::now();
    const StepOutput out = engine.step();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
    ++steps;
    tokens += static_cast<int64_t>(out.tokens.size());
    if (out.num_scheduled_tokens == c.max_num_seqs &&
        static_cast<int>(out.tokens.size()) == c.max_num_seqs)
      full.push_back(us);
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double mean = 0;
  for (double x : full) mean += x;
  mean = full.empty() ? 0 : mean / static_cast<double>(full.size());
  std::printf("%d requests x %d + %d tokens, max_num_seqs %d, vocab %lld, temperature %g\n",
              prompts, input_len, output_len, c.max_num_seqs, static_cast<long long>(mc.vocab_size),
              p.temperature);
  std::printf(
      "decode steps at %d sequences: %zu, mean %.1f us, p50 %.1f us, p90 %.1f us, p99 %.1f us\n",
      c.max_num_seqs, full.size(), mean, pct(full, 50), pct(full, 90), pct(full, 99));
  std::printf("all %lld steps: %.3f s, %.1f us per step, %lld tokens, %lld preemptions\n",
              static_cast<long long>(steps), total, 1e6 * total / static_cast<double>(steps),
              static_cast<long long>(tokens),
              static_cast<long long>(engine.stats().num_preemptions));
  return 0;
}
