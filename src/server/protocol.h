// OpenAI / vLLM request bodies for /v1/completions and /v1/chat/completions, parsed and
// validated into typed structs. Every rule violation is an ApiError (400) naming the parameter.
// Unknown fields are accepted and ignored, as vLLM does.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace atom::server {

// Sampling fields of a request. Unset fields fall back to the model's generation_config.json,
// then to vLLM's defaults (the engine applies that chain).
// What structured output asks decoding to produce (compiled by the backend into a grammar).
struct StructuredOutput {
  enum Kind {
    kJsonSchema,
    kJsonObject,
    kRegex,
    kChoice,
    kGrammar,
    kStructuralTag
  } kind = kJsonObject;
  std::string spec;  // the schema or structural tag (JSON text), regex or GBNF grammar
  std::vector<std::string> choices;  // kChoice
  std::string param;                 // the request field it came from, for errors
  // Reasoning models (a reasoning parser splits this request's answer): the grammar applies once
  // the reasoning block has ended, as vLLM's does; unset, from the first output token.
  struct Reasoning {
    std::string start, end;            // the block's tags
    bool starts_in_reasoning = false;  // the prompt opened the block
  };
  std::optional<Reasoning> after_reasoning;
};

struct SamplingRequest {
  std::optional<double> temperature, top_p, min_p;
  std::optional<double> presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int64_t> top_k, seed;
  std::optional<int64_t> max_tokens;  // unset: 16 for completions, what fits for chat
  int64_t min_tokens = 0;
  int n = 1;
  std::vector<std::string> stop;
  std::vector<int64_t> stop_token_ids;
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  std::vector<std::pair<int64_t, double>> logit_bias;  // token id -> bias
  std::optional<int> logprobs;         // top-N logprobs per generated token (0: the sampled one)
  std::optional<int> prompt_logprobs;  // top-N logprobs per prompt token
  // response_format, vLLM's structured_outputs or guided_* fields; at most one of them.
  std::optional<StructuredOutput> structured;
};

struct StreamOptions {
  bool include_usage = false;
  bool continuous_usage_stats = false;
};

// A prompt given as text or as token ids.
using Prompt = std::variant<std::string, std::vector<int32_t>>;

struct CompletionRequest {
  std::optional<std::string> model;
  std::vector<Prompt> prompts;  // a list of prompts gives one choice (or n) per prompt
  bool echo = false;
  bool stream = false;
  StreamOptions stream_options;
  bool add_special_tokens = true;
  bool return_token_ids = false;
  SamplingRequest sampling;
  std::optional<std::string> request_id;
};

// An image a chat message carries (an image content part), as sent: decoded and processed for
// the model by the chat flow (chat_images), on the HTTP thread.
struct ChatImage {
  std::string where;  // the part, "messages[i].content[j]", for errors
  std::string url;    // a data: URL (image_data_url_decode checks it)
};

struct ChatRequest {
  std::optional<std::string> model;
  // List of {role, content, ...}. Content given as a list of text parts is one string (their
  // texts joined by newlines); a list with image parts stays a list for the chat template, as
  // vLLM passes it: {"type": "text", "text": ...} and {"type": "image"} (the image in `images`).
  nlohmann::ordered_json messages;
  std::vector<ChatImage> images;          // the image parts' images, in prompt order
  nlohmann::ordered_json tools;           // null or a non-empty list
  std::string tool_choice = "none";       // none | auto | required | named
  std::optional<std::string> named_tool;  // tool_choice {"type":"function","function":{"name"}}
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  std::optional<std::string> chat_template;  // overrides the model's template
  std::optional<std::string> reasoning_effort;
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool echo = false;
  bool stream = false;
  StreamOptions stream_options;
  bool add_special_tokens = false;  // the template emits BOS itself
  bool return_token_ids = false;
  bool logprobs = false;
  SamplingRequest sampling;  // sampling.logprobs = top_logprobs when logprobs is true
  std::optional<std::string> request_id;
};

// Limits the server applies while parsing.
struct ProtocolLimits {
  int max_logprobs = 20;
  int max_n = 128;
  int max_images = 8;  // per prompt: vLLM's --limit-mm-per-prompt '{"image": N}'
};

CompletionRequest completion_request_parse(const nlohmann::ordered_json& body,
                                           const ProtocolLimits& limits = {});
ChatRequest chat_request_parse(const nlohmann::ordered_json& body,
                               const ProtocolLimits& limits = {});

// The chat template's variables for a request, as vLLM passes them: the server's
// --default-chat-template-kwargs, overridden by the request's chat_template_kwargs, then its
// reasoning_effort when given (gpt-oss's template reads `reasoning_effort`).
nlohmann::ordered_json chat_template_variables(const ChatRequest& request,
                                               const nlohmann::ordered_json& defaults);

// Content given as a list of text parts ({"type": one of `types`, "text": ...}) as one string,
// the parts' texts joined by newlines (what vLLM passes to templates that expect string content).
// Any other part is a 400 naming `param` and the part (`where`[j]).
std::string join_text_parts(const nlohmann::ordered_json& parts,
                            std::initializer_list<const char*> types, const std::string& where,
                            const std::string& param);

// A video content part (vLLM's `video_url` and `video`, `input_video`, an Anthropic `video`
// block) is a 400 naming `param` and the part (`where`) and saying the server takes no videos;
// any other type returns.
void refuse_video_part(const std::string& type, const std::string& where, const std::string& param);

// The image bytes of a data: URL (data:image/png;base64,... or image/jpeg): a remote http(s) URL,
// another scheme, another media type, a URL that is not base64 or bad base64 is an ApiError
// (400, param "messages") whose message begins with `where`.
std::vector<uint8_t> image_data_url_decode(const std::string& url, const std::string& where);

// The JSON body of a request as text; an ApiError (400) when it is not a JSON object.
nlohmann::ordered_json request_body_parse(const std::string& text);

}  // namespace atom::server
