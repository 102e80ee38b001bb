// Speculative decoding on the GPU with the MTP drafters of the DeepSeek-V3 fixture and of the
// hybrid (linear-attention) Qwen3-Next and Qwen3.5 fixtures: verification steps of K + 1 tokens
// per sequence and the drafter's steps replay CUDA graphs (or run eagerly), and greedy outputs
// are the target's own, K = 1..4, alone and in mixed batches. A hybrid's rejected drafts roll its
// recurrent state back through the rollback slots the CUDA kernels keep per verification row.
//
// The reference for "the target's own" is independent of the engine's decode path: every output
// is re-scored by one eager forward over prompt + output (teacher forcing) and each emitted token
// must be that forward's argmax, up to BF16 rounding (a near tie). Outputs are also compared
// token for token with plain decoding. To make acceptances and rejections both happen (random
// drafter weights agree with the target rarely), the drafter's proposals are replaced by the plain
// run's tokens with planted mistakes (one in K + 2 positions, so some proposals are clean); the
// drafter still runs every step (its graphs, its cache writes), and its own drafts are compared
// between graphs and eager.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include <fmt/format.h>

#include "common/fixtures.h"
#include "engine/engine_test_util.h"
#include "engine/llm_engine.h"
#include "engine/model_runner.h"
#include "gpu_util.h"
#include "models/draft_model.h"
#include "models/loading.h"

namespace atom::test {
namespace {

using Outputs = std::vector<std::vector<int32_t>>;

EngineConfig spec_gpu_config(int k, bool eager) {
  EngineConfig c;
  c.max_model_len = 256;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 512;
  c.kv_cache_memory = int64_t{32} << 20;  // engines side by side: no share of free memory
  c.enforce_eager = eager;
  c.num_speculative_tokens = k;
  return c;
}

Outputs tokens_of(const std::vector<RequestOutput>& outs) {
  Outputs r;
  for (const auto& o : outs) r.push_back(o.outputs.at(0).token_ids);
  return r;
}

// Runs the real MTP drafter every step and logs its drafts; with an oracle (prompt -> the plain
// run's output) proposes the oracle's tokens instead, one in `bad_every` of them wrong.
class SteeredMtp : public DraftProposer {
 public:
  SteeredMtp(std::unique_ptr<MtpProposer> mtp,
             std::map<std::vector<int32_t>, std::vector<int32_t>> oracle, int64_t vocab,
             int bad_every)
      : mtp_(std::move(mtp)), oracle_(std::move(oracle)), vocab_(vocab), bad_every_(bad_every) {}
  void propose(const Tensor& hidden, std::span<const DraftRequest> reqs, int block_size,
               std::vector<std::vector<int32_t>>& drafts) override {
    mtp_->propose(hidden, reqs, block_size, drafts);
    for (const auto& d : drafts) log.insert(log.end(), d.begin(), d.end());
    if (oracle_.empty()) return;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Sequence& seq = *reqs[i].seq;
      const std::vector<int32_t> prompt(seq.tokens.begin(),
                                        seq.tokens.begin() + seq.num_prompt_tokens);
      const auto it = oracle_.find(prompt);
      const int n = seq.num_output_tokens();
      for (size_t j = 0; j < drafts[i].size(); ++j) {
        const size_t at = static_cast<size_t>(n) + j;
        int32_t t = it != oracle_.end() && at < it->second.size() ? it->second[at] : 3;
        if (bad_every_ > 0 && (calls_ + i + j) % static_cast<size_t>(bad_every_) == 0)
          t = static_cast<int32_t>((t + 1) % vocab_);
        drafts[i][j] = t;
      }
    }
    ++calls_;
  }
  const MtpProposer& mtp() const { return *mtp_; }
  std::vector<int32_t> log;  // the drafter's own drafts, in call order

 private:
  std::unique_ptr<MtpProposer> mtp_;
  std::map<std::vector<int32_t>, std::vector<int32_t>> oracle_;
  int64_t vocab_;
  int bad_every_;
  size_t calls_ = 0;
};

// Output tokens that are not the argmax of an eager teacher-forced forward over prompt + output
// beyond BF16 rounding: max logit - the token's logit > 0.05 x the row's logit RMS (the GPU
// logits' normalised error against the CPU's is ~1e-2, GpuParity).
int off_argmax_tokens(ModelRunner& scorer, const std::vector<int32_t>& prompt,
                      const std::vector<int32_t>& out, double* worst) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), out.begin(), out.end());
  const int n = static_cast<int>(all.size()), P = static_cast<int>(prompt.size());
  Batch b;
  b.block_size = scorer.block_size();
  b.query_start = {0, n};
  b.page_indptr = {0};
  for (int i = 0; i < n; ++i) {
    b.token_ids.push_back(all[static_cast<size_t>(i)]);
    b.positions.push_back(i);
    b.slot_mapping.push_back(i);
  }
  for (int p = 0; p < (n + b.block_size - 1) / b.block_size; ++p) b.page_indices.push_back(p);
  b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
  b.context_lens = {n};
  if (!scorer.model().state_specs().empty()) b.state_slots = {0};  // a fresh recurrent state
  for (int i = P - 1; i < n - 1; ++i) b.logits_indices.push_back(i);
  const Tensor logits = scorer.execute(b);
  const int64_t V = logits.size(1);
  int bad = 0;
  for (int64_t r = 0; r < logits.size(0); ++r) {
    const float* row = logits.ptr<float>() + r * V;
    double ss = 0;
    for (int64_t v = 0; v < V; ++v) ss += static_cast<double>(row[v]) * row[v];
    const double rms = std::sqrt(ss / V);
    const float mx = *std::max_element(row, row + V);
    const double gap = mx - row[out[static_cast<size_t>(r)]];
    EXPECT_TRUE(std::isfinite(gap));
    *worst = std::max(*worst, gap / rms);
    bad += gap > 0.05 * rms;
  }
  return bad;
}

struct Fixture {
  explicit Fixture(const std::string& name)
      : target(model_load(fixture_dir(name), on_gpu())),
        drafter(drafter_load(fixture_dir(name), *target.model, on_gpu())),
        // Prefill steps only (always eager); one state slot for a recurrent target.
        scorer(*target.model, 32, 16, target.model->state_specs().empty() ? 0 : 1) {}
  LoadedModel target;
  LoadedDrafter drafter;
  ModelRunner scorer;
};

int64_t count_equal(const Outputs& a, const Outputs& b) {
  int64_t same = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) same += a[i] == b[i];
  return same;
}

// Greedy outputs of `fixture` with speculation, K = 1..4, graphs and eager: the target's
// teacher-forced argmax and plain decoding's tokens. Steered drafts always (acceptances and
// rejections both asserted); the drafter's own drafts too when `unsteered`.
void greedy_outputs_are_the_targets(const std::string& fixture, bool unsteered) {
  Fixture f(fixture);
  Model& target = *f.target.model;
  const bool recurrent = !target.state_specs().empty();
  for (int k = 1; k <= 4; ++k) {
    const Workload w = random_workload(10, 40, 24, target.vocab_size(), 300 + k, /*min_tokens=*/4);
    LLMEngine plain(target, spec_gpu_config(0, false));
    const Outputs want = tokens_of(plain.generate(w.prompts, w.params));
    std::map<std::vector<int32_t>, std::vector<int32_t>> oracle;
    for (size_t i = 0; i < w.prompts.size(); ++i) oracle[w.prompts[i]] = want[i];
    std::map<bool, std::vector<int32_t>> drafter_log;
    for (bool eager : {false, true}) {
      for (int steer : {0, 1}) {
        if (!steer && !unsteered) continue;
        SCOPED_TRACE(fmt::format("{}: K = {}, {}, {}", fixture, k, eager ? "eager" : "graphs",
                                 steer ? "steered drafts" : "the drafter's drafts"));
        EngineConfig c = spec_gpu_config(k, eager);
        LLMEngine spec(target, c);
        MtpProposerOptions po;
        po.graphs = !eager;
        po.max_model_len = c.max_model_len;
        po.max_num_seqs = c.max_num_seqs;
        po.num_speculative_tokens = k;
        auto steered = std::make_unique<SteeredMtp>(
            std::make_unique<MtpProposer>(*f.drafter.model, spec.kv_plan().num_blocks,
                                          spec.kv_plan().block_size, spec.kv_plan().kv_cache_dtype,
                                          po),
            steer ? oracle : decltype(oracle){}, target.vocab_size(), steer ? k + 2 : 0);
        SteeredMtp* s = steered.get();
        spec.set_proposer(std::move(steered));
        const Outputs got = tokens_of(spec.generate(w.prompts, w.params));
        // Alone: the first two requests, each in an engine of its own.
        Outputs alone;
        for (size_t i = 0; i < 2; ++i) {
          LLMEngine one(target, c);
          one.set_proposer(std::make_unique<SteeredMtp>(
              std::make_unique<MtpProposer>(*f.drafter.model, one.kv_plan().num_blocks,
                                            one.kv_plan().block_size, one.kv_plan().kv_cache_dtype,
                                            po),
              steer ? oracle : decltype(oracle){}, target.vocab_size(), steer ? k + 2 : 0));
          alone.push_back(tokens_of(one.generate({w.prompts[i]}, {w.params[i]})).at(0));
        }
        ASSERT_EQ(got.size(), want.size());
        int bad = 0;
        double worst = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(static_cast<int>(got[i].size()), w.params[i].max_tokens);
          bad += off_argmax_tokens(f.scorer, w.prompts[i], got[i], &worst);
        }
        for (size_t i = 0; i < alone.size(); ++i)
          bad += off_argmax_tokens(f.scorer, w.prompts[i], alone[i], &worst);
        const int64_t same = count_equal(got, want), same_alone = count_equal(alone, want);
        const EngineStats st = spec.stats();
        std::printf("%s K=%d %s %s: %lld/%zu mixed and %lld/2 alone equal plain decoding; "
                    "%d tokens off the teacher-forced argmax (worst gap %.4f rms); %lld "
                    "verifications, %lld draft tokens, %lld accepted; target graph steps %lld, "
                    "drafter graph steps %lld\n",
                    fixture.c_str(), k, eager ? "eager" : "graphs", steer ? "steered" : "mtp",
                    static_cast<long long>(same), got.size(), static_cast<long long>(same_alone),
                    bad, worst, static_cast<long long>(st.spec_num_drafts),
                    static_cast<long long>(st.spec_num_draft_tokens),
                    static_cast<long long>(st.spec_num_accepted_tokens),
                    static_cast<long long>(spec.runner().graph_steps()),
                    static_cast<long long>(s->mtp().graph_steps()));
        EXPECT_EQ(bad, 0);
        // BF16 rounding moves with the batch's shape: a request near a logit tie may take the
        // other token; most may not.
        EXPECT_GE(same, static_cast<int64_t>(got.size()) - 2);
        EXPECT_GT(st.spec_num_drafts, 0);
        if (steer) {
          // Both outcomes occurred, and runs as long as K were accepted.
          EXPECT_GT(st.spec_num_accepted_tokens, 0);
          EXPECT_LT(st.spec_num_accepted_tokens, st.spec_num_draft_tokens);
          EXPECT_GT(st.spec_accepted_per_position[static_cast<size_t>(k - 1)], 0);
          if (same == static_cast<int64_t>(got.size())) drafter_log[eager] = s->log;
        }
        if (eager) {
          EXPECT_EQ(spec.runner().graph_steps(), 0);
          EXPECT_EQ(s->mtp().graph_steps(), 0);
        } else {
          // Decode steps here are verification steps (every decoding sequence has drafts): they
          // and the drafter's steps replayed graphs.
          EXPECT_GT(spec.runner().graph_steps(), st.spec_num_drafts / 10);
          EXPECT_GT(s->mtp().graph_steps(), 0);
        }
        // A recurrent target's verification rows kept their states for rollback (the plan
        // holds 1 + K slots per request).
        if (recurrent) {
          EXPECT_EQ(spec.kv_plan().state_slots_per_request, 1 + k);
        }
      }
    }
    // The drafter's own drafts under the same steered run: graphs against eager.
    if (drafter_log.size() == 2) {
      const auto& g = drafter_log[false];
      const auto& e = drafter_log[true];
      ASSERT_EQ(g.size(), e.size()) << "K = " << k;
      int64_t agree = 0;
      for (size_t i = 0; i < g.size(); ++i) agree += g[i] == e[i];
      std::printf("%s K=%d: drafter graphs vs eager: %lld of %zu drafts equal\n", fixture.c_str(),
                  k, static_cast<long long>(agree), g.size());
      EXPECT_GE(static_cast<double>(agree), 0.95 * static_cast<double>(g.size())) << "K = " << k;
    }
  }
}

TEST(GpuSpecDecode, GreedyOutputsAreTheTargetsWithGraphsAndEager) {
  greedy_outputs_are_the_targets("deepseek_v3_mtp", true);
}

// The hybrids: Qwen3-Next (gated delta net layers, MoE) and Qwen3.5 (gated delta net layers, its
// MTP head's fc over [embedding | hidden]); the recurrent state of rejected drafts is rolled back.
TEST(GpuHybridSpecDecode, Qwen3NextGreedyOutputsAreTheTargets) {
  greedy_outputs_are_the_targets("qwen3_next_mtp", false);
}
TEST(GpuHybridSpecDecode, Qwen35GreedyOutputsAreTheTargets) {
  greedy_outputs_are_the_targets("qwen3_5_mtp", false);
}

// A verification batch (K + 1 tokens per sequence) through the runner's graphs against eager:
// logits and the hidden states the drafter reads.
TEST(GpuSpecDecode, VerifyGraphsMatchEager) {
  LoadedModel m = model_load(fixture_dir("deepseek_v3_mtp"), on_gpu());
  Model& target = *m.model;
  RunnerOptions o;
  o.num_pages = 64;
  o.block_size = 4;
  o.max_model_len = 64;
  o.max_num_seqs = 8;
  o.num_speculative_tokens = 3;
  ModelRunner graphs(target, o);
  o.enforce_eager = true;
  ModelRunner eager(target, o);
  EXPECT_EQ(graphs.graph_query_lens(), (std::vector<int>{1, 4}));
  const int S = 3;
  std::vector<int> len(S, 0), len2(S, 0);
  std::vector<std::vector<int32_t>> prompts(S);
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < 5 + 3 * s; ++i) prompts[s].push_back((s * 37 + i * 11) % 500);
  Batch pb = append_step_batch(prompts, len);
  Batch pb2 = append_step_batch(prompts, len2);
  EXPECT_EQ(graphs.execute_greedy(pb), eager.execute_greedy(pb2));
  for (int step = 0; step < 4; ++step) {
    std::vector<std::vector<int32_t>> toks(S);
    for (int s = 0; s < S; ++s)
      for (int i = 0; i < 4; ++i) toks[s].push_back((step * 13 + s * 7 + i * 29) % 500);
    Batch b = append_step_batch(toks, len), b2 = append_step_batch(toks, len2);
    for (Batch* x : {&b, &b2}) {  // every row's logits, as a verification step asks
      x->logits_indices.clear();
      for (int i = 0; i < x->num_tokens(); ++i) x->logits_indices.push_back(i);
    }
    const int64_t before = graphs.graph_steps();
    const Tensor lg = graphs.execute(b), le = eager.execute(b2);
    EXPECT_EQ(graphs.graph_steps(), before + 1) << "step " << step;
    EXPECT_EQ(lg.size(0), S * 4);
    EXPECT_LE(rel_err(lg, le), 1e-2) << "step " << step;
    const Tensor hg = host(graphs.last_hidden()), he = host(eager.last_hidden());
    EXPECT_LE(rel_err(to_f32_cpu(hg), to_f32_cpu(he)), 1e-2) << "step " << step;
  }
}

// The same for a hybrid target (Qwen3-Next): its verification rows keep their recurrent states in
// rollback slots, and each step commits a different number of accepted rows (the committed slot
// swapped with the last accepted row's, the rejected rows' KV rewound), as the engine does; the
// graphs' padded batch must carry the rollback slots to the kernels.
TEST(GpuHybridSpecDecode, VerifyGraphsMatchEagerWithRollback) {
  LoadedModel m = model_load(fixture_dir("qwen3_next_mtp"), on_gpu());
  Model& target = *m.model;
  const int S = 3, K = 3;
  RunnerOptions o;
  o.num_pages = 64;
  o.block_size = 4;
  o.max_model_len = 64;
  o.max_num_seqs = 8;
  o.num_speculative_tokens = K;
  o.num_state_slots = S * (1 + K);
  ModelRunner graphs(target, o);
  o.enforce_eager = true;
  ModelRunner eager(target, o);
  EXPECT_EQ(graphs.graph_query_lens(), (std::vector<int>{1, K + 1}));
  // Sequence s's slots: slots[s][0] its state, the others its rows' kept states.
  std::vector<std::vector<int32_t>> slots(S);
  for (int s = 0; s < S; ++s) {
    slots[s].push_back(s);
    for (int r = 0; r < K; ++r) slots[s].push_back(S + K * s + r);
  }
  std::vector<int> len(S, 0), len2(S, 0);
  std::vector<std::vector<int32_t>> prompts(S);
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < 5 + 3 * s; ++i) prompts[s].push_back((s * 37 + i * 11) % 500);
  Batch pb = append_step_batch(prompts, len);
  Batch pb2 = append_step_batch(prompts, len2);
  EXPECT_EQ(graphs.execute_greedy(pb), eager.execute_greedy(pb2));
  for (int step = 0; step < 6; ++step) {
    std::vector<std::vector<int32_t>> toks(S);
    for (int s = 0; s < S; ++s)
      for (int i = 0; i <= K; ++i) toks[s].push_back((step * 13 + s * 7 + i * 29) % 500);
    Batch b = append_step_batch(toks, len), b2 = append_step_batch(toks, len2);
    for (Batch* x : {&b, &b2}) {  // every row's logits and rollback slots, as verification asks
      x->logits_indices.clear();
      for (int i = 0; i < x->num_tokens(); ++i) x->logits_indices.push_back(i);
      x->state_rollback_slots.clear();
      for (int s = 0; s < S; ++s) {
        x->state_slots[s] = slots[s][0];
        for (int r = 0; r <= K; ++r)
          x->state_rollback_slots.push_back(r < K ? slots[s][r + 1] : -1);
      }
    }
    const int64_t before = graphs.graph_steps();
    const Tensor lg = graphs.execute(b), le = eager.execute(b2);
    EXPECT_EQ(graphs.graph_steps(), before + 1) << "step " << step;
    EXPECT_EQ(lg.size(0), S * (K + 1));
    const double e = rel_err(lg, le);
    std::printf("hybrid verification step %d: logits graphs vs eager rel err %.3g\n", step, e);
    EXPECT_LE(e, 1e-2) << "step " << step;
    // Accept 1 + (step + s) % (K + 1) rows of sequence s: the state after the last accepted row
    // becomes its own, the rejected rows' tokens are dropped.
    for (int s = 0; s < S; ++s) {
      const int accepted = 1 + (step + s) % (K + 1);
      if (accepted <= K) std::swap(slots[s][0], slots[s][static_cast<size_t>(accepted)]);
      len[s] -= K + 1 - accepted;
      len2[s] -= K + 1 - accepted;
    }
  }
}

}  // namespace
}  // namespace atom::test
