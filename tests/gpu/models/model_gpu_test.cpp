// Whole models on the GPU: logits against transformers' fp32 fixtures (bf16 tolerance) and
// against the CPU path, greedy tokens teacher-forced and free-running against a measured noise
// level with a stated minimum of agreeing steps, decode through CUDA graphs against eager decode,
// and KV-cache sizing from GPU memory.
#include <algorithm>
#include <cstdio>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "core/cuda_stream.h"
#include "engine/model_runner.h"
#include "engine/sequence_runner.h"
#include "gpu_util.h"
#include "models/loading.h"

namespace atom::test {
namespace {

class GpuParity : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuParity, LogitsGreedyAndChunkedPrefill) {
  const std::string name = GetParam();
  const Reference ref = reference_load(name);
  LoadedModel m = model_load(fixture_dir(name), on_gpu());
  EXPECT_EQ(m.model->act_dtype(),
            m.model->config().dtype == DType::kF16 ? DType::kF16 : DType::kBF16);
  Tensor logits = score_tokens(*m.model, ref.input_ids);
  const double err = rel_err(logits, ref.logits, name);
  const float dmax = max_abs_diff(logits, ref.logits, name);
  const float margin_err = max_margin_error(logits, ref.logits);
  // The CPU path in the same precision (bf16 activations and weights).
  ModelOptions cpu_bf16;
  cpu_bf16.act_dtype = m.model->act_dtype();
  cpu_bf16.weight_dtype = m.model->act_dtype();
  LoadedModel c = model_load(fixture_dir(name), cpu_bf16);
  Tensor cpu_logits = score_tokens(*c.model, ref.input_ids);
  const double err_cpu = rel_err(logits, cpu_logits, name);
  // Chunked prefill (chunks straddle pages) and token-by-token decode through the graphs.
  const double err_chunked =
      rel_err(score_tokens(*m.model, ref.input_ids, /*chunk=*/7, /*block_size=*/4), logits, name);
  const double err_stepwise =
      rel_err(score_tokens(*m.model, ref.input_ids, /*chunk=*/1, /*block_size=*/16), logits, name);
  std::printf(
      "%s: bf16 GPU vs transformers fp32: rel err %.3g, max |dlogit| %.3g, top-2 margin error "
      "%.3g; vs bf16 CPU: rel err %.3g; chunked, token by token vs whole: %.3g, %.3g\n",
      name.c_str(), err, dmax, margin_err, err_cpu, err_chunked, err_stepwise);
  // bf16 against fp32: the CPU in bf16 measures 1.03-1.39e-2 on these fixtures (the GPU measured
  // 0.96-1.13e-2 on the fixtures before their regeneration), hence 2e-2 (3e-2 before). bf16
  // noise hides small bugs at this level (an RMSNorm eps x 100 leaves the CPU's bf16 error at
  // 1.03-1.41e-2): those are caught by the CPU parity tests (fp32, 3e-5) and, for the CUDA
  // kernels, by their F32 cases against the CPU (GpuRmsNorm: 1e-6).
  EXPECT_LE(err, 2e-2) << name;
  // The same precision on both sides: measured 8e-8 to 6.1e-3 (bench/results/*/tests.log).
  EXPECT_LE(err_cpu, 1.2e-2) << name;
  EXPECT_LE(err_chunked, 2e-2) << name;
  EXPECT_LE(err_stepwise, 2e-2) << name;

  // Greedy. The noise level is measured: twice the largest error of the reference's top-2 margin
  // over the scored rows (what flips a choice is the error of that difference). Teacher-forced
  // through the decode graphs, every step whose reference margin is above it must agree, and at
  // least 13 of 16: the CPU in bf16 measures 15-16 of 16, and the GPU, rounding differently,
  // may flip one or two more of the steps whose reference margin is below 0.1 (at most 3 per
  // fixture). Free-running, the steps before the first one within the noise must agree.
  const float noise = 2.0f * margin_err;
  expect_forced_greedy_agrees(name, score_tokens(*m.model, greedy_sequence(ref), 1, 16), noise, 13);
  const GreedyResult r = generate_greedy(*m.model, ref.greedy_prompt,
                                         static_cast<int>(ref.greedy_tokens.size()), {}, true);
  expect_greedy_agrees(name, r.token_ids, ref.greedy_tokens, noise,
                       leading_steps_above(name, noise));
}

// The FP8 (e4m3) KV cache end to end: logits against transformers and against the CPU path with
// the same cache, chunked prefill and token-by-token decode through the graphs, greedy tokens.
TEST_P(GpuParity, Fp8KvCache) {
  const std::string name = GetParam();
  const Reference ref = reference_load(name);
  LoadedModel m = model_load(fixture_dir(name), on_gpu());
  const DType f8 = DType::kF8E4M3;
  Tensor logits = score_tokens(*m.model, ref.input_ids, 0, 16, f8);
  const double err = rel_err(logits, ref.logits, name);
  const float dmax = max_abs_diff(logits, ref.logits, name);
  const float margin_err = max_margin_error(logits, ref.logits);
  std::printf(
      "%s: fp8 KV cache GPU vs transformers fp32: rel err %.3g, max |dlogit| %.3g, top-2 margin "
      "error %.3g\n",
      name.c_str(), err, dmax, margin_err);
  // The CPU with bf16 activations and an FP8 cache measures 4.3-6.5e-2 on these fixtures (the
  // 3 mantissa bits of e4m3 on small random models; tests/engine/kv_cache_dtype_test.cpp has the
  // fp32 activations' 4.0-6.5e-2); the GPU measured 3.7-4.8e-2 before the regeneration.
  EXPECT_LE(err, 8e-2) << name;
  EXPECT_GT(rel_err(logits, score_tokens(*m.model, ref.input_ids), name), 1e-4) << "not quantised";

  ModelOptions cpu_bf16;
  cpu_bf16.act_dtype = m.model->act_dtype();
  cpu_bf16.weight_dtype = m.model->act_dtype();
  LoadedModel c = model_load(fixture_dir(name), cpu_bf16);
  const double err_cpu = rel_err(logits, score_tokens(*c.model, ref.input_ids, 0, 16, f8), name);
  const double err_chunked = rel_err(score_tokens(*m.model, ref.input_ids, 7, 4, f8), logits, name);
  const double err_stepwise =
      rel_err(score_tokens(*m.model, ref.input_ids, 1, 16, f8), logits, name);
  std::printf(
      "%s: fp8 KV cache GPU vs CPU (bf16 activations): rel err %.3g; chunked, token by token vs "
      "whole: %.3g, %.3g\n",
      name.c_str(), err_cpu, err_chunked, err_stepwise);
  // A last-bit difference in a key before quantisation moves it a whole e4m3 step now and then:
  // GPU against CPU measured 7.7e-8 to 7.6e-3 (bench/results/*/tests.log).
  EXPECT_LE(err_cpu, 2e-2) << name;
  EXPECT_LE(err_chunked, 4e-2) << name;
  EXPECT_LE(err_stepwise, 4e-2) << name;

  // Greedy as above; FP8 flips more steps: at least 12 of 16 teacher-forced (the CPU with bf16
  // activations and an FP8 cache: 14-16 of 16).
  const float noise = 2.0f * margin_err;
  expect_forced_greedy_agrees(name, score_tokens(*m.model, greedy_sequence(ref), 1, 16, f8), noise,
                              12);
  const GreedyResult r = generate_greedy(
      *m.model, ref.greedy_prompt, static_cast<int>(ref.greedy_tokens.size()), {}, true, 16, f8);
  expect_greedy_agrees(name, r.token_ids, ref.greedy_tokens, noise,
                       leading_steps_above(name, noise));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuParity, ::testing::ValuesIn(dense_fixture_names()),
                         [](const auto& info) { return info.param; });

// FP8 checkpoints on the GPU: the weights stay FP8 (no BF16 copy) and the products quantise
// activations (kernels::linear_fp8), so the logits sit off transformers' (run on the dequantised
// weights) by what that quantisation costs. The bound is the one the CPU computing the same FP8
// form holds to (Fp8Resident in tests/unit/fp8_loading_test.cpp: about twice its measured error)
// plus the bf16 activations' 2e-2 (GpuParity); teacher-forced greedy one step below its minimum.
class GpuFp8Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuFp8Parity, WeightsStayFp8AndLogitsStayNearTheReference) {
  const std::string name = GetParam();
  const Reference ref = reference_load(name);
  LoadedModel m = model_load(fixture_dir(name), on_gpu());
  int fp8 = 0;
  for (const auto& [pname, p] : m.model->params().all()) fp8 += p->data().dtype() == DType::kF8E4M3;
  EXPECT_GT(fp8, 5) << name << ": FP8 weights kept FP8 on the GPU";
  Tensor logits = score_tokens(*m.model, ref.input_ids);
  const double err = rel_err(logits, ref.logits, name);
  const float margin_err = max_margin_error(logits, ref.logits);
  const Tensor stepwise = score_tokens(*m.model, ref.input_ids, /*chunk=*/1, /*block_size=*/16);
  const double err_stepwise = rel_err(stepwise, ref.logits, name);
  std::printf("%s: FP8 on the GPU vs transformers fp32 (dequantised weights): rel err %.3g, top-2 "
              "margin error %.3g; token by token through the graphs: %.3g (vs whole %.3g)\n",
              name.c_str(), err, margin_err, err_stepwise, rel_err(stepwise, logits, name));
  struct Bound {
    double rel;
    size_t steps;
  };
  const Bound b = name == "deepseek_v3_fp8"           ? Bound{0.66, 7}
                  : name == "deepseek_v3_fp8_partial" ? Bound{0.4, 10}
                  : name == "qwen3_fp8_tensor"        ? Bound{0.23, 10}
                                                      : Bound{0.13, 11};
  EXPECT_LE(err, b.rel + 2e-2) << name;
  // Decode through the graphs (the skinny FP8 products) holds the same bound. Not the whole
  // prefill's logits to bf16 noise: bf16-level differences upstream move activations across e4m3
  // rounding steps, so two FP8 runs differ by about the quantisation's own error (measured 0.037
  // to 0.245 between whole and token by token on the H200, 2026-12-02).
  EXPECT_LE(err_stepwise, b.rel + 2e-2) << name;
  expect_forced_greedy_agrees(name, score_tokens(*m.model, greedy_sequence(ref), 1, 16),
                              2.0f * margin_err, b.steps);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuFp8Parity, ::testing::ValuesIn(fp8_fixture_names()),
                         [](const auto& info) { return info.param; });

// Three sequences decoded together, graphs against eager, then one more with a new bucket.
TEST(GpuRunner, DecodeGraphsMatchEager) {
  // Both cache dtypes: the activations' (BF16) and FP8.
  const std::optional<DType> kv_dtypes[] = {std::nullopt, DType::kF8E4M3};
  for (const std::optional<DType> kv : kv_dtypes) {
    SCOPED_TRACE(kv ? "fp8 cache" : "bf16 cache");
    // Padded graph batches may round a key's last bit differently, which can move an e4m3 code.
    const double tol = kv ? 4e-2 : 1e-2;
    LoadedModel m = model_load(fixture_dir("qwen3_sliding"), on_gpu());
    RunnerOptions o;
    o.num_pages = 64;
    o.block_size = 4;
    o.max_model_len = 64;
    o.max_num_seqs = 8;
    o.kv_cache_dtype = kv;
    ModelRunner graphs(*m.model, o);
    o.enforce_eager = true;
    ModelRunner eager(*m.model, o);
    EXPECT_EQ(graphs.graph_buckets(), (std::vector<int>{1, 2, 4, 8}));
    EXPECT_TRUE(eager.graph_buckets().empty());
    const int S = 3;
    std::vector<int> len(S, 0);
    const std::vector<int> prompt_len = {5, 11, 2};
    auto make = [&](const std::vector<std::vector<int32_t>>& toks) {
      return append_step_batch(toks, len);
    };
    std::vector<std::vector<int32_t>> prompts(S);
    for (int s = 0; s < S; ++s)
      for (int i = 0; i < prompt_len[s]; ++i) prompts[s].push_back((s * 37 + i * 11) % 500);
    Batch pb = make(prompts);
    Batch pb2 = pb;
    std::vector<int32_t> next = graphs.execute_greedy(pb);
    EXPECT_EQ(eager.execute_greedy(pb2), next);
    for (int step = 0; step < 12; ++step) {
      std::vector<std::vector<int32_t>> toks(S);
      for (int s = 0; s < S; ++s) toks[s] = {next[s]};
      Batch b = make(toks);
      Batch b2 = b;
      Tensor lg = graphs.execute(b), le = eager.execute(b2);
      EXPECT_LE(rel_err(lg, le), tol) << "step " << step;
      next.clear();
      for (int s = 0; s < S; ++s) {
        const float* row = lg.ptr<float>() + s * lg.size(1);
        next.push_back(static_cast<int32_t>(std::max_element(row, row + lg.size(1)) - row));
      }
    }
    // Capturing every bucket afterwards leaves decoding intact.
    graphs.capture_decode_graphs();
    std::vector<std::vector<int32_t>> toks(S);
    for (int s = 0; s < S; ++s) toks[s] = {next[s]};
    Batch b = make(toks);
    Batch b2 = b;
    EXPECT_LE(rel_err(graphs.execute(b), eager.execute(b2)), tol);
  }
}

TEST(GpuRunner, KvCacheSizedFromMemoryAndRefusedWithNumbers) {
  LoadedModel m = model_load(fixture_dir("llama3_gqa"), on_gpu());
  RunnerOptions o;
  o.max_model_len = 512;
  o.max_num_batched_tokens = 512;
  o.gpu_memory_utilization = 0.5;
  {
    ModelRunner r(*m.model, o);
    EXPECT_GE(static_cast<int64_t>(r.num_pages()) * r.block_size(), 512);
  }
  o.max_model_len = 2000000000;
  o.max_num_batched_tokens = 256;
  try {
    ModelRunner r(*m.model, o);
    FAIL() << "a max_model_len beyond memory was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("max_model_len 2000000000"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gpu_memory_utilization"), std::string::npos) << msg;
  }
}

TEST(GpuDevice, ChecksNameTheProblem) {
  EXPECT_NO_THROW(cuda_device_check(0));
  try {
    cuda_device_check(63);
    FAIL() << "cuda:63 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:63"), std::string::npos) << e.what();
  }
}

TEST(GpuSampling, RunnerSamplesOnTheDevice) {
  LoadedModel m = model_load(fixture_dir("qwen3_tied"), on_gpu());
  ModelRunner r(*m.model, 8, 16);
  Batch b;
  b.token_ids = {1, 2, 3, 4};
  b.positions = {0, 1, 2, 3};
  b.slot_mapping = {0, 1, 2, 3};
  b.query_start = {0, 4};
  b.context_lens = {4};
  b.page_indptr = {0, 1};
  b.page_indices = {0};
  b.logits_indices = {3, 3};
  b.state_slots = {0};
  kernels::SamplingRow greedy, hot;
  hot.temperature = 1.0f;
  hot.seed = 42;
  hot.step = 3;
  Batch b2 = b;
  const auto ids = r.execute_sample(b, {greedy, hot});
  Tensor logits = r.execute(b2);
  const float* row = logits.ptr<float>() + 0;
  EXPECT_EQ(ids[0], static_cast<int32_t>(std::max_element(row, row + logits.size(1)) - row));
  Tensor cpu_ids = Tensor::empty({2}, DType::kI32);
  kernels::sample(cpu_ids, logits, kernels::sampling_rows_tensor({greedy, hot}));
  EXPECT_EQ(ids[1], cpu_ids.ptr<int32_t>()[1]);
}

}  // namespace
}  // namespace atom::test

namespace atom::test {
namespace {

// The hyper-connection families (GLM-5.3, DeepSeek-V4 and V4.1) all run on CUDA now
// (tests/gpu/models/hybrid_model_gpu_test.cpp); a hyper-connection count beyond the kernels' is
// refused by name (GpuHyperConnection.TooManyStreamsAreRefusedByName).

}  // namespace
}  // namespace atom::test
