// A request and its sequences (one per parallel sample): tokens, where their KV lives, and what
// has been produced so far. The scheduler and block manager read the cache half; the engine's
// output processing writes the output half.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/logits_constraint.h"
#include "engine/sampling_params.h"
#include "engine/text_stream.h"

namespace atom {

enum class FinishReason : uint8_t { kNone, kStop, kLength, kAbort };
// "stop", "length", "abort" (vLLM's names); "" for kNone.
const char* finish_reason_name(FinishReason r);

struct TopLogprob {
  int32_t token_id;
  float logprob;
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0;            // log_softmax of the model's raw logits
  int32_t rank = 0;             // 1 + number of tokens with a larger logprob
  std::vector<TopLogprob> top;  // the most likely tokens, most likely first
};

// vLLM's stop_reason: the stop string or stop token id that ended generation; empty for EOS,
// length and abort.
using StopReason = std::variant<std::monostate, std::string, int32_t>;

enum class SeqStatus : uint8_t { kWaiting, kRunning, kFinished };

using Clock = std::chrono::steady_clock;

struct Request;
struct RequestImages;  // engine/multimodal.h

struct Sequence {
  Request* request = nullptr;
  int index = 0;      // among the request's n samples
  uint64_t seed = 0;  // keys this sequence's random draws (kernels/sampling_scheme.h)

  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int num_prompt_tokens = 0;

  // --- KV cache state (scheduler, block manager, state pool) ---
  SeqStatus status = SeqStatus::kWaiting;
  int num_computed_tokens = 0;       // tokens whose KV (and state) are in the cache
  std::vector<int32_t> block_table;  // physical block of each logical block
  // The block manager's partition its blocks come from (data-parallel attention: the rank whose
  // cache holds them); chosen at admission, kept while it holds blocks.
  int partition = 0;
  std::vector<uint64_t> block_hashes;  // chained hash of each full block of `tokens`
  std::vector<int32_t> state_slots;    // committed slot, then one rollback slot per draft token
  int num_cached_tokens = -1;          // prefix-cache hit at first admission (-1: not yet)
  // Prefix-cache registration: blocks [0, cache_cursor) are registered or duplicates of
  // registered ones; cache_parent (generation cache_parent_gen) is the registered block that
  // stands for block cache_cursor - 1. cache_cursor < 0: the chain hit a collision, stop.
  int cache_cursor = 0;
  int cache_parent = -1;
  uint32_t cache_parent_gen = 0;
  int num_preemptions = 0;
  // When the scheduler first gave it a place in a batch (epoch until then); a preemption keeps
  // it, as vLLM's scheduled_ts.
  Clock::time_point first_scheduled{};
  bool in_step = false;  // scheduled in the step being planned or run
  // For n > 1: a sibling whose prompt this one waits for, so the prompt's blocks are computed
  // once and shared through the prefix cache.
  Sequence* prefix_leader = nullptr;
  // Set when the logits of every computed prompt row are needed (prompt_logprobs): such a
  // sequence takes no prefix-cache hits until they are collected.
  bool collects_prompt_logprobs = false;
  // Speculative decoding: the drafter's proposal for the next step, and how many draft tokens sit
  // provisionally at the end of `tokens` during the step that verifies them (0 otherwise).
  std::vector<int32_t> spec_drafts;
  int num_draft_tokens = 0;

  // --- output ---
  std::string text;  // detokenized output (when a detokenizer is set)
  // Bytes of `text` already handed out as streamed pieces; text that could still turn into the
  // start of a stop string is held back.
  size_t text_emitted = 0;
  std::unique_ptr<TokenTextStream> text_stream;
  std::vector<TokenLogprob> logprobs;  // one per output token when requested
  // Structured output: where this sample is in its request's constraint (grammar).
  std::unique_ptr<LogitsConstraintState> constraint;
  std::vector<Clock::time_point> token_times;  // when each output token was produced
  FinishReason finish_reason = FinishReason::kNone;
  StopReason stop_reason;

  int num_tokens() const { return static_cast<int>(tokens.size()); }
  // Output tokens, not counting provisional draft tokens.
  int num_output_tokens() const { return num_tokens() - num_draft_tokens - num_prompt_tokens; }
  bool finished() const { return status == SeqStatus::kFinished; }
  // Whether this step's computation reaches the last known token, so its logits give the next one.
  bool prefill_done() const { return num_computed_tokens >= num_prompt_tokens; }
  int state_slot() const { return state_slots.empty() ? -1 : state_slots[0]; }
  const SamplingParams& params() const;
};

struct Request {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::vector<int32_t> min_tokens_suppressed;  // EOS (unless ignore_eos) and stop_token_ids
  // The prompt's images (null: none): their placeholders' places and their features.
  std::shared_ptr<const RequestImages> images;
  Clock::time_point arrival;
  std::vector<std::unique_ptr<Sequence>> seqs;  // n of them
  // prompt_logprobs[i] for prompt position i >= 1 (entry 0 stays empty, as in vLLM).
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  int prompt_logprobs_done = 1;  // positions [1, done) are collected
  int num_finished = 0;

  bool finished() const { return num_finished == static_cast<int>(seqs.size()); }
};

inline const SamplingParams& Sequence::params() const { return request->params; }

}  // namespace atom
