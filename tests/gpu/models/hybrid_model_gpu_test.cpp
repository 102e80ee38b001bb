// Hybrid linear-attention models on the GPU (Gated DeltaNet: Qwen3-Next, Qwen3.5 dense and MoE;
// Kimi delta attention: Kimi-Linear; GLM-5.3's KDA with NoPE latent attention over k-pool
// selections and hyper-connections): logits against the CPU path in the same precision (bf16
// activations and weights) and against transformers' fp32 fixtures, chunked prefill and
// token-by-token decode (the recurrent state carried in the slot pool) against a whole prefill,
// greedy tokens against the bf16 CPU path's; and the engine on the GPU: continuous batching with
// decode graphs (padding rows, captures in the middle of requests) and prefix-cache hits resumed
// from state checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "engine/llm_engine.h"
#include "engine/model_runner.h"
#include "engine/sequence_runner.h"
#include "loader/hf_config.h"
#include "gpu_util.h"
#include "models/loading.h"

namespace atom::test {
namespace {

// Qwen3-Next, Qwen3.5 (dense, MoE stacked and per-expert) and Kimi-Linear (its two checkpoint
// formats).
class GpuHybridParity : public ::testing::TestWithParam<std::string> {};

// Per-row relative L2 differences of a and b [T, V] (NaN stays NaN), sorted.
std::vector<double> row_errors(const Tensor& a, const Tensor& b) {
  if (!expect_same_shape(a, b)) return {std::nan("")};
  const Tensor x = f32_host(a), y = f32_host(b);
  const int64_t T = x.size(0), V = x.size(1);
  std::vector<double> errs;
  for (int64_t t = 0; t < T; ++t) {
    double num = 0, den = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double d = x.ptr<float>()[t * V + v] - y.ptr<float>()[t * V + v];
      num += d * d;
      den += static_cast<double>(y.ptr<float>()[t * V + v]) * y.ptr<float>()[t * V + v];
    }
    errs.push_back(std::sqrt(num / std::max(den, 1e-30)));
  }
  for (double e : errs)
    if (!(e == e)) return {std::nan("")};
  std::sort(errs.begin(), errs.end());
  return errs;
}

// In bf16 the hybrids' tiny MoE fixtures (hidden 64) move most rows by a little: a different
// expert GEMM path, or a router near a tie, on one side (measured at the first GPU run: median
// rows 0.8-1.4e-2 GPU vs bf16 CPU on the MoE fixtures, 7.7e-8 on dense qwen3_5, and 1-5 of 96
// rows beyond 0.1; the GPU is as close to fp32 transformers as the bf16 CPU, checked
// separately). A broken kernel moves every row by far more (a dropped gate: ~1).
// Kimi-K3's fixtures move further in bf16 (measured on one H200, 2026-12-06: GPU vs bf16 CPU
// median row 0.021-0.022 with 5-12 of 100 rows beyond 0.1, the token-by-token decode vs whole
// prefill median 0.031 with 15 rows beyond 0.1; bf16 itself moves them 0.21-0.31 relative from
// fp32, where the GPU is no further than the bf16 CPU): their bounds are twice the family's.
void expect_rows_near(const Tensor& got, const Tensor& want, const std::string& what,
                      const std::string& fixture) {
  const bool k3 = fixture.starts_with("kimi_k3");
  const double median_bound = k3 ? 4e-2 : 2e-2;
  const int beyond_bound = k3 ? 20 : 8;
  const std::vector<double> e = row_errors(got, want);
  const double median = e[e.size() / 2], p90 = e[e.size() * 9 / 10], worst = e.back();
  int beyond = 0;
  for (double x : e) beyond += !(x <= 0.1);
  std::printf("  %s: row rel err median %.3g, p90 %.3g, max %.3g, %d of %zu rows beyond 0.1\n",
              what.c_str(), median, p90, worst, beyond, e.size());
  EXPECT_LE(median, median_bound) << what;
  EXPECT_LE(beyond, beyond_bound) << what;
}

size_t leading(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// How many of `tokens` (a greedy continuation of `prompt` by another model) are `model`'s argmax
// when it is fed the prompt and the tokens before each (teacher-forced).
int teacher_forced_agreement(Model& model, const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& tokens) {
  std::vector<int32_t> in = prompt;
  in.insert(in.end(), tokens.begin(), tokens.end() - 1);
  const Tensor fl = f32_host(score_tokens(model, in));
  const int64_t V = fl.size(1), p0 = static_cast<int64_t>(prompt.size()) - 1;
  int agree = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float* row = fl.ptr<float>() + (p0 + static_cast<int64_t>(i)) * V;
    agree += std::max_element(row, row + V) - row == tokens[i];
  }
  return agree;
}

TEST_P(GpuHybridParity, LogitsChunkedStepwiseAndGreedy) {
  const Reference ref = reference_load(GetParam());
  LoadedModel m = model_load(fixture_dir(GetParam()), on_gpu());
  Tensor logits = score_tokens(*m.model, ref.input_ids);
  ModelOptions cpu_bf16;
  cpu_bf16.act_dtype = m.model->act_dtype();
  cpu_bf16.weight_dtype = m.model->act_dtype();
  LoadedModel c = model_load(fixture_dir(GetParam()), cpu_bf16);
  Tensor cpu_logits = score_tokens(*c.model, ref.input_ids);
  const double err_cpu = rel_err(logits, cpu_logits);
  const double err_ref = rel_err(logits, ref.logits);
  const double err_cpu_ref = rel_err(cpu_logits, ref.logits);
  std::printf("%s (%lld tokens): bf16 GPU vs bf16 CPU: rel err %.3g; vs transformers fp32: GPU "
              "%.3g, bf16 CPU %.3g\n",
              GetParam().c_str(), static_cast<long long>(ref.input_ids.size()), err_cpu, err_ref,
              err_cpu_ref);
  expect_rows_near(logits, cpu_logits, GetParam() + " GPU vs bf16 CPU", GetParam());
  // No further from fp32 transformers than the CPU in the same precision, with bf16's slack.
  EXPECT_LE(err_ref, err_cpu_ref + 2e-2) << GetParam();

  // Prefill in chunks of 7 (the chunked rule continuing a carried state, the conv state's
  // window across chunk boundaries) and one token at a time (the recurrent decode kernels).
  Tensor chunked = score_tokens(*m.model, ref.input_ids, /*chunk=*/7, /*block_size=*/4);
  expect_rows_near(chunked, logits, GetParam() + " chunked vs whole", GetParam());
  Tensor stepwise = score_tokens(*m.model, ref.input_ids, /*chunk=*/1, /*block_size=*/16);
  expect_rows_near(stepwise, logits, GetParam() + " token by token vs whole", GetParam());

  const int n = static_cast<int>(ref.greedy_tokens.size());
  const GreedyResult g = generate_greedy(*m.model, ref.greedy_prompt, n, {}, true);
  const GreedyResult h = generate_greedy(*c.model, ref.greedy_prompt, n, {}, true);
  const size_t agree = leading(g.token_ids, h.token_ids);
  const size_t agree_ref = leading(g.token_ids, ref.greedy_tokens);
  // Free-running greedy stops agreeing at the first near-tie (kimi_linear: the bf16 CPU, the GPU
  // and fp32 transformers all part at step 3), so also teacher-forced: the GPU's argmax at every
  // step of the bf16 CPU's greedy sequence.
  const int forced = teacher_forced_agreement(*m.model, ref.greedy_prompt, h.token_ids);
  std::printf("%s: GPU and bf16 CPU greedy tokens agree for %zu of %d steps (transformers: GPU "
              "%zu, bf16 CPU %zu); teacher-forced on the CPU's tokens: %d of %d\n",
              GetParam().c_str(), agree, n, agree_ref, leading(h.token_ids, ref.greedy_tokens),
              forced, n);
  EXPECT_GE(forced, n - 2) << GetParam();
  EXPECT_GE(std::max(agree, agree_ref), 3u) << GetParam();
}

std::vector<std::string> gpu_hybrid_names() {
  std::vector<std::string> names = hybrid_fixture_names();
  names.push_back("glm5_next");
  return names;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuHybridParity, ::testing::ValuesIn(gpu_hybrid_names()),
                         [](const auto& info) { return info.param; });

// Decode graphs against eager decoding on a hybrid: three sequences (a batch the graphs pad to 4:
// the padding row must leave the live slots alone), the graph of each bucket captured on first
// use right after the prefill, in the middle of the requests (the capture's warm-up must not apply
// the step's recurrent update on top of the replay's), then every bucket captured again.
// Not yet run on the GPU (written after the session's device time was spent): its bound is a
// first guess, far under what a doubled or misplaced update gives (~1 relative).
class GpuHybridRunner : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuHybridRunner, DecodeGraphsMatchEager) {
  LoadedModel m = model_load(fixture_dir(GetParam()), on_gpu());
  RunnerOptions o;
  o.num_pages = 64;
  o.block_size = 4;
  o.max_model_len = 64;
  o.max_num_seqs = 8;
  o.num_state_slots = 8;
  ModelRunner graphs(*m.model, o);
  o.enforce_eager = true;
  ModelRunner eager(*m.model, o);
  ASSERT_EQ(graphs.graph_buckets(), (std::vector<int>{1, 2, 4, 8}));
  const int S = 3;
  std::vector<int> len(S, 0), len2(S, 0);
  const std::vector<int> prompt_len = {5, 11, 2};
  std::vector<std::vector<int32_t>> prompts(S);
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < prompt_len[s]; ++i) prompts[s].push_back((s * 37 + i * 11) % 500);
  Batch pb = append_step_batch(prompts, len), pb2 = append_step_batch(prompts, len2);
  std::vector<int32_t> next = graphs.execute_greedy(pb);
  EXPECT_EQ(eager.execute_greedy(pb2), next);
  double worst = 0;
  for (int step = 0; step < 13; ++step) {
    if (step == 12) graphs.capture_decode_graphs();  // every bucket again, mid-request
    std::vector<std::vector<int32_t>> toks(S);
    for (int s = 0; s < S; ++s) toks[s] = {next[s]};
    Batch b = append_step_batch(toks, len), b2 = append_step_batch(toks, len2);
    Tensor lg = graphs.execute(b), le = eager.execute(b2);
    const double e = rel_err(lg, le);
    worst = std::max(worst, e);
    EXPECT_LE(e, 5e-2) << "step " << step;
    next.clear();
    for (int s = 0; s < S; ++s) {
      const float* row = le.ptr<float>() + s * le.size(1);  // both follow eager's tokens
      next.push_back(static_cast<int32_t>(std::max_element(row, row + le.size(1)) - row));
    }
  }
  std::printf("%s: decode graphs vs eager over 13 steps: worst rel err %.3g\n", GetParam().c_str(),
              worst);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuHybridRunner,
                         ::testing::Values("qwen3_next", "qwen3_5", "kimi_linear", "glm5_next",
                                           "kimi_k3", "deepseek_v4"),
                         [](const auto& info) { return info.param; });

// The engine on the GPU: 12 requests of mixed lengths under continuous batching (chunked prefill
// beside decode, decode graphs padding odd batch sizes and captured as batch sizes first occur,
// mid-request), run twice with prefix caching and state checkpoints every 8 tokens: the second
// pass resumes prefixes from checkpoints. Every request against its single-sequence run.
class GpuHybridEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuHybridEngine, BatchedAndCheckpointResumedRequestsMatchSingleRuns) {
  LoadedModel m = model_load(fixture_dir(GetParam()), on_gpu());
  const GreedyWorkload w = greedy_workload(*m.model);
  const auto& prompts = w.prompts;
  const SamplingParams& p = w.params;
  const auto& alone = w.alone;
  EngineConfig c;
  c.max_model_len = 256;
  c.max_num_seqs = 5;             // odd: decode batches of 3, 5 pad to graph sizes 4, 8
  c.max_num_batched_tokens = 48;  // chunked prefill beside decode
  c.gpu_memory_utilization = 0.5;
  c.block_size = 4;
  c.enable_prefix_caching = true;
  c.state_checkpoint_interval_tokens = 8;
  // Room for every boundary of the 12 prompts (about 60): with fewer, the second pass's own
  // checkpoints evict, least recently used first, the ones its later prompts would resume from.
  c.num_state_checkpoints = 80;
  LLMEngine engine(*m.model, c);
  std::vector<std::vector<int32_t>> first;
  for (int pass = 0; pass < 2; ++pass) {
    const auto out = engine.generate(prompts, std::vector<SamplingParams>(prompts.size(), p));
    int same = 0, same_first = 0, cached = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const auto& o = out[i].outputs.at(0);
      same += o.token_ids == alone[i];
      cached += o.num_cached_tokens;
      if (pass == 0)
        first.push_back(o.token_ids);
      else
        same_first += o.token_ids == first[i];
    }
    std::printf("%s pass %d: %d of %zu requests equal their single-sequence runs, %d prompt "
                "tokens resumed from state checkpoints%s\n",
                GetParam().c_str(), pass, same, prompts.size(), cached,
                pass ? (", " + std::to_string(same_first) + " equal pass 0").c_str() : "");
    // Batch composition changes bf16 rounding in the GEMMs (other kernels for other row
    // counts); in these tiny MoE fixtures a request near a router or logit tie diverges
    // (measured 8, 9 and 11 of 12 on qwen3_5_moe, qwen3_next, kimi_linear; the CPU engine's
    // fp32 runs match exactly: tests/engine).
    EXPECT_GE(same, 7) << "pass " << pass;
    if (pass == 1) {
      EXPECT_GT(cached, 100) << "the second pass should resume prefixes from state checkpoints";
      EXPECT_GE(same_first, 10);  // measured 12 of 12 (without resumed prefixes)
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuHybridEngine,
                         ::testing::Values("qwen3_next", "qwen3_5_moe", "kimi_linear", "glm5_next",
                                           "kimi_k3", "deepseek_v4", "deepseek_v41"),
                         [](const auto& info) { return info.param; });

// DeepSeek-V4 on the GPU (kernels/compressed_kv.h: the sink attention over the sliding window
// and compressed entries, the window compressors' pooling, the Lightning Indexer over rows of 4
// tokens, hash routing): bf16 against the CPU, which computes V4 in F32 only, and against
// transformers' fp32 logits; chunked prefill with pages of 4 tokens (chunks of 7 end inside
// compression windows; the HCA windows of 16 span pages) and token-by-token decode against the
// whole prefill; greedy tokens teacher-forced on the CPU's. The fixture's prompt passes the
// window (8), completes HCA (16) and CSA (4) windows and gives the indexer more entries than its
// top 4. The bounds are the hybrids' with bf16 against F32 (not bf16 against bf16) on both
// sides: a broken kernel (a dropped sink, a wrong entry row, a stale window state) moves every
// row by far more.
TEST(GpuDeepseekV4, LogitsChunkedStepwiseAndGreedy) {
  const std::string name = "deepseek_v4";
  const Reference ref = reference_load(name);
  LoadedModel m = model_load(fixture_dir(name), on_gpu());
  Tensor logits = score_tokens(*m.model, ref.input_ids);
  LoadedModel c = model_load(fixture_dir(name), ModelOptions{});
  Tensor cpu_logits = score_tokens(*c.model, ref.input_ids);
  const double err_cpu = rel_err(logits, cpu_logits), err_ref = rel_err(logits, ref.logits),
               err_cpu_ref = rel_err(cpu_logits, ref.logits);
  std::printf("%s (%lld tokens): bf16 GPU vs F32 CPU rel err %.3g; vs transformers fp32: GPU "
              "%.3g, CPU %.3g\n",
              name.c_str(), static_cast<long long>(ref.input_ids.size()), err_cpu, err_ref,
              err_cpu_ref);
  EXPECT_LE(err_cpu_ref, 1e-4);  // the CPU path is the reference's
  expect_rows_near(logits, cpu_logits, name + " GPU vs F32 CPU", "kimi_k3");
  Tensor chunked = score_tokens(*m.model, ref.input_ids, /*chunk=*/7, /*block_size=*/4);
  expect_rows_near(chunked, logits, name + " chunked vs whole", name);
  Tensor stepwise = score_tokens(*m.model, ref.input_ids, /*chunk=*/1, /*block_size=*/16);
  expect_rows_near(stepwise, logits, name + " token by token vs whole", name);
  const int n = static_cast<int>(ref.greedy_tokens.size());
  const GreedyResult h = generate_greedy(*c.model, ref.greedy_prompt, n, {}, true);
  const int forced = teacher_forced_agreement(*m.model, ref.greedy_prompt, h.token_ids);
  std::printf("%s: GPU argmax on the CPU's greedy tokens: %d of %d\n", name.c_str(), forced, n);
  EXPECT_GE(forced, n - 2);
}

// DeepSeek-V4.1 on the GPU (its attention over the CSA2 topology: the index plane stored in FP8
// or FP4 and scored by the indexer with candidate blocks, REINDEX and REUSE layers reading
// earlier layers' rows; Engram's read with its host tables; single-pass hyper-connections): bf16
// against the F32 CPU (V4.1 runs in F32 only there) and against the PyTorch reference's fp32
// logits; chunked prefill over pages of 4 and token-by-token decode against the whole prefill;
// greedy tokens teacher-forced on the CPU's. Decode runs eagerly (no decode graphs: Engram works
// with the host inside the step). On this fixture a different top-k choice moves the logits by
// 0.2-0.5 of their scale, and bf16 keys move FP8 / FP4 codes across rounding boundaries, so bf16
// moves rows far more than in other families: measured on one H100 (2026-12-08), GPU vs CPU row
// medians 0.053 (FP8 plane) and 0.15 (FP4) with 12 and 22 of 40 rows beyond 0.1, token by token
// vs whole 0.018 and 0.057, teacher-forced greedy 12 and 9 of 12. The bounds are about twice
// those; a broken kernel moves every row by about 1 (GpuDeepseekV41.F32OnTheGpuComputesTheCpuModel
// is the strict test).
TEST(GpuDeepseekV41, LogitsChunkedStepwiseAndGreedy) {
  for (const std::string name : {"deepseek_v41", "deepseek_v41_fp4_index"}) {
    const bool fp4 = name == "deepseek_v41_fp4_index";
    // The FP4 plane: the fixture copied with index_cache_dtype fp4 (its own reference file).
    TempDir d;
    std::string dir = fixture_dir("deepseek_v41");
    if (fp4) {
      copy_dir(dir, d.str());
      nlohmann::json c = json_load_file(d.file("config.json"));
      c["text_config"]["index_cache_dtype"] = "fp4";
      write_file(d.file("config.json"), c.dump());
      dir = d.str();
    }
    const Reference ref = reference_load(name);
    LoadedModel m = model_load(dir, on_gpu());
    EXPECT_FALSE(m.model->runs_in_decode_graphs());
    Tensor logits = score_tokens(*m.model, ref.input_ids);
    LoadedModel c = model_load(dir, ModelOptions{});
    Tensor cpu_logits = score_tokens(*c.model, ref.input_ids);
    const double err_cpu = rel_err(logits, cpu_logits), err_ref = rel_err(logits, ref.logits),
                 err_cpu_ref = rel_err(cpu_logits, ref.logits);
    std::printf("%s (%lld tokens): bf16 GPU vs F32 CPU rel err %.3g; vs the reference fp32: GPU "
                "%.3g, CPU %.3g\n",
                name.c_str(), static_cast<long long>(ref.input_ids.size()), err_cpu, err_ref,
                err_cpu_ref);
    EXPECT_LE(err_cpu_ref, 1e-4) << name;  // the CPU path is the reference's
    auto near = [&](const Tensor& got, const Tensor& want, const std::string& what,
                    double median_bound, int beyond_bound) {
      const std::vector<double> e = row_errors(got, want);
      int beyond = 0;
      for (double x : e) beyond += !(x <= 0.1);
      std::printf("  %s %s: row rel err median %.3g, p90 %.3g, max %.3g, %d of %zu rows beyond "
                  "0.1\n",
                  name.c_str(), what.c_str(), e[e.size() / 2], e[e.size() * 9 / 10], e.back(),
                  beyond, e.size());
      EXPECT_LE(e[e.size() / 2], median_bound) << name << " " << what;
      EXPECT_LE(beyond, beyond_bound) << name << " " << what;
    };
    near(logits, cpu_logits, "GPU vs F32 CPU", fp4 ? 0.3 : 0.1, fp4 ? 30 : 24);
    Tensor chunked = score_tokens(*m.model, ref.input_ids, /*chunk=*/7, /*block_size=*/4);
    near(chunked, logits, "chunked vs whole", 2e-2, 4);
    Tensor stepwise = score_tokens(*m.model, ref.input_ids, /*chunk=*/1, /*block_size=*/16);
    near(stepwise, logits, "token by token vs whole", fp4 ? 0.12 : 0.04, fp4 ? 24 : 12);
    const int n = static_cast<int>(ref.greedy_tokens.size());
    const GreedyResult h = generate_greedy(*c.model, ref.greedy_prompt, n, {}, true);
    const int forced = teacher_forced_agreement(*m.model, ref.greedy_prompt, h.token_ids);
    std::printf("%s: GPU argmax on the CPU's greedy tokens: %d of %d\n", name.c_str(), forced, n);
    EXPECT_GE(forced, fp4 ? n / 2 : n - 2) << name;
  }
}

// DeepSeek-V4.1 on the GPU in F32 activations and weights against the F32 CPU: with the bf16
// roundings gone the index plane's codes, and so the top-k choices, should be the CPU's (the
// fixture's index gaps are >= 2e-4), so every row must agree closely; what bf16 moves above is
// then the choices' sensitivity, not a kernel.
TEST(GpuDeepseekV41, F32OnTheGpuComputesTheCpuModel) {
  const Reference ref = reference_load("deepseek_v41");
  ModelOptions o = on_gpu();
  o.act_dtype = DType::kF32;
  o.weight_dtype = DType::kF32;
  LoadedModel m = model_load(fixture_dir("deepseek_v41"), o);
  Tensor logits = score_tokens(*m.model, ref.input_ids);
  LoadedModel c = model_load(fixture_dir("deepseek_v41"), ModelOptions{});
  Tensor cpu_logits = score_tokens(*c.model, ref.input_ids);
  const std::vector<double> e = row_errors(logits, cpu_logits);
  int beyond = 0;
  for (double x : e) beyond += !(x <= 1e-2);
  std::printf("deepseek_v41 F32 GPU vs F32 CPU: rel err %.3g, row median %.3g, max %.3g, %d of "
              "%zu rows beyond 1e-2\n",
              rel_err(logits, cpu_logits), e[e.size() / 2], e.back(), beyond, e.size());
  EXPECT_LE(e[e.size() / 2], 1e-3);
  EXPECT_LE(beyond, 2);
}

// ATOM_K3_SHARED_EXPERT_OVERLAP: Kimi-K3's shared experts on a second stream give the same
// logits as on one (the same kernels on the same inputs), eager and through the engine, whose
// decode steps replay captured graphs with the fork and join inside.
TEST(GpuKimiK3, SharedExpertOverlapGivesTheSameValues) {
  const std::vector<int32_t> ids = {3, 17, 29, 41, 53, 67, 79, 97, 101, 113, 127, 131, 149, 151};
  ::unsetenv("ATOM_K3_SHARED_EXPERT_OVERLAP");
  LoadedModel one = model_load(fixture_dir("kimi_k3"), on_gpu());
  ::setenv("ATOM_K3_SHARED_EXPERT_OVERLAP", "1", 1);
  LoadedModel two = model_load(fixture_dir("kimi_k3"), on_gpu());
  ::unsetenv("ATOM_K3_SHARED_EXPERT_OVERLAP");
  const Tensor a = score_tokens(*one.model, ids), b = score_tokens(*two.model, ids);
  EXPECT_EQ(max_abs_diff(a, b), 0.0f) << "eager prefill";
  // Batched greedy decoding is compared with the same batches without the overlap (not with
  // each prompt alone: batching alone changes BF16 sums, GpuHybridEngine's 7 of 12).
  const GreedyWorkload w = greedy_workload(*one.model);
  EngineConfig c;
  c.max_model_len = 256;
  c.max_num_seqs = 5;
  c.max_num_batched_tokens = 48;
  c.gpu_memory_utilization = 0.15;
  c.block_size = 4;
  const std::vector<SamplingParams> params(w.prompts.size(), w.params);
  std::vector<RequestOutput> base, out;
  {
    LLMEngine engine(*one.model, c);
    base = engine.generate(w.prompts, params);
  }
  {
    LLMEngine engine(*two.model, c);
    out = engine.generate(w.prompts, params);
  }
  ASSERT_EQ(out.size(), base.size());
  int same = 0;
  for (size_t i = 0; i < out.size(); ++i)
    same += out[i].outputs.at(0).token_ids == base[i].outputs.at(0).token_ids;
  EXPECT_EQ(same, static_cast<int>(out.size()))
      << "greedy with overlap vs the same batches without";
}

}  // namespace
}  // namespace atom::test
