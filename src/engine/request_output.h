// What the engine hands back: per request, one completion per parallel sample, with timings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/sequence.h"

namespace atom {

struct CompletionOutput {
  int index = 0;                       // among the request's n samples
  std::string text;                    // empty without a detokenizer
  std::vector<int32_t> token_ids;      // generated tokens only
  std::vector<TokenLogprob> logprobs;  // one per token when logprobs was requested
  FinishReason finish_reason = FinishReason::kNone;
  StopReason stop_reason;
  int num_cached_tokens = 0;  // prompt tokens served from the prefix cache at admission
  int num_preemptions = 0;
  // Seconds from arrival: to the first token (TTFT), and to each token (ITL = differences).
  double ttft = 0;
  double tpot = 0;  // (last - first) / (tokens - 1): mean time per output token after the first
  std::vector<double> token_times;
};

struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  // When prompt_logprobs was requested: one entry per prompt token, the first empty.
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  std::vector<CompletionOutput> outputs;
  bool finished = false;
  double e2e_latency = 0;  // seconds from arrival to the last sequence's end
  // vLLM's request phases, in seconds, over all n samples: waiting (arrival to first scheduled),
  // prefill (first scheduled to first token), decode (first token to last token) and inference
  // (first scheduled to last token). `scheduled`: the first phase ended; `produced`: a token
  // came, so the other three did.
  double queue_time = 0, prefill_time = 0, decode_time = 0, inference_time = 0;
  bool scheduled = false, produced = false;
};

// A token produced in a step, for streaming. The pointers stay valid until the next call into the
// engine; through `seq` a streaming front end reads the rest of a delta (seq->logprobs.back() when
// logprobs were asked for, finish_reason and stop_reason once finished, num_cached_tokens, and the
// request's prompt_logprobs).
struct TokenEvent {
  const std::string* request_id;
  const Sequence* seq;
  int index;  // which of the n samples
  int32_t token_id;
  std::string text;  // the text this token completed (with a detokenizer); may be empty
  bool finished;
};

struct StepOutput {
  std::vector<TokenEvent> tokens;
  std::vector<RequestOutput> finished;  // requests that completed in this step
  int num_scheduled_tokens = 0;
};

}  // namespace atom
