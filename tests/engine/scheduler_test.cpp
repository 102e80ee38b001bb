// Scheduler over randomized workloads, without a model: budgets are never exceeded, steps mix
// decodes and prefill chunks, preemption and prefix caching never hand a sequence wrong KV, FCFS
// admission, and abort at every stage returns every block and state slot.
//
// A "model" stands in: the next token is a hash of the whole sequence so far, and computing a
// position writes a fingerprint of the prefix into a shadow KV cache. Before a step computes
// position p, every context position < p must hold this sequence's fingerprint, which is what
// attention would read. Outputs must equal those of the same request run alone.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "core/error.h"

namespace atom {
namespace {

uint64_t fingerprint(const std::vector<int32_t>& t, int upto) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i <= upto; ++i) h = (h ^ static_cast<uint64_t>(t[i] + 1)) * 1099511628211ull;
  return h;
}

int32_t fake_next_token(const std::vector<int32_t>& t) {
  return static_cast<int32_t>(fingerprint(t, static_cast<int>(t.size()) - 1) % 11);
}

struct Sim {
  SchedulerConfig cfg;
  BlockManager bm;
  StatePool pool;
  Scheduler sched;
  std::vector<uint64_t> shadow;
  std::vector<std::unique_ptr<Request>> reqs;
  bool saw_mixed_step = false;
  int64_t steps = 0;

  Sim(SchedulerConfig c, int blocks, int bs, bool caching, int state_slots = 0, int partitions = 1)
      : cfg(c),
        bm(blocks, bs, caching, block_hash_xxh64, partitions),
        pool(state_slots, state_slots > 0 ? 1 : 0),
        sched(c, bm, pool),
        shadow(static_cast<size_t>(blocks) * bs, 0) {}

  Sequence* add(std::vector<int32_t> prompt, int max_tokens) {
    auto r = std::make_unique<Request>();
    r->params.max_tokens = max_tokens;
    r->prompt = prompt;
    auto s = std::make_unique<Sequence>();
    s->request = r.get();
    s->num_prompt_tokens = static_cast<int>(prompt.size());
    s->tokens = std::move(prompt);
    Sequence* p = s.get();
    r->seqs.push_back(std::move(s));
    reqs.push_back(std::move(r));
    sched.add(p);
    return p;
  }

  void step() {
    const SchedulerOutput& so = sched.schedule();
    ++steps;
    ASSERT_LE(static_cast<int>(so.seqs.size()), cfg.max_num_seqs);
    ASSERT_LE(so.num_tokens, cfg.max_num_batched_tokens);
    ASSERT_LE(sched.num_running(), cfg.max_num_seqs);
    int sum = 0;
    bool decode = false, prefill = false;
    std::set<Sequence*> seen;
    const int bs = bm.block_size();
    for (const ScheduledSeq& s : so.seqs) {
      ASSERT_TRUE(seen.insert(s.seq).second) << "a sequence scheduled twice in one step";
      ASSERT_GE(s.num_new_tokens, 1);
      ASSERT_EQ(s.seq->status, SeqStatus::kRunning);
      sum += s.num_new_tokens;
      Sequence& q = *s.seq;
      const int start = q.num_computed_tokens, end = start + s.num_new_tokens;
      ASSERT_LE(end, q.num_tokens());
      for (int32_t b : q.block_table)
        ASSERT_EQ(bm.partition_of(b), q.partition) << "a block of another partition";
      ASSERT_GE(static_cast<int>(q.block_table.size()) * bs, end);
      if (pool.enabled()) {
        ASSERT_EQ(q.state_slots.size(), 1u);
      }
      // What attention would read must be this sequence's own prefix.
      for (int p = 0; p < start; ++p) {
        const int b = q.block_table[static_cast<size_t>(p / bs)];
        ASSERT_EQ(shadow[static_cast<size_t>(b) * bs + p % bs], fingerprint(q.tokens, p))
            << "stale or foreign KV at position " << p;
      }
      for (int p = start; p < end; ++p) {
        const int b = q.block_table[static_cast<size_t>(p / bs)];
        ASSERT_EQ(bm.ref_count(b), 1) << "writing into a shared block";
        shadow[static_cast<size_t>(b) * bs + p % bs] = fingerprint(q.tokens, p);
      }
      (end - start == 1 && start >= q.num_prompt_tokens ? decode : prefill) = true;
    }
    ASSERT_EQ(sum, so.num_tokens);
    saw_mixed_step |= decode && prefill;
    sched.step_done();
    for (const ScheduledSeq& s : so.seqs) {
      Sequence& q = *s.seq;
      if (q.num_computed_tokens < q.num_tokens()) continue;  // mid-prefill
      q.tokens.push_back(fake_next_token(q.tokens));
      if (q.num_output_tokens() >= q.params().max_tokens) sched.finish(&q);
    }
    bm.check_invariants();
  }

  void run_to_end(int max_steps = 100000) {
    while (sched.has_unfinished() && steps < max_steps) {
      step();
      if (::testing::Test::HasFatalFailure()) return;
    }
    ASSERT_FALSE(sched.has_unfinished()) << "no progress";
  }
};

std::vector<int32_t> alone_output(std::vector<int32_t> prompt, int max_tokens) {
  std::vector<int32_t> t = std::move(prompt);
  const size_t p = t.size();
  for (int i = 0; i < max_tokens; ++i) t.push_back(fake_next_token(t));
  return {t.begin() + static_cast<std::ptrdiff_t>(p), t.end()};
}

// partitions > 1: data-parallel attention's block partitions, each able to hold a sequence.
void random_workloads(int partitions) {
  int64_t preemptions = 0, hits = 0;
  bool mixed = false;
  std::set<int> used_partitions;
  for (int trial = 0; trial < 60; ++trial) {
    std::mt19937 rng(7 + trial);
    SchedulerConfig c;
    c.max_num_seqs = 1 + static_cast<int>(rng() % 8);
    c.max_num_batched_tokens = c.max_num_seqs + static_cast<int>(rng() % 48);
    c.long_prefill_token_threshold = trial % 3 == 0 ? 1 + static_cast<int>(rng() % 8) : 0;
    const int bs = 1 + static_cast<int>(rng() % 4);
    const int max_len = 48;
    const int blocks = partitions * ((max_len + bs - 1) / bs + static_cast<int>(rng() % 24));
    Sim sim(c, blocks, bs, trial % 5 != 4, trial % 2 ? c.max_num_seqs : 0, partitions);
    std::vector<std::vector<int32_t>> stems(3);
    for (auto& st : stems)
      for (int i = 0; i < 30; ++i) st.push_back(static_cast<int32_t>(rng() % 5));
    std::vector<std::pair<Sequence*, std::vector<int32_t>>> expect;
    const int num_requests = 10 + static_cast<int>(rng() % 30);
    for (int r = 0; r < num_requests; ++r) {
      std::vector<int32_t> prompt = stems[rng() % 3];
      prompt.resize(1 + rng() % 30);
      const int max_tokens = 1 + static_cast<int>(rng() % (max_len - prompt.size()));
      expect.emplace_back(sim.add(prompt, max_tokens), alone_output(prompt, max_tokens));
      // Arrivals interleave with steps.
      for (int k = static_cast<int>(rng() % 3); k > 0 && sim.sched.has_unfinished(); --k) {
        sim.step();
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
    sim.run_to_end();
    if (::testing::Test::HasFatalFailure()) return;
    for (const auto& [seq, out] : expect) used_partitions.insert(seq->partition);
    for (const auto& [seq, out] : expect)
      ASSERT_EQ(
          std::vector<int32_t>(seq->tokens.begin() + seq->num_prompt_tokens, seq->tokens.end()),
          out)
          << "trial " << trial;
    EXPECT_EQ(sim.bm.num_free_blocks(), sim.bm.num_blocks());
    EXPECT_EQ(sim.pool.num_free(), sim.pool.num_slots());
    preemptions += sim.sched.stats().num_preemptions;
    hits += sim.sched.stats().prefix_cache_hits;
    mixed |= sim.saw_mixed_step;
  }
  EXPECT_GT(preemptions, 0) << "the workloads should exercise preemption";
  EXPECT_GT(hits, 0) << "the workloads should exercise prefix hits";
  EXPECT_TRUE(mixed) << "some step should mix decodes and prefill chunks";
  EXPECT_EQ(static_cast<int>(used_partitions.size()), partitions) << "some partition never used";
}

TEST(Scheduler, RandomWorkloadsRespectBudgetsAndKeepKvConsistent) { random_workloads(1); }

TEST(Scheduler, PartitionedRandomWorkloadsKeepEachSequenceInItsPartition) {
  random_workloads(2);
  random_workloads(3);
}

// Data-parallel attention's partitions: a new sequence goes where its prefix is cached, else to
// the partition with the most free blocks; a sequence that needs a block preempts one of its own
// partition, never another's.
TEST(Scheduler, PartitionsPlaceByCachedPrefixThenFreeBlocksAndPreemptWithin) {
  SchedulerConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  Sim sim(c, /*blocks=*/16, /*bs=*/4, true, 0, /*partitions=*/2);  // 8 blocks each
  const std::vector<int32_t> stem = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
  Sequence* a = sim.add(stem, 4);  // 3 blocks, then a fourth
  sim.step();
  EXPECT_EQ(a->partition, 0) << "ties go to the lowest partition";
  Sequence* b = sim.add({7, 7, 7, 7, 7}, 2);
  sim.step();
  EXPECT_EQ(b->partition, 1) << "the partition with the most free blocks";
  sim.run_to_end();
  // The stem is cached in partition 0 only. A blocker running there leaves it fewer free blocks
  // than partition 1, yet a prompt sharing the stem goes there, to its cached prefix.
  Sequence* blocker = sim.add({8, 8, 8, 8, 8}, 20);
  sim.step();
  ASSERT_EQ(blocker->partition, 0) << "both partitions all free: the lowest";
  ASSERT_LT(sim.bm.num_free_blocks(0), sim.bm.num_free_blocks(1));
  std::vector<int32_t> again = stem;
  again.push_back(4);
  Sequence* c0 = sim.add(again, 1);
  sim.step();
  EXPECT_EQ(c0->partition, 0);
  EXPECT_EQ(c0->num_cached_tokens, 12);
  sim.run_to_end();
  // Four one-block prompts admitted in one step alternate between the partitions (most free
  // blocks, ties to the lowest). The two of partition 0 then outgrow it (8 + 7 blocks of 8) while
  // the two of partition 1 grow to fill theirs exactly: one of partition 0 is preempted, and
  // never one of partition 1, whose blocks would not help.
  Sim p(c, 16, 4, false, 0, 2);
  Sequence* grow = p.add({1, 1, 1, 1}, 28);   // grows to 8 blocks: all of its partition
  Sequence* x = p.add({2}, 14);               // grows to 4 blocks
  Sequence* other = p.add({3, 3, 3, 3}, 24);  // grows to 7 blocks
  Sequence* y = p.add({4}, 14);
  p.step();
  ASSERT_EQ(grow->partition, 0);
  ASSERT_EQ(x->partition, 1);
  ASSERT_EQ(other->partition, 0);
  ASSERT_EQ(y->partition, 1);
  p.run_to_end();
  EXPECT_GT(grow->num_preemptions + other->num_preemptions, 0)
      << "partition 0 should run out of blocks";
  EXPECT_EQ(x->num_preemptions + y->num_preemptions, 0)
      << "a sequence of partition 1 was preempted for partition 0";
  EXPECT_TRUE(grow->finished() && x->finished() && other->finished() && y->finished());
}

TEST(Scheduler, FirstComeFirstServedAdmission) {
  SchedulerConfig c;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 64;
  Sim sim(c, /*blocks=*/10, /*bs=*/4, false);
  Sequence* running = sim.add(std::vector<int32_t>(20, 1), 8);  // 5 blocks, growing to 7
  sim.step();
  Sequence* big = sim.add(std::vector<int32_t>(30, 2), 1);   // 8 blocks: must wait
  Sequence* small = sim.add(std::vector<int32_t>(3, 3), 1);  // would fit, but arrived later
  for (int i = 0; i < 3; ++i) {
    sim.step();
    ASSERT_EQ(big->status, SeqStatus::kWaiting);
    ASSERT_EQ(small->status, SeqStatus::kWaiting) << "a later request overtook the queue head";
  }
  sim.run_to_end();
  EXPECT_TRUE(running->finished() && big->finished() && small->finished());
}

TEST(Scheduler, DecodesAreScheduledBeforePrefillChunks) {
  SchedulerConfig c;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 8;
  Sim sim(c, 64, 4, false);
  Sequence* a = sim.add({1, 2, 3}, 20);
  sim.step();  // a's prompt
  Sequence* b = sim.add(std::vector<int32_t>(40, 5), 2);
  for (int i = 0; i < 4; ++i) {
    const SchedulerOutput& so = sim.sched.schedule();
    ASSERT_EQ(so.seqs.at(0).seq, a);
    ASSERT_EQ(so.seqs.at(0).num_new_tokens, 1);
    ASSERT_EQ(so.seqs.at(1).seq, b);
    ASSERT_EQ(so.seqs.at(1).num_new_tokens, 7) << "a prefill chunk takes the rest of the budget";
    sim.sched.step_done();
    a->tokens.push_back(0);
  }
}

TEST(Scheduler, AbortAtEveryStageReturnsEverything) {
  SchedulerConfig c;
  c.max_num_seqs = 2;
  c.max_num_batched_tokens = 8;
  Sim sim(c, 32, 4, true, /*state_slots=*/2);
  Sequence* decoding = sim.add({1, 2, 3}, 50);
  Sequence* prefilling = sim.add(std::vector<int32_t>(40, 7), 5);
  Sequence* waiting = sim.add({4, 5}, 5);
  for (int i = 0; i < 3; ++i) sim.step();
  ASSERT_EQ(decoding->status, SeqStatus::kRunning);
  ASSERT_GT(decoding->num_output_tokens(), 0);
  ASSERT_EQ(prefilling->status, SeqStatus::kRunning);
  ASSERT_LT(prefilling->num_computed_tokens, prefilling->num_prompt_tokens);
  ASSERT_EQ(waiting->status, SeqStatus::kWaiting);
  sim.sched.finish(waiting);
  sim.sched.finish(prefilling);
  sim.sched.finish(decoding);
  EXPECT_FALSE(sim.sched.has_unfinished());
  EXPECT_EQ(sim.sched.num_running() + sim.sched.num_waiting(), 0);
  EXPECT_EQ(sim.bm.num_free_blocks(), sim.bm.num_blocks());
  EXPECT_EQ(sim.pool.num_free(), 2);
  sim.bm.check_invariants();
  EXPECT_TRUE(sim.sched.schedule().empty());
}

TEST(Scheduler, RejectsBudgetsThatCannotHoldEverySequence) {
  BlockManager bm(4, 4, false);
  StatePool pool(0, 0);
  SchedulerConfig c;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 8;
  try {
    Scheduler s(c, bm, pool);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_num_batched_tokens (8)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace atom
