// One HTTP request's engine work, shared by the generation endpoints (/v1/completions,
// /v1/chat/completions, /v1/responses, /v1/messages): its engine requests and choices, the updates
// the engine thread hands over, waiting for them or streaming them, and aborting what the client
// stops waiting for.
#pragma once

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/log.h"
#include "server/api_error.h"
#include "server/connection_probe.h"
#include "server/http_server.h"
#include "server/responses.h"

namespace atom::server {

using Clock = std::chrono::steady_clock;

// One engine request: a prompt and its n choices.
struct EngineRequest {
  std::string id;
  std::vector<int32_t> prompt_ids;
  std::string prompt_text;                  // for echo
  std::vector<vision::VisionInput> images;  // handed to the backend at submit_all
  int prompt_tokens = 0;
  int cached_tokens = 0;
  std::vector<TokenLogprob> prompt_logprobs;
  bool finished = false;
  Clock::time_point first_token{}, last_token{};
  int generated = 0;
};

// Updates from the engine thread, handed to the HTTP thread. Shared with the callbacks, which may
// outlive the HTTP request (an abort's final update arrives after the client is gone).
struct UpdateQueue {
  using Late = std::function<bool(int, RequestUpdate&)>;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int, RequestUpdate>> items;
  // Set once nobody waits any more (hand_over): takes each update as it comes, on the engine
  // thread, until it returns true.
  Late late;
  void push(int request, RequestUpdate u) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (late) {
        if (Late f = late; f(request, u)) late = nullptr;
        return;
      }
      items.emplace_back(request, std::move(u));
    }
    cv.notify_one();
  }
  // From now on `f` takes the updates (those already queued first).
  void hand_over(Late f) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [p, u] : items)
      if (f(p, u)) {
        items.clear();
        return;
      }
    items.clear();
    late = std::move(f);
  }
  std::deque<std::pair<int, RequestUpdate>> take(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, wait, [&] { return !items.empty(); });
    std::deque<std::pair<int, RequestUpdate>> out;
    out.swap(items);
    return out;
  }
};

struct ChoiceEvent {
  int choice;  // global choice index
  ChoiceDelta delta;
};

// Everything one HTTP request waits for. Held by a shared_ptr (abort_unfinished may hand the rest
// of its engine updates to a callback that keeps it alive).
class Job : public std::enable_shared_from_this<Job> {
 public:
  Job(HttpServer& s, SamplingRequest sampling)
      : s_(s),
        sampling_(std::move(sampling)),
        queue_(std::make_shared<UpdateQueue>()),
        arrival_(Clock::now()) {}

  // Gives each choice its reasoning and tool-call parsers.
  void set_choice_setup(std::function<void(ChoiceState&)> setup) { setup_ = std::move(setup); }

  // `images`: one per image placeholder token of `ids`, in order (the engine expands them).
  void add_prompt(std::vector<int32_t> ids, std::string text,
                  std::vector<vision::VisionInput> images = {}) {
    EngineRequest r;
    r.prompt_ids = std::move(ids);
    r.prompt_text = std::move(text);
    r.prompt_tokens = static_cast<int>(r.prompt_ids.size());
    for (const auto& im : images) r.prompt_tokens += static_cast<int>(im.num_tokens) - 1;
    r.images = std::move(images);
    requests_.push_back(std::move(r));
    for (int j = 0; j < sampling_.n; ++j) {
      ChoiceState c;
      c.index = static_cast<int>(choices_.size());
      if (setup_) setup_(c);
      choices_.push_back(std::move(c));
    }
  }

  void submit_all(const std::optional<std::string>& request_id, const std::string& prefix) {
    const std::string base = request_id ? *request_id : response_id(prefix);
    for (size_t p = 0; p < requests_.size(); ++p) {
      EngineRequest& r = requests_[p];
      r.id = requests_.size() == 1 ? base : fmt::format("{}-{}", base, p);
      BackendRequest b{r.id, r.prompt_ids, sampling_, arrival_, std::move(r.images)};
      auto q = queue_;
      const int idx = static_cast<int>(p);
      s_.backend().submit(std::move(b), [q, idx](RequestUpdate u) { q->push(idx, std::move(u)); });
      ++submitted_;
    }
  }

  // Applies pending updates; returns the per-choice deltas they carried.
  std::vector<ChoiceEvent> poll(std::chrono::milliseconds wait) {
    std::vector<ChoiceEvent> events;
    for (auto& [p, u] : queue_->take(wait)) apply(p, u, &events);
    return events;
  }

 private:
  // One update of engine request p: counts, text and finish reasons into the choices, the
  // metrics, and the choices' deltas into `events` (when given).
  void apply(int p, RequestUpdate& u, std::vector<ChoiceEvent>* events) {
    EngineRequest& r = requests_[p];
    if (r.finished) return;  // aborted here already: its last update changes nothing
    if (!u.error.empty()) error_ = u.error;
    // The first update carries the prompt's counts (its cache hit included); later ones none.
    if (u.prompt_tokens) {
      r.prompt_tokens = u.prompt_tokens;
      r.cached_tokens = u.cached_tokens;
    }
    if (!u.prompt_logprobs.empty()) r.prompt_logprobs = u.prompt_logprobs;
    const auto now = Clock::now();
    for (auto& d : u.choices) {
      const int global = p * sampling_.n + d.index;
      if (global < 0 || global >= static_cast<int>(choices_.size())) continue;
      ChoiceState& c = choices_[global];
      if (!d.token_ids.empty()) {
        if (r.generated == 0) {
          r.first_token = now;
          s_.metrics().observe_ttft(std::chrono::duration<double>(now - arrival_).count());
        } else {
          s_.metrics().observe_inter_token_latency(
              std::chrono::duration<double>(now - r.last_token).count());
        }
        r.last_token = now;
        r.generated += static_cast<int>(d.token_ids.size());
        s_.metrics().add_generation_tokens(static_cast<int64_t>(d.token_ids.size()));
      }
      c.text += d.text;
      c.token_ids.insert(c.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
      c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
      if (d.finish_reason) {
        c.finish_reason = d.finish_reason;
        c.stop_reason = d.stop_reason;
        s_.metrics().add_request_success(*d.finish_reason);
      }
      if (events) events->push_back({global, std::move(d)});
    }
    if (u.finished) {
      r.finished = true;
      ++finished_;
      s_.metrics().add_prompt_tokens(r.prompt_tokens);
      const double e2e = std::chrono::duration<double>(now - arrival_).count();
      s_.metrics().observe_e2e_latency(e2e);
      s_.metrics().observe_request_tokens(r.prompt_tokens, r.generated, sampling_.n,
                                          sampling_.max_tokens.value_or(0));
      if (r.generated > 1)
        s_.metrics().observe_tpot(
            std::chrono::duration<double>(r.last_token - r.first_token).count() /
            (r.generated - 1));
      if (u.phases) {
        s_.metrics().observe_queue_time(u.phases->queue);
        if (u.phases->prefilled) {
          s_.metrics().observe_prefill_time(u.phases->prefill);
          s_.metrics().observe_decode_time(u.phases->decode);
          s_.metrics().observe_inference_time(u.phases->inference);
        }
      }
    }
  }

 public:
  bool all_finished() const { return finished_ == submitted_; }
  // Aborts what is still running. The engine answers each abort with a final update (finish
  // reason abort, the request's phases), taken so that an aborted request is counted in every
  // series as any other is. Answers that have not come within half a second (a long engine step)
  // are taken later, as they come, by the engine thread (the Job stays alive for them); only a
  // Job not held by a shared_ptr counts them as aborted at once.
  void abort_unfinished() {
    if (handed_over_) return;
    for (auto& r : requests_)
      if (!r.finished && !r.id.empty()) s_.backend().abort(r.id);
    const auto deadline = Clock::now() + std::chrono::milliseconds(500);
    while (!all_finished() && Clock::now() < deadline) poll(std::chrono::milliseconds(20));
    if (all_finished()) return;
    if (auto self = weak_from_this().lock()) {
      handed_over_ = true;
      queue_->hand_over([self](int p, RequestUpdate& u) {
        self->apply(p, u, nullptr);
        return self->all_finished();
      });
      return;
    }
    for (size_t p = 0; p < requests_.size(); ++p) {
      EngineRequest& r = requests_[p];
      if (r.finished || r.id.empty()) continue;
      r.finished = true;
      ++finished_;
      for (int j = 0; j < sampling_.n; ++j)
        if (!choices_[p * sampling_.n + j].finish_reason) s_.metrics().add_request_success("abort");
    }
  }
  const std::string& error() const { return error_; }
  std::vector<ChoiceState>& choices() { return choices_; }
  std::vector<EngineRequest>& requests() { return requests_; }
  int n() const { return sampling_.n; }
  int64_t prompt_tokens() const {
    int64_t t = 0;
    for (const auto& r : requests_) t += r.prompt_tokens;
    return t;
  }
  int64_t cached_tokens() const {
    int64_t t = 0;
    for (const auto& r : requests_) t += r.cached_tokens;
    return t;
  }
  int64_t completion_tokens() const {
    int64_t t = 0;
    for (const auto& c : choices_) t += static_cast<int64_t>(c.token_ids.size());
    return t;
  }

 private:
  HttpServer& s_;
  SamplingRequest sampling_;
  std::shared_ptr<UpdateQueue> queue_;
  Clock::time_point arrival_;
  std::vector<EngineRequest> requests_;
  std::vector<ChoiceState> choices_;
  int submitted_ = 0, finished_ = 0;
  bool handed_over_ = false;  // abort_unfinished left the remaining updates to the engine thread
  std::string error_;
  std::function<void(ChoiceState&)> setup_;
};

// Tokenised prompt checks shared by both endpoints. image_tokens: what the prompt's image
// placeholders expand by (their images' tokens less the placeholders).
inline void check_prompt(HttpServer& s, const std::vector<int32_t>& ids, SamplingRequest& sampling,
                         bool chat, int64_t image_tokens = 0) {
  const BackendInfo& info = s.backend().info();
  if (ids.empty()) bad_request("prompt", "The prompt is empty.");
  for (int32_t id : ids)
    if (id < 0 || id >= info.vocab_size)
      bad_request("prompt", fmt::format("Token id {} is out of vocabulary", id));
  const int64_t n = static_cast<int64_t>(ids.size()) + image_tokens;
  if (!sampling.max_tokens && chat)
    sampling.max_tokens = std::max<int64_t>(1, info.max_model_len - n);
  const int64_t want = sampling.max_tokens.value_or(16);
  if (n >= info.max_model_len || want > info.max_model_len - n)  // no overflow for any want
    bad_request(
        "input_tokens",
        fmt::format(
            "This model's maximum context length is {} tokens. However, you requested {} output "
            "tokens and your prompt contains at least {} input tokens, for a total of at least {} "
            "tokens. Please reduce the length of the input prompt or the number of requested "
            "output "
            "tokens.",
            info.max_model_len, want, n, n + want));
}

inline std::optional<int64_t> cached(HttpServer& s, const Job& job) {
  if (!s.options().enable_prompt_tokens_details) return std::nullopt;
  return job.cached_tokens();
}

// The end of a stream: an error event if the engine failed, the usage chunk when asked for, then
// [DONE].
inline std::string stream_tail(HttpServer& s, const Job& job, const StreamOptions& so,
                               const std::string& id, const char* object, int64_t created,
                               const std::string& model) {
  std::string out;
  if (!job.error().empty())
    out += "data: " + error_body(500, "InternalServerError", job.error()) + "\n\n";
  if (so.include_usage)
    out += sse_event(
        {{"id", id},
         {"object", object},
         {"created", created},
         {"model", model},
         {"choices", ojson::array()},
         {"usage", usage_json(job.prompt_tokens(), job.completion_tokens(), cached(s, job))}});
  return out + sse_done();
}

// Waits for a non-streamed job, aborting it if the client goes away. Returns false on abort.
inline bool wait_unstreamed(Job& job, const httplib::Request& req) {
  ConnectionProbe probe(req.remote_addr, req.remote_port);
  auto last_probe = Clock::now();
  while (!job.all_finished()) {
    job.poll(std::chrono::milliseconds(100));
    if (Clock::now() - last_probe > std::chrono::milliseconds(200)) {
      last_probe = Clock::now();
      if (probe.closed()) {
        log_debug("the client of request {} went away: aborting it",
                  job.requests().empty() ? std::string("?") : job.requests().front().id);
        job.abort_unfinished();
        return false;
      }
    }
  }
  return true;
}

// A streaming response: the content provider pulls from the job and writes SSE events; when the
// client disconnects (a failed write, or the probe), unfinished engine requests are aborted.
// `prologue` (events that open the stream, as the Responses API's response.created) is written at
// once, before the first token.
template <typename Emit, typename Finish>
void stream_job(httplib::Response& res, const httplib::Request& req, std::shared_ptr<Job> job,
                Emit emit, Finish finish, std::string prologue = {}) {
  auto probe = std::make_shared<ConnectionProbe>(req.remote_addr, req.remote_port);
  auto done = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, probe, done, emit, finish, prologue = std::move(prologue)](
          size_t, httplib::DataSink& sink) mutable {
        if (*done) return false;
        if (!prologue.empty()) {
          std::string first;
          first.swap(prologue);
          if (!sink.write(first.data(), first.size())) {
            job->abort_unfinished();
            return false;
          }
          return true;
        }
        std::string out;
        if (!job->all_finished()) {
          for (auto& ev : job->poll(std::chrono::milliseconds(100))) out += emit(ev);
          if (out.empty() && probe->closed()) {
            job->abort_unfinished();
            return false;
          }
        }
        if (job->all_finished()) {
          // Drain anything that arrived with the final update.
          for (auto& ev : job->poll(std::chrono::milliseconds(0))) out += emit(ev);
          out += finish();
          *done = true;
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          job->abort_unfinished();
          return false;
        }
        if (*done) sink.done();
        return true;
      },
      [job](bool success) {
        if (!success) job->abort_unfinished();
      });
}

}  // namespace atom::server
