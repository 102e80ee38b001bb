#include "server/protocol.h"

#include <fmt/ranges.h>

#include <algorithm>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <limits>

#include "server/api_error.h"

namespace atom::server {

using json = nlohmann::ordered_json;

namespace {

// Typed, validated access to the fields of a request body.
class Fields {
 public:
  explicit Fields(const json& j) : j_(j) {}

  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  const json& at(const char* k) const { return j_[k]; }

  std::optional<int64_t> opt_int(const char* k) const {
    if (!has(k)) return std::nullopt;
    const json& v = j_[k];
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad_request(k, fmt::format("'{}' is out of range, got {}", k, v.dump()));
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9.2e18)
        return static_cast<int64_t>(d);
    }
    bad_request(k, fmt::format("'{}' must be an integer, got {}", k, v.dump()));
  }
  // An integer the engine holds in 32 bits: larger values are refused, not wrapped.
  std::optional<int64_t> opt_int32(const char* k) const {
    const auto v = opt_int(k);
    if (v && (*v < std::numeric_limits<int32_t>::min() || *v > std::numeric_limits<int32_t>::max()))
      bad_request(k, fmt::format("'{}' must be at most {} in magnitude, got {}", k,
                                 std::numeric_limits<int32_t>::max(), *v));
    return v;
  }
  std::optional<double> opt_double(const char* k) const {
    if (!has(k)) return std::nullopt;
    const json& v = j_[k];
    if (!v.is_number()) bad_request(k, fmt::format("'{}' must be a number, got {}", k, v.dump()));
    const double d = v.get<double>();
    if (!std::isfinite(d)) bad_request(k, fmt::format("'{}' must be finite", k));
    return d;
  }
  bool get_bool(const char* k, bool fallback) const {
    if (!has(k)) return fallback;
    const json& v = j_[k];
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1))
      return v.get<int64_t>() == 1;
    bad_request(k, fmt::format("'{}' must be a boolean, got {}", k, v.dump()));
  }
  std::optional<std::string> opt_string(const char* k) const {
    if (!has(k)) return std::nullopt;
    const json& v = j_[k];
    if (!v.is_string()) bad_request(k, fmt::format("'{}' must be a string, got {}", k, v.dump()));
    return v.get<std::string>();
  }

 private:
  const json& j_;
};

std::string num(double v) { return fmt::format("{}", v); }

void parse_stop(const Fields& f, SamplingRequest& s) {
  if (!f.has("stop")) return;
  const json& v = f.at("stop");
  if (v.is_string()) {
    s.stop.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const auto& x : v) {
      if (!x.is_string()) bad_request("stop", "'stop' must be a string or a list of strings");
      s.stop.push_back(x.get<std::string>());
    }
  } else {
    bad_request("stop", "'stop' must be a string or a list of strings");
  }
  for (const auto& st : s.stop)
    if (st.empty()) bad_request("stop", "'stop' strings must not be empty");
}

void parse_sampling(const Fields& f, SamplingRequest& s, const ProtocolLimits& limits,
                    const char* max_tokens_key) {
  s.temperature = f.opt_double("temperature");
  s.top_p = f.opt_double("top_p");
  s.min_p = f.opt_double("min_p");
  s.presence_penalty = f.opt_double("presence_penalty");
  s.frequency_penalty = f.opt_double("frequency_penalty");
  s.repetition_penalty = f.opt_double("repetition_penalty");
  s.top_k = f.opt_int32("top_k");
  s.seed = f.opt_int("seed");
  s.max_tokens = f.opt_int32(max_tokens_key);
  if (const auto n = f.opt_int("n")) {
    if (*n < 1) bad_request("n", fmt::format("n must be at least 1, got {}.", *n));
    if (*n > limits.max_n)
      bad_request("n", fmt::format("n must be at most {}, got {}.", limits.max_n, *n));
    s.n = static_cast<int>(*n);
  }
  if (const auto m = f.opt_int32("min_tokens")) s.min_tokens = *m;
  s.ignore_eos = f.get_bool("ignore_eos", false);
  s.include_stop_str_in_output = f.get_bool("include_stop_str_in_output", false);
  s.skip_special_tokens = f.get_bool("skip_special_tokens", true);
  parse_stop(f, s);
  if (f.has("stop_token_ids")) {
    const json& v = f.at("stop_token_ids");
    if (!v.is_array()) bad_request("stop_token_ids", "'stop_token_ids' must be a list of integers");
    for (const auto& x : v) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0)
        bad_request("stop_token_ids", "'stop_token_ids' must be a list of non-negative integers");
      if (x.get<int64_t>() > std::numeric_limits<int32_t>::max())
        bad_request("stop_token_ids",
                    fmt::format("'stop_token_ids' entry {} is not a token id", x.dump()));
      s.stop_token_ids.push_back(x.get<int64_t>());
    }
  }
  if (f.has("logit_bias")) {
    const json& v = f.at("logit_bias");
    if (!v.is_object())
      bad_request("logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (auto it = v.begin(); it != v.end(); ++it) {
      char* end = nullptr;
      errno = 0;
      const long long id = std::strtoll(it.key().c_str(), &end, 10);
      if (it.key().empty() || *end != '\0' || id < 0 || errno == ERANGE ||
          id > std::numeric_limits<int32_t>::max())
        bad_request("logit_bias", fmt::format("'logit_bias' key '{}' is not a token id", it.key()));
      if (!it.value().is_number())
        bad_request("logit_bias",
                    fmt::format("'logit_bias' value for {} must be a number", it.key()));
      const double b = it.value().get<double>();
      if (!(b >= -100 && b <= 100))
        bad_request("logit_bias",
                    fmt::format("'logit_bias' value for {} must be in [-100, 100], got {}",
                                it.key(), num(b)));
      s.logit_bias.emplace_back(id, b);
    }
  }
  if (const auto p = f.opt_int("prompt_logprobs")) {
    if (*p < 0 && *p != -1)
      bad_request("prompt_logprobs",
                  fmt::format("prompt_logprobs must be non-negative, got {}.", *p));
    const int64_t want = *p == -1 ? limits.max_logprobs : *p;
    if (want > limits.max_logprobs)
      bad_request(
          "prompt_logprobs",
          fmt::format("Requested prompt logprobs of {}, which is greater than max allowed: {}", *p,
                      limits.max_logprobs));
    s.prompt_logprobs = static_cast<int>(want);
  }

  // The checks of vLLM's SamplingParams, with its messages.
  if (s.temperature && *s.temperature < 0)
    bad_request("temperature",
                fmt::format("temperature must be non-negative, got {}.", num(*s.temperature)));
  if (s.top_p && !(*s.top_p > 0 && *s.top_p <= 1))
    bad_request("top_p", fmt::format("top_p must be in (0, 1], got {}.", num(*s.top_p)));
  if (s.min_p && !(*s.min_p >= 0 && *s.min_p <= 1))
    bad_request("min_p", fmt::format("min_p must be in [0, 1], got {}.", num(*s.min_p)));
  if (s.top_k && *s.top_k < -1)
    bad_request("top_k",
                fmt::format("top_k must be -1 or 0 (disable), or at least 1, got {}.", *s.top_k));
  if (s.presence_penalty && !(*s.presence_penalty >= -2 && *s.presence_penalty <= 2))
    bad_request("presence_penalty", fmt::format("presence_penalty must be in [-2, 2], got {}.",
                                                num(*s.presence_penalty)));
  if (s.frequency_penalty && !(*s.frequency_penalty >= -2 && *s.frequency_penalty <= 2))
    bad_request("frequency_penalty", fmt::format("frequency_penalty must be in [-2, 2], got {}.",
                                                 num(*s.frequency_penalty)));
  if (s.repetition_penalty && !(*s.repetition_penalty > 0))
    bad_request("repetition_penalty",
                fmt::format("repetition_penalty must be greater than zero, got {}.",
                            num(*s.repetition_penalty)));
  if (s.max_tokens && *s.max_tokens < 1)
    bad_request(max_tokens_key,
                fmt::format("max_tokens must be at least 1, got {}.", *s.max_tokens));
  if (s.min_tokens < 0)
    bad_request("min_tokens", fmt::format("min_tokens must be greater than or equal to 0, got {}.",
                                          s.min_tokens));
  if (s.max_tokens && s.min_tokens > *s.max_tokens)
    bad_request("min_tokens",
                fmt::format("min_tokens must be less than or equal to max_tokens={}, got {}.",
                            *s.max_tokens, s.min_tokens));
  if (s.seed && (*s.seed < std::numeric_limits<int64_t>::min() ||
                 *s.seed > std::numeric_limits<int64_t>::max()))
    bad_request("seed", "seed out of range");
}

// Structured output, as vLLM reads it: OpenAI's response_format ({"type": "json_object"} or
// {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}), vLLM's structured_outputs
// object ({"json" | "regex" | "choice" | "grammar" | "json_object"}) and its older guided_json,
// guided_regex, guided_choice and guided_grammar fields. More than one is an error.
void parse_structured(const Fields& f, SamplingRequest& s) {
  auto set = [&](StructuredOutput o) {
    if (s.structured)
      bad_request(o.param,
                  fmt::format("only one kind of structured output may be given, got '{}' and '{}'",
                              s.structured->param, o.param));
    s.structured = std::move(o);
  };
  auto json_spec = [](const json& v, const char* param) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() || v.is_boolean()) return v.dump();
    bad_request(
        param,
        fmt::format("'{}' must be a JSON schema (an object, or a string holding one)", param));
  };
  auto choice_list = [](const json& v, const char* param) {
    if (!v.is_array() || v.empty())
      bad_request(param, fmt::format("'{}' must be a non-empty list of strings", param));
    std::vector<std::string> c;
    for (const auto& x : v) {
      if (!x.is_string())
        bad_request(param, fmt::format("'{}' must be a non-empty list of strings", param));
      c.push_back(x.get<std::string>());
    }
    return c;
  };
  auto text = [](const json& v, const char* param) {
    if (!v.is_string() || v.get<std::string>().empty())
      bad_request(param, fmt::format("'{}' must be a non-empty string", param));
    return v.get<std::string>();
  };
  if (f.has("response_format")) {
    const json& rf = f.at("response_format");
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
      bad_request("response_format", "'response_format' must be an object with a 'type'");
    const std::string type = rf["type"].get<std::string>();
    if (type == "json_object") {
      set({StructuredOutput::kJsonObject, "", {}, "response_format", std::nullopt});
    } else if (type == "json_schema") {
      if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
        bad_request("response_format", "response_format json_schema needs a 'json_schema' object");
      const json& js = rf["json_schema"];
      const json schema = js.contains("schema")        ? js["schema"]
                          : js.contains("json_schema") ? js["json_schema"]
                                                       : json::object();
      set({StructuredOutput::kJsonSchema,
           json_spec(schema, "response_format"),
           {},
           "response_format",
           std::nullopt});
    } else if (type == "structural_tag") {
      // vLLM's form: the response_format object holds the structures and triggers itself.
      set({StructuredOutput::kStructuralTag, rf.dump(), {}, "response_format", std::nullopt});
    } else if (type != "text") {
      bad_request("response_format", fmt::format("unknown response_format type '{}'", type));
    }
  }
  if (f.has("structured_outputs")) {
    const json& so = f.at("structured_outputs");
    if (!so.is_object())
      bad_request("structured_outputs", "'structured_outputs' must be an object");
    Fields g(so);
    if (g.has("json"))
      set({StructuredOutput::kJsonSchema,
           json_spec(so["json"], "structured_outputs"),
           {},
           "structured_outputs",
           std::nullopt});
    if (g.has("regex"))
      set({StructuredOutput::kRegex,
           text(so["regex"], "structured_outputs"),
           {},
           "structured_outputs",
           std::nullopt});
    if (g.has("choice"))
      set({StructuredOutput::kChoice, "", choice_list(so["choice"], "structured_outputs"),
           "structured_outputs", std::nullopt});
    if (g.has("grammar"))
      set({StructuredOutput::kGrammar,
           text(so["grammar"], "structured_outputs"),
           {},
           "structured_outputs",
           std::nullopt});
    if (g.get_bool("json_object", false))
      set({StructuredOutput::kJsonObject, "", {}, "structured_outputs", std::nullopt});
    if (g.has("structural_tag")) {
      // A JSON string, as vLLM's clients send it, or the object itself.
      const json& st = so["structural_tag"];
      if (!st.is_string() && !st.is_object())
        bad_request("structured_outputs", "'structural_tag' must be a JSON string or an object");
      set({StructuredOutput::kStructuralTag,
           st.is_string() ? st.get<std::string>() : st.dump(),
           {},
           "structured_outputs",
           std::nullopt});
    }
  }
  if (f.has("guided_json"))
    set({StructuredOutput::kJsonSchema,
         json_spec(f.at("guided_json"), "guided_json"),
         {},
         "guided_json",
         std::nullopt});
  if (f.has("guided_regex"))
    set({StructuredOutput::kRegex,
         text(f.at("guided_regex"), "guided_regex"),
         {},
         "guided_regex",
         std::nullopt});
  if (f.has("guided_choice"))
    set({StructuredOutput::kChoice, "", choice_list(f.at("guided_choice"), "guided_choice"),
         "guided_choice", std::nullopt});
  if (f.has("guided_grammar"))
    set({StructuredOutput::kGrammar,
         text(f.at("guided_grammar"), "guided_grammar"),
         {},
         "guided_grammar",
         std::nullopt});
}

StreamOptions parse_stream_options(const Fields& f, bool stream) {
  StreamOptions o;
  if (!f.has("stream_options")) return o;
  if (!stream)
    bad_request("stream_options", "Stream options can only be defined when `stream=True`.");
  const json& v = f.at("stream_options");
  if (!v.is_object()) bad_request("stream_options", "'stream_options' must be an object");
  Fields so(v);
  o.include_usage = so.get_bool("include_usage", false);
  o.continuous_usage_stats = so.get_bool("continuous_usage_stats", false);
  return o;
}

std::vector<int32_t> token_list(const json& v, const char* param) {
  std::vector<int32_t> r;
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
        x.get<int64_t>() > std::numeric_limits<int32_t>::max())
      bad_request(param, fmt::format("'{}' token ids must be non-negative integers", param));
    r.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return r;
}

std::vector<Prompt> parse_prompts(const Fields& f) {
  if (!f.has("prompt")) bad_request("prompt", "'prompt' is required");
  const json& p = f.at("prompt");
  std::vector<Prompt> r;
  if (p.is_string()) {
    r.emplace_back(p.get<std::string>());
  } else if (p.is_array()) {
    if (p.empty()) bad_request("prompt", "'prompt' must not be empty");
    if (p[0].is_number_integer()) {
      r.emplace_back(token_list(p, "prompt"));
    } else {
      for (const auto& x : p) {
        if (x.is_string()) {
          r.emplace_back(x.get<std::string>());
        } else if (x.is_array()) {
          if (x.empty()) bad_request("prompt", "'prompt' token lists must not be empty");
          r.emplace_back(token_list(x, "prompt"));
        } else {
          bad_request("prompt", "'prompt' must be a string, a list of strings, a list of token ids "
                                "or a list of token-id lists");
        }
      }
    }
  } else {
    bad_request("prompt", "'prompt' must be a string, a list of strings, a list of token ids or a "
                          "list of token-id lists");
  }
  return r;
}

// The data URL of an image content part, or nullptr when `part` is no image part: OpenAI's
// {"type": "image_url", "image_url": {"url": ...}} (or "image_url": "..."), the Responses API's
// {"type": "input_image", "image_url": ...} and {"type": "image", "image": ...}, as vLLM takes
// them. A malformed image part is a 400 naming it.
const json* image_part_url(const json& part, const std::string& type, const std::string& pw) {
  const char* key = type == "image_url" || type == "input_image" ? "image_url"
                    : type == "image"                            ? "image"
                                                                 : nullptr;
  if (!key) return nullptr;
  if (!part.contains(key))
    bad_request("messages", fmt::format("{} ({} part) needs '{}'", pw, type, key));
  const json& v = part[key];
  if (v.is_string()) return &v;
  if (v.is_object() && v.contains("url") && v["url"].is_string()) return &v["url"];
  bad_request("messages", fmt::format("{}.{} must be a data: URL string or an object with a string "
                                      "'url'",
                                      pw, key));
}

// Content parts with images: the list the chat template sees (text parts {"type": "text",
// "text"}, image parts {"type": "image"}, as vLLM passes them), the images appended to `images`.
json content_with_images(const json& parts, const std::string& where, const ProtocolLimits& limits,
                         std::vector<ChatImage>& images) {
  json out = json::array();
  for (size_t j = 0; j < parts.size(); ++j) {
    const json& part = parts[j];
    std::string pw = fmt::format("{}[{}]", where, j);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad_request("messages", pw + " must be an object with a string 'type'");
    const std::string& type = part["type"].get_ref<const std::string&>();
    if (const json* url = image_part_url(part, type, pw)) {
      // Parts converted from another API name themselves as that API's request does.
      if (part.contains("atom_where") && part["atom_where"].is_string())
        pw = part["atom_where"].get<std::string>();
      if (static_cast<int>(images.size()) >= limits.max_images)
        bad_request("messages",
                    fmt::format("{}: at most {} image(s) may be provided in one prompt (the "
                                "server's --limit-mm-per-prompt)",
                                pw, limits.max_images));
      images.push_back({pw, url->get<std::string>()});
      out.push_back({{"type", "image"}});
    } else if (type == "text" || type == "input_text" || type == "output_text") {
      if (!part.contains("text") || !part["text"].is_string())
        bad_request("messages", pw + " needs a string 'text'");
      out.push_back({{"type", "text"}, {"text", part["text"]}});
    } else {
      refuse_video_part(type, pw, "messages");
      bad_request(
          "messages",
          fmt::format("{}.type '{}' is not supported (text and image parts are)", pw, type));
    }
  }
  return out;
}

bool has_image_part(const json& parts) {
  for (const auto& part : parts)
    if (part.is_object() && part.contains("type") && part["type"].is_string()) {
      const std::string& t = part["type"].get_ref<const std::string&>();
      if (t == "image_url" || t == "input_image" || t == "image") return true;
    }
  return false;
}

// Chat message content given as a list of text parts is flattened to text (join_text_parts), a
// list with image parts kept as parts (content_with_images); null or missing is "".
json normalise_messages(const json& messages, const ProtocolLimits& limits,
                        std::vector<ChatImage>& images) {
  if (!messages.is_array() || messages.empty())
    bad_request("messages", "'messages' must be a non-empty list");
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) bad_request("messages", fmt::format("messages[{}] must be an object", i));
    if (!m.contains("role") || !m["role"].is_string())
      bad_request("messages", fmt::format("messages[{}].role must be a string", i));
    json n = m;
    if (m.contains("content") && m["content"].is_array()) {
      const std::string where = fmt::format("messages[{}].content", i);
      n["content"] = has_image_part(m["content"])
                         ? content_with_images(m["content"], where, limits, images)
                         : json(join_text_parts(m["content"], {"text"}, where, "messages"));
    } else if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
      bad_request("messages",
                  fmt::format("messages[{}].content must be a string, a list of parts or null", i));
    } else if (!m.contains("content") || m["content"].is_null()) {
      // As vLLM: no content is empty text (an assistant turn that only called tools has content
      // null, and templates test it with `in`).
      n["content"] = "";
    }
    out.push_back(std::move(n));
  }
  return out;
}

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;  // standard and URL-safe alphabets
  if (c == '/' || c == '_') return 63;
  return -1;
}

}  // namespace

std::vector<uint8_t> image_data_url_decode(const std::string& url, const std::string& where) {
  auto refuse = [&](const std::string& why) { bad_request("messages", where + ": " + why); };
  auto starts = [&](const char* prefix) {
    const size_t n = std::strlen(prefix);
    if (url.size() < n) return false;
    for (size_t i = 0; i < n; ++i)
      if (std::tolower(static_cast<unsigned char>(url[i])) != prefix[i]) return false;
    return true;
  };
  if (starts("http://") || starts("https://"))
    refuse("the server fetches no URLs; send the image as a data: URL "
           "(data:image/png;base64,... or data:image/jpeg;base64,...)");
  if (!starts("data:")) {
    const size_t colon = url.find(':');
    refuse(colon != std::string::npos && colon < 16
               ? fmt::format("'{}' URLs are not supported; send the image as a data: URL "
                             "(data:image/png;base64,...)",
                             url.substr(0, colon))
               : std::string("the image must be a data: URL (data:image/png;base64,...)"));
  }
  const size_t comma = url.find(',');
  if (comma == std::string::npos) refuse("the data: URL has no ',' before its data");
  // data:<media type>[;parameter=value]*;base64,<data>
  std::string media_type;
  bool base64 = false;
  {
    const std::string header = url.substr(5, comma - 5);
    size_t pos = 0;
    for (int k = 0; pos <= header.size(); ++k) {
      const size_t semi = std::min(header.find(';', pos), header.size());
      std::string item = header.substr(pos, semi - pos);
      for (char& c : item) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (k == 0)
        media_type = item;
      else if (item == "base64")
        base64 = true;
      pos = semi + 1;
    }
  }
  if (media_type != "image/png" && media_type != "image/jpeg" && media_type != "image/jpg")
    refuse(fmt::format("unsupported image media type '{}' (PNG and JPEG are supported: "
                       "image/png, image/jpeg)",
                       media_type.size() > 64 ? media_type.substr(0, 64) + "..." : media_type));
  if (!base64) refuse("the data: URL must be base64-encoded (data:image/png;base64,...)");
  std::vector<uint8_t> out;
  out.reserve((url.size() - comma) / 4 * 3 + 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t padding = 0;
  for (size_t i = comma + 1; i < url.size(); ++i) {
    const auto c = static_cast<unsigned char>(url[i]);
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;  // MIME line breaks
    if (c == '=') {
      ++padding;
      continue;
    }
    const int v = base64_value(c);
    if (v < 0 || padding)
      refuse(
          fmt::format("the data: URL is not valid base64 (character {} at offset {} of its data)",
                      c >= 0x20 && c < 0x7f ? fmt::format("'{}'", static_cast<char>(c))
                                            : fmt::format("0x{:02x}", c),
                      i - comma - 1));
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  if (bits >= 6 || padding > 2)
    refuse("the data: URL is not valid base64 (its length is not a whole number of bytes)");
  if (out.empty()) refuse("the data: URL holds no image");
  return out;
}

json request_body_parse(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw ApiError(400, "BadRequestError",
                   std::string("Request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "BadRequestError", "Request body must be a JSON object");
  return j;
}

CompletionRequest completion_request_parse(const json& body, const ProtocolLimits& limits) {
  Fields f(body);
  CompletionRequest r;
  r.model = f.opt_string("model");
  r.prompts = parse_prompts(f);
  r.echo = f.get_bool("echo", false);
  r.stream = f.get_bool("stream", false);
  r.stream_options = parse_stream_options(f, r.stream);
  r.add_special_tokens = f.get_bool("add_special_tokens", true);
  r.return_token_ids = f.get_bool("return_token_ids", false);
  r.request_id = f.opt_string("request_id");
  parse_sampling(f, r.sampling, limits, "max_tokens");
  parse_structured(f, r.sampling);
  if (!r.sampling.max_tokens) r.sampling.max_tokens = 16;  // OpenAI's and vLLM's default here
  if (f.has("logprobs")) {
    const auto lp = f.opt_int("logprobs");
    if (*lp < 0)
      bad_request("logprobs", fmt::format("logprobs must be non-negative, got {}.", *lp));
    if (*lp > limits.max_logprobs)
      bad_request(
          "logprobs",
          fmt::format("Requested sample logprobs of {}, which is greater than max allowed: {}", *lp,
                      limits.max_logprobs));
    r.sampling.logprobs = static_cast<int>(*lp);
  }
  if (f.has("suffix")) bad_request("suffix", "suffix is not currently supported");
  if (f.get_bool("use_beam_search", false))
    bad_request("use_beam_search", "beam search is not supported");
  if (const auto best_of = f.opt_int("best_of"); best_of && *best_of != r.sampling.n)
    bad_request("best_of", "best_of different from n is not supported");
  if (r.echo && r.sampling.prompt_logprobs == std::nullopt && r.sampling.logprobs)
    r.sampling.prompt_logprobs =
        *r.sampling.logprobs;  // echo with logprobs reports the prompt's too
  return r;
}

ChatRequest chat_request_parse(const json& body, const ProtocolLimits& limits) {
  Fields f(body);
  ChatRequest r;
  r.model = f.opt_string("model");
  if (!f.has("messages")) bad_request("messages", "'messages' is required");
  r.messages = normalise_messages(f.at("messages"), limits, r.images);
  r.stream = f.get_bool("stream", false);
  r.stream_options = parse_stream_options(f, r.stream);
  r.echo = f.get_bool("echo", false);
  r.add_generation_prompt = f.get_bool("add_generation_prompt", true);
  r.continue_final_message = f.get_bool("continue_final_message", false);
  if (r.add_generation_prompt && r.continue_final_message && f.has("add_generation_prompt"))
    bad_request("continue_final_message",
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
  if (r.continue_final_message) r.add_generation_prompt = false;
  r.add_special_tokens = f.get_bool("add_special_tokens", false);
  r.return_token_ids = f.get_bool("return_token_ids", false);
  r.chat_template = f.opt_string("chat_template");
  r.reasoning_effort = f.opt_string("reasoning_effort");
  r.request_id = f.opt_string("request_id");
  if (f.has("chat_template_kwargs")) {
    if (!f.at("chat_template_kwargs").is_object())
      bad_request("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    r.chat_template_kwargs = f.at("chat_template_kwargs");
  }
  // max_completion_tokens is preferred; max_tokens is the deprecated spelling.
  parse_sampling(f, r.sampling, limits,
                 f.has("max_completion_tokens") ? "max_completion_tokens" : "max_tokens");
  parse_structured(f, r.sampling);
  r.logprobs = f.get_bool("logprobs", false);
  if (const auto top = f.opt_int("top_logprobs")) {
    if (!r.logprobs)
      bad_request("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true.");
    if (*top < 0 || *top > limits.max_logprobs)
      bad_request("top_logprobs", fmt::format("top_logprobs must be between 0 and {}, got {}.",
                                              limits.max_logprobs, *top));
    r.sampling.logprobs = static_cast<int>(*top);
  } else if (r.logprobs) {
    r.sampling.logprobs = 0;
  }
  if (f.has("tools")) {
    const json& t = f.at("tools");
    if (!t.is_array()) bad_request("tools", "'tools' must be a list");
    if (t.empty()) bad_request("tools", "'tools' must not be an empty list; omit it instead");
    for (const auto& tool : t)
      if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object() ||
          !tool["function"].contains("name") || !tool["function"]["name"].is_string())
        bad_request("tools",
                    "each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    r.tools = t;
    r.tool_choice = "auto";
  }
  if (f.has("tool_choice")) {
    const json& tc = f.at("tool_choice");
    if (tc.is_string()) {
      const std::string s = tc.get<std::string>();
      if (s != "none" && s != "auto" && s != "required")
        bad_request("tool_choice",
                    "'tool_choice' must be none, auto, required or a named function");
      r.tool_choice = s;
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
               tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      r.tool_choice = "named";
      r.named_tool = tc["function"]["name"].get<std::string>();
    } else {
      bad_request("tool_choice", "'tool_choice' must be none, auto, required or a named function");
    }
    if (r.tools.is_null() && r.tool_choice != "none")
      bad_request("tool_choice", "When using `tool_choice`, `tools` must be set.");
    if (r.named_tool) {
      bool found = false;
      for (const auto& tool : r.tools) found |= tool["function"]["name"] == *r.named_tool;
      if (!found)
        bad_request("tool_choice", fmt::format("Tool '{}' named in tool_choice is not in `tools`.",
                                               *r.named_tool));
    }
  }
  return r;
}

json chat_template_variables(const ChatRequest& r, const json& defaults) {
  json vars = defaults.is_object() ? defaults : json::object();
  for (auto it = r.chat_template_kwargs.begin(); it != r.chat_template_kwargs.end(); ++it)
    vars[it.key()] = it.value();
  if (r.reasoning_effort) vars["reasoning_effort"] = *r.reasoning_effort;
  return vars;
}

void refuse_video_part(const std::string& type, const std::string& where,
                       const std::string& param) {
  if (type == "video_url" || type == "video" || type == "input_video")
    bad_request(param, fmt::format("{}: '{}' parts are not supported: videos are not supported by "
                                   "this server (it takes text and images; send a video's frames "
                                   "as image parts)",
                                   where, type));
}

std::string join_text_parts(const json& parts, std::initializer_list<const char*> types,
                            const std::string& where, const std::string& param) {
  std::string text;
  for (size_t j = 0; j < parts.size(); ++j) {
    const json& part = parts[j];
    const std::string pw = fmt::format("{}[{}]", where, j);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad_request(param, pw + " must be an object with a string 'type'");
    const std::string& type = part["type"].get_ref<const std::string&>();
    refuse_video_part(type, pw, param);
    if (std::none_of(types.begin(), types.end(), [&](const char* t) { return type == t; }))
      bad_request(
          param, fmt::format("{}.type '{}' is not supported by this model (text parts are: {})", pw,
                             type, fmt::join(types, ", ")));
    if (!part.contains("text") || !part["text"].is_string())
      bad_request(param, pw + " needs a string 'text'");
    if (j) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace atom::server
