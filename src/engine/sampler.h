// Turning logits into tokens. Sampler is the seam where another sampler slots in; CpuSampler is
// the reference, working on host F32 logits.
//
// Per row, in vLLM's order: log-probabilities of the raw logits (when asked), logit_bias, EOS and
// stop ids suppressed until min_tokens, repetition penalty (prompt and output tokens: positive
// logits divided, others multiplied), frequency and presence penalties (output tokens), then the
// draw of kernels::sample (kernels/sampling.h): greedy argmax when temperature < 1e-5, else
// temperature, min_p, top_k, top_p and Gumbel-max keyed by (seed, position). Because the draw is
// the device sampler's, a row without penalties, bias or suppression gets the same token here as
// from kernels::sample on the model's device: which of the two samples a request never changes
// its tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "engine/sampling_params.h"
#include "engine/sequence.h"
#include "kernels/sampling.h"

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
  // Structured output: when set, only tokens whose bit is set may be drawn (bit t of word t / 64).
  std::span<const uint64_t> allowed;
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

// How kernels::sample draws a token for these parameters at output position `position`.
kernels::SamplingRow sampling_row(const SamplingParams& p, uint64_t seed, int64_t position);

// Whether a request's tokens can be drawn by kernels::sample on the model's device: nothing the
// CPU sampler adds (penalties, logit_bias, logprobs, prompt_logprobs) is asked for. A property of
// the request, not of the step; min_tokens suppression is checked per token by the engine (it
// depends only on the request's own output count). A structured-output constraint does not keep
// a row off the device: its mask is applied there (StepSampling::device_mask).
bool device_sampleable(const SamplingParams& p);

// log_softmax of `logits` [vocab] at `token`, its rank, and the `top` most likely tokens (-1: all)
// into `out`. Sums in double.
void logprobs_compute(const float* logits, int64_t vocab, int32_t token, int top, TokenLogprob& out,
                      std::vector<int32_t>& scratch);

}  // namespace atom
