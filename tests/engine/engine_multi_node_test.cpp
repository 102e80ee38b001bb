// A model over several nodes on CPU ranks (--nnodes, dist/nodes.h): each node a Nodes object and
// its ModelGroup on threads of this test, talking over loopback TCP as separate hosts' processes
// do; the head (node 0) runs the sequence runner or the engine, the workers follow its commands
// (tp_runner_follow). Logits, greedy tokens and whole engine workloads (batched, chunked,
// preempted, prefix-cached with state checkpoints) equal the same ranks in one process bit for bit:
// collectives sum and gather in rank order on every node. The CLI's two-process run is in
// engine_cli_test.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <thread>

#include "common/fixtures.h"
#include "common/nodes_util.h"
#include "common/test_util.h"
#include "engine/tp_runner.h"
#include "models/draft_model.h"
#include "engine_test_util.h"
#include "models/model_group.h"

namespace atom::test {
namespace {

struct NodesCase {
  std::string fixture;
  int tp, pp, nnodes;
  bool ep = false;
};

void PrintTo(const NodesCase& c, std::ostream* os) {
  *os << c.fixture << " tp " << c.tp << " pp " << c.pp << " over " << c.nnodes << " nodes"
      << (c.ep ? " ep" : "");
}

ModelOptions options(const NodesCase& c) {
  ModelOptions o;
  o.pp_size = c.pp;
  o.expert_parallel = c.ep;
  return o;
}

// Loads the case on every node at once; runs head(group) on node 0 while the workers follow.
void run_on_nodes(const NodesCase& c, const std::function<void(ModelGroup&)>& head) {
  on_nodes(
      c.nnodes,
      [&](Nodes& nodes) {
        auto group =
            model_group_load(fixture_dir(c.fixture), options(c), c.tp, LoadFormat::kAuto, &nodes);
        EXPECT_EQ(group->is_worker(), nodes.rank() != 0);
        if (nodes.rank() == 0)
          head(*group);
        else
          tp_runner_follow(*group);
      },
      120);
}

class MultiNode : public ::testing::TestWithParam<NodesCase> {};

TEST_P(MultiNode, LogitsAndGreedyTokensEqualOneProcess) {
  const NodesCase c = GetParam();
  const Reference ref = reference_load(c.fixture);
  auto one = model_group_load(fixture_dir(c.fixture), options(c), c.tp);
  const Tensor want = score_tokens(*one, ref.input_ids);
  const Tensor want_chunked = score_tokens(*one, ref.input_ids, /*chunk=*/5, /*block_size=*/4);
  const GreedyResult want_greedy = generate_greedy(
      *one, ref.greedy_prompt, static_cast<int>(ref.greedy_tokens.size()), {}, true);
  one.reset();
  Tensor got, got_chunked;
  GreedyResult got_greedy;
  run_on_nodes(c, [&](ModelGroup& g) {
    EXPECT_TRUE(g.holds(g.leader()));
    int held = 0;
    for (int r = 0; r < g.world_size(); ++r) held += g.holds(r) ? 1 : 0;
    EXPECT_EQ(held, g.world_size() / c.nnodes);
    // Three runners built and destroyed one after another on every node.
    got = score_tokens(g, ref.input_ids);
    got_chunked = score_tokens(g, ref.input_ids, 5, 4);
    got_greedy =
        generate_greedy(g, ref.greedy_prompt, static_cast<int>(ref.greedy_tokens.size()), {}, true);
  });
  expect_logits_near(got, want, 0.0f, "whole prompt over nodes");
  expect_logits_near(got_chunked, want_chunked, 0.0f, "chunks over nodes");
  expect_cpu_parity(got, ref.logits, c.fixture, "over nodes vs transformers");
  EXPECT_EQ(got_greedy.token_ids, want_greedy.token_ids);
  EXPECT_EQ(got_greedy.token_ids, ref.greedy_tokens);
}

TEST_P(MultiNode, EngineWorkloadsEqualOneProcess) {
  const NodesCase c = GetParam();
  auto one = model_group_load(fixture_dir(c.fixture), options(c), c.tp);
  const Workload w = random_workload(10, 40, 8, one->model().vocab_size(), 31);
  EngineConfig batched = test_config();
  EngineConfig tight = test_config();  // chunked prefill and preemption
  tight.max_num_seqs = 6;
  tight.max_num_batched_tokens = 24;
  tight.max_model_len = 96;
  tight.num_gpu_blocks_override = 7;
  // Prefix caching with the recurrent state's checkpoints (restored by the steps' state copies):
  // the workload twice, the second pass hitting the first's blocks.
  EngineConfig cached = test_config();
  cached.block_size = 4;
  cached.state_checkpoint_interval_tokens = 8;
  const std::vector<EngineConfig> configs = {batched, tight, cached};
  auto run = [&](LLMEngine& engine, const EngineConfig& e) {
    std::vector<std::vector<int32_t>> tokens;
    for (int pass = 0; pass < (e.state_checkpoint_interval_tokens ? 2 : 1); ++pass)
      for (const auto& o : engine.generate(w.prompts, w.params))
        tokens.push_back(o.outputs.at(0).token_ids);
    return tokens;
  };
  std::vector<std::vector<std::vector<int32_t>>> want;
  for (const EngineConfig& e : configs) {
    LLMEngine engine(*one, e);
    want.push_back(run(engine, e));
  }
  one.reset();
  run_on_nodes(c, [&](ModelGroup& g) {
    for (size_t i = 0; i < configs.size(); ++i) {
      LLMEngine engine(g, configs[i]);
      const auto got = run(engine, configs[i]);
      ASSERT_EQ(got.size(), want[i].size());
      for (size_t r = 0; r < got.size(); ++r)
        EXPECT_EQ(got[r], want[i][r]) << "config " << i << " request " << r;
      if (configs[i].num_gpu_blocks_override) {
        EXPECT_GT(engine.stats().num_preemptions, 0);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, MultiNode,
    ::testing::Values(NodesCase{"llama3_gqa", 2, 1, 2},     // one stage's ranks on two nodes
                      NodesCase{"llama3_gqa", 1, 3, 3},     // a stage per node, links across
                      NodesCase{"qwen3_moe", 2, 2, 2},      // stage 0 on node 1, stage 1 on node 0
                      NodesCase{"mixtral", 4, 1, 2, true},  // experts split over nodes
                      NodesCase{"qwen3_next", 2, 1, 2}),    // recurrent state on every node
    [](const auto& info) {
      const NodesCase& c = info.param;
      return fmt::format("{}_tp{}_pp{}_nodes{}{}", c.fixture, c.tp, c.pp, c.nnodes,
                         c.ep ? "_ep" : "");
    });

// Speculative decoding over nodes: the drafter runs whole on the head (which holds the leader) and
// gathers the target's embedding and head from every rank, the workers answering for theirs
// (with -pp 2 the embedding is on the worker). The drafter's tensors are the one-process group's
// bit for bit, and the tokens with K = 1 and 3 equal plain decoding's, with the same draft and
// accepted counts as one process.
// Prompts with images over two nodes (tp 2, a rank each): the features computed on the head
// travel in the step's bytes to the worker's rank, whose embedding layer writes them too; the
// engine's outputs equal one process's, and differ from the same prompts without the images.
TEST(MultiNodeImages, ImagePromptsEqualOneProcess) {
  const NodesCase c{"kimi_k25", 2, 1, 2};
  const ImageFixture x = image_fixture();
  std::vector<std::vector<PromptImage>> images = {x.images, x.images};
  Tensor other = x.images[0].pixel_values.clone();  // another image on the same grid
  for (int64_t i = 0; i < other.numel(); ++i) other.ptr<float>()[i] = -other.ptr<float>()[i];
  images[1][0].pixel_values = other;
  auto run = [&](LLMEngine& engine) {
    for (size_t i = 0; i < images.size(); ++i)
      engine.add_request("img" + std::to_string(i), x.prompt, greedy(8), images[i]);
    engine.add_request("txt", {5, 6, 7, 8}, greedy(8));
    std::map<std::string, std::vector<int32_t>> out;
    while (engine.has_unfinished())
      for (RequestOutput& o : engine.step().finished) out[o.request_id] = o.outputs.at(0).token_ids;
    return out;
  };
  auto one = model_group_load(fixture_dir(c.fixture), options(c), c.tp);
  std::map<std::string, std::vector<int32_t>> want;
  {
    LLMEngine engine(*one, test_config());
    want = run(engine);
  }
  one.reset();
  ASSERT_EQ(want.size(), 3u);
  EXPECT_NE(want["img0"], want["img1"]) << "the images do not change the output: a weak test";
  run_on_nodes(c, [&](ModelGroup& g) {
    LLMEngine engine(g, test_config());
    EXPECT_EQ(run(engine), want);
  });
}

TEST(MultiNodeSpec, DrafterOnTheHeadMatchesOneProcess) {
  for (const NodesCase& c :
       {NodesCase{"deepseek_v3_mtp", 2, 1, 2}, NodesCase{"qwen3_next_mtp", 1, 2, 2}}) {
    SCOPED_TRACE(c.fixture);
    auto one = model_group_load(fixture_dir(c.fixture), options(c), c.tp);
    LoadedDrafter d1 = drafter_load(fixture_dir(c.fixture), *one, ModelOptions{});
    const Workload w = random_workload(6, 30, 12, one->model().vocab_size(), 71);
    std::vector<std::vector<int32_t>> plain;
    {
      LLMEngine e(*one, test_config());
      for (const auto& o : e.generate(w.prompts, w.params))
        plain.push_back(o.outputs.at(0).token_ids);
    }
    std::vector<EngineStats> want_stats;
    for (int k : {1, 3}) {
      EngineConfig sc = test_config();
      sc.speculative_method = "mtp";
      sc.num_speculative_tokens = k;
      LLMEngine e(*one, sc, {}, {}, d1.model.get());
      e.generate(w.prompts, w.params);
      want_stats.push_back(e.stats());
    }
    run_on_nodes(c, [&](ModelGroup& g) {
      LoadedDrafter d = drafter_load(fixture_dir(c.fixture), g, ModelOptions{});
      EXPECT_EQ(d.shared, d1.shared);
      EXPECT_FALSE(d.shared.empty());
      for (const std::string& n : d.shared)
        EXPECT_EQ(
            max_abs_diff(d.model->params().find(n)->data(), d1.model->params().find(n)->data()),
            0.0f)
            << n;
      size_t i = 0;
      for (int k : {1, 3}) {
        EngineConfig sc = test_config();
        sc.speculative_method = "mtp";
        sc.num_speculative_tokens = k;
        LLMEngine e(g, sc, {}, {}, d.model.get());
        const auto out = e.generate(w.prompts, w.params);
        for (size_t r = 0; r < out.size(); ++r)
          EXPECT_EQ(out[r].outputs.at(0).token_ids, plain[r]) << "K " << k << " request " << r;
        EXPECT_GT(e.stats().spec_num_drafts, 0);
        EXPECT_EQ(e.stats().spec_num_drafts, want_stats[i].spec_num_drafts) << "K " << k;
        EXPECT_EQ(e.stats().spec_num_accepted_tokens, want_stats[i].spec_num_accepted_tokens)
            << "K " << k;
        ++i;
      }
    });
  }
}

// Each node's error from loading llama3_gqa with tp_of(node) ranks over 2 nodes ("" if it loaded).
std::vector<std::string> load_errors(const std::function<int(int node)>& tp_of) {
  std::vector<std::string> errors(2);
  on_nodes(2, [&](Nodes& nodes) {
    try {
      model_group_load(fixture_dir("llama3_gqa"), {}, tp_of(nodes.rank()), LoadFormat::kAuto,
                       &nodes);
    } catch (const Error& e) {
      errors[static_cast<size_t>(nodes.rank())] = e.what();
    }
  });
  return errors;
}

// Nodes started with other flags than the head's are named before any weight is read.
TEST(MultiNodeErrors, MismatchedFlagsAndUnevenSplitsAreNamed) {
  for (const std::string& e : load_errors([](int node) { return node == 0 ? 2 : 4; }))
    EXPECT_NE(e.find("node 1 was started with other model and parallel flags"), std::string::npos)
        << e;
  // 3 ranks do not split over 2 nodes: each node says so before reading anything.
  for (const std::string& e : load_errors([](int) { return 3; }))
    EXPECT_NE(e.find("= 3 ranks do not split evenly over --nnodes 2"), std::string::npos) << e;
  // A node that never joins is named after the timeout.
  NodeOptions two;
  two.nnodes = 2;
  two.master_port = free_port();
  two.timeout_s = 0.5;
  EXPECT_ERROR_CONTAINS(Nodes{two}, "node 1 did not join within 0.5 s");
}

}  // namespace
}  // namespace atom::test
