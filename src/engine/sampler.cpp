#include "engine/sampler.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/parallel.h"

namespace atom {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}  // namespace

struct CpuSampler::Scratch {
  std::vector<float> work;     // [vocab] the processed logits of one row
  std::vector<int32_t> count;  // [vocab] output-token counts (penalties), zero between rows
  std::vector<uint8_t> seen;   // [vocab] prompt-or-output marks (repetition), zero between rows
  std::vector<int32_t> order;  // scratch for logprob ranking
  kernels::cpu::SampleScratch draw;

  void fit(int64_t vocab) {
    if (static_cast<int64_t>(work.size()) == vocab) return;
    work.assign(static_cast<size_t>(vocab), 0.0f);
    count.assign(static_cast<size_t>(vocab), 0);
    seen.assign(static_cast<size_t>(vocab), 0);
  }
};

kernels::SamplingRow sampling_row(const SamplingParams& p, uint64_t seed, int64_t position) {
  kernels::SamplingRow r;
  r.temperature = p.greedy() ? 0.0f : static_cast<float>(p.temperature);
  r.top_p = static_cast<float>(p.top_p);
  r.min_p = static_cast<float>(p.min_p);
  r.top_k = p.top_k;
  r.seed = seed;
  r.step = static_cast<uint64_t>(position);
  return r;
}

bool device_sampleable(const SamplingParams& p) {
  return !p.has_penalties() && p.logit_bias.empty() && !p.logprobs && !p.prompt_logprobs;
}

CpuSampler::CpuSampler() = default;
CpuSampler::~CpuSampler() = default;

void logprobs_compute(const float* x, int64_t vocab, int32_t token, int top, TokenLogprob& out,
                      std::vector<int32_t>& order) {
  float mx = x[0];
  for (int64_t i = 1; i < vocab; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = mx + std::log(sum);
  out.token_id = token;
  out.logprob = static_cast<float>(x[token] - lse);
  int32_t rank = 1;
  for (int64_t i = 0; i < vocab; ++i) rank += x[i] > x[token];
  out.rank = rank;
  out.top.clear();
  const int64_t k = top < 0 ? vocab : std::min<int64_t>(top, vocab);
  if (k == 0) return;
  order.resize(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto before = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  for (int64_t i = 0; i < k; ++i)
    out.top.push_back({order[i], static_cast<float>(x[order[i]] - lse)});
}

namespace {

void apply_penalties(const SampleTask& t, float* w, CpuSampler::Scratch& s) {
  const SamplingParams& p = *t.params;
  if (p.repetition_penalty != 1.0) {
    const float rp = static_cast<float>(p.repetition_penalty);
    auto penalize = [&](int32_t id) {
      if (s.seen[id]) return;
      s.seen[id] = 1;
      w[id] = w[id] > 0 ? w[id] / rp : w[id] * rp;
    };
    for (int32_t id : t.prompt) penalize(id);
    for (int32_t id : t.output) penalize(id);
    for (int32_t id : t.prompt) s.seen[id] = 0;
    for (int32_t id : t.output) s.seen[id] = 0;
  }
  if (p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) {
    for (int32_t id : t.output) ++s.count[id];
    for (int32_t id : t.output) {
      if (s.count[id] == 0) continue;  // already applied for this id
      w[id] -= static_cast<float>(p.frequency_penalty * s.count[id] + p.presence_penalty);
      s.count[id] = 0;
    }
  }
}

int32_t sample_row(const SampleTask& t, const float* raw, int64_t vocab, CpuSampler::Scratch& s) {
  const SamplingParams& p = *t.params;
  const float* row = raw;
  if (!p.logit_bias.empty() || !t.suppressed.empty() || p.has_penalties() || !t.allowed.empty()) {
    s.fit(vocab);
    float* w = s.work.data();
    std::copy(raw, raw + vocab, w);
    for (const auto& [id, bias] : p.logit_bias) w[id] += bias;
    for (int32_t id : t.suppressed) w[id] = kNegInf;
    if (!t.allowed.empty())
      for (int64_t id = 0; id < vocab; ++id)
        if (!((t.allowed[static_cast<size_t>(id / 64)] >> (id % 64)) & 1)) w[id] = kNegInf;
    apply_penalties(t, w, s);
    row = w;
  }
  // The draw itself is kernels::sample's, so the same logits give the same token here and on the
  // model's device.
  const int32_t token =
      kernels::cpu::sample_row(row, vocab, sampling_row(p, t.seed, t.position), s.draw);
  if (t.logprob) logprobs_compute(raw, vocab, token, *p.logprobs, *t.logprob, s.order);
  return token;
}

}  // namespace

void CpuSampler::sample(const Tensor& logits, std::span<const SampleTask> tasks,
                        std::span<int32_t> tokens) {
  if (tasks.empty()) return;
  ATOM_CHECK(logits.device().is_cpu() && logits.dtype() == DType::kF32 && logits.dim() == 2 &&
                 logits.is_contiguous(),
             "CpuSampler needs contiguous host F32 logits, got {}", logits.str());
  ATOM_CHECK(tokens.size() == tasks.size(), "sampler: {} tasks, {} outputs", tasks.size(),
             tokens.size());
  const int64_t vocab = logits.size(1);
  const int threads = std::max(1, omp_get_max_threads());
  while (static_cast<int>(scratch_.size()) < threads)
    scratch_.push_back(std::make_unique<Scratch>());
  const float* base = logits.ptr<float>();
  const int64_t n = static_cast<int64_t>(tasks.size());
  for (const SampleTask& t : tasks)
    ATOM_CHECK(t.row >= 0 && t.row < logits.size(0) && t.params, "sampler: row {} of {}", t.row,
               logits.size(0));
  // Rows are independent; a greedy row is one pass over the vocabulary, so only fan out when the
  // batch has enough of them to pay for the threads.
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 4) if (n >= 8)
  for (int64_t i = 0; i < n; ++i) {
    errors.guard([&] {
      const SampleTask& t = tasks[static_cast<size_t>(i)];
      tokens[static_cast<size_t>(i)] = sample_row(t, base + static_cast<int64_t>(t.row) * vocab,
                                                  vocab, *scratch_[omp_get_thread_num()]);
    });
  }
  errors.rethrow();
}

}  // namespace atom
