#include "tokenizer/chat_template.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "jinja/lexer.h"
#include "jinja/py_format.h"
#include "jinja/unicode.h"

namespace atom::tokenizer {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_json(const fs::path& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    fail("{} is not valid JSON: {}", path.string(), e.what());
  }
}

// A special token in a config: a string, or an AddedToken object {"content": ...}.
std::optional<std::string> token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

// transformers' special_tokens_map: the named special tokens that are set (non-empty).
void collect_special_tokens(const json& config, json& out) {
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    if (!config.contains(key)) continue;
    auto text = token_text(config[key]);
    if (text && !text->empty())
      out[key] = *text;
    else if (config[key].is_null())
      out.erase(key);
  }
  if (config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array()) {
    json list = json::array();
    for (const auto& t : config["additional_special_tokens"]) {
      if (auto text = token_text(t)) list.push_back(*text);
    }
    if (list.empty())
      out.erase("additional_special_tokens");
    else
      out["additional_special_tokens"] = list;
  }
}

std::string strftime_python(const std::string& format, const std::tm& tm) {
  // datetime.strftime: naive datetimes give "" for %z and %Z, and %f is the microseconds.
  std::string fmt;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] == '%' && i + 1 < format.size()) {
      char c = format[i + 1];
      if (c == 'z' || c == 'Z') {
        ++i;
        continue;
      }
      if (c == 'f') {
        fmt += "000000";
        ++i;
        continue;
      }
      fmt += format[i];
      fmt += format[++i];
      continue;
    }
    fmt += format[i];
  }
  if (fmt.empty()) return "";
  std::vector<char> buf(256);
  while (buf.size() <= (size_t{1} << 20)) {
    size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
    if (n > 0) return std::string(buf.data(), n);
    buf.resize(buf.size() * 4);
  }
  return "";
}

std::tm local_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

// transformers' strftime_now(format): datetime.now().strftime(format).
jinja::Value strftime_now_function(std::optional<std::tm> now) {
  return jinja::make_function("strftime_now", [now](jinja::Interpreter&, jinja::CallArgs& args) {
    auto fmt = args.take(0, "format");
    args.finish("strftime_now", 1);
    if (!fmt || !fmt->is_string()) jinja::eval_fail("strftime_now() argument must be str");
    return jinja::Value::string(strftime_python(fmt->str(), now ? *now : local_now()));
  });
}

}  // namespace

void tool_call_arguments_to_dicts(json& messages) {
  if (!messages.is_array()) return;
  for (auto& m : messages) {
    if (!m.is_object() || m.value("role", json()) != "assistant" || !m.contains("tool_calls") ||
        !m["tool_calls"].is_array()) {
      continue;
    }
    for (auto& call : m["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
        continue;
      json& fn = call["function"];
      json& args = fn["arguments"];  // inserted as null when absent, then set to {} below
      bool empty = args.is_null() || (args.is_string() && args.get<std::string>().empty()) ||
                   (args.is_boolean() && !args.get<bool>()) || (args.is_number() && args == 0) ||
                   (args.is_object() && args.empty()) || (args.is_array() && args.empty());
      if (empty) {
        args = json::object();
      } else if (!args.is_object() && !args.is_array()) {
        if (!args.is_string()) continue;
        try {
          args = json::parse(args.get<std::string>());
        } catch (const json::exception& e) {
          fail("tool call '{}' has arguments that are not valid JSON: {}",
               fn.value("name", std::string("?")), e.what());
        }
      }
    }
  }
}

std::string load_chat_template_arg(const std::string& value) {
  std::error_code ec;
  if (fs::is_regular_file(value, ec)) return read_file(value);
  if (value.find_first_of("{}\n") == std::string::npos) {
    fail("the chat template '{}' looks like a file path, but it cannot be opened", value);
  }
  try {
    return jinja::decode_python_escapes(value);
  } catch (const std::invalid_argument& e) {
    fail("cannot decode the escapes of the chat template: {}", e.what());
  }
}

jinja::Value chat_tojson(jinja::Interpreter&, const jinja::Value& value, jinja::CallArgs& args) {
  using jinja::Value;
  auto ensure_ascii = args.take(0, "ensure_ascii");
  auto indent = args.take(1, "indent");
  auto separators = args.take(2, "separators");
  auto sort_keys = args.take(3, "sort_keys");
  args.finish("tojson", 4);
  jinja::JsonOptions o;
  o.ensure_ascii = ensure_ascii && jinja::truthy(*ensure_ascii);
  o.sort_keys = sort_keys && jinja::truthy(*sort_keys);
  if (indent && !indent->is_none()) {
    if (indent->is_string()) {
      o.indent = indent->str();
    } else if (indent->is_integral()) {
      o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent->as_int())), ' ');
    } else {
      jinja::eval_fail("tojson indent must be an int or a str, not {}", jinja::type_name(*indent));
    }
    o.item_separator = ",";
  }
  if (separators && !separators->is_none()) {
    std::vector<Value> seps = jinja::iterate(*separators);
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
      jinja::eval_fail(
          "tojson separators must be an (item_separator, key_separator) pair of strings");
    }
    o.item_separator = seps[0].str();
    o.key_separator = seps[1].str();
  }
  return Value::string(jinja::json_dumps(value, o));
}

namespace {

// transformers' raise_exception(message): the template rejects the conversation.
jinja::Value raise_exception(jinja::Interpreter&, jinja::CallArgs& args) {
  auto msg = args.take(0, "message");
  args.finish("raise_exception", 1);
  if (!msg) jinja::eval_fail("raise_exception() missing 1 required positional argument: 'message'");
  throw jinja::EvalError{jinja::TemplateError::Kind::kRaised, jinja::to_str(*msg)};
}

}  // namespace

jinja::Environment chat_template_environment(std::optional<std::tm> now,
                                             const jinja::Limits& limits) {
  jinja::Options o;
  o.limits = limits;
  o.trim_blocks = true;
  o.lstrip_blocks = true;
  o.loop_controls = true;
  o.scope_tags = {"generation"};  // transformers' AssistantTracker tag
  jinja::Environment env(o);
  env.set_filter("tojson", chat_tojson);
  env.set_global("raise_exception", jinja::make_function("raise_exception", raise_exception));
  env.set_global("strftime_now", strftime_now_function(now));
  return env;
}

std::string ChatTemplate::parse_error() const {
  for (const auto& [name, c] : templates_)
    if (!c.tpl) return name + ": " + c.error;
  return "";
}

void ChatTemplate::add_template(const std::string& name, const std::string& source) {
  Compiled c;
  c.source = source;
  try {
    std::string where = origin_.empty() ? "chat template" : "chat template " + origin_;
    if (name != "default") where += " '" + name + "'";
    c.tpl = std::make_shared<jinja::Template>(
        chat_template_environment(std::nullopt, limits_).from_string(source, where));
  } catch (const jinja::TemplateError& e) {
    c.error = e.what();
  }
  templates_[name] = std::move(c);
}

ChatTemplate ChatTemplate::from_string(const std::string& source, const json& special_tokens,
                                       const jinja::Limits& limits) {
  ChatTemplate ct;
  ct.limits_ = limits;
  if (!special_tokens.is_object()) fail("chat template special tokens must be a JSON object");
  ct.special_tokens_ = special_tokens;
  ct.add_template("default", source);
  return ct;
}

ChatTemplate ChatTemplate::from_model_dir(const fs::path& dir, const std::string& override_template,
                                          const jinja::Limits& limits) {
  ChatTemplate ct;
  ct.limits_ = limits;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("model folder {} does not exist", dir.string());
  json config = json::object();
  if (fs::exists(dir / "tokenizer_config.json")) config = read_json(dir / "tokenizer_config.json");
  collect_special_tokens(config, ct.special_tokens_);
  if (fs::exists(dir / "special_tokens_map.json")) {
    collect_special_tokens(read_json(dir / "special_tokens_map.json"), ct.special_tokens_);
  }
  if (!override_template.empty()) {
    ct.origin_ = "(--chat-template)";
    ct.add_template("default", load_chat_template_arg(override_template));
    return ct;
  }
  if (fs::exists(dir / "chat_template.jinja")) {
    ct.origin_ = (dir / "chat_template.jinja").string();
    ct.add_template("default", read_file(dir / "chat_template.jinja"));
  } else if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    ct.origin_ = (dir / "tokenizer_config.json").string();
    const json& t = config["chat_template"];
    if (t.is_string()) {
      ct.add_template("default", t.get<std::string>());
    } else if (t.is_array()) {
      ct.named_ = true;
      for (const auto& entry : t) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["name"].is_string() || !entry["template"].is_string()) {
          fail("{}: chat_template list entries must be {{\"name\": ..., \"template\": ...}}",
               ct.origin_);
        }
        ct.add_template(entry["name"].get<std::string>(), entry["template"].get<std::string>());
      }
    } else {
      fail("{}: chat_template must be a string or a list of named templates", ct.origin_);
    }
  } else if (fs::exists(dir / "chat_template.json")) {
    ct.origin_ = (dir / "chat_template.json").string();
    json j = read_json(dir / "chat_template.json");
    if (!j.contains("chat_template") || !j["chat_template"].is_string()) {
      fail("{}: expected {{\"chat_template\": \"...\"}}", ct.origin_);
    }
    ct.add_template("default", j["chat_template"].get<std::string>());
  }
  // Extra named templates beside chat_template.jinja; a single template then becomes "default".
  fs::path extra = dir / "additional_chat_templates";
  if (fs::is_directory(extra, ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(extra)) {
      if (e.path().extension() == ".jinja") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      ct.named_ = true;
      ct.add_template(f.stem().string(), read_file(f));
    }
  }
  return ct;
}

std::map<std::string, std::string> ChatTemplate::template_sources() const {
  std::map<std::string, std::string> out;
  for (const auto& [name, c] : templates_) out[name] = c.source;
  return out;
}

const ChatTemplate::Compiled& ChatTemplate::select(const ChatRenderOptions& options) const {
  if (templates_.empty()) {
    fail("this model has no chat template (none in tokenizer_config.json, chat_template.jinja or "
         "chat_template.json); pass one with --chat-template");
  }
  auto names = [&] {
    std::string s;
    for (const auto& [name, c] : templates_) s += (s.empty() ? "" : ", ") + name;
    return s;
  };
  if (options.template_name) {
    auto it = templates_.find(*options.template_name);
    if (it == templates_.end()) {
      fail("this model has no chat template named '{}' (it has: {})", *options.template_name,
           names());
    }
    return it->second;
  }
  if (!named_) return templates_.begin()->second;
  if (!options.tools.is_null() && templates_.count("tool_use")) return templates_.at("tool_use");
  if (templates_.count("default")) return templates_.at("default");
  fail("this model has several chat templates and none is named 'default'; choose one of: {}",
       names());
}

std::string ChatTemplate::render(const json& messages, const ChatRenderOptions& options) const {
  const Compiled& c = select(options);
  if (!c.tpl) throw jinja::TemplateError(jinja::TemplateError::Kind::kSyntax, c.error, "", 0);
  if (!messages.is_array()) fail("the conversation must be a JSON array of messages");
  if (options.continue_final_message && options.add_generation_prompt) {
    fail("continue_final_message and add_generation_prompt are not compatible: use "
         "continue_final_message when the final message is a partial assistant response to extend");
  }
  if (!options.tools.is_null()) {
    if (!options.tools.is_array()) fail("tools must be a list of tool definitions");
    for (const auto& t : options.tools) {
      if (!t.is_object()) fail("each tool must be a JSON object (a JSON schema of the function)");
    }
  }
  if (!options.documents.is_null()) {
    if (!options.documents.is_array()) fail("documents must be a list");
    for (const auto& d : options.documents) {
      if (!d.is_object())
        fail("documents should be a list of objects with 'title' and 'text' keys");
    }
  }
  if (!options.kwargs.is_object()) fail("chat template kwargs must be a JSON object");
  for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"}) {
    if (options.kwargs.contains(reserved)) fail("chat template kwargs cannot set '{}'", reserved);
  }

  // continue_final_message: transformers marks the end of the final message with a tag, renders,
  // and cuts the prompt at the tag, so whatever the template appends after the message is dropped.
  static const std::string kTag = "CONTINUE_FINAL_MESSAGE_TAG ";
  json chat = messages;
  std::string final_text;
  if (options.continue_final_message) {
    if (chat.empty() || !chat.back().is_object() || !chat.back().contains("content")) {
      fail("continue_final_message is set but the final message has no \"content\" to continue");
    }
    json& content = chat.back()["content"];
    if (content.is_array()) {
      bool found = false;
      for (auto it = content.rbegin(); it != content.rend(); ++it) {
        if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) {
          final_text = (*it)["text"].get<std::string>();
          (*it)["text"] = final_text + kTag;
          found = true;
          break;
        }
      }
      if (!found)
        fail("continue_final_message is set but there is no text to continue in the final message");
    } else if (content.is_string()) {
      final_text = content.get<std::string>();
      content = final_text + kTag;
    } else {
      fail("continue_final_message is set but the final message content is not text");
    }
  }

  std::vector<std::pair<std::string, jinja::Value>> vars;
  // strftime_now with the requested clock, as a variable so that each render can pin its own;
  // kwargs may still override it, as render() keyword arguments override globals in Python.
  vars.emplace_back("strftime_now", strftime_now_function(options.now));
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) {
    vars.emplace_back(it.key(), jinja::value_from_json(it.value()));
  }
  for (auto it = options.kwargs.begin(); it != options.kwargs.end(); ++it) {
    vars.emplace_back(it.key(), jinja::value_from_json(it.value()));
  }
  vars.emplace_back("messages", jinja::value_from_json(chat));
  vars.emplace_back("tools", jinja::value_from_json(options.tools));
  vars.emplace_back("documents", jinja::value_from_json(options.documents));
  vars.emplace_back("add_generation_prompt", jinja::Value::boolean(options.add_generation_prompt));
  std::string out = c.tpl->render(vars);

  if (options.continue_final_message) {
    std::string stripped_final = jinja::unicode::strip(final_text, nullptr, true, true);
    static const std::string kTagTrimmed = "CONTINUE_FINAL_MESSAGE_TAG";
    if (out.find(stripped_final) == std::string::npos ||
        out.find(kTagTrimmed) == std::string::npos) {
      fail("continue_final_message is set but the final message does not appear in the chat after "
           "applying the chat template (the template may rewrite or drop parts of it)");
    }
    size_t at = out.rfind(kTagTrimmed);
    if (out.compare(at, kTag.size(), kTag) == 0) {
      out.resize(at);
    } else {
      out = jinja::unicode::strip(out.substr(0, at), nullptr, false, true);
    }
  }
  return out;
}

}  // namespace atom::tokenizer
