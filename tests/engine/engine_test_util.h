// Helpers for the engine tests that run real models on the CPU.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/fixtures.h"
#include "common/reference_images.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "engine/sequence_runner.h"
#include "engine/spec_decode.h"
#include "models/loading.h"
#include "models/moonvit.h"

namespace atom::test {

// Models are loaded once per test program.
inline Model& fixture_model(const std::string& name) {
  static std::map<std::string, LoadedModel> cache;
  auto it = cache.find(name);
  if (it == cache.end())
    it = cache.emplace(name, model_load(fixture_dir(name), ModelOptions{})).first;
  return *it->second.model;
}

inline SamplingParams greedy(int max_tokens) { return SamplingParams::greedy_tokens(max_tokens); }

// A small cache for tests: the default 4 GiB cap is far more than these models need.
inline EngineConfig test_config() {
  EngineConfig c;
  c.max_num_seqs = 64;
  c.max_num_batched_tokens = 2048;
  c.max_model_len = 256;
  c.kv_cache_memory = int64_t{64} << 20;
  return c;
}

// A way to run a workload through the engine (the workload tests compare every request's tokens
// with a reference under each).
struct EngineScenario {
  std::string name;
  EngineConfig config;
  bool run_twice = false;  // the second pass hits the prefix cache
  bool expect_preemption = false;
};

inline EngineScenario scenario_one_batch() { return {"one_batch", test_config()}; }
// Prefill in chunks beside decodes: budgets of `seqs` sequences and `tokens` tokens a step.
inline EngineScenario scenario_chunked(int seqs, int tokens) {
  EngineScenario s{"chunked_mixed_steps", test_config()};
  s.config.max_num_seqs = seqs;
  s.config.max_num_batched_tokens = tokens;
  return s;
}
// `blocks` blocks of 16 tokens (8 hold one sequence of max_model_len 128): sequences preempted
// and recomputed.
inline EngineScenario scenario_preempted(int blocks, int seqs, int tokens) {
  EngineScenario s{"preempted", test_config()};
  s.config.max_model_len = 128;
  s.config.num_gpu_blocks_override = blocks;
  s.config.max_num_seqs = seqs;
  s.config.max_num_batched_tokens = tokens;
  s.expect_preemption = true;
  return s;
}
// Blocks of 4 tokens, the workload run twice: the second pass from the prefix cache.
inline EngineScenario scenario_prefix_cache(std::string name = "prefix_cache") {
  EngineScenario s{std::move(name), test_config()};
  s.config.block_size = 4;
  s.run_twice = true;
  return s;
}
// Recurrent models: their state checkpointed every 8 tokens into 8 checkpoint slots, so the
// second pass resumes prefixes from checkpoints, in chunks of `tokens` that end at the
// checkpoint boundaries.
inline EngineScenario scenario_state_checkpoints(int seqs, int tokens) {
  EngineScenario s = scenario_prefix_cache("prefix_cache_state_checkpoints");
  s.config.state_checkpoint_interval_tokens = 8;
  s.config.num_state_checkpoints = 8;
  s.config.max_num_seqs = seqs;
  s.config.max_num_batched_tokens = tokens;
  return s;
}

struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
};

// n greedy requests: prompts of mixed lengths in [1, max_len], about a third sharing a stem
// (prefix-cache hits), each asking for min_tokens..max_tokens new tokens.
inline Workload random_workload(int n, int max_len, int max_tokens, int64_t vocab, uint32_t seed,
                                int min_tokens = 1) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> stem(static_cast<size_t>(max_len));
  for (auto& t : stem) t = id(rng);
  Workload w;
  for (int i = 0; i < n; ++i) {
    const int len = 1 + static_cast<int>(rng() % static_cast<uint32_t>(max_len));
    std::vector<int32_t> p;
    if (i % 3 == 0) p.assign(stem.begin(), stem.begin() + len);
    while (static_cast<int>(p.size()) < len) p.push_back(id(rng));
    w.prompts.push_back(p);
    w.params.push_back(greedy(
        min_tokens + static_cast<int>(rng() % static_cast<uint32_t>(max_tokens - min_tokens + 1))));
  }
  return w;
}

// Prompts with images (Kimi-K2.5's kimi_k25 fixture).
struct ImageFixture {
  std::vector<int32_t> prompt;  // one placeholder per image
  std::vector<int32_t> expanded;
  std::vector<PromptImage> images;
  int64_t image_token = 0;
};

// Text around and between the two images of the kimi_k25 fixture's torch reference (an 8 x 8 and
// a 2 x 6 grid), one placeholder each.
// A reference's images as the engine takes them (owned copies).
inline std::vector<PromptImage> prompt_images_of(const ReferenceImages& r) {
  std::vector<PromptImage> images;
  for (size_t i = 0; i < r.grids.size(); ++i) images.push_back({r.patches(i).clone(), r.grids[i]});
  return images;
}

inline ImageFixture image_fixture() {
  ImageFixture x;
  x.images = prompt_images_of(reference_images("kimi_k25_torch"));
  VisionEncoder* v = fixture_model("kimi_k25").vision_encoder();
  x.image_token = v->image_token_id();
  const int32_t img = static_cast<int32_t>(x.image_token);
  x.prompt = {0, 11, 12, 13, 14, 15, 16, 17, 18, img, 21, 22, 23, img, 31, 32, 33, 34, 35, 36, 37};
  size_t next = 0;
  for (int32_t t : x.prompt) {
    if (t != img) {
      x.expanded.push_back(t);
      continue;
    }
    const PromptImage& im = x.images[next++];
    x.expanded.insert(x.expanded.end(), static_cast<size_t>(v->tokens_for(im.grid)), img);
  }
  return x;
}

inline void expect_engine_idle(const LLMEngine& e) {
  EXPECT_FALSE(e.has_unfinished());
  EXPECT_EQ(e.num_requests(), 0);
  EXPECT_EQ(e.block_manager().num_free_blocks(), e.block_manager().num_blocks());
  EXPECT_EQ(e.state_pool().num_free(), e.state_pool().num_slots());
  e.block_manager().check_invariants();
}

// The reference prompt alone through `engine`: transformers' greedy tokens, the engine idle after.
inline void expect_alone_gives_reference(LLMEngine& engine, const Reference& ref) {
  const auto out =
      engine.generate({ref.greedy_prompt}, greedy(static_cast<int>(ref.greedy_tokens.size())));
  EXPECT_EQ(out.at(0).outputs.at(0).token_ids, ref.greedy_tokens);
  expect_engine_idle(engine);
}

// Every request of `got` has the tokens of the same request in `want` (pass: for the message);
// returns the prompt tokens `got`'s requests found in the prefix cache.
inline int expect_same_tokens(const std::vector<RequestOutput>& got,
                              const std::vector<RequestOutput>& want, int pass) {
  EXPECT_EQ(got.size(), want.size());
  int cached = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    EXPECT_EQ(got[i].outputs.at(0).token_ids, want[i].outputs.at(0).token_ids)
        << "request " << i << " pass " << pass;
    cached += got[i].outputs.at(0).num_cached_tokens;
  }
  return cached;
}

// log_softmax of one row, in long double.
inline std::vector<double> log_softmax(const float* row, int64_t V) {
  long double mx = row[0], sum = 0;
  for (int64_t i = 1; i < V; ++i) mx = std::max<long double>(mx, row[i]);
  for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<long double>(row[i]) - mx);
  const long double lse = mx + std::log(sum);
  std::vector<double> r(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) r[static_cast<size_t>(i)] = static_cast<double>(row[i] - lse);
  return r;
}

// Checks one returned logprob entry against log_softmax(row) of the model's own logits.
inline void expect_logprob_matches(const TokenLogprob& got, const float* row, int64_t V,
                                   int32_t token, int top, const std::string& where) {
  const auto ls = log_softmax(row, V);
  EXPECT_EQ(got.token_id, token) << where;
  EXPECT_NEAR(got.logprob, ls[static_cast<size_t>(token)], 1e-4) << where;
  int rank = 1;
  for (double x : ls) rank += x > ls[static_cast<size_t>(token)];
  EXPECT_EQ(got.rank, rank) << where;
  ASSERT_EQ(static_cast<int>(got.top.size()), top) << where;
  for (int i = 0; i < top; ++i) {
    EXPECT_NEAR(got.top[i].logprob, ls[static_cast<size_t>(got.top[i].token_id)], 1e-4) << where;
    if (i > 0) {
      EXPECT_LE(got.top[i].logprob, got.top[i - 1].logprob) << where;
    }
  }
  // Nothing outside the list beats its last entry.
  if (top > 0) {
    int better = 0;
    for (double x : ls) better += x > got.top[top - 1].logprob + 1e-6;
    EXPECT_LE(better, top - 1) << where;
  }
}

// Proposes the continuation the test knows (the target's own output), with a planted mistake in
// about one proposal of `bad_every` (0: none).
class OracleProposer : public DraftProposer {
 public:
  OracleProposer(std::map<std::vector<int32_t>, std::vector<int32_t>> expected, int64_t vocab,
                 int bad_every)
      : expected_(std::move(expected)), vocab_(vocab), bad_every_(bad_every) {}
  void propose(const Tensor&, std::span<const DraftRequest> reqs, int,
               std::vector<std::vector<int32_t>>& drafts) override {
    drafts.assign(reqs.size(), {});
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Sequence& seq = *reqs[i].seq;
      const std::vector<int32_t> prompt(seq.tokens.begin(),
                                        seq.tokens.begin() + seq.num_prompt_tokens);
      auto it = expected_.find(prompt);
      const int n = seq.num_output_tokens();
      for (int j = 0; j < reqs[i].num_drafts; ++j) {
        const size_t at = static_cast<size_t>(n + j);
        int32_t t = it != expected_.end() && at < it->second.size() ? it->second[at] : 3;
        if (bad_every_ > 0 && (calls_ + i + static_cast<size_t>(j)) % bad_every_ == 0)
          t = static_cast<int32_t>((t + 1) % vocab_);
        drafts[i].push_back(t);
      }
    }
    ++calls_;
  }

 private:
  std::map<std::vector<int32_t>, std::vector<int32_t>> expected_;
  int64_t vocab_;
  int bad_every_;
  size_t calls_ = 0;
};

inline std::map<std::vector<int32_t>, std::vector<int32_t>> by_prompt(
    const Workload& w, const std::vector<std::vector<int32_t>>& outs) {
  std::map<std::vector<int32_t>, std::vector<int32_t>> m;
  for (size_t i = 0; i < w.prompts.size(); ++i)
    if (!m.count(w.prompts[i]) || m[w.prompts[i]].size() < outs[i].size())
      m[w.prompts[i]] = outs[i];
  return m;
}

}  // namespace atom::test
