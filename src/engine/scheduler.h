// Continuous batching: each step picks, under a sequence budget (max_num_seqs) and a token budget
// (max_num_batched_tokens), a mix of decodes, prefill chunks of running sequences and newly
// admitted prompts (ATOM separates prefill and decode steps; we mix them).
//
// Order within a step, so that decodes never wait behind a long prompt:
//   1. running sequences with one token left to compute (decodes), in admission order;
//   2. running sequences part-way through a prompt (or a recompute), in admission order, each
//      taking min(remaining, budget left, long_prefill_token_threshold) tokens;
//   3. waiting sequences, first come first served: admission stops at the first one that does not
//      fit, so a large request is never overtaken indefinitely (no starvation). Nothing is
//      admitted in a step that had to preempt.
// When a running sequence needs a block and none is free, the most recently admitted sequence not
// yet scheduled this step is preempted by recompute: its blocks and state slots are returned and
// it goes back to the front of the waiting queue (its tokens are kept; its prefix blocks usually
// stay in the prefix cache). With block partitions (data-parallel attention) a new sequence goes to
// the partition where it fits with the longest cached prefix (then the most free blocks), and a
// victim comes from the needy sequence's own partition. Outputs are identical afterwards because
// the forward pass is deterministic per row and sampling is keyed by (seed, position).
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"
#include "engine/state_pool.h"

namespace atom {

struct SchedulerConfig {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
  int long_prefill_token_threshold = 0;  // 0: a prefill chunk is bounded by the budget only
  // Recurrent models with prefix caching: every this many tokens (a multiple of the block size)
  // a sequence's state is checkpointed into one of the state slots [checkpoint_slot_begin,
  // + num_checkpoint_slots), prefill chunks end at those boundaries, and admission restores the
  // checkpoint of the longest cached prefix that has one. 0: no checkpoints.
  int state_checkpoint_interval = 0;
  int checkpoint_slot_begin = 0, num_checkpoint_slots = 0;
};

struct ScheduledSeq {
  Sequence* seq;
  int num_new_tokens;  // computed this step, starting at seq->num_computed_tokens
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;
  int num_tokens = 0;
  // State slots to copy (from, to) before the step runs: checkpoints, then restores.
  std::vector<std::pair<int32_t, int32_t>> state_copies;
  bool empty() const { return seqs.empty(); }
};

struct SchedulerStats {
  int64_t num_preemptions = 0;
  int64_t prefix_cache_queries = 0;  // tokens looked up at admission
  int64_t prefix_cache_hits = 0;     // of which were found in the cache
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockManager& blocks, StatePool& states);

  // Queues a new sequence at the back.
  void add(Sequence* seq);
  // Plans the next step. The result stays valid until the next call.
  const SchedulerOutput& schedule();
  // After the step's forward pass: every scheduled sequence has computed its new tokens; full
  // blocks are registered in the prefix cache.
  void step_done();
  // Speculative decoding, between the forward pass and step_done: the last n tokens seq computed
  // this step were draft tokens the target rejected. step_done counts them as not computed (their
  // cache slots are written again later), so no block holding them reaches the prefix cache.
  void reject_tail(Sequence* seq, int n);
  // Ends a sequence (finished or aborted) wherever it is, returning its blocks and slots.
  void finish(Sequence* seq);

  bool has_unfinished() const { return num_unfinished_ > 0; }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  bool schedule_running(Sequence* seq, int num_new_tokens);
  Sequence* pick_victim(int partition);
  void preempt(Sequence* seq);
  bool waits_for_leader(const Sequence* seq) const;
  void admit_waiting(int& budget);
  // Recurrent state checkpoints (SchedulerConfig::state_checkpoint_interval).
  bool checkpoints() const { return config_.num_checkpoint_slots > 0; }
  int cap_at_checkpoint(const Sequence& seq, int start, int n) const;
  int find_checkpoint(int block) const;  // its index in checkpoints_, -1 none
  void checkpoint(Sequence& seq);
  struct Checkpoint {
    int block = -1;  // the prefix's last block and its generation (BlockManager::generation)
    uint32_t gen = 0;
    uint64_t used = 0;  // last put or restore (least recently used is overwritten)
  };
  std::vector<Checkpoint> checkpoints_;                      // one per checkpoint slot
  std::unordered_map<int, int> checkpoint_of_block_;         // block -> index in checkpoints_
  std::vector<std::pair<int32_t, int32_t>> pending_copies_;  // checkpoints of the last step
  uint64_t clock_ = 0;

  SchedulerConfig config_;
  BlockManager& blocks_;
  StatePool& states_;
  std::deque<Sequence*> waiting_;   // front first; preempted sequences go back to the front
  std::vector<Sequence*> running_;  // admission order (preemption victims come from the back)
  std::vector<Sequence*> order_;    // scratch: running_ at the start of a step
  std::vector<int32_t> hits_;       // scratch for prefix lookups
  SchedulerOutput out_;
  SchedulerStats stats_;
  int num_unfinished_ = 0;
  bool preempted_this_step_ = false;
};

}  // namespace atom
