#include "engine/sampler.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "engine/philox.h"

namespace atom {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int32_t argmax_first(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}
}  // namespace

struct CpuSampler::Scratch {
  std::vector<float> work;     // [vocab] the processed logits of one row
  std::vector<int32_t> ids;    // candidate token ids
  std::vector<int32_t> count;  // [vocab] output-token counts (penalties), zero between rows
  std::vector<uint8_t> seen;   // [vocab] prompt-or-output marks (repetition), zero between rows
  std::vector<int32_t> order;  // scratch for logprob ranking

  void fit(int64_t vocab) {
    if (static_cast<int64_t>(work.size()) == vocab) return;
    work.assign(static_cast<size_t>(vocab), 0.0f);
    count.assign(static_cast<size_t>(vocab), 0);
    seen.assign(static_cast<size_t>(vocab), 0);
  }
};

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

// Draws from softmax(w) restricted to min_p / top_k / top_p. w is already divided by temperature;
// it is overwritten with unnormalised probabilities.
int32_t draw(const SampleTask& t, float* w, int64_t vocab, CpuSampler::Scratch& s) {
  const SamplingParams& p = *t.params;
  const float mx = w[argmax_first(w, vocab)];
  // min_p keeps tokens whose probability is at least min_p times the largest one.
  const float floor = p.min_p > 0 ? mx + static_cast<float>(std::log(p.min_p)) : kNegInf;
  double total = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    w[i] = w[i] >= floor && w[i] > kNegInf ? std::exp(w[i] - mx) : 0.0f;
    total += w[i];
  }
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  if (!top_k && p.top_p >= 1.0) {
    // The common case: one walk over the vocabulary, nothing sorted.
    const double target = philox_uniform(t.seed, static_cast<uint64_t>(t.position)) * total;
    double acc = 0;
    int32_t last = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (w[i] == 0.0f) continue;
      acc += w[i];
      last = static_cast<int32_t>(i);
      if (acc > target) return last;
    }
    return last;
  }
  auto& ids = s.ids;
  ids.clear();
  for (int64_t i = 0; i < vocab; ++i)
    if (w[i] > 0.0f) ids.push_back(static_cast<int32_t>(i));
  auto before = [w](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
  if (top_k && static_cast<size_t>(p.top_k) < ids.size()) {
    // Ties with the k-th value stay, as with a threshold on torch.topk's last value.
    std::nth_element(ids.begin(), ids.begin() + (p.top_k - 1), ids.end(), before);
    const float kth = w[ids[static_cast<size_t>(p.top_k - 1)]];
    std::erase_if(ids, [w, kth](int32_t i) { return w[i] < kth; });
    total = 0;
    for (int32_t i : ids) total += w[i];
  }
  if (p.top_p < 1.0) {
    // The smallest most-likely-first prefix whose mass reaches top_p (the token crossing it
    // included). Grow a partial selection geometrically: peaked distributions never sort the
    // whole vocabulary.
    const double need = p.top_p * total;
    size_t k = std::min<size_t>(64, ids.size());
    for (;;) {
      std::nth_element(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k - 1), ids.end(),
                       before);
      double mass = 0;
      for (size_t i = 0; i < k; ++i) mass += w[ids[i]];
      if (mass >= need || k == ids.size()) break;
      k = std::min(ids.size(), k * 4);
    }
    std::sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), before);
    double acc = 0;
    size_t keep = 0;
    while (keep < k && acc < need) acc += w[ids[keep++]];
    ids.resize(std::max<size_t>(keep, 1));
    total = acc;
  }
  std::sort(ids.begin(), ids.end());  // the draw walks tokens in id order
  const double target = philox_uniform(t.seed, static_cast<uint64_t>(t.position)) * total;
  double acc = 0;
  for (int32_t i : ids) {
    acc += w[i];
    if (acc > target) return i;
  }
  return ids.back();
}

int32_t sample_row(const SampleTask& t, const float* raw, int64_t vocab, CpuSampler::Scratch& s) {
  const SamplingParams& p = *t.params;
  const bool modify = !p.logit_bias.empty() || !t.suppressed.empty() || p.has_penalties();
  int32_t token;
  if (p.greedy() && !modify) {
    token = argmax_first(raw, vocab);
  } else {
    s.fit(vocab);
    float* w = s.work.data();
    std::copy(raw, raw + vocab, w);
    for (const auto& [id, bias] : p.logit_bias) w[id] += bias;
    for (int32_t id : t.suppressed) w[id] = kNegInf;
    apply_penalties(t, w, s);
    if (p.greedy()) {
      token = argmax_first(w, vocab);
    } else {
      const float temperature = static_cast<float>(p.temperature);
      for (int64_t i = 0; i < vocab; ++i) w[i] /= temperature;
      token = draw(t, w, vocab, s);
    }
  }
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
  for (const SampleTask& t : tasks)  // checked here: an exception may not leave the parallel loop
    ATOM_CHECK(t.row >= 0 && t.row < logits.size(0) && t.params, "sampler: row {} of {}", t.row,
               logits.size(0));
    // Rows are independent; a greedy row is one pass over the vocabulary, so only fan out when the
    // batch has enough of them to pay for the threads.
#pragma omp parallel for schedule(dynamic, 4) if (n >= 8)
  for (int64_t i = 0; i < n; ++i) {
    const SampleTask& t = tasks[static_cast<size_t>(i)];
    tokens[static_cast<size_t>(i)] = sample_row(t, base + static_cast<int64_t>(t.row) * vocab,
                                                vocab, *scratch_[omp_get_thread_num()]);
  }
}

}  // namespace atom
