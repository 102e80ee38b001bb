// The per-request state slot pool, exercised by the test-only recurrent architecture: batched,
// chunked and preempted runs give the one-shot single-sequence outputs and logits; the pool is
// reserved before the paged cache is sized; slots come back on finish and abort.
#include "common/test_util.h"
#include "engine/model_runner.h"
#include "engine_test_util.h"

namespace atom::test {
namespace {

// AtomTestRecurrentForCausalLM (test_recurrent_model.cpp) with seeded random weights.
Model& recurrent_model() {
  static LoadedModel m =
      model_load(std::string(ATOM_SOURCE_DIR) + "/tests/engine/fixtures/test_recurrent",
                 ModelOptions{}, LoadFormat::kDummy);
  return *m.model;
}

TEST(EngineState, ModelDeclaresItsStateAndChunkedScoringMatchesOneShot) {
  Model& model = recurrent_model();
  ASSERT_EQ(model.state_specs().size(), 2u);  // two recurrent layers
  std::vector<int32_t> t;
  for (int i = 0; i < 45; ++i) t.push_back(3 + (i * 53) % 500);
  const Tensor one = score_tokens(model, t);
  const Tensor chunked = score_tokens(model, t, /*chunk=*/7, /*block_size=*/4);
  EXPECT_EQ(max_abs_diff(one, chunked), 0.0f) << "state must carry across chunks exactly";
}

// A runner of a recurrent model without state slots would have its kernels write each sequence's
// state past the end of an empty pool (GLM-5.3's benchmark on CUDA: an illegal address at 32
// sequences); it is refused, and a step naming a slot outside the pool is refused too.
TEST(EngineState, RunnerNeedsStateSlotsAndRefusesOnesOutsideThePool) {
  Model& model = recurrent_model();
  try {
    ModelRunner runner(model, 8, 4, /*num_state_slots=*/0);
    ADD_FAILURE() << "a recurrent model ran without state slots";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_state_slots is 0"), std::string::npos) << e.what();
  }
  ModelRunner runner(model, 8, 4, /*num_state_slots=*/2);
  Batch b;
  b.block_size = 4;
  b.token_ids = {5, 6, 7};
  b.positions = {0, 1, 2};
  b.query_start = {0, 3};
  b.context_lens = {3};
  b.slot_mapping = {0, 1, 2};
  b.page_indptr = {0, 1};
  b.page_indices = {0};
  b.logits_indices = {2};
  b.max_query_len = 3;
  b.max_context_len = 3;
  for (int32_t slot : {1, 2}) {
    b.state_slots = {slot};
    if (slot < 2) {
      EXPECT_EQ(runner.execute(b).size(0), 1);
      continue;
    }
    try {
      runner.execute(b);
      ADD_FAILURE() << "state slot 2 of a pool of 2 was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("state slot 2 outside the pool's 2 slots"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(EngineState, BatchedChunkedPreemptedMatchOneShot) {
  Model& model = recurrent_model();
  Workload w = random_workload(24, 70, 16, model.vocab_size(), 23);
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < w.prompts.size(); ++i)
    want.push_back(
        generate_greedy(model, w.prompts[i], w.params[i].max_tokens, {}, true).token_ids);

  EngineConfig batched = test_config();
  EngineConfig chunked = test_config();
  chunked.max_num_seqs = 5;
  chunked.max_num_batched_tokens = 8;
  EngineConfig preempt = test_config();
  preempt.max_model_len = 96;
  preempt.num_gpu_blocks_override = 7;
  preempt.max_num_seqs = 6;
  preempt.max_num_batched_tokens = 24;
  preempt.num_speculative_tokens = 2;  // three slots per request: committed + two rollback
  for (const EngineConfig& c : {batched, chunked, preempt}) {
    LLMEngine engine(model, c);
    EXPECT_FALSE(engine.block_manager().prefix_caching()) << "recurrent models need checkpoints";
    EXPECT_EQ(engine.state_pool().num_slots(), c.max_num_seqs * (1 + c.num_speculative_tokens));
    EXPECT_EQ(engine.state_pool().slots_per_request(), 1 + c.num_speculative_tokens);
    const auto out = engine.generate(w.prompts, w.params);
    for (size_t i = 0; i < out.size(); ++i)
      EXPECT_EQ(out[i].outputs.at(0).token_ids, want[i]) << "request " << i;
    if (c.num_gpu_blocks_override) {
      EXPECT_GT(engine.stats().num_preemptions, 0);
    }
    expect_engine_idle(engine);
  }
}

TEST(EngineState, LogprobsMatchOneShotLogitsUnderChunking) {
  Model& model = recurrent_model();
  const int64_t V = model.vocab_size();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 33; ++i) prompt.push_back(3 + (i * 29) % 500);
  EngineConfig c = test_config();
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = 3;
  c.long_prefill_token_threshold = 6;
  LLMEngine engine(model, c);
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 3;
  p.max_tokens = 10;
  p.logprobs = 2;
  p.prompt_logprobs = 1;
  Workload w = random_workload(4, 40, 10, V, 1);
  w.prompts.push_back(prompt);
  w.params.push_back(p);
  const RequestOutput o = engine.generate(w.prompts, w.params).back();
  const auto& out = o.outputs.at(0);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), out.token_ids.begin(), out.token_ids.end() - 1);
  const Tensor logits = score_tokens(model, all);
  const int P = static_cast<int>(prompt.size());
  for (size_t i = 0; i < out.token_ids.size(); ++i)
    expect_logprob_matches(out.logprobs.at(i), logits.ptr<float>() + (P - 1 + i) * V, V,
                           out.token_ids[i], 2, "output " + std::to_string(i));
  for (int j = 1; j < P; ++j)
    expect_logprob_matches(*o.prompt_logprobs.at(j), logits.ptr<float>() + (j - 1) * V, V,
                           prompt[j], 1, "prompt " + std::to_string(j));
}

TEST(EngineState, PoolIsReservedBeforeThePagedCacheIsSized) {
  Model& model = recurrent_model();
  EngineConfig c = test_config();
  c.max_num_seqs = 8;
  c.kv_cache_memory = 200000;  // below the cap of 8 sequences x 16 blocks
  const KvCachePlan plan = kv_cache_plan(model, c);
  EXPECT_EQ(plan.state_slot_bytes, 2u * 64 * sizeof(float));
  EXPECT_EQ(plan.num_state_slots, 8);
  EXPECT_EQ(plan.num_blocks,
            static_cast<int>((c.kv_cache_memory - plan.num_state_slots * plan.state_slot_bytes) /
                             plan.block_bytes));
  // One attention layer: K and V of 2 heads x 16 dims, F32, 16 tokens.
  EXPECT_EQ(plan.block_bytes, 2u * 16 * 2 * 16 * 4);
}

TEST(EngineState, AbortReturnsStateSlots) {
  Model& model = recurrent_model();
  EngineConfig c = test_config();
  c.max_num_seqs = 3;
  c.max_num_batched_tokens = 8;
  LLMEngine engine(model, c);
  for (int i = 0; i < 6; ++i)
    engine.add_request(std::to_string(i), {3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, greedy(20));
  for (int i = 0; i < 4; ++i) engine.step();
  EXPECT_EQ(engine.state_pool().num_free(), engine.state_pool().num_slots() - 3);
  for (int i = 0; i < 6; ++i) engine.abort(std::to_string(i));
  expect_engine_idle(engine);
}

// Speculative decoding rolls recurrent state back through rollback slots, which this test layer
// does not fill (StateCacheSpec::rollback_rows): refused by name.
class NoProposals : public DraftProposer {
 public:
  void propose(const Tensor&, std::span<const DraftRequest> reqs, int,
               std::vector<std::vector<int32_t>>& drafts) override {
    drafts.assign(reqs.size(), {});
  }
};

TEST(EngineState, SpeculativeDecodingNeedsRollbackRows) {
  EngineConfig c = test_config();
  c.num_speculative_tokens = 2;
  LLMEngine engine(recurrent_model(), c);
  EXPECT_ERROR_CONTAINS(engine.set_proposer(std::make_unique<NoProposals>()),
                        "keep no state per row");
}

}  // namespace
}  // namespace atom::test
