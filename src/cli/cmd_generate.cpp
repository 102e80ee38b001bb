// atom generate --model DIR --prompt-tokens 1,2,3 --max-tokens N --temperature 0 --ignore-eos
// --json atom generate --model DIR --input requests.jsonl [--json]
//
// Every prompt goes through the engine together (continuous batching). Each JSONL line is a
// request object: {"prompt_token_ids": [...], "max_tokens": 32, "temperature": 0.7, ...} with
// vLLM's sampling fields; fields a line leaves out come from the command line, then
// generation_config.json, then vLLM's defaults. The command line's --temperature defaults to 0
// (greedy), as this command always did. Output: one line per prompt (per sample when n > 1), in
// input order; with --json one object with prompt_token_ids, token_ids (generated ids only) and
// finish_reason, plus stop_reason, index, text, logprobs, prompt_logprobs and metrics when they
// apply.
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/engine_args.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "engine/tokenizer_text.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::json;

struct GenerateArgs {
  atom::cli::ModelArgs model;
  atom::cli::EngineArgs engine;
  std::vector<std::string> prompts;
  std::vector<std::string> text_prompts;
  bool chat = false;
  std::string chat_template;
  std::string chat_template_kwargs;
  std::string input;
  int max_tokens = 16;
  double temperature = 0.0;
  double top_p = 1.0, min_p = 0.0;
  int top_k = 0, n = 1, min_tokens = 0, logprobs = 0;
  int64_t seed = 0;
  bool ignore_eos = false;
  bool json = false;
  bool metrics = false;
  CLI::Option *top_p_opt, *top_k_opt, *min_p_opt, *seed_opt, *n_opt, *min_tokens_opt, *logprobs_opt;
};

json logprob_json(const atom::TokenLogprob& lp) {
  json top = json::array();
  for (const auto& t : lp.top) top.push_back({{"token_id", t.token_id}, {"logprob", t.logprob}});
  return {
      {"token_id", lp.token_id}, {"logprob", lp.logprob}, {"rank", lp.rank}, {"top_logprobs", top}};
}

json stop_reason_json(const atom::StopReason& r) {
  if (const auto* s = std::get_if<std::string>(&r)) return *s;
  if (const auto* t = std::get_if<int32_t>(&r)) return *t;
  return nullptr;
}

void print_output(const atom::RequestOutput& o, const atom::SamplingParams& p,
                  const GenerateArgs& a, bool has_text) {
  for (const auto& c : o.outputs) {
    if (!a.json) {
      // Text when the model has a tokenizer, else the generated ids.
      if (has_text) {
        std::printf("%s\n", c.text.c_str());
      } else {
        std::printf("%s\n", fmt::format("{}", fmt::join(c.token_ids, ",")).c_str());
      }
      continue;
    }
    json j = {{"prompt_token_ids", o.prompt_token_ids},
              {"token_ids", c.token_ids},
              {"finish_reason", atom::finish_reason_name(c.finish_reason)}};
    if (!std::holds_alternative<std::monostate>(c.stop_reason))
      j["stop_reason"] = stop_reason_json(c.stop_reason);
    if (o.outputs.size() > 1) j["index"] = c.index;
    if (has_text) j["text"] = c.text;
    if (p.logprobs) {
      json lps = json::array();
      for (const auto& lp : c.logprobs) lps.push_back(logprob_json(lp));
      j["logprobs"] = lps;
    }
    if (p.prompt_logprobs) {
      json lps = json::array();
      for (const auto& lp : o.prompt_logprobs)
        lps.push_back(lp ? logprob_json(*lp) : json(nullptr));
      j["prompt_logprobs"] = lps;
    }
    if (a.metrics)
      j["metrics"] = {{"ttft", c.ttft},
                      {"tpot", c.tpot},
                      {"e2e_latency", o.e2e_latency},
                      {"num_cached_tokens", c.num_cached_tokens},
                      {"num_preemptions", c.num_preemptions},
                      {"token_times", c.token_times}};
    std::printf("%s\n", j.dump().c_str());
  }
}

// Text prompts: the model folder's tokenizer and, for chat, its chat template.
struct TextSide {
  std::optional<atom::tokenizer::Tokenizer> tok;
  std::optional<atom::tokenizer::ChatTemplate> tpl;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();

  const atom::tokenizer::Tokenizer& tokenizer(const std::string& what) const {
    if (!tok) atom::fail("{} needs a tokenizer, but the model folder has no tokenizer.json", what);
    return *tok;
  }
  std::vector<int32_t> encode(const std::string& text) const {
    return tokenizer("a text prompt").encode(text, /*add_special_tokens=*/true);
  }
  // The conversation rendered with the chat template, then tokenized without adding specials
  // (the template writes BOS itself), as vLLM's chat endpoint does.
  std::vector<int32_t> encode_chat(nlohmann::ordered_json messages) const {
    const auto& t = tokenizer("a chat prompt");
    if (!tpl) atom::fail("a chat prompt needs the model's chat template");
    atom::tokenizer::tool_call_arguments_to_dicts(messages);
    atom::tokenizer::ChatRenderOptions o;
    o.kwargs = kwargs;
    return t.encode(tpl->render(messages, o), /*add_special_tokens=*/false);
  }
};

std::vector<int32_t> prompt_from_json(const json& line, const std::string& where,
                                      const TextSide& text) {
  if (!line.contains("prompt_token_ids")) {
    try {
      if (line.contains("prompt") && line["prompt"].is_string())
        return text.encode(line["prompt"].get<std::string>());
      if (line.contains("messages"))
        return text.encode_chat(nlohmann::ordered_json::parse(line["messages"].dump()));
    } catch (const atom::Error& e) {
      atom::fail("{}: {}", where, e.what());
    }
    atom::fail("{}: the request has no prompt_token_ids, prompt or messages", where);
  }
  const json& ids = line.at("prompt_token_ids");
  if (!ids.is_array()) atom::fail("{}: prompt_token_ids must be a list of token ids", where);
  std::vector<int32_t> r;
  for (const json& e : ids) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX)
      atom::fail("{}: prompt_token_ids must be a list of non-negative token ids, got {}", where,
                 ids.dump());
    r.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  return r;
}

void run(const GenerateArgs& a) {
  if (a.prompts.empty() && a.text_prompts.empty() && a.input.empty())
    atom::fail("give prompts with --prompt-tokens, --prompt or --input FILE.jsonl");
  if (a.max_tokens < 0) atom::fail("--max-tokens {} must be >= 0", a.max_tokens);
  TextSide side;
  if (std::filesystem::exists(std::filesystem::path(a.model.model) / "tokenizer.json")) {
    side.tok = atom::tokenizer::Tokenizer::from_dir(a.model.model);
    side.tpl = atom::tokenizer::ChatTemplate::from_model_dir(a.model.model, a.chat_template);
  }
  if (!a.chat_template_kwargs.empty()) {
    try {
      side.kwargs = nlohmann::ordered_json::parse(a.chat_template_kwargs);
    } catch (const json::exception& e) {
      atom::fail("--chat-template-kwargs is not JSON: {}", e.what());
    }
    if (!side.kwargs.is_object()) atom::fail("--chat-template-kwargs must be a JSON object");
  }
  auto m = atom::cli::model_args_load(a.model);
  if (atom::cli::worker_ran(*m)) return;
  const auto gen = atom::generation_config_load(a.model.model);
  const atom::EngineConfig config = atom::cli::engine_args_config(a.engine);
  const auto drafter = atom::cli::model_args_load_drafter(a.model, *m, config);
  atom::LLMEngine engine(
      *m, config, gen,
      side.tok ? atom::tokenizer_text_streams(*side.tok) : atom::TextStreamFactory{},
      atom::cli::drafter_of(drafter));

  // Command-line sampling options overlay generation_config.json's defaults.
  atom::SamplingParams base = engine.default_params();
  base.max_tokens = a.max_tokens;
  base.temperature = a.temperature;
  base.ignore_eos = a.ignore_eos;
  if (a.top_p_opt->count()) base.top_p = a.top_p;
  if (a.top_k_opt->count()) base.top_k = a.top_k;
  if (a.min_p_opt->count()) base.min_p = a.min_p;
  if (a.seed_opt->count()) base.seed = a.seed;
  if (a.n_opt->count()) base.n = a.n;
  if (a.min_tokens_opt->count()) base.min_tokens = a.min_tokens;
  if (a.logprobs_opt->count()) base.logprobs = a.logprobs;

  std::vector<std::vector<int32_t>> prompts;
  std::vector<atom::SamplingParams> params;
  for (const auto& p : a.prompts) {
    prompts.push_back(atom::cli::token_list_parse(p, "--prompt-tokens"));
    params.push_back(base);
  }
  for (const auto& p : a.text_prompts) {
    prompts.push_back(a.chat ? side.encode_chat(nlohmann::ordered_json::array(
                                   {{{"role", "user"}, {"content", p}}}))
                             : side.encode(p));
    params.push_back(base);
  }
  if (!a.input.empty()) {
    std::ifstream in(a.input);
    if (!in) atom::fail("--input {}: cannot open the file", a.input);
    std::string text;
    for (int line_no = 1; std::getline(in, text); ++line_no) {
      if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = fmt::format("{}:{}", a.input, line_no);
      json line;
      try {
        line = json::parse(text);
      } catch (const json::exception& e) {
        atom::fail("{}: not a JSON object: {}", where, e.what());
      }
      prompts.push_back(prompt_from_json(line, where, side));
      try {
        params.push_back(atom::sampling_params_from_json(line, base));
        params.back().validate(m->model().vocab_size());
      } catch (const atom::Error& e) {
        atom::fail("{}: {}", where, e.what());
      }
    }
  }
  const auto outputs = engine.generate(prompts, params);
  for (size_t i = 0; i < outputs.size(); ++i)
    print_output(outputs[i], params[i], a, side.tok.has_value());
}

}  // namespace

ATOM_REGISTER_COMMAND([](CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate tokens for one or more prompts");
  atom::cli::model_args_add(cmd, args->model);
  atom::cli::engine_args_add(cmd, args->engine);
  cmd->add_option("--prompt", args->text_prompts,
                  "a text prompt (repeatable); needs the model's tokenizer");
  cmd->add_flag("--chat", args->chat,
                "send each --prompt as a user message through the chat template");
  cmd->add_option("--chat-template", args->chat_template,
                  "chat template file or text (default: the model's)");
  cmd->add_option("--chat-template-kwargs", args->chat_template_kwargs,
                  "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'");
  cmd->add_option("--prompt-tokens", args->prompts,
                  "comma-separated prompt token ids (repeatable)");
  cmd->add_option(
      "--input", args->input,
      "JSONL file of requests: {\"prompt_token_ids\": [...], \"max_tokens\": ..., ...}");
  cmd->add_option("--max-tokens", args->max_tokens, "tokens to generate per prompt")
      ->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "sampling temperature (0: greedy)")
      ->capture_default_str();
  args->top_p_opt = cmd->add_option("--top-p", args->top_p, "nucleus sampling mass");
  args->top_k_opt =
      cmd->add_option("--top-k", args->top_k, "sample among the k most likely (0: off)");
  args->min_p_opt =
      cmd->add_option("--min-p", args->min_p, "drop tokens below min_p x the top one");
  args->seed_opt = cmd->add_option("--sampling-seed", args->seed, "per-request sampling seed");
  args->n_opt = cmd->add_option("--n", args->n, "samples per prompt");
  args->min_tokens_opt = cmd->add_option("--min-tokens", args->min_tokens,
                                         "tokens to generate before EOS or stop ids may end it");
  args->logprobs_opt = cmd->add_option("--logprobs", args->logprobs,
                                       "return log-probabilities with this many top tokens");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->add_flag("--json", args->json, "print one JSON object per prompt");
  cmd->add_flag("--metrics", args->metrics, "add TTFT, TPOT and token times to the JSON output");
  cmd->callback([args] { run(*args); });
});
