#include "server/engine_backend.h"

#include <fmt/ranges.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/log.h"
#include "models/moonvit.h"
#include "grammar/reasoning_gate.h"
#include "server/api_error.h"
#include "server/responses.h"

namespace atom::server {

namespace {

server::TokenLogprob to_server(const atom::TokenLogprob& lp) {
  server::TokenLogprob r{lp.token_id, lp.logprob, {}};
  for (const auto& t : lp.top) r.top.push_back({t.token_id, t.logprob});
  return r;
}

nlohmann::json stop_reason_json(const StopReason& r) {
  if (const auto* s = std::get_if<std::string>(&r)) return *s;
  if (const auto* t = std::get_if<int32_t>(&r)) return *t;
  return nullptr;
}

bool template_has(const tokenizer::ChatTemplate& t, const char* text) {
  for (const auto& [name, src] : t.template_sources())
    if (src.find(text) != std::string::npos) return true;
  return false;
}

// The image processor's parameters of a model folder: preprocessor_config.json's
// media_proc_cfg (Kimi-K2.5's) or its top level, over Kimi-K2.5's defaults.
vision::ProcessorParams image_processor_params(const std::string& dir) {
  vision::ProcessorParams p;
  const std::filesystem::path path = std::filesystem::path(dir) / "preprocessor_config.json";
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_regular_file(path, ec)) return p;
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    const nlohmann::json j = nlohmann::json::parse(ss.str());
    const nlohmann::json& c =
        j.contains("media_proc_cfg") && j["media_proc_cfg"].is_object() ? j["media_proc_cfg"] : j;
    if (c.contains("patch_size")) p.patch_size = c["patch_size"].get<int>();
    if (c.contains("merge_kernel_size")) p.merge_kernel_size = c["merge_kernel_size"].get<int>();
    if (c.contains("in_patch_limit")) p.in_patch_limit = c["in_patch_limit"].get<int64_t>();
    if (c.contains("patch_limit_on_one_side"))
      p.patch_limit_on_one_side = c["patch_limit_on_one_side"].get<int>();
    for (int k = 0; k < 3; ++k) {
      if (c.contains("image_mean")) p.image_mean[k] = c["image_mean"].at(k).get<float>();
      if (c.contains("image_std")) p.image_std[k] = c["image_std"].at(k).get<float>();
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", path.string(), e.what());
  }
  if (p.patch_size < 1 || p.merge_kernel_size < 1 || p.in_patch_limit < 1 ||
      p.patch_limit_on_one_side < 1)
    fail("{}: the image processor's sizes must be positive", path.string());
  return p;
}

}  // namespace

EngineBackend::EngineBackend(LLMEngine& engine, tokenizer::Tokenizer tok,
                             EngineBackendOptions options)
    : engine_(engine),
      tok_(std::move(tok)),
      template_(tokenizer::ChatTemplate::from_model_dir(
          options.tokenizer_path.empty() ? options.model_path : options.tokenizer_path,
          options.chat_template, options.template_limits)),
      options_(std::move(options)),
      image_cache_(options_.image_cache_bytes) {
  info_.model_name = options_.served_model_name;
  info_.model_path = options_.model_path;
  info_.max_model_len = engine_.kv_plan().max_model_len;
  // Ids the model takes and the tokenizer can print.
  info_.vocab_size = std::min<int64_t>(engine_.model().vocab_size(), tok_.id_limit());
  info_.created = unix_time_now();
  // The gauges move when a batch is scheduled, not only when its (possibly long) step ends.
  engine_.set_on_scheduled([this](int running, int waiting) {
    running_ = running;
    engine_waiting_ = waiting;
  });
  info_.reasoning = template_has(template_, "</think>");
  info_.harmony = template_has(template_, "<|channel|>");
  VisionEncoder* v = engine_.model().vision_encoder();
  if (v && !v->unavailable().empty()) {
    info_.images_unavailable = v->unavailable();
    log_warn("images will be refused: {}", info_.images_unavailable);
  } else if (v) {
    info_.image_token_id = static_cast<int32_t>(v->image_token_id());
    info_.image_processor = image_processor_params(options_.model_path);
    info_.max_image_prompt_tokens = engine_.config().max_num_batched_tokens;
  }
  blocks_total_ = engine_.block_manager().num_blocks();
  blocks_free_ = engine_.block_manager().num_free_blocks();
  slots_total_ = engine_.state_pool().enabled() ? engine_.state_pool().num_slots() : 0;
  slots_free_ = engine_.state_pool().enabled() ? engine_.state_pool().num_free() : 0;
  thread_ = std::thread([this] { loop(); });
}

EngineBackend::~EngineBackend() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  engine_.set_on_scheduled({});  // the engine may outlive this backend
}

std::vector<int32_t> EngineBackend::tokenize(const std::string& text, bool add_special_tokens) {
  return tok_.encode(text, add_special_tokens);
}

std::string EngineBackend::detokenize(std::span<const int32_t> ids, bool skip_special_tokens) {
  return tok_.decode(ids, skip_special_tokens);
}

std::string EngineBackend::token_text(int32_t id) {
  // The token as decoded on its own (what vLLM shows in logprobs).
  return tok_.decode(std::span<const int32_t>(&id, 1), false);
}

std::string EngineBackend::render_chat(const ChatRequest& r) {
  nlohmann::ordered_json messages = r.messages;
  tokenizer::tool_call_arguments_to_dicts(messages);
  tokenizer::ChatRenderOptions o;
  o.add_generation_prompt = r.add_generation_prompt;
  o.continue_final_message = r.continue_final_message;
  o.tools = r.tools;
  // The server merged --default-chat-template-kwargs and reasoning_effort in
  // (chat_template_variables).
  o.kwargs = r.chat_template_kwargs;
  try {
    if (r.chat_template) {
      const auto t = tokenizer::ChatTemplate::from_string(
          *r.chat_template, template_.special_tokens(), template_.limits());
      return t.render(messages, o);
    }
    return template_.render(messages, o);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw ApiError(400, "BadRequestError", e.what());
  }
}

SamplingParams EngineBackend::sampling_params(const SamplingRequest& r) const {
  SamplingParams p = engine_.default_params();
  if (r.temperature) p.temperature = *r.temperature;
  if (r.top_p) p.top_p = *r.top_p;
  if (r.min_p) p.min_p = *r.min_p;
  if (r.top_k) p.top_k = static_cast<int>(*r.top_k);
  if (r.presence_penalty) p.presence_penalty = *r.presence_penalty;
  if (r.frequency_penalty) p.frequency_penalty = *r.frequency_penalty;
  if (r.repetition_penalty) p.repetition_penalty = *r.repetition_penalty;
  if (r.seed) p.seed = *r.seed;
  if (r.max_tokens) p.max_tokens = static_cast<int>(std::min<int64_t>(*r.max_tokens, INT32_MAX));
  p.min_tokens = static_cast<int>(r.min_tokens);
  p.n = r.n;
  p.stop = r.stop;
  p.stop_token_ids.clear();
  for (int64_t id : r.stop_token_ids) p.stop_token_ids.push_back(static_cast<int32_t>(id));
  p.ignore_eos = r.ignore_eos;
  p.include_stop_str_in_output = r.include_stop_str_in_output;
  p.skip_special_tokens = r.skip_special_tokens;
  p.logit_bias.clear();
  for (const auto& [id, b] : r.logit_bias)
    p.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  p.logprobs = r.logprobs;
  p.prompt_logprobs = r.prompt_logprobs;
  try {
    p.validate(engine_.model().vocab_size());
  } catch (const Error& e) {
    throw ApiError(400, "BadRequestError", e.what());
  }
  if (r.structured) {
    p.constraint = constraint_for(*r.structured);
    // The reasoning block's tags as single tokens; where they are not, the grammar applies from
    // the first token.
    if (const auto& gate = r.structured->after_reasoning) {
      const int32_t start = tok_.token_to_id(gate->start), end = tok_.token_to_id(gate->end);
      if (end >= 0)
        p.constraint = std::make_shared<const grammar::ReasoningGate>(p.constraint, start, end,
                                                                      gate->starts_in_reasoning);
    }
  }
  return p;
}

std::shared_ptr<const LogitsConstraint> EngineBackend::constraint_for(
    const StructuredOutput& so) const {
  const std::string key =
      fmt::format("{}\n{}\n{}", static_cast<int>(so.kind), so.spec, fmt::join(so.choices, "\x1f"));
  {
    std::lock_guard<std::mutex> lock(grammar_mu_);
    auto it = grammars_.find(key);
    if (it != grammars_.end()) return it->second;
  }
  std::call_once(trie_once_, [&] {
    trie_ = grammar::TokenTrie::from_tokenizer(tok_, engine_.model().vocab_size());
  });
  const grammar::GrammarLimits& lim = options_.grammar_limits;
  std::shared_ptr<const LogitsConstraint> c;
  try {
    std::string gbnf;
    switch (so.kind) {
      case StructuredOutput::kJsonSchema:
        gbnf = grammar::json_schema_to_gbnf(so.spec, lim);
        break;
      case StructuredOutput::kJsonObject:
        gbnf = grammar::json_object_gbnf();
        break;
      case StructuredOutput::kRegex:
        gbnf = grammar::regex_to_gbnf(so.spec, lim);
        break;
      case StructuredOutput::kChoice:
        gbnf = grammar::choice_to_gbnf(so.choices);
        break;
      case StructuredOutput::kGrammar:
        gbnf = so.spec;
        break;
      case StructuredOutput::kStructuralTag:
        gbnf = grammar::structural_tag_to_gbnf(so.spec, lim);
        break;
    }
    auto g = std::make_shared<const grammar::Grammar>(grammar::Grammar::from_gbnf(gbnf, lim));
    c = std::make_shared<const grammar::GrammarConstraint>(std::move(g), trie_);
  } catch (const Error& e) {
    throw ApiError(400, "BadRequestError", fmt::format("{}: {}", so.param, e.what()), so.param);
  }
  std::lock_guard<std::mutex> lock(grammar_mu_);
  if (grammars_.size() >= 256) grammars_.clear();
  grammars_.emplace(key, c);
  return c;
}

void EngineBackend::submit(BackendRequest request, std::function<void(RequestUpdate)> on_update) {
  if (draining_) throw ApiError(503, "ServiceUnavailableError", "The server is shutting down.");
  if (waiting_.load() >= options_.max_waiting)
    throw ApiError(
        503, "ServiceUnavailableError",
        fmt::format("The server is overloaded: {} requests are waiting.", waiting_.load()));
  Command c{Command::kAdd, std::move(request), {}, std::move(on_update), {}};
  c.params = sampling_params(c.request.sampling);
  // The images' pixel values as the engine takes them (their vectors owned by the tensors),
  // expanded and run through the vision tower here, on the submitting thread, so that the engine
  // thread's steps never wait for the tower.
  if (!c.request.images.empty()) {
    std::vector<PromptImage> images;
    for (auto& im : c.request.images) {
      auto owner = std::make_shared<vision::VisionInput>(std::move(im));
      const int64_t p = owner->grid.num_patches();
      const int64_t side = info_.image_processor.patch_size;
      images.push_back({Tensor::wrap(owner->pixel_values.data(), {p, 3, side, side}, DType::kF32,
                                     Device::cpu(), owner),
                        owner->grid});
    }
    c.request.images.clear();
    VisionEncoder* encoder = engine_.model().vision_encoder();
    if (!encoder) throw ApiError(400, "BadRequestError", "this model takes no images", "messages");
    try {
      c.images = prompt_images_expand(*encoder, c.request.prompt_ids, images, &image_cache_);
    } catch (const Error& e) {
      throw ApiError(400, "BadRequestError", e.what(), "messages");
    }
  }
  ++live_;
  ++waiting_;  // counted until the engine thread admits it
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(c));
  }
  cv_.notify_all();
}

void EngineBackend::abort(const std::string& id) {
  Command c{Command::kAbort, {}, {}, {}, {}};
  c.request.id = id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(c));
  }
  cv_.notify_all();
}

BackendStats EngineBackend::stats() {
  BackendStats s;
  s.running = running_;
  s.waiting = waiting_ + engine_waiting_;
  s.kv_blocks_total = blocks_total_;
  s.kv_blocks_free = blocks_free_;
  s.state_slots_total = slots_total_;
  s.state_slots_free = slots_free_;
  s.num_preemptions = preemptions_;
  s.num_steps = steps_;
  s.step_seconds = 1e-9 * static_cast<double>(step_ns_);
  s.step_host_seconds = 1e-9 * static_cast<double>(step_host_ns_);
  s.prefix_cache_queries = prefix_queries_;
  s.prefix_cache_hits = prefix_hits_;
  s.spec_num_drafts = spec_drafts_;
  s.spec_num_draft_tokens = spec_draft_tokens_;
  s.spec_num_accepted_tokens = spec_accepted_;
  for (int i = 0; i < spec_positions_.load(); ++i)
    s.spec_accepted_per_position.push_back(spec_per_pos_[static_cast<size_t>(i)]);
  return s;
}

void EngineBackend::drain() {
  draining_ = true;
  while (live_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void EngineBackend::deliver(
    std::vector<std::pair<std::function<void(RequestUpdate)>, RequestUpdate>>& out) {
  for (auto& [cb, u] : out) cb(std::move(u));
  out.clear();
}

namespace {
std::optional<RequestPhases> phases_of(const RequestOutput& o) {
  if (!o.scheduled) return std::nullopt;
  RequestPhases p;
  p.queue = o.queue_time;
  p.prefill = o.prefill_time;
  p.decode = o.decode_time;
  p.inference = o.inference_time;
  p.prefilled = o.produced;
  return p;
}
}  // namespace

void EngineBackend::loop() {
  std::vector<std::pair<std::function<void(RequestUpdate)>, RequestUpdate>> out;
  // Final update of a request that ended outside a step (abort, or an add that failed).
  auto final_update = [&](const std::string& id, const RequestOutput* o, const std::string& error) {
    auto it = live_map_.find(id);
    if (it == live_map_.end()) return;
    RequestUpdate u;
    u.finished = true;
    u.error = error;
    if (o) u.phases = phases_of(*o);
    if (o) {
      for (const auto& c : o->outputs) {
        if (!it->second.first_finish(c.index)) continue;
        ChoiceDelta d;
        d.index = c.index;
        d.finish_reason = finish_reason_name(c.finish_reason);
        if (d.finish_reason->empty()) d.finish_reason = "abort";
        d.stop_reason = stop_reason_json(c.stop_reason);
        u.choices.push_back(std::move(d));
      }
    } else {
      for (int i = 0; i < it->second.n; ++i) {
        if (!it->second.first_finish(i)) continue;
        ChoiceDelta d;
        d.index = i;
        d.finish_reason = error.empty() ? "abort" : "error";
        u.choices.push_back(std::move(d));
      }
    }
    out.emplace_back(it->second.on_update, std::move(u));
    live_map_.erase(it);
    --live_;
  };

  for (;;) {
    std::deque<Command> cmds;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !commands_.empty() || engine_.has_unfinished(); });
      if (stop_) break;
      cmds.swap(commands_);
    }
    for (auto& c : cmds) {
      const std::string id = c.request.id;
      if (c.kind == Command::kAdd) {
        --waiting_;
        live_map_[id] = Live{std::move(c.on_update), false, c.params.n,
                             std::vector<bool>(static_cast<size_t>(c.params.n))};
        try {
          engine_.add_request(id, std::move(c.request.prompt_ids), c.params, c.images);
        } catch (const std::exception& e) {
          final_update(id, nullptr, e.what());
        }
      } else {
        if (auto o = engine_.abort(id)) {
          log_info("aborted request {}", id);
          final_update(id, &*o, "");
        }
      }
    }
    if (engine_.has_unfinished()) {
      StepOutput step;
      try {
        step = engine_.step();
      } catch (const std::exception& e) {
        // A failed step (out of memory, a kernel error) fails the requests it held; the engine
        // keeps serving the others.
        log_warn("engine step failed: {}", e.what());
        std::vector<std::string> ids;
        for (const auto& [id, live] : live_map_) ids.push_back(id);
        for (const auto& id : ids) {
          auto o = engine_.abort(id);
          final_update(id, o ? &*o : nullptr, std::string("engine error: ") + e.what());
        }
        deliver(out);
        continue;
      }
      std::unordered_map<std::string, RequestUpdate> updates;
      for (const auto& ev : step.tokens) {
        auto it = live_map_.find(*ev.request_id);
        if (it == live_map_.end()) continue;
        RequestUpdate& u = updates[*ev.request_id];
        const Sequence& seq = *ev.seq;
        if (!it->second.sent_prompt_info) {
          u.prompt_tokens = seq.num_prompt_tokens;
          u.cached_tokens = std::max(0, seq.num_cached_tokens);
          for (const auto& lp : seq.request->prompt_logprobs)
            u.prompt_logprobs.push_back(
                lp ? to_server(*lp) : server::TokenLogprob{seq.request->prompt.front(), 0, {}});
          it->second.sent_prompt_info = true;
        }
        ChoiceDelta* d = nullptr;
        for (auto& x : u.choices)
          if (x.index == ev.index) d = &x;
        if (!d) {
          u.choices.push_back(ChoiceDelta{});
          d = &u.choices.back();
          d->index = ev.index;
        }
        d->text += ev.text;
        d->token_ids.push_back(ev.token_id);
        if (seq.params().logprobs && !seq.logprobs.empty())
          d->logprobs.push_back(to_server(seq.logprobs.back()));
        if (ev.finished && it->second.first_finish(ev.index)) {
          d->finish_reason = finish_reason_name(seq.finish_reason);
          d->stop_reason = stop_reason_json(seq.stop_reason);
        }
      }
      for (const auto& fo : step.finished) {
        auto it = live_map_.find(fo.request_id);
        if (it == live_map_.end()) continue;
        RequestUpdate& u = updates[fo.request_id];
        u.finished = true;
        u.phases = phases_of(fo);
        // Text the detokenizer held back until the end, and finish reasons of samples that ended
        // without a token in this step.
        for (const auto& c : fo.outputs) {
          ChoiceDelta* d = nullptr;
          for (auto& x : u.choices)
            if (x.index == c.index) d = &x;
          if (!d) {
            u.choices.push_back(ChoiceDelta{});
            d = &u.choices.back();
            d->index = c.index;
          }
          if (!d->finish_reason && it->second.first_finish(c.index)) {
            d->finish_reason = finish_reason_name(c.finish_reason);
            d->stop_reason = stop_reason_json(c.stop_reason);
          }
        }
        if (!it->second.sent_prompt_info) {
          u.prompt_tokens = static_cast<int>(fo.prompt_token_ids.size());
          it->second.sent_prompt_info = true;
        }
      }
      for (auto& [id, u] : updates) {
        auto it = live_map_.find(id);
        if (it == live_map_.end()) continue;
        const bool done = u.finished;
        out.emplace_back(it->second.on_update, std::move(u));
        if (done) {
          live_map_.erase(it);
          --live_;
        }
      }
      const EngineStats st = engine_.stats();
      preemptions_ = st.num_preemptions;
      steps_ = st.num_steps;
      step_ns_ = static_cast<int64_t>(1e9 * st.step_seconds);
      step_host_ns_ = static_cast<int64_t>(1e9 * (st.step_seconds - st.forward_seconds));
      prefix_queries_ = st.prefix_cache_queries;
      prefix_hits_ = st.prefix_cache_hits;
      spec_drafts_ = st.spec_num_drafts;
      spec_draft_tokens_ = st.spec_num_draft_tokens;
      spec_accepted_ = st.spec_num_accepted_tokens;
      const size_t P = std::min(st.spec_accepted_per_position.size(), spec_per_pos_.size());
      for (size_t i = 0; i < P; ++i) spec_per_pos_[i] = st.spec_accepted_per_position[i];
      spec_positions_ = static_cast<int>(P);
    }
    running_ = engine_.scheduler().num_running();
    engine_waiting_ = engine_.scheduler().num_waiting();
    blocks_free_ = engine_.block_manager().num_free_blocks();
    if (engine_.state_pool().enabled()) slots_free_ = engine_.state_pool().num_free();
    deliver(out);
  }
  // Shutting down: every request still held ends with "abort".
  std::vector<std::string> ids;
  for (const auto& [id, live] : live_map_) ids.push_back(id);
  for (const auto& id : ids) {
    auto o = engine_.abort(id);
    final_update(id, o ? &*o : nullptr, "");
  }
  deliver(out);
}

}  // namespace atom::server
