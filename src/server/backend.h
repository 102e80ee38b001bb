// What the HTTP layer needs from the engine: tokenization, chat rendering, and asynchronous
// generation with per-request updates and abort. The engine adapter implements it; tests use
// fakes, so the HTTP layer is tested on its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "server/protocol.h"
#include "vision/image.h"

namespace atom::server {

struct TopLogprob {
  int32_t token_id;
  float logprob;
};

struct TokenLogprob {
  int32_t token_id;
  float logprob;
  std::vector<TopLogprob> top;  // the most likely tokens at this position, best first
};

// What happened to one choice since its previous update.
struct ChoiceDelta {
  int index = 0;
  std::string text;                          // newly completed text (never a broken UTF-8 sequence)
  std::vector<int32_t> token_ids;            // newly generated tokens
  std::vector<TokenLogprob> logprobs;        // one per new token, when the request asked for them
  std::optional<std::string> finish_reason;  // stop | length | abort | error, on the last update
  nlohmann::json stop_reason;                // the stop string or token id that ended it, or null
};

// vLLM's request phases in seconds (RequestOutput's queue/prefill/decode/inference times): set on
// the final update of a request the engine scheduled.
struct RequestPhases {
  double queue = 0, prefill = 0, decode = 0, inference = 0;
  bool prefilled = false;  // a token came: the prefill, decode and inference phases happened
};

struct RequestUpdate {
  std::vector<ChoiceDelta> choices;
  int prompt_tokens = 0;
  int cached_tokens = 0;                      // prompt tokens served from the prefix cache
  std::vector<TokenLogprob> prompt_logprobs;  // on the first update, when asked for
  bool finished = false;                      // every choice has finished
  std::optional<RequestPhases> phases;        // with `finished`, once the engine scheduled it
  std::string error;                          // set when the request failed inside the engine
};

struct BackendRequest {
  std::string id;
  std::vector<int32_t> prompt_ids;
  SamplingRequest sampling;
  std::chrono::steady_clock::time_point arrival;
  // The prompt's images (a model that takes them), in order: one image placeholder token
  // (BackendInfo::image_token_id) in prompt_ids each, which the engine expands.
  std::vector<vision::VisionInput> images;
};

struct BackendInfo {
  std::string model_name;  // served name
  std::string model_path;
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;
  int64_t created = 0;     // unix time of start-up
  bool reasoning = false;  // the chat template emits <think> blocks
  bool harmony = false;    // the chat template writes harmony channels (gpt-oss)
  // A model that takes images: its image placeholder token (one per image in a rendered prompt)
  // and its image processor's parameters; -1: the model takes no images.
  int32_t image_token_id = -1;
  // Why a model with a vision tower takes no images here (its device), for the 400.
  std::string images_unavailable;
  vision::ProcessorParams image_processor;
  // A prompt with images is prefilled in one step: at most this many tokens (0: no bound).
  int64_t max_image_prompt_tokens = 0;
};

struct BackendStats {
  int running = 0;
  int waiting = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;
  int64_t state_slots_total = 0;  // recurrent-state slots (0 for models without recurrent layers)
  int64_t state_slots_free = 0;
  int64_t num_preemptions = 0;
  // Engine steps that ran a batch, their wall time and its host part (EngineStats).
  int64_t num_steps = 0;
  double step_seconds = 0, step_host_seconds = 0;
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  // Speculative decoding (empty spec_accepted_per_position: off).
  int64_t spec_num_drafts = 0;
  int64_t spec_num_draft_tokens = 0;
  int64_t spec_num_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_position;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const BackendInfo& info() const = 0;
  virtual std::vector<int32_t> tokenize(const std::string& text, bool add_special_tokens) = 0;
  virtual std::string detokenize(std::span<const int32_t> ids, bool skip_special_tokens) = 0;
  // The text of one token as the logprobs `token` field shows it.
  virtual std::string token_text(int32_t id) = 0;
  // The prompt text of a chat request (throws ApiError 400 for template errors).
  virtual std::string render_chat(const ChatRequest& request) = 0;
  // Starts generation. `on_update` runs on the engine's thread with each update; the last one has
  // finished = true. Throws ApiError (503 when the queue is full, 400 for bad input).
  virtual void submit(BackendRequest request, std::function<void(RequestUpdate)> on_update) = 0;
  // Stops a request wherever it is; its final update reports finish_reason "abort".
  virtual void abort(const std::string& id) = 0;
  virtual BackendStats stats() = 0;
};

}  // namespace atom::server
