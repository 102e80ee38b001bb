// Speculative decoding on the CPU: outputs token-identical to plain decoding (greedy, and sampled
// with the same seeds) for K = 1..4, alone and in mixed batches of random prompts, with the
// checkpoints' MTP drafters (DeepSeekMTP; Qwen3NextMTP and Qwen3_5MTP on hybrid targets, whose
// recurrent state rejected drafts roll back), whose random weights rarely agree with the
// target, and with an oracle
// drafter that proposes the target's own tokens with planted mistakes (long accepted runs, their
// rollback, stops inside a run); DSpark, DeepSeek-V4.1's block drafter, greedy against plain
// decoding with drafts accepted; the sampled distribution against the target's by chi-square;
// the forced-acceptance knob; the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "common/test_util.h"
#include "engine/engine_test_util.h"
#include "engine/model_runner.h"
#include "loader/safetensors.h"
#include "models/draft_model.h"

namespace atom::test {
namespace {

using Outputs = std::vector<std::vector<int32_t>>;

Outputs tokens_of(const std::vector<RequestOutput>& outs) {
  Outputs r;
  for (const auto& o : outs)
    for (const auto& c : o.outputs) r.push_back(c.token_ids);
  return r;
}

struct Drafter {
  LoadedDrafter d;
  explicit Drafter(Model& target, const std::string& name = "deepseek_v3_mtp")
      : d(drafter_load(fixture_dir(name), target, ModelOptions{})) {}
};

EngineConfig spec_config(int k) {
  EngineConfig c = test_config();
  c.speculative_method = "mtp";
  c.num_speculative_tokens = k;
  return c;
}

TEST(SpecDecode, MtpGreedyMatchesPlainDecoding) {
  Model& target = fixture_model("deepseek_v3_mtp");
  Drafter d(target);
  for (int k = 1; k <= 4; ++k) {
    const Workload w = random_workload(10, 40, 24, target.vocab_size(), 100 + k);
    LLMEngine plain(target, test_config());
    const Outputs want = tokens_of(plain.generate(w.prompts, w.params));
    LLMEngine spec(target, spec_config(k), {}, {}, d.d.model.get());
    ASSERT_TRUE(spec.speculative());
    EXPECT_EQ(tokens_of(spec.generate(w.prompts, w.params)), want) << "K = " << k << ", mixed";
    // Alone.
    for (size_t i = 0; i < 2; ++i)
      EXPECT_EQ(tokens_of(spec.generate({w.prompts[i]}, {w.params[i]}))[0], want[i])
          << "K = " << k << ", alone";
    const EngineStats s = spec.stats();
    EXPECT_GT(s.spec_num_drafts, 0);
    EXPECT_GT(s.spec_num_draft_tokens, s.spec_num_drafts - 1);
    EXPECT_LE(s.spec_num_draft_tokens, k * s.spec_num_drafts);
    EXPECT_LE(s.spec_num_accepted_tokens, s.spec_num_draft_tokens);
    std::printf("K=%d: %lld verifications, %lld draft tokens, %lld accepted\n", k,
                static_cast<long long>(s.spec_num_drafts),
                static_cast<long long>(s.spec_num_draft_tokens),
                static_cast<long long>(s.spec_num_accepted_tokens));
    expect_engine_idle(spec);
  }
}

// The hybrid targets (gated delta net layers beside full attention) with their checkpoints' MTP
// drafters (Qwen3NextMTP, Qwen3_5MTP dense and MoE): rejected drafts roll the recurrent state
// back through the state pool's rollback slots, so every output matches plain decoding. The
// random-weight drafters' drafts are mostly rejected; the oracle below has long accepted runs.
class HybridMtp : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridMtp, GreedyMatchesPlainDecoding) {
  Model& target = fixture_model(GetParam());
  Drafter d(target, GetParam());
  for (int k = 1; k <= 4; ++k) {
    const Workload w = random_workload(8, 40, 20, target.vocab_size(), 300 + k);
    LLMEngine plain(target, test_config());
    const Outputs want = tokens_of(plain.generate(w.prompts, w.params));
    LLMEngine spec(target, spec_config(k), {}, {}, d.d.model.get());
    ASSERT_TRUE(spec.speculative());
    EXPECT_EQ(tokens_of(spec.generate(w.prompts, w.params)), want) << "K = " << k << ", mixed";
    for (size_t i = 0; i < 2; ++i)
      EXPECT_EQ(tokens_of(spec.generate({w.prompts[i]}, {w.params[i]}))[0], want[i])
          << "K = " << k << ", alone";
    const EngineStats s = spec.stats();
    EXPECT_GT(s.spec_num_drafts, 0);
    EXPECT_LT(s.spec_num_accepted_tokens, s.spec_num_draft_tokens) << "no draft was rejected";
    std::printf("%s K=%d: %lld verifications, %lld draft tokens, %lld accepted\n",
                GetParam().c_str(), k, static_cast<long long>(s.spec_num_drafts),
                static_cast<long long>(s.spec_num_draft_tokens),
                static_cast<long long>(s.spec_num_accepted_tokens));
    expect_engine_idle(spec);
  }
}

INSTANTIATE_TEST_SUITE_P(Drafters, HybridMtp,
                         ::testing::Values("qwen3_next_mtp", "qwen3_5_mtp", "qwen3_5_moe_mtp"),
                         [](const auto& info) { return info.param; });

// Every target family through the oracle: MLA (DeepSeek-V3), GQA (Llama 3), MoE (Qwen3-MoE), and
// the hybrids (Qwen3-Next, Qwen3.5, Qwen3.5-MoE), whose recurrent state is rolled back after
// each rejection.
class SpecOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(SpecOracle, LongAcceptedRunsMatchPlainDecoding) {
  Model& target = fixture_model(GetParam());
  for (int k = 1; k <= 4; ++k) {
    for (int bad_every : {0, 5}) {
      const Workload w = random_workload(9, 30, 20, target.vocab_size(), 200 + k);
      LLMEngine plain(target, test_config());
      const Outputs want = tokens_of(plain.generate(w.prompts, w.params));
      EngineConfig c = test_config();
      c.num_speculative_tokens = k;
      LLMEngine spec(target, c);
      spec.set_proposer(
          std::make_unique<OracleProposer>(by_prompt(w, want), target.vocab_size(), bad_every));
      EXPECT_EQ(tokens_of(spec.generate(w.prompts, w.params)), want)
          << GetParam() << " K = " << k << " bad_every " << bad_every;
      const EngineStats s = spec.stats();
      EXPECT_GT(s.spec_num_accepted_tokens, 0);
      // Runs of every length are accepted; with planted mistakes some drafts are rejected.
      EXPECT_GT(s.spec_accepted_per_position[static_cast<size_t>(k - 1)], 0) << "K = " << k;
      if (bad_every > 0) {
        EXPECT_LT(s.spec_num_accepted_tokens, s.spec_num_draft_tokens);
      } else {
        EXPECT_EQ(s.spec_num_accepted_tokens, s.spec_num_draft_tokens);
      }
      expect_engine_idle(spec);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, SpecOracle,
                         ::testing::Values("deepseek_v3", "llama3_gqa", "qwen3_moe", "qwen3_next",
                                           "qwen3_5", "qwen3_5_moe"),
                         [](const auto& info) { return info.param; });

TEST(SpecDecode, StopsInsideAnAcceptedRun) {
  Model& target = fixture_model("llama3_gqa");
  const std::vector<int32_t> prompt = {5, 17, 300, 42, 8, 99, 1, 250, 77};
  LLMEngine plain(target, test_config());
  const std::vector<int32_t> full = tokens_of(plain.generate({prompt}, {greedy(24)}))[0];
  ASSERT_GE(full.size(), 12u);
  std::vector<SamplingParams> cases;
  SamplingParams stop_id = greedy(24);
  stop_id.stop_token_ids = {full[6]};  // inside a run of 4 accepted drafts
  cases.push_back(stop_id);
  cases.push_back(greedy(7));  // max_tokens inside a run
  SamplingParams min_tokens = greedy(24);
  min_tokens.stop_token_ids = {full[2]};
  min_tokens.min_tokens = 4;  // suppressed in the rows before it
  cases.push_back(min_tokens);
  GenerationConfig gen;
  gen.eos_token_ids = {full[9]};
  SamplingParams eos = greedy(24);
  eos.ignore_eos = false;
  cases.push_back(eos);
  for (size_t i = 0; i < cases.size(); ++i) {
    LLMEngine p(target, test_config(), gen);
    const auto want = p.generate({prompt}, {cases[i]});
    EngineConfig c = test_config();
    c.num_speculative_tokens = 4;
    LLMEngine spec(target, c, gen);
    // The oracle knows the unconstrained continuation: the stop lands inside an accepted run.
    spec.set_proposer(std::make_unique<OracleProposer>(
        std::map<std::vector<int32_t>, std::vector<int32_t>>{{prompt, full}}, target.vocab_size(),
        0));
    const auto got = spec.generate({prompt}, {cases[i]});
    EXPECT_EQ(got[0].outputs[0].token_ids, want[0].outputs[0].token_ids) << "case " << i;
    EXPECT_EQ(got[0].outputs[0].finish_reason, want[0].outputs[0].finish_reason) << "case " << i;
    if (i != 2) {
      EXPECT_LT(want[0].outputs[0].token_ids.size(), 24u) << "case " << i << " did not stop early";
    }
    EXPECT_GT(spec.stats().spec_num_accepted_tokens, 0) << "case " << i;
    expect_engine_idle(spec);
  }
}

class SpecSampled : public ::testing::TestWithParam<std::string> {};

TEST_P(SpecSampled, TokensMatchPlainDecodingWithTheSameSeeds) {
  Model& target = fixture_model(GetParam());
  Workload w = random_workload(8, 30, 16, target.vocab_size(), 7);
  for (size_t i = 0; i < w.params.size(); ++i) {
    SamplingParams& p = w.params[i];
    p.temperature = 0.9;
    p.top_p = 0.95;
    p.seed = static_cast<int64_t>(40 + i);
    if (i % 2) p.repetition_penalty = 1.2;  // drawn by the host sampler, over the drafts so far
    if (i % 3 == 0) p.n = 2;
  }
  LLMEngine plain(target, test_config());
  const Outputs want = tokens_of(plain.generate(w.prompts, w.params));
  std::map<std::vector<int32_t>, std::vector<int32_t>> oracle;
  size_t o = 0;
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    oracle[w.prompts[i]] = want[o];
    o += static_cast<size_t>(w.params[i].n);
  }
  for (int k : {2, 4}) {
    EngineConfig c = test_config();
    c.num_speculative_tokens = k;
    LLMEngine spec(target, c);
    spec.set_proposer(std::make_unique<OracleProposer>(oracle, target.vocab_size(), 4));
    EXPECT_EQ(tokens_of(spec.generate(w.prompts, w.params)), want) << "K = " << k;
    const EngineStats s = spec.stats();
    EXPECT_GT(s.spec_num_accepted_tokens, 0);
    EXPECT_LT(s.spec_num_accepted_tokens, s.spec_num_draft_tokens);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, SpecSampled, ::testing::Values("qwen3_moe", "qwen3_next"),
                         [](const auto& info) { return info.param; });

// Drafts of a fixed token d for the second output token: it is accepted with probability p(d) and
// otherwise replaced; the emitted tokens must follow the target's distribution, checked against
// the target's own softmax (top_k 4, temperature 1) by chi-square, and the acceptance count
// against p(d).
TEST(SpecDecode, SampledDistributionIsTheTargets) {
  Model& target = fixture_model("llama3_gqa");
  const std::vector<int32_t> prompt = {11, 200, 37, 5, 480, 91};
  const int64_t V = target.vocab_size();
  ModelRunner runner(target, 8, 16);
  auto next_probs = [&](const std::vector<int32_t>& ids) {
    Batch b;
    b.token_ids = ids;
    const int n = static_cast<int>(ids.size());
    for (int i = 0; i < n; ++i) {
      b.positions.push_back(i);
      b.slot_mapping.push_back(i);
    }
    b.query_start = {0, n};
    b.context_lens = {n};
    b.page_indptr = {0, (n + 15) / 16};
    for (int p = 0; p < b.page_indptr[1]; ++p) b.page_indices.push_back(p);
    b.logits_indices = {n - 1};
    b.state_slots = {0};
    Tensor l = runner.execute(b);
    std::vector<std::pair<float, int32_t>> top;
    for (int64_t t = 0; t < V; ++t) top.push_back({l.ptr<float>()[t], static_cast<int32_t>(t)});
    std::partial_sort(top.begin(), top.begin() + 4, top.end(), std::greater<>());
    std::map<int32_t, double> p;
    double z = 0;
    for (int i = 0; i < 4; ++i) z += std::exp(static_cast<double>(top[i].first - top[0].first));
    for (int i = 0; i < 4; ++i)
      p[top[i].second] = std::exp(static_cast<double>(top[i].first - top[0].first)) / z;
    return p;
  };
  const auto p1 = next_probs(prompt);
  // The most likely first token, and its most likely follower as the draft everyone gets.
  const int32_t x1 = std::max_element(p1.begin(), p1.end(), [](auto& a, auto& b) {
                       return a.second < b.second;
                     })->first;
  std::vector<int32_t> ctx = prompt;
  ctx.push_back(x1);
  const auto p2 = next_probs(ctx);
  const int32_t draft = std::max_element(p2.begin(), p2.end(), [](auto& a, auto& b) {
                          return a.second < b.second;
                        })->first;

  EngineConfig c = test_config();
  c.num_speculative_tokens = 1;
  c.max_num_seqs = 256;
  c.max_num_batched_tokens = 4096;
  LLMEngine spec(target, c);
  spec.set_proposer(std::make_unique<OracleProposer>(
      std::map<std::vector<int32_t>, std::vector<int32_t>>{{prompt, {x1, draft}}}, V, 0));
  SamplingParams sp;
  sp.temperature = 1.0;
  sp.top_k = 4;
  sp.max_tokens = 3;  // a draft for the second token only when a bonus third one can follow
  sp.ignore_eos = true;
  sp.n = 250;
  std::map<int32_t, int> counts;
  int given_x1 = 0, second_is_draft = 0, total = 0;
  for (int r = 0; r < 12; ++r) {
    sp.seed = 1000 + r * 1000;
    const auto outs = spec.generate({prompt}, {sp});
    for (const auto& o : outs[0].outputs) {
      ASSERT_EQ(o.token_ids.size(), 3u);
      ++total;
      second_is_draft += o.token_ids[1] == draft;
      if (o.token_ids[0] != x1) continue;  // the draft was proposed for this first token only
      ++given_x1;
      ++counts[o.token_ids[1]];
    }
  }
  ASSERT_GT(given_x1, 1000) << "p(x1) " << p1.at(x1);
  double chi2 = 0;
  for (const auto& [t, p] : p2) {
    const double e = p * given_x1;
    const double o = counts.count(t) ? counts[t] : 0;
    chi2 += (o - e) * (o - e) / e;
  }
  int outside = 0;
  for (const auto& [t, n] : counts) outside += p2.count(t) ? 0 : n;
  EXPECT_EQ(outside, 0) << "a token outside the target's top 4";
  // 3 degrees of freedom: P(chi2 > 16.27) = 0.001.
  EXPECT_LT(chi2, 16.27) << "draws " << given_x1;
  // Every sequence had its second token drafted (the same d whatever its first), and a draft is
  // accepted exactly when the target draws it.
  const EngineStats s = spec.stats();
  EXPECT_EQ(s.spec_num_draft_tokens, total);
  EXPECT_EQ(s.spec_num_accepted_tokens, second_is_draft);
  const double pd = p2.at(draft);
  std::printf("draws %d, chi2 %.2f (3 dof), draft frequency %.3f vs p(draft) %.3f\n", given_x1,
              chi2, static_cast<double>(counts[draft]) / given_x1, pd);
}

TEST(SpecDecode, ForcedAcceptanceRate) {
  Model& target = fixture_model("deepseek_v3_mtp");
  Drafter d(target);
  const Workload w = random_workload(6, 30, 20, target.vocab_size(), 9);
  for (double rate : {1.0, 0.5}) {
    EngineConfig c = spec_config(3);
    c.spec_decode_acceptance_rate = rate;
    LLMEngine spec(target, c, {}, {}, d.d.model.get());
    const auto outs = spec.generate(w.prompts, w.params);
    for (size_t i = 0; i < outs.size(); ++i)
      EXPECT_EQ(static_cast<int>(outs[i].outputs[0].token_ids.size()), w.params[i].max_tokens);
    const EngineStats s = spec.stats();
    const double acc = static_cast<double>(s.spec_num_accepted_tokens) / s.spec_num_draft_tokens;
    if (rate == 1.0) {
      EXPECT_EQ(s.spec_num_accepted_tokens, s.spec_num_draft_tokens);
    } else {
      // Each rejection ends a run, so position 0 is tried most: its share is the forced rate
      // (plus the rare real agreement).
      const double p0 = static_cast<double>(s.spec_accepted_per_position[0]) / s.spec_num_drafts;
      EXPECT_NEAR(p0, 0.5, 5 * std::sqrt(0.25 / s.spec_num_drafts)) << "acceptance " << acc;
    }
  }
}

// The DSpark engine tests' base: pages of 4, up to 16 sequences, chunked prefill of 24 tokens,
// no prefix caching.
EngineConfig dspark_base_config() {
  EngineConfig c = test_config();
  c.block_size = 4;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 24;
  c.enable_prefix_caching = false;
  return c;
}

// DSpark (models/dspark.h) on DeepSeek-V4.1's fixture with two DSpark stages
// (tests/fixtures/models/deepseek_v41_dspark, tools/dspark_reference.py), whose Markov head is
// planted to follow the target's greedy continuation of the reference's greedy prompt: greedy
// outputs identical with and without DSpark for K = 1, 3, 5 and 8, the greedy prompt alone
// (its tokens also the reference's continuation) and batched among random prompts with chunked
// prefill in pages of 4; the greedy prompt's drafts must be accepted (the planted Markov head
// follows the target), the random prompts' mostly are not. Measured (2026-12-07): alone, K = 5
// gives 4 verifications of 20 draft tokens with 15 accepted (mean acceptance length 4.75), K = 8
// 16 of 21 (6.33), K = 1 8 of 10. Planted once each: the verification's state not copied into
// the rollback slots (models/deepseek_v41.cpp) fails the token comparisons for every K; the
// anchor taken one token early (DSparkProposer) fails the acceptance check with 0 accepted.
TEST(SpecDecode, DSparkGreedyMatchesPlainDecoding) {
  const std::string name = "deepseek_v41_dspark";
  Model& target = fixture_model(name);
  Drafter d(target, name);
  SafetensorsFile ref(source_dir() + "/tests/fixtures/references/" + name + ".safetensors", true);
  const std::vector<int32_t> prompt = ids_of(ref.tensor("case0_prompt"));
  const std::vector<int32_t> trace = ids_of(ref.tensor("trace"));
  const int n = 20;
  ASSERT_GE(trace.size(), static_cast<size_t>(n));
  Workload w = random_workload(6, 30, 12, target.vocab_size(), 7);
  w.prompts.insert(w.prompts.begin() + 2, prompt);
  w.params.insert(w.params.begin() + 2, greedy(n));
  EngineConfig base = dspark_base_config();
  LLMEngine plain(target, base);
  const Outputs want = tokens_of(plain.generate(w.prompts, w.params));
  EXPECT_EQ(want[2], std::vector<int32_t>(trace.begin(), trace.begin() + n))
      << "plain decoding is not the reference's greedy continuation";
  for (int k : {1, 3, 5, 8}) {
    EngineConfig c = base;
    c.speculative_method = "dspark";
    c.num_speculative_tokens = k;
    LLMEngine spec(target, c, {}, {}, d.d.model.get());
    ASSERT_TRUE(spec.speculative());
    EXPECT_EQ(tokens_of(spec.generate({prompt}, {greedy(n)}))[0], want[2])
        << "K = " << k << ", alone";
    const EngineStats alone = spec.stats();
    EXPECT_EQ(tokens_of(spec.generate(w.prompts, w.params)), want) << "K = " << k << ", batched";
    const EngineStats s = spec.stats();
    // Alone, the planted Markov head's drafts are the target's: accepted, runs of more than one.
    EXPECT_GT(alone.spec_num_accepted_tokens, 0) << "K = " << k;
    EXPECT_LT(alone.spec_num_drafts, n) << "K = " << k << ": no step emitted more than one token";
    EXPECT_LE(s.spec_num_accepted_tokens, s.spec_num_draft_tokens);
    EXPECT_LE(s.spec_num_draft_tokens, k * s.spec_num_drafts);
    std::printf(
        "dspark K=%d: alone %lld verifications, %lld draft tokens, %lld accepted; alone "
        "and batched %lld, %lld, %lld (alone: %s)\n",
        k, static_cast<long long>(alone.spec_num_drafts),
        static_cast<long long>(alone.spec_num_draft_tokens),
        static_cast<long long>(alone.spec_num_accepted_tokens),
        static_cast<long long>(s.spec_num_drafts), static_cast<long long>(s.spec_num_draft_tokens),
        static_cast<long long>(s.spec_num_accepted_tokens),
        spec_decode_stats_line(alone.spec_num_drafts, alone.spec_num_draft_tokens,
                               alone.spec_num_accepted_tokens, alone.spec_accepted_per_position)
            .c_str());
    expect_engine_idle(spec);
  }
}

// DSpark with the confidence schedule (engine/verify_schedule.h): whatever the throughput profile
// the greedy outputs are plain decoding's (a dropped draft only costs a step), and the profile
// decides how many drafts are verified: a flat one every draft (as without the schedule), a cost
// per token and nothing else (SPS = 1 / B) none, a fixed cost per step plus one per token some;
// measured as the engine runs (no table), at most as many as without the schedule.
TEST(SpecDecode, DSparkConfidenceScheduleKeepsOutputsAndFollowsTheProfile) {
  const std::string name = "deepseek_v41_dspark";
  Model& target = fixture_model(name);
  Drafter d(target, name);
  SafetensorsFile ref(source_dir() + "/tests/fixtures/references/" + name + ".safetensors", true);
  Workload w = random_workload(5, 30, 12, target.vocab_size(), 7);
  w.prompts.insert(w.prompts.begin() + 1, ids_of(ref.tensor("case0_prompt")));
  w.params.insert(w.params.begin() + 1, greedy(20));
  EngineConfig base = dspark_base_config();
  LLMEngine plain(target, base);
  const Outputs want = tokens_of(plain.generate(w.prompts, w.params));
  base.speculative_method = "dspark";
  base.num_speculative_tokens = 5;
  auto run = [&](const char* what, bool schedule, std::vector<std::pair<int, double>> table,
                 std::vector<float> temperatures = {}) {
    EngineConfig c = base;
    c.spec_confidence_schedule = schedule;
    c.spec_sps_table = std::move(table);
    c.spec_sts_temperatures = std::move(temperatures);
    LLMEngine spec(target, c, {}, {}, d.d.model.get());
    EXPECT_EQ(tokens_of(spec.generate(w.prompts, w.params)), want) << what;
    expect_engine_idle(spec);
    const EngineStats s = spec.stats();
    std::printf("%s: %lld verifications, %lld draft tokens, %lld accepted\n", what,
                static_cast<long long>(s.spec_num_drafts),
                static_cast<long long>(s.spec_num_draft_tokens),
                static_cast<long long>(s.spec_num_accepted_tokens));
    return s;
  };
  auto table = [](double fixed) {
    std::vector<std::pair<int, double>> t;
    for (int b = 1; b <= 64; ++b) t.emplace_back(b, 1.0 / (fixed + b));
    return t;
  };
  const EngineStats all = run("every draft", false, {});
  ASSERT_GT(all.spec_num_accepted_tokens, 0);
  const EngineStats flat = run("flat profile", true, {{1, 10.0}});
  EXPECT_EQ(flat.spec_num_draft_tokens, all.spec_num_draft_tokens);
  EXPECT_EQ(flat.spec_num_accepted_tokens, all.spec_num_accepted_tokens);
  const EngineStats none = run("cost per token", true, table(0));
  EXPECT_EQ(none.spec_num_draft_tokens, 0);
  const EngineStats some = run("fixed cost of 4 tokens per step", true, table(4));
  EXPECT_GT(some.spec_num_draft_tokens, 0);
  EXPECT_LT(some.spec_num_draft_tokens, all.spec_num_draft_tokens);
  // Hotter temperatures flatten the confidences towards 1/2 (survival 1/2^k), colder ones push
  // them apart: the same profile verifies a different number of drafts.
  const EngineStats hot =
      run("fixed cost of 4, temperatures 8", true, table(4), std::vector<float>(5, 8.0f));
  EXPECT_NE(hot.spec_num_draft_tokens, some.spec_num_draft_tokens);
  const EngineStats measured = run("measured profile", true, {});
  EXPECT_LE(measured.spec_num_draft_tokens, all.spec_num_draft_tokens);
}

// DSpark on DeepSeek's native FP8 / FP4 checkpoint (tests/fixtures/models/deepseek_v41_dspark_fp8/
// quantized, tools/make_dspark_fp8_fixture.py; its drafter against the dequantised twin:
// tests/models/dspark_test.cpp): greedy outputs with DSpark (K = 5) are plain decoding's, the
// reference's greedy prompt alone and among 5 random prompts, and drafts are accepted — few: the
// Markov head was planted on the unquantised target's greedy continuation, which the quantisation
// moved (measured 2026-12-07: 1 of 75 alone, 2 of 343 in all).
TEST(SpecDecode, DSparkFp8GreedyMatchesPlainDecoding) {
  const std::string name = "deepseek_v41_dspark_fp8/quantized";
  Model& target = fixture_model(name);
  Drafter d(target, name);
  SafetensorsFile ref(source_dir() + "/tests/fixtures/references/deepseek_v41_dspark.safetensors",
                      true);
  Workload w = random_workload(5, 30, 20, target.vocab_size(), 11);
  w.prompts.insert(w.prompts.begin(), ids_of(ref.tensor("case0_prompt")));
  w.params.insert(w.params.begin(), greedy(20));
  EngineConfig c = dspark_base_config();
  LLMEngine plain(target, c);
  const Outputs want = tokens_of(plain.generate(w.prompts, w.params));
  c.speculative_method = "dspark";
  c.num_speculative_tokens = 5;
  LLMEngine spec(target, c, {}, {}, d.d.model.get());
  ASSERT_TRUE(spec.speculative());
  EXPECT_EQ(tokens_of(spec.generate({w.prompts[0]}, {w.params[0]}))[0], want[0]) << "alone";
  const EngineStats alone = spec.stats();
  EXPECT_EQ(tokens_of(spec.generate(w.prompts, w.params)), want) << "batched";
  const EngineStats all = spec.stats();
  std::printf("dspark fp8 K=5: alone %lld verifications, %lld draft tokens, %lld accepted; alone "
              "and batched %lld, %lld, %lld\n",
              static_cast<long long>(alone.spec_num_drafts),
              static_cast<long long>(alone.spec_num_draft_tokens),
              static_cast<long long>(alone.spec_num_accepted_tokens),
              static_cast<long long>(all.spec_num_drafts),
              static_cast<long long>(all.spec_num_draft_tokens),
              static_cast<long long>(all.spec_num_accepted_tokens));
  EXPECT_GT(all.spec_num_accepted_tokens, 0);
  EXPECT_LE(all.spec_num_accepted_tokens, all.spec_num_draft_tokens);
  expect_engine_idle(spec);
}

// Sampled requests (seeded, temperature 0.5 and 1.0, top_p, a repetition penalty, n = 2) give
// the same tokens with and without DSpark: the engine's seeded sampler draws each verification
// row as plain decoding draws that output position. Measured: 49 verifications, 187 draft
// tokens, 3 accepted (the drafts are the Markov head's argmax; sampled tokens leave the planted
// continuation), so nearly every verification rolls back.
TEST(SpecDecode, DSparkSampledMatchesPlainDecodingWithTheSameSeeds) {
  const std::string name = "deepseek_v41_dspark";
  Model& target = fixture_model(name);
  Drafter d(target, name);
  SafetensorsFile ref(source_dir() + "/tests/fixtures/references/" + name + ".safetensors", true);
  Workload w = random_workload(5, 30, 12, target.vocab_size(), 11);
  w.prompts.insert(w.prompts.begin(), ids_of(ref.tensor("case0_prompt")));
  w.params.insert(w.params.begin(), greedy(16));
  for (size_t i = 0; i < w.params.size(); ++i) {
    SamplingParams& p = w.params[i];
    p.temperature = i % 2 ? 1.0 : 0.5;
    p.top_p = 0.95;
    p.seed = static_cast<int64_t>(70 + i);
    if (i % 2) p.repetition_penalty = 1.2;
    if (i == 3) p.n = 2;
  }
  EngineConfig c = test_config();
  c.max_num_seqs = 16;
  c.enable_prefix_caching = false;
  LLMEngine plain(target, c);
  const Outputs want = tokens_of(plain.generate(w.prompts, w.params));
  c.speculative_method = "dspark";
  c.num_speculative_tokens = 5;
  LLMEngine spec(target, c, {}, {}, d.d.model.get());
  EXPECT_EQ(tokens_of(spec.generate(w.prompts, w.params)), want);
  const EngineStats s = spec.stats();
  EXPECT_GT(s.spec_num_drafts, 0);
  std::printf("dspark sampled K=5: %lld verifications, %lld draft tokens, %lld accepted\n",
              static_cast<long long>(s.spec_num_drafts),
              static_cast<long long>(s.spec_num_draft_tokens),
              static_cast<long long>(s.spec_num_accepted_tokens));
  expect_engine_idle(spec);
}

// Method and drafter must agree: dspark needs DSpark stages, a checkpoint whose mtp.* stages are
// DSpark's is not an MTP drafter, and K is bounded per method.
TEST(SpecDecode, DSparkRefusals) {
  EngineConfig c;
  EXPECT_ERROR_CONTAINS(
      speculative_config_parse(R"({"method": "dspark", "num_speculative_tokens": 9})", c),
      "must be in 1..8, got 9");
  speculative_config_parse(R"({"method": "dspark", "num_speculative_tokens": 5})", c);
  EXPECT_EQ(c.speculative_method, "dspark");
  EXPECT_EQ(c.num_speculative_tokens, 5);
  EXPECT_FALSE(c.spec_confidence_schedule);
  speculative_config_parse(
      R"({"method": "dspark", "num_speculative_tokens": 3, "confidence_schedule": true,
          "sts_temperatures": [1.5, 2, 2.5], "sps_table": [[64, 20.5], [1, 100]]})",
      c);
  EXPECT_TRUE(c.spec_confidence_schedule);
  EXPECT_EQ(c.spec_sts_temperatures, std::vector<float>({1.5f, 2.0f, 2.5f}));
  EXPECT_EQ(c.spec_sps_table, (std::vector<std::pair<int, double>>{{64, 20.5}, {1, 100.0}}));
  // The schedule's keys: bad values named.
  for (const auto& [json, error] : std::vector<std::pair<std::string, std::string>>{
           {R"("confidence_schedule": 1)", "'confidence_schedule' must be true or false"},
           {R"("confidence_schedule": true, "sts_temperatures": [1, 0, 1])",
            "'sts_temperatures' must hold positive numbers, got 0"},
           {R"("confidence_schedule": true, "sts_temperatures": [1, 1])",
            "one temperature per draft position, 3 (num_speculative_tokens), got 2"},
           {R"("confidence_schedule": true, "sps_table": [])", "'sps_table' must be a non-empty"},
           {R"("confidence_schedule": true, "sps_table": [[0, 5]])",
            "entries must be [tokens >= 1, steps per second > 0], got [0,5]"},
           {R"("confidence_schedule": true, "sps_table": [[4, -1]])", "got [4,-1]"},
           {R"("confidence_schedule": true, "sps_table": [[4, 1], [4, 2]])",
            "lists 4 tokens twice"},
           {R"("sps_table": [[4, 1]])", "need 'confidence_schedule': true"},
       }) {
    SCOPED_TRACE(json);
    EXPECT_ERROR_CONTAINS(
        speculative_config_parse(
            R"({"method": "dspark", "num_speculative_tokens": 3, )" + json + "}", c),
        error);
  }
  EXPECT_ERROR_CONTAINS(
      speculative_config_parse(
          R"({"method": "mtp", "num_speculative_tokens": 3, "confidence_schedule": true})", c),
      "'confidence_schedule' needs method 'dspark'");
  EngineConfig dspark = test_config();
  dspark.speculative_method = "dspark";
  dspark.num_speculative_tokens = 5;
  Model& v3 = fixture_model("deepseek_v3_mtp");
  Drafter mtp(v3);
  EXPECT_ERROR_CONTAINS(LLMEngine(v3, dspark, {}, {}, mtp.d.model.get()),
                        "needs DSpark stages in the checkpoint");
  Model& v41 = fixture_model("deepseek_v41_dspark");
  Drafter block(v41, "deepseek_v41_dspark");
  EXPECT_ERROR_CONTAINS(LLMEngine(v41, spec_config(2), {}, {}, block.d.model.get()),
                        "use method 'dspark'");
  EXPECT_ERROR_CONTAINS(LLMEngine(v41, dspark), "needs the target's drafter");
  // A config built in code, past the parser: temperatures for the wrong number of positions.
  EngineConfig sts = dspark;
  sts.spec_confidence_schedule = true;
  sts.spec_sts_temperatures = {1.0f, 2.0f};
  EXPECT_ERROR_CONTAINS(LLMEngine(v41, sts, {}, {}, block.d.model.get()),
                        "DSpark's confidence schedule: 2 temperatures for 5 draft positions");
  EngineConfig mtp_schedule = spec_config(2);
  mtp_schedule.spec_confidence_schedule = true;
  EXPECT_ERROR_CONTAINS(LLMEngine(v3, mtp_schedule, {}, {}, mtp.d.model.get()),
                        "a confidence schedule needs speculative decoding with method 'dspark'");
}

TEST(SpecDecode, Refusals) {
  EngineConfig c;
  EXPECT_ERROR_CONTAINS(
      speculative_config_parse(R"({"method": "eagle", "num_speculative_tokens": 2})", c),
      "method 'eagle' is not supported");
  EXPECT_ERROR_CONTAINS(
      speculative_config_parse(R"({"method": "mtp", "num_speculative_tokens": 5})", c),
      "must be in 1..4, got 5");
  EXPECT_ERROR_CONTAINS(speculative_config_parse(R"({"method": "mtp"})", c), "got nothing");
  EXPECT_ERROR_CONTAINS(speculative_config_parse(R"({"method": "mtp", "k": 1})", c),
                        "unknown key 'k'");
  EXPECT_ERROR_CONTAINS(speculative_config_parse("{mtp", c), "not valid JSON");
  speculative_config_parse(R"({"method": "mtp", "num_speculative_tokens": 3})", c);
  EXPECT_EQ(c.speculative_method, "mtp");
  EXPECT_EQ(c.num_speculative_tokens, 3);
  EXPECT_ERROR_CONTAINS(LLMEngine(fixture_model("deepseek_v3_mtp"), spec_config(2)),
                        "needs the target's drafter");
  EngineConfig knob = test_config();
  knob.spec_decode_acceptance_rate = 0.5;
  EXPECT_ERROR_CONTAINS(LLMEngine(fixture_model("llama3_gqa"), knob), "needs speculative decoding");
}

}  // namespace
}  // namespace atom::test
