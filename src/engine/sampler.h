// Turning logits into tokens. Sampler is the seam where a GPU sampler slots in; CpuSampler is the
// reference, working on host F32 logits.
//
// Per row, in vLLM's order: log-probabilities of the raw logits (when asked), logit_bias, EOS and
// stop ids suppressed until min_tokens, repetition penalty (prompt and output tokens: positive
// logits divided, others multiplied), frequency and presence penalties (output tokens), then
// greedy argmax when temperature < 1e-5, else temperature, min_p, top_k, top_p, and one draw by
// inverse CDF over the kept tokens in id order with u = philox_uniform(seed, position).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "engine/sampling_params.h"
#include "engine/sequence.h"

namespace atom {

struct SampleTask {
  int32_t row = 0;  // row of the logits tensor
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;
  int64_t position = 0;                 // index of the output token being drawn
  std::span<const int32_t> prompt;      // for the repetition penalty
  std::span<const int32_t> output;      // generated so far (penalties)
  std::span<const int32_t> suppressed;  // ids that may not be drawn now (min_tokens)
  TokenLogprob* logprob = nullptr;      // filled when params->logprobs is set
};

class Sampler {
 public:
  virtual ~Sampler() = default;
  // logits [rows, vocab] F32. tokens[i] receives the draw for tasks[i].
  virtual void sample(const Tensor& logits, std::span<const SampleTask> tasks,
                      std::span<int32_t> tokens) = 0;
};

class CpuSampler : public Sampler {
 public:
  CpuSampler();
  ~CpuSampler() override;
  void sample(const Tensor& logits, std::span<const SampleTask> tasks,
              std::span<int32_t> tokens) override;

  struct Scratch;

 private:
  std::vector<std::unique_ptr<Scratch>> scratch_;  // one per thread, kept across steps
};

// log_softmax of `logits` [vocab] at `token`, its rank, and the `top` most likely tokens (-1: all)
// into `out`. Sums in double.
void logprobs_compute(const float* logits, int64_t vocab, int32_t token, int top, TokenLogprob& out,
                      std::vector<int32_t>& scratch);

}  // namespace atom
