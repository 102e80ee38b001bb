// Chat templates: turning a conversation into the prompt text a model was trained on, exactly as
// Hugging Face transformers' apply_chat_template(tokenize=False) does. Loads the template of a
// model folder the way transformers and vLLM find it, and renders it with atom::jinja set up as
// transformers sets up jinja2 (trim_blocks, lstrip_blocks, loopcontrols, its tojson, and the
// raise_exception / strftime_now globals).
#pragma once

#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "jinja/template.h"

namespace atom::tokenizer {

struct ChatRenderOptions {
  // Append the assistant-turn header so the model answers. transformers defaults to false; vLLM's
  // chat endpoint (and atom's CLI) default to true.
  bool add_generation_prompt = true;
  // Leave the last (assistant) message open so the model continues it. Incompatible with
  // add_generation_prompt.
  bool continue_final_message = false;
  // OpenAI-style tool definitions ([{"type": "function", "function": {...}}]); null passes None.
  nlohmann::ordered_json tools;
  // RAG documents ([{"title": ..., "text": ...}]); null passes None.
  nlohmann::ordered_json documents;
  // Further template variables: enable_thinking, reasoning_effort, builtin_tools, ... (vLLM's
  // chat_template_kwargs). They override the special tokens of the same name.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  // A named template of the model ("tool_use", ...). Unset: "tool_use" when tools are given and
  // the model has one, else "default", as transformers chooses.
  std::optional<std::string> template_name;
  // The local time strftime_now() reports. Unset: the current local time. Tests pin it.
  std::optional<std::tm> now;
};

class ChatTemplate {
 public:
  // Loads the chat template(s) and special tokens of a model folder:
  //  - chat_template.jinja, plus additional_chat_templates/<name>.jinja (transformers' files; they
  //    take precedence over the config), else
  //  - tokenizer_config.json "chat_template": a string, or a list of {"name", "template"}, else
  //  - chat_template.json {"chat_template": ...} (processor folders).
  // Special tokens (bos_token, eos_token, ...) come from tokenizer_config.json, overridden by
  // special_tokens_map.json, as plain strings or AddedToken objects ({"content": ...}).
  // `override_template` is vLLM's --chat-template: a file path, or the template text itself
  // (then Python escapes such as \n in it are decoded, as vLLM does); it replaces the folder's
  // templates. A model folder without any template is not an error until render().
  // `limits` bound what parsing and rendering may take (depth, steps, output); the same limits
  // serve templates from a checkpoint and templates from a request.
  static ChatTemplate from_model_dir(const std::filesystem::path& dir,
                                     const std::string& override_template = "",
                                     const jinja::Limits& limits = {});
  // A template given directly, with the special-token variables it may use
  // ({"bos_token": "<s>", ...}).
  static ChatTemplate from_string(
      const std::string& source,
      const nlohmann::ordered_json& special_tokens = nlohmann::ordered_json::object(),
      const jinja::Limits& limits = {});

  // Renders a conversation (a JSON array of messages). Throws atom::Error: jinja::TemplateError
  // for template failures, including the template's own raise_exception() (kind kRaised, message
  // verbatim), and atom::Error for invalid requests.
  std::string render(const nlohmann::ordered_json& messages,
                     const ChatRenderOptions& options = {}) const;

  bool has_template() const { return !templates_.empty(); }
  // The first template that does not parse, as "NAME: error" (a server checks it at start-up);
  // empty when every template parses.
  std::string parse_error() const;
  // Template names ("default" for a single template) to their source.
  std::map<std::string, std::string> template_sources() const;
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }
  const jinja::Limits& limits() const { return limits_; }

 private:
  struct Compiled {
    std::string source;
    std::shared_ptr<jinja::Template> tpl;  // null when the source does not parse
    std::string error;                     // the parse error, reported at render time
  };
  void add_template(const std::string& name, const std::string& source);
  const Compiled& select(const ChatRenderOptions& options) const;

  std::map<std::string, Compiled> templates_;
  bool named_ = false;  // the model has a dict of named templates
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  std::string origin_;  // where the template came from, for error messages
  jinja::Limits limits_;
};

// What vLLM does to OpenAI-style messages before rendering (chat_utils._postprocess_messages):
// assistant tool calls carry `function.arguments` as a JSON string in the API, while templates
// expect a dict, so a string is parsed (JSON objects keep their key order) and an empty or missing
// one becomes {}. Throws atom::Error naming the call when a string is not valid JSON.
void tool_call_arguments_to_dicts(nlohmann::ordered_json& messages);

// vLLM's load_chat_template for --chat-template: the contents of the file it names, or, when no
// such file exists and the value looks like a template (it has '{', '}' or a newline), the value
// itself with Python escapes decoded. Anything else is an error naming the missing file.
std::string load_chat_template_arg(const std::string& value);

// The jinja environment transformers renders chat templates in. strftime_now reads `now` when
// given, else the local time at the call.
jinja::Environment chat_template_environment(std::optional<std::tm> now = std::nullopt,
                                             const jinja::Limits& limits = {});

// transformers' tojson filter: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False).
jinja::Value chat_tojson(jinja::Interpreter& ip, const jinja::Value& value, jinja::CallArgs& args);

}  // namespace atom::tokenizer
