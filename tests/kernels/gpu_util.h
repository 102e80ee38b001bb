// Helpers of the GPU tests: seeded random inputs, poisoned outputs; normalised errors come from
// common/compare.h (shapes must match, and an unmatched NaN or Inf fails).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <cstring>
#include <limits>
#include <vector>

#include "common/compare.h"  // rel_err, max_abs_diff: shape- and NaN-checked
#include "common/tensor_util.h"
#include "core/convert.h"
#include "core/cuda_check.h"
#include "core/half.h"
#include "core/tensor.h"
#include "engine/sampling_params.h"
#include "engine/sequence_runner.h"
#include "layers/batch.h"
#include "models/model.h"

namespace atom::test {

inline Device gpu() { return Device::cuda(0); }

// Model options that load onto the first GPU.
inline ModelOptions on_gpu() {
  ModelOptions o;
  o.device = gpu();
  return o;
}

// One step that appends toks[s] to each sequence s, whose length len[s] it advances. Pages hold 4
// tokens and sequence s owns pages [16 s, 16 s + 16); one logits row per sequence (its last new
// token).
inline Batch append_step_batch(const std::vector<std::vector<int32_t>>& toks,
                               std::vector<int>& len) {
  const int S = static_cast<int>(toks.size());
  Batch b;
  b.query_start = {0};
  b.page_indptr = {0};
  for (int s = 0; s < S; ++s) {
    for (size_t i = 0; i < toks[s].size(); ++i) {
      const int pos = len[s] + static_cast<int>(i);
      b.token_ids.push_back(toks[s][i]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(16 * s * 4 + pos);
    }
    len[s] += static_cast<int>(toks[s].size());
    b.query_start.push_back(b.query_start.back() + static_cast<int>(toks[s].size()));
    b.context_lens.push_back(len[s]);
    const int pages = (len[s] + 3) / 4;
    for (int p = 0; p < pages; ++p) b.page_indices.push_back(16 * s + p);
    b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
    b.logits_indices.push_back(b.query_start.back() - 1);
    b.state_slots.push_back(s);
  }
  return b;
}

// Captures what `work` enqueues on `stream` (thread-local capture mode) and instantiates it; the
// caller launches and destroys the returned graph. Errors throw (CUDA_CHECK), so a rank thread's
// failure reaches its failure hook.
inline cudaGraphExec_t capture_graph(cudaStream_t stream, const std::function<void()>& work) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  work();
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaGraphDestroy(graph);
  return exec;
}

// Fills a device tensor with 0xff bytes: NaN for floats, -1 for integers. Unwritten outputs fail.
inline void poison(Tensor& t) {
  ASSERT_TRUE(t.is_contiguous());
  ASSERT_EQ(cudaMemset(t.data(), 0xff, t.nbytes()), cudaSuccess);
}

inline Tensor to_f32_cpu(const Tensor& t) { return tensor_cast_cpu(t, DType::kF32); }

// A contiguous host copy (device tensors must be contiguous).
inline Tensor host(const Tensor& t) {
  return t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu());
}

// An F32 host copy of an F8E4M3 tensor (any device, contiguous), code by code.
inline Tensor f8_to_f32_host(const Tensor& t) {
  Tensor h = host(t);
  Tensor out = Tensor::empty(h.shape(), DType::kF32);
  for (int64_t i = 0; i < h.numel(); ++i) out.ptr<float>()[i] = f8e4m3_to_f32(h.ptr<uint8_t>()[i]);
  return out;
}

// Exact equality of two tensors' bytes.
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  Tensor x = host(a), y = host(b);
  return x.nbytes() == y.nbytes() && std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
}

// The GPU engine tests' workload: 12 greedy requests of 5 to 82 tokens (12 new tokens each, EOS
// ignored; ids below 503, or inside a smaller vocabulary) and what each decodes alone through the
// single-sequence runner.
struct GreedyWorkload {
  std::vector<std::vector<int32_t>> prompts;
  SamplingParams params;
  std::vector<std::vector<int32_t>> alone;
};
inline GreedyWorkload greedy_workload(Model& model) {
  GreedyWorkload w;
  w.params.temperature = 0;
  w.params.max_tokens = 12;
  w.params.ignore_eos = true;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> q;
    const int64_t span = std::min<int64_t>(500, model.vocab_size() - 3);
    for (int j = 0; j < 5 + 7 * i; ++j)
      q.push_back(static_cast<int32_t>(3 + (j * 37 + i * 11) % span));
    w.prompts.push_back(q);
  }
  for (const auto& q : w.prompts)
    w.alone.push_back(generate_greedy(model, q, w.params.max_tokens, {}, true).token_ids);
  return w;
}

}  // namespace atom::test
