// The Backend the server runs on: an LLMEngine driven by its own thread (the engine is
// single-threaded), a tokenizer and a chat template. Requests and aborts reach the engine thread
// through a queue; each engine step's tokens go back to their requests as updates.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "grammar/matcher.h"
#include "engine/llm_engine.h"
#include "engine/multimodal.h"
#include "server/backend.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace atom::server {

struct EngineBackendOptions {
  grammar::GrammarLimits grammar_limits;  // bounds on request grammars, schemas and regexes
  std::string served_model_name;
  std::string model_path;
  std::string tokenizer_path;     // where the chat template lives; empty: model_path
  int max_waiting = 4096;         // queued requests beyond this get 503
  std::string chat_template;      // --chat-template: file or text; empty: the model's
  jinja::Limits template_limits;  // for the model's template and the requests' chat_template
  // --mm-processor-cache-gb: image features kept for images sent again (ImageFeatureCache);
  // 0 keeps none.
  int64_t image_cache_bytes = int64_t{4} << 30;
};

class EngineBackend final : public Backend {
 public:
  EngineBackend(LLMEngine& engine, tokenizer::Tokenizer tok, EngineBackendOptions options);
  ~EngineBackend() override;

  const BackendInfo& info() const override { return info_; }
  std::vector<int32_t> tokenize(const std::string& text, bool add_special_tokens) override;
  std::string detokenize(std::span<const int32_t> ids, bool skip_special_tokens) override;
  std::string token_text(int32_t id) override;
  std::string render_chat(const ChatRequest& request) override;
  void submit(BackendRequest request, std::function<void(RequestUpdate)> on_update) override;
  void abort(const std::string& id) override;
  BackendStats stats() override;

  // Refuses new requests (503) from now on and waits until every running one has finished.
  void drain();
  // The number of requests the engine holds (waiting, running, or finishing).
  int live_requests() const { return live_.load(); }

  // SamplingRequest overlaid on the engine's defaults (generation_config.json, then vLLM's);
  // invalid values are ApiError 400.
  SamplingParams sampling_params(const SamplingRequest& r) const;

 private:
  struct Command {
    enum Kind { kAdd, kAbort } kind;
    BackendRequest request;
    SamplingParams params;
    std::function<void(RequestUpdate)> on_update;
    // The request's images, expanded in request.prompt_ids with their features computed on the
    // submitting thread (the engine thread never runs the vision tower); null: none.
    std::shared_ptr<const RequestImages> images;
  };
  struct Live {
    std::function<void(RequestUpdate)> on_update;
    bool sent_prompt_info = false;
    int n = 1;
    // Choices whose finish reason has been sent: a choice that ends before its request's last
    // step must not get a second one with the request's final update (nor with an abort's).
    std::vector<bool> finish_sent;
    // True the first time it is called for choice i (whose finish reason is then to be sent).
    bool first_finish(int i) {
      if (i < 0 || i >= static_cast<int>(finish_sent.size()) || finish_sent[static_cast<size_t>(i)])
        return false;
      finish_sent[static_cast<size_t>(i)] = true;
      return true;
    }
  };

  void loop();
  // Structured output: the request's grammar compiled against this vocabulary (cached by spec).
  std::shared_ptr<const LogitsConstraint> constraint_for(const StructuredOutput& so) const;
  void deliver(std::vector<std::pair<std::function<void(RequestUpdate)>, RequestUpdate>>& out);

  LLMEngine& engine_;
  tokenizer::Tokenizer tok_;
  tokenizer::ChatTemplate template_;
  EngineBackendOptions options_;
  BackendInfo info_;
  // The vocabulary's byte strings as a trie (built at the first structured request) and compiled
  // grammars by spec, so a schema sent again shares its masks.
  mutable std::once_flag trie_once_;
  mutable std::shared_ptr<const grammar::TokenTrie> trie_;
  mutable std::mutex grammar_mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const LogitsConstraint>> grammars_;
  // Features of recent images, so that a chat's images resent each turn skip the vision tower.
  ImageFeatureCache image_cache_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> commands_;
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  std::atomic<int> live_{0};
  // waiting_: submitted, not yet handed to the engine; engine_waiting_: in the scheduler's queue.
  std::atomic<int> waiting_{0}, running_{0}, engine_waiting_{0};
  // Speculative decoding totals, copied from the engine's loop (up to 4 draft positions).
  std::atomic<int64_t> spec_drafts_{0}, spec_draft_tokens_{0}, spec_accepted_{0};
  std::array<std::atomic<int64_t>, 4> spec_per_pos_{};
  std::atomic<int> spec_positions_{0};
  std::atomic<int64_t> blocks_total_{0}, blocks_free_{0}, slots_total_{0}, slots_free_{0},
      preemptions_{0}, prefix_queries_{0}, prefix_hits_{0};
  // Engine step totals (nanoseconds), copied from the engine's loop.
  std::atomic<int64_t> steps_{0}, step_ns_{0}, step_host_ns_{0};
  std::unordered_map<std::string, Live> live_map_;  // engine thread only
  std::thread thread_;
};

}  // namespace atom::server
