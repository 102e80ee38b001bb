#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace atom {

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager& blocks, StatePool& states)
    : config_(config), blocks_(blocks), states_(states) {
  if (config.max_num_seqs < 1) fail("max_num_seqs must be at least 1, got {}", config.max_num_seqs);
  if (config.max_num_batched_tokens < config.max_num_seqs)
    fail("max_num_batched_tokens ({}) must be greater than or equal to max_num_seqs ({})",
         config.max_num_batched_tokens, config.max_num_seqs);
  if (config.long_prefill_token_threshold < 0)
    fail("long_prefill_token_threshold must be >= 0, got {}", config.long_prefill_token_threshold);
  running_.reserve(static_cast<size_t>(config.max_num_seqs));
  out_.seqs.reserve(static_cast<size_t>(config.max_num_seqs));
  if (config.num_checkpoint_slots > 0) {
    const int I = config.state_checkpoint_interval;
    if (I <= 0 || I % blocks.block_size() != 0 || !blocks.prefix_caching() || !states.enabled())
      fail("state checkpoints need prefix caching, a recurrent model and an interval that is a "
           "positive multiple of the block size {}, got {}",
           blocks.block_size(), I);
    checkpoints_.resize(static_cast<size_t>(config.num_checkpoint_slots));
  }
}

// A prefill chunk from `start` ends at the next checkpoint boundary, so that the state there can
// be copied after the step.
int Scheduler::cap_at_checkpoint(const Sequence& seq, int start, int n) const {
  (void)seq;
  if (!checkpoints()) return n;
  const int I = config_.state_checkpoint_interval;
  const int boundary = (start / I + 1) * I;
  return std::min(n, boundary - start);
}

int Scheduler::find_checkpoint(int block) const {
  auto it = checkpoint_of_block_.find(block);
  if (it == checkpoint_of_block_.end()) return -1;
  // A block evicted and reused since has a new generation: that checkpoint is of another prefix.
  return checkpoints_[static_cast<size_t>(it->second)].gen == blocks_.generation(block) ? it->second
                                                                                        : -1;
}

// After a step that left seq at a boundary with every full block registered: its state is the
// state after the prefix ending with the (canonical) block seq.cache_parent.
void Scheduler::checkpoint(Sequence& seq) {
  const int I = config_.state_checkpoint_interval;
  const int done = seq.num_computed_tokens;
  if (done == 0 || done % I != 0 || seq.cache_cursor != done / blocks_.block_size() ||
      seq.cache_parent < 0 || seq.state_slots.empty())
    return;
  int i = find_checkpoint(seq.cache_parent);
  if (i >= 0) {  // that prefix's state is kept already
    checkpoints_[static_cast<size_t>(i)].used = ++clock_;
    return;
  }
  if (auto it = checkpoint_of_block_.find(seq.cache_parent); it != checkpoint_of_block_.end()) {
    checkpoints_[static_cast<size_t>(it->second)] = {};  // of the block's earlier content
    checkpoint_of_block_.erase(it);
  }
  i = 0;  // the least recently used (an empty one first)
  for (size_t j = 1; j < checkpoints_.size(); ++j)
    if (checkpoints_[j].used < checkpoints_[static_cast<size_t>(i)].used) i = static_cast<int>(j);
  Checkpoint& c = checkpoints_[static_cast<size_t>(i)];
  if (c.block >= 0) checkpoint_of_block_.erase(c.block);
  c = {seq.cache_parent, seq.cache_parent_gen, ++clock_};
  checkpoint_of_block_[seq.cache_parent] = i;
  pending_copies_.push_back({seq.state_slot(), config_.checkpoint_slot_begin + i});
}

void Scheduler::add(Sequence* seq) {
  ATOM_CHECK(seq->status == SeqStatus::kWaiting && seq->block_table.empty(),
             "scheduler: a new sequence must be waiting and hold no blocks");
  waiting_.push_back(seq);
  ++num_unfinished_;
}

void Scheduler::finish(Sequence* seq) {
  if (seq->finished()) return;
  // Dropped from the queues now: the caller may destroy the sequence once it is finished.
  if (seq->status == SeqStatus::kWaiting) {
    auto it = std::find(waiting_.begin(), waiting_.end(), seq);
    if (it != waiting_.end()) waiting_.erase(it);
  } else {
    auto it = std::find(running_.begin(), running_.end(), seq);
    if (it != running_.end()) running_.erase(it);
  }
  seq->in_step = false;
  blocks_.free(*seq);
  states_.free(*seq);
  seq->status = SeqStatus::kFinished;
  --num_unfinished_;
}

void Scheduler::preempt(Sequence* seq) {
  blocks_.free(*seq);
  states_.free(*seq);
  seq->num_computed_tokens = 0;
  seq->status = SeqStatus::kWaiting;
  ++seq->num_preemptions;
  ++stats_.num_preemptions;
  preempted_this_step_ = true;
  waiting_.push_front(seq);
}

// The most recently admitted running sequence of `partition` that has no work in this step yet
// (another partition's blocks would not help).
Sequence* Scheduler::pick_victim(int partition) {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    Sequence* s = *it;
    if (!s->finished() && !s->in_step && s->partition == partition) {
      running_.erase(std::next(it).base());
      return s;
    }
  }
  return nullptr;
}

// Grows seq's blocks for num_new_tokens, preempting others (or, last, seq itself) until it fits.
bool Scheduler::schedule_running(Sequence* seq, int num_new_tokens) {
  seq->in_step = true;  // never its own victim while others remain
  while (!blocks_.append_slots(*seq, num_new_tokens)) {
    Sequence* victim = pick_victim(seq->partition);
    if (!victim) {  // everyone else is in this step already: give way
      seq->in_step = false;
      running_.erase(std::find(running_.begin(), running_.end(), seq));
      preempt(seq);
      return false;
    }
    preempt(victim);
  }
  out_.seqs.push_back({seq, num_new_tokens});
  out_.num_tokens += num_new_tokens;
  return true;
}

bool Scheduler::waits_for_leader(const Sequence* seq) const {
  const Sequence* l = seq->prefix_leader;
  return l && !l->finished() && (l->status == SeqStatus::kWaiting || !l->prefill_done());
}

void Scheduler::admit_waiting(int& budget) {
  const int bs = blocks_.block_size();
  auto it = waiting_.begin();
  while (budget > 0 && static_cast<int>(running_.size()) < config_.max_num_seqs &&
         it != waiting_.end()) {
    Sequence* seq = *it;
    if (waits_for_leader(seq)) {  // its sibling computes the shared prompt first
      ++it;
      continue;
    }
    if (!states_.can_allocate()) break;
    // The prefix hits in seq's partition, the checkpoint its state resumes from (-1: none) and
    // the tokens it computes now (-1: a prompt with images that waits for a step with room).
    int restore = -1, n = 0;
    auto plan = [&] {
      if (seq->collects_prompt_logprobs)
        hits_.clear();
      else
        blocks_.find_cached_prefix(*seq, hits_);
      restore = -1;
      if (checkpoints()) {
        // KV blocks alone cannot resume a recurrent state: the hits are cut back to the longest
        // prefix whose state was checkpointed.
        const int per = config_.state_checkpoint_interval / bs;
        size_t keep = hits_.size() / static_cast<size_t>(per) * static_cast<size_t>(per);
        for (; keep > 0; keep -= static_cast<size_t>(per)) {
          const int i = find_checkpoint(hits_[keep - 1]);
          if (i >= 0) {
            restore = i;
            break;
          }
        }
        hits_.resize(keep);
      }
      n = seq->num_tokens() - static_cast<int>(hits_.size()) * bs;
      if (seq->request && seq->request->images) {
        // A prompt with images is prefilled in one step: it waits for a step with room for all
        // of it (LLMEngine::add_request refused one that can never have it).
        if (n > budget) n = -1;
      } else {
        n = cap_at_checkpoint(*seq, static_cast<int>(hits_.size()) * bs, n);
        if (config_.long_prefill_token_threshold > 0)
          n = std::min(n, config_.long_prefill_token_threshold);
        n = std::min(n, budget);
      }
    };
    if (blocks_.num_partitions() > 1) {
      // Partitions (data-parallel attention): the one where the sequence fits with the longest
      // cached prefix, then the most free blocks, then the lowest index.
      int best = -1, best_hits = -1, best_free = -1;
      for (int p = 0; p < blocks_.num_partitions(); ++p) {
        seq->partition = p;
        plan();
        if (n < 0 || !blocks_.can_allocate(*seq, hits_, n)) continue;
        const int h = static_cast<int>(hits_.size()), f = blocks_.num_free_blocks(p);
        if (h > best_hits || (h == best_hits && f > best_free)) {
          best = p;
          best_hits = h;
          best_free = f;
        }
      }
      if (best < 0) break;  // FCFS: nobody overtakes the head
      seq->partition = best;
    }
    plan();
    if (n < 0) break;  // FCFS: nobody overtakes the head
    const int cached = static_cast<int>(hits_.size()) * bs;
    if (!blocks_.allocate(*seq, hits_, n)) break;  // FCFS: nobody overtakes the head
    ATOM_CHECK(states_.allocate(*seq), "state pool exhausted after can_allocate");
    if (restore >= 0) {
      checkpoints_[static_cast<size_t>(restore)].used = ++clock_;
      out_.state_copies.push_back({config_.checkpoint_slot_begin + restore, seq->state_slot()});
    }
    stats_.prefix_cache_queries += seq->num_tokens();
    stats_.prefix_cache_hits += cached;
    if (seq->num_cached_tokens < 0) seq->num_cached_tokens = cached;
    seq->num_computed_tokens = cached;
    seq->status = SeqStatus::kRunning;
    if (seq->first_scheduled == Clock::time_point{}) seq->first_scheduled = Clock::now();
    seq->in_step = true;
    running_.push_back(seq);
    out_.seqs.push_back({seq, n});
    out_.num_tokens += n;
    budget -= n;
    it = waiting_.erase(it);
  }
}

const SchedulerOutput& Scheduler::schedule() {
  out_.seqs.clear();  // its sequences may be gone: step_done() already reset their flags
  out_.num_tokens = 0;
  out_.state_copies.swap(pending_copies_);  // the last step's checkpoints first
  pending_copies_.clear();
  preempted_this_step_ = false;

  int budget = config_.max_num_batched_tokens;
  // Preemption removes sequences from running_, so walk a snapshot and skip whoever left.
  order_.assign(running_.begin(), running_.end());
  // 1. Decodes.
  for (Sequence* seq : order_) {
    if (budget == 0) break;
    if (seq->status != SeqStatus::kRunning || seq->in_step ||
        seq->num_tokens() - seq->num_computed_tokens != 1)
      continue;
    // seq itself gave way: nothing else can fit (in another partition something may).
    if (!schedule_running(seq, 1)) {
      if (blocks_.num_partitions() == 1) break;
      continue;
    }
    --budget;
  }
  // 2. Prefill chunks (and recomputes) of running sequences.
  for (Sequence* seq : order_) {
    if (budget == 0) break;
    if (seq->status != SeqStatus::kRunning || seq->in_step) continue;
    int n = seq->num_tokens() - seq->num_computed_tokens;
    ATOM_CHECK(n > 0, "running sequence has nothing to compute");
    if (config_.long_prefill_token_threshold > 0)
      n = std::min(n, config_.long_prefill_token_threshold);
    n = std::min(n, budget);
    n = cap_at_checkpoint(*seq, seq->num_computed_tokens, n);
    if (!schedule_running(seq, n)) {
      if (blocks_.num_partitions() == 1) break;
      continue;
    }
    budget -= n;
  }
  // 3. New work, unless memory is short right now.
  if (!preempted_this_step_) admit_waiting(budget);
  return out_;
}

void Scheduler::reject_tail(Sequence* seq, int n) {
  for (ScheduledSeq& s : out_.seqs)
    if (s.seq == seq) {
      ATOM_CHECK(n >= 0 && n < s.num_new_tokens, "reject_tail: {} of {} new tokens", n,
                 s.num_new_tokens);
      s.num_new_tokens -= n;
      return;
    }
  ATOM_CHECK(false, "reject_tail: the sequence is not in this step");
}

void Scheduler::step_done() {
  for (const ScheduledSeq& s : out_.seqs) {
    Sequence* seq = s.seq;
    seq->in_step = false;
    if (seq->finished()) continue;
    seq->num_computed_tokens += s.num_new_tokens;
    ATOM_CHECK(seq->num_computed_tokens <= seq->num_tokens(), "computed past the known tokens");
    blocks_.cache_computed_blocks(*seq);
    if (checkpoints()) checkpoint(*seq);
  }
}

}  // namespace atom
