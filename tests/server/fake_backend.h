// A Backend without a model: one token per byte, a scripted reply, a configurable delay per token.
// It lets the HTTP layer be tested for protocol behaviour on its own.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "server/api_error.h"
#include "server/backend.h"

namespace atom::test {

class FakeBackend : public server::Backend {
 public:
  // Token id = byte + kOffset; ids below kOffset are specials (0 = BOS, 1 = EOS).
  static constexpr int32_t kOffset = 3;

  FakeBackend() {
    info_.model_name = "fake-model";
    info_.model_path = "/models/fake";
    info_.max_model_len = 256;
    info_.vocab_size = 256 + kOffset;
    info_.created = 1700000000;
  }
  ~FakeBackend() override {
    std::vector<std::thread> ts;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ts.swap(threads_);
    }
    for (auto& t : ts) t.join();
  }

  std::string reply = "Hello, world! This is atom.";
  std::chrono::milliseconds delay{0};
  int max_waiting = 1 << 30;  // submissions beyond this many in flight get 503
  bool reasoning = false;
  bool harmony = false;  // as if the chat template wrote harmony channels (gpt-oss)
  int64_t max_model_len = 256;
  // As a model that takes images: the chat template renders an image part as kImagePlaceholder,
  // which tokenizes to this id (-1: the model takes no images).
  static constexpr const char* kImagePlaceholder = "<|media_pad|>";
  int32_t image_token_id = -1;
  std::string images_unavailable;  // a vision tower that cannot run on this device
  int64_t max_image_prompt_tokens = 0;
  // Replies chosen by the prompt: the first whose key the prompt's text contains, else `reply`.
  std::vector<std::pair<std::string, std::string>> replies;

  const server::BackendInfo& info() const override {
    const_cast<server::BackendInfo&>(info_).reasoning = reasoning;
    const_cast<server::BackendInfo&>(info_).harmony = harmony;
    const_cast<server::BackendInfo&>(info_).max_model_len = max_model_len;
    const_cast<server::BackendInfo&>(info_).image_token_id = image_token_id;
    const_cast<server::BackendInfo&>(info_).images_unavailable = images_unavailable;
    const_cast<server::BackendInfo&>(info_).max_image_prompt_tokens = max_image_prompt_tokens;
    return info_;
  }
  std::vector<int32_t> tokenize(const std::string& text, bool add_special) override {
    std::vector<int32_t> r;
    if (add_special) r.push_back(0);
    const std::string pad = kImagePlaceholder;
    for (size_t i = 0; i < text.size(); ++i) {
      if (image_token_id >= 0 && text.compare(i, pad.size(), pad) == 0) {
        r.push_back(image_token_id);
        i += pad.size() - 1;
        continue;
      }
      r.push_back(static_cast<unsigned char>(text[i]) + kOffset);
    }
    return r;
  }
  std::string detokenize(std::span<const int32_t> ids, bool skip_special) override {
    std::string s;
    for (int32_t id : ids) {
      if (id >= kOffset)
        s.push_back(static_cast<char>(id - kOffset));
      else if (!skip_special)
        s += id == 0 ? "<s>" : "</s>";
    }
    return s;
  }
  std::string token_text(int32_t id) override {
    return detokenize(std::span<const int32_t>(&id, 1), false);
  }
  std::string render_chat(const server::ChatRequest& r) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_chat_template_kwargs_ = r.chat_template_kwargs;
    }
    std::string s;
    for (const auto& m : r.messages) {
      if (m.value("role", "") == "raise")
        throw server::ApiError(400, "BadRequestError", "template error: raise role");
      s += "<|" + m.value("role", "") + "|>";
      if (m.contains("content") && m["content"].is_string()) s += m["content"].get<std::string>();
      if (m.contains("content") && m["content"].is_array())  // parts with images
        for (const auto& part : m["content"])
          s += part.value("type", "") == "image" ? std::string(kImagePlaceholder)
                                                 : part.value("text", "");
    }
    if (r.add_generation_prompt) s += "<|assistant|>";
    if (reasoning && r.chat_template_kwargs.value("enable_thinking", true)) s += "<think>";
    return s;
  }

  void submit(server::BackendRequest req, std::function<void(server::RequestUpdate)> cb) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (live_ >= max_waiting)
        throw server::ApiError(503, "ServiceUnavailableError", "queue full");
      ++live_;
      ++total_submitted_;
      aborted_[req.id] = false;
      last_request_ = req;
    }
    std::string text = reply;
    const std::string prompt = detokenize(req.prompt_ids, false);
    for (const auto& [key, r] : replies)
      if (prompt.find(key) != std::string::npos) {
        text = r;
        break;
      }
    std::lock_guard<std::mutex> lock(mu_);
    threads_.emplace_back([this, req = std::move(req), cb = std::move(cb), reply = text] {
      const int n = req.sampling.n;
      const int64_t max_tokens = req.sampling.max_tokens.value_or(16);
      std::vector<std::string> texts(n);
      for (int64_t step = 0;; ++step) {
        if (delay.count()) std::this_thread::sleep_for(delay);
        bool aborted;
        {
          std::lock_guard<std::mutex> lock(mu_);
          aborted = aborted_[req.id];
        }
        server::RequestUpdate u;
        // As the engine: each image's placeholder counts as the image's tokens.
        u.prompt_tokens = static_cast<int>(req.prompt_ids.size());
        for (const auto& im : req.images) u.prompt_tokens += static_cast<int>(im.num_tokens) - 1;
        if (step == 0 && req.sampling.prompt_logprobs)
          for (int32_t id : req.prompt_ids) u.prompt_logprobs.push_back({id, -1.0f, {{id, -1.0f}}});
        const bool out_of_reply = step >= static_cast<int64_t>(reply.size());
        const bool last = aborted || out_of_reply || step + 1 >= max_tokens;
        for (int i = 0; i < n; ++i) {
          server::ChoiceDelta d;
          d.index = i;
          if (!aborted && !out_of_reply) {
            const auto c = static_cast<unsigned char>(reply[step]);
            // As the engine's detokenizer: text comes out in whole UTF-8 characters, so a
            // character's leading bytes (tokens) carry no text yet.
            std::string& pending = texts[i];
            pending += static_cast<char>(c);
            const auto lead = static_cast<unsigned char>(pending[0]);
            const size_t need = lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
            if (pending.size() >= need) {
              d.text = pending;
              pending.clear();
            }
            d.token_ids = {c + kOffset};
            if (req.sampling.logprobs)
              d.logprobs = {{c + kOffset, -0.5f, {{c + kOffset, -0.5f}, {kOffset, -1.5f}}}};
          }
          if (last) {
            d.text += texts[i];  // an incomplete character at the end (malformed reply) as is
            texts[i].clear();
            d.finish_reason = aborted ? "abort" : out_of_reply ? "stop" : "length";
            if (out_of_reply && !aborted) d.stop_reason = nullptr;
          }
          u.choices.push_back(std::move(d));
        }
        u.finished = last;
        cb(std::move(u));
        if (last) break;
      }
      std::lock_guard<std::mutex> lock(mu_);
      --live_;
      if (aborted_[req.id]) ++aborted_count_;
    });
  }

  void abort(const std::string& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.count(id)) aborted_[id] = true;
  }

  server::BackendStats stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    server::BackendStats s;
    s.running = live_;
    s.kv_blocks_total = 100;
    s.kv_blocks_free = 100 - live_;
    // Engine steps as a rule of its own: one per request submitted, 4 ms each, 1 ms of it host.
    s.num_steps = total_submitted_;
    s.step_seconds = 0.004 * total_submitted_;
    s.step_host_seconds = 0.001 * total_submitted_;
    return s;
  }

  int live() {
    std::lock_guard<std::mutex> lock(mu_);
    return live_;
  }
  int aborted_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_count_;
  }
  server::BackendRequest last_request() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_request_;
  }
  // The template variables of the last chat request rendered.
  nlohmann::ordered_json last_chat_template_kwargs() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_chat_template_kwargs_;
  }

 private:
  server::BackendInfo info_;
  std::mutex mu_;
  int live_ = 0, total_submitted_ = 0, aborted_count_ = 0;
  std::map<std::string, bool> aborted_;
  server::BackendRequest last_request_;
  nlohmann::ordered_json last_chat_template_kwargs_;
  std::vector<std::thread> threads_;
};

}  // namespace atom::test
