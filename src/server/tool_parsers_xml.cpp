// The XML-style formats, whose arguments are untyped text between tags and take their types from
// the tool's schema: Qwen3-Coder (vLLM's qwen3_coder) and GLM-4.5/4.6 (glm45).
//
// Both stream as vLLM does: a call's first piece once its name is complete, then its arguments
// as a JSON object built piece by piece ("{", then `"key": value` per argument as each closes,
// GLM's string values character by character, "}" at the end), so the pieces join into the same
// text as the finished call's arguments: json.dumps(arguments, ensure_ascii=False) for distinct
// keys. Once a call's name is out it is a call; text before that which does not follow the
// format stays content.
#include <cctype>
#include <string_view>

#include "server/py_literal.h"
#include "server/tool_parser_util.h"
#include "server/tool_parsers.h"

namespace atom::server {

namespace {

using json = nlohmann::ordered_json;
using namespace parse_util;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The schema of tool `name`'s parameters in the request's tools, or nullptr.
const json* tool_parameters(const json& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const auto& t : tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const json& f = t["function"];
    if (f.value("name", "") != name) continue;
    if (!f.contains("parameters") || !f["parameters"].is_object()) return nullptr;
    return &f["parameters"];
  }
  return nullptr;
}

// ---- Python's int() and float() of a string, as vLLM's qwen3_coder converts typed values.

std::optional<int64_t> py_int(const std::string& raw) {
  const std::string t = trim(raw);
  size_t i = 0;
  bool negative = false;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) negative = t[i++] == '-';
  std::string digits;
  for (; i < t.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(t[i]))) {
      digits += t[i];
    } else if (t[i] == '_' && !digits.empty() && i + 1 < t.size() &&
               std::isdigit(static_cast<unsigned char>(t[i + 1]))) {
      continue;
    } else {
      return std::nullopt;
    }
  }
  if (digits.empty() || digits.size() > 18) return std::nullopt;  // 64-bit, without overflow
  const int64_t v = std::stoll(digits);
  return negative ? -v : v;
}

std::optional<double> py_float(const std::string& raw) {
  const std::string t = trim(raw);
  // Python's float() grammar, less inf/nan (json.dumps would write them as no JSON).
  std::string clean;
  size_t i = 0;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) clean += t[i++];
  bool digits = false, dot = false, exp = false;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      clean += c;
      digits = true;
    } else if (c == '_' && i > 0 && std::isdigit(static_cast<unsigned char>(t[i - 1])) &&
               i + 1 < t.size() && std::isdigit(static_cast<unsigned char>(t[i + 1]))) {
      continue;
    } else if (c == '.' && !dot && !exp) {
      clean += c;
      dot = true;
    } else if ((c == 'e' || c == 'E') && digits && !exp) {
      clean += 'e';
      exp = true;
      digits = false;
      if (i + 1 < t.size() && (t[i + 1] == '+' || t[i + 1] == '-')) clean += t[++i];
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  const double d = std::strtod(clean.c_str(), nullptr);
  if (!std::isfinite(d)) return std::nullopt;
  return d;
}

// vLLM's qwen3_coder conversion of a parameter's text by its schema (`spec`: the parameter's
// entry in the tool's properties, nullptr when the tool does not declare it: then it is text).
json qwen3_coder_value(const std::string& raw, const json* spec) {
  if (!spec) return raw;
  std::string type = "string";
  bool allows_null = false;
  if (spec->is_object() && spec->contains("type")) {
    const json& t = (*spec)["type"];
    if (t.is_string()) {
      type = lower(trim(t.get<std::string>()));
      allows_null = type == "null";
    } else if (t.is_array()) {  // ["integer", "null"]: the first type that is not null
      bool picked = false;
      for (const auto& x : t) {
        if (!x.is_string()) continue;
        const std::string xt = lower(trim(x.get<std::string>()));
        if (xt == "null") {
          allows_null = true;
        } else if (!picked) {
          type = xt;
          picked = true;
        }
      }
    }
  } else if (spec->is_object() && spec->contains("anyOf") && (*spec)["anyOf"].is_array()) {
    bool picked = false;
    for (const auto& option : (*spec)["anyOf"]) {
      if (!option.is_object() || !option.contains("type") || !option["type"].is_string()) continue;
      const std::string ot = lower(trim(option["type"].get<std::string>()));
      if (ot == "null") {
        allows_null = true;
      } else if (!picked) {
        type = ot;
        picked = true;
      }
    }
  }
  const std::string low = lower(raw);
  if (allows_null && (low == "null" || low == "none")) return nullptr;
  if (type == "string" || type == "str" || type == "text" || type == "varchar" || type == "char" ||
      type == "enum")
    return raw;
  if (low == "null" || low == "none") return nullptr;
  auto starts = [&](const char* p) { return starts_with(type, p); };
  if (starts("int") || starts("uint") || starts("long") || starts("short") || starts("unsigned")) {
    if (const auto v = py_int(raw)) return *v;
    return raw;
  }
  if (starts("num") || starts("float")) {
    if (const auto v = py_float(raw)) {
      // An integral value is written as an int (vLLM: int(v) when v - int(v) == 0).
      if (*v == std::floor(*v) && std::fabs(*v) < 9.2e18) return static_cast<int64_t>(*v);
      return *v;
    }
    return raw;
  }
  if (type == "boolean" || type == "bool" || type == "binary") return low == "true";
  const bool container =
      type == "object" || type == "array" || type == "arr" || starts("dict") || starts("list");
  if (container) {
    json j = json_loads(raw);
    if (!j.is_discarded()) {
      // A JSON string holding a Python repr ("{'k': 'v'}") is decoded once more.
      if (j.is_string())
        if (auto again = py_literal_eval(j.get<std::string>())) return *again;
      return j;
    }
  }
  if (auto v = py_literal_eval(raw)) {
    if (container && v->is_string())
      if (auto again = py_literal_eval(v->get<std::string>())) return *again;
    return *v;
  }
  return raw;
}

// What both formats share: the request's tools, and a call's arguments streamed as one JSON
// object built piece by piece.
class XmlCallParser : public HeldTextParser {
 protected:
  explicit XmlCallParser(json tools) : tools_(std::move(tools)) {}

  void open_call(ToolDelta& out, const std::string& name) {
    index_ = begin_call(out, tool_call_id(), name);
    count_ = 0;
  }
  // Streams a piece of the open call's arguments.
  void stream(ToolDelta& out, const std::string& piece) { call_arguments(out, index_, piece); }
  // Streams the next argument, its value `value_json` (or the start of it).
  void argument(ToolDelta& out, const std::string& key, const std::string& value_json) {
    stream(out, (count_++ == 0 ? "{" : ", ") + ("\"" + json_escape(key) + "\": " + value_json));
  }
  void close_call(ToolDelta& out) {
    stream(out, count_ == 0 ? "{}" : "}");
    end_call(out, index_);
  }

  const json tools_;

 private:
  int index_ = 0, count_ = 0;
};

// ---------------------------------------------------------------------------- qwen3_coder

// <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// One newline after <parameter=P> and one before </parameter> belong to the tags. Content is the
// text around calls (whitespace right after a call dropped); a <tool_call> not followed by
// <function=NAME> stays content.
class Qwen3CoderParser : public XmlCallParser {
 public:
  explicit Qwen3CoderParser(json tools) : XmlCallParser(std::move(tools)) {}

 private:
  enum class State { kText, kOpen, kName, kBody, kParamName, kValue, kAfterFunction };
  static constexpr std::string_view kToolCall = "<tool_call>", kToolEnd = "</tool_call>",
                                    kFunction = "<function=", kFunctionEnd = "</function>",
                                    kParam = "<parameter=", kParamEnd = "</parameter>";

  void flush(ToolDelta& out) override {
    switch (state_) {
      case State::kText:
        content(out, held_);
        break;
      case State::kOpen:
      case State::kName:
        content(out, raw_ + held_);  // never became a call
        break;
      case State::kValue: {
        // Cut off inside a value (or its </parameter> missing): the value is what arrived,
        // without the closing tags the model wrote instead.
        std::string v = held_;
        for (std::string_view tail : {kToolEnd, kFunctionEnd}) {
          const std::string t = trim(v);
          if (t.size() >= tail.size() && t.compare(t.size() - tail.size(), tail.size(), tail) == 0)
            v = v.substr(0, v.rfind(tail));
        }
        const size_t last = v.find_last_not_of(kSpace);
        v = last == std::string::npos ? "" : v.substr(0, last + 1) + "\n";
        parameter_done(out, v);
        close_call(out);
        break;
      }
      case State::kBody:
      case State::kParamName:
        close_call(out);
        break;
      case State::kAfterFunction:
        break;
    }
    raw_.clear();
    value_scan_ = 0;
    state_ = State::kText;
  }

  void not_a_call(ToolDelta& out) {
    held_ = raw_ + held_;
    raw_.clear();
    // The tag itself is content; scanning resumes after it.
    content(out, kToolCall);
    held_.erase(0, kToolCall.size());
    state_ = State::kText;
  }

  void run(ToolDelta& out) override {
    for (;;) {
      switch (state_) {
        case State::kText:
          if (!content_until(out, kToolCall)) return;
          raw_ = std::string(kToolCall);
          state_ = State::kOpen;
          break;
        case State::kOpen: {
          // Whitespace moves to raw_ as it comes (no rescanning of a long run).
          if (!move_leading_space(held_, raw_)) return;
          const std::string_view rest = held_;
          if (starts_with(rest, kFunction)) {
            raw_ += std::string(kFunction);
            held_.erase(0, kFunction.size());
            state_ = State::kName;
          } else if (is_partial(rest, kFunction)) {
            return;
          } else {
            not_a_call(out);
          }
          break;
        }
        case State::kName: {
          const size_t gt = held_.find('>');
          const size_t bad = held_.find_first_of("\n<");
          if (gt == std::string::npos && bad == std::string::npos && held_.size() <= kMaxName)
            return;
          const std::string name = gt == std::string::npos ? "" : trim(held_.substr(0, gt));
          if (gt == std::string::npos || (bad != std::string::npos && bad < gt) || name.empty() ||
              gt > kMaxName) {
            not_a_call(out);
            break;
          }
          held_.erase(0, gt + 1);
          raw_.clear();
          open_call(out, name);
          const json* params = tool_parameters(tools_, name);
          properties_ =
              params && params->contains("properties") && (*params)["properties"].is_object()
                  ? &(*params)["properties"]
                  : params;
          state_ = State::kBody;
          break;
        }
        case State::kBody: {
          // Between parameters: anything but a tag is skipped.
          const Found f = find_first(held_, {kParam, kFunctionEnd, kToolEnd});
          if (!f.found()) {
            held_.erase(0,
                        held_.size() - partial_tag_suffix(held_, {kParam, kFunctionEnd, kToolEnd}));
            return;
          }
          if (f.which == 0) {
            held_.erase(0, f.pos + kParam.size());
            state_ = State::kParamName;
          } else if (f.which == 1) {
            held_.erase(0, f.pos + kFunctionEnd.size());
            close_call(out);
            state_ = State::kAfterFunction;
          } else {  // </tool_call> without </function>
            held_.erase(0, f.pos + kToolEnd.size());
            close_call(out);
            after_call_ = true;
            state_ = State::kText;
          }
          break;
        }
        case State::kParamName: {
          const size_t gt = held_.find('>');
          const size_t nl = held_.find('\n');
          if (gt == std::string::npos && nl == std::string::npos && held_.size() <= kMaxName)
            return;
          if (gt == std::string::npos || (nl != std::string::npos && nl < gt) || gt > kMaxName) {
            state_ = State::kBody;  // no parameter after all
            break;
          }
          param_ = held_.substr(0, gt);
          held_.erase(0, gt + 1);
          state_ = State::kValue;
          break;
        }
        case State::kValue: {
          // A value is typed once whole, so it is held; the search resumes where it stopped.
          const size_t end = find_resuming(held_, kParamEnd, value_scan_);
          if (end == std::string::npos) return;
          parameter_done(out, held_.substr(0, end));
          held_.erase(0, end + kParamEnd.size());
          state_ = State::kBody;
          break;
        }
        case State::kAfterFunction: {
          const size_t lead = held_.find_first_not_of(kSpace);
          if (lead == std::string::npos) {
            held_.clear();  // dropped, as whitespace after a call is
            return;
          }
          const std::string_view rest = std::string_view(held_).substr(lead);
          if (starts_with(rest, kToolEnd)) {
            held_.erase(0, lead + kToolEnd.size());
          } else if (is_partial(rest, kToolEnd)) {
            return;
          }
          after_call_ = true;
          state_ = State::kText;
          break;
        }
      }
    }
  }

  void parameter_done(ToolDelta& out, std::string value) {
    if (starts_with(value, "\n")) value.erase(0, 1);
    if (!value.empty() && value.back() == '\n') value.pop_back();
    const json* spec = properties_ && properties_->is_object() && properties_->contains(param_)
                           ? &(*properties_)[param_]
                           : nullptr;
    argument(out, param_, py_json_dumps(qwen3_coder_value(value, spec), false));
  }

  State state_ = State::kText;
  std::string raw_;  // the text of a call that has not been recognised yet
  std::string param_;
  size_t value_scan_ = 0;  // where the search for </parameter> resumes
  const json* properties_ = nullptr;
};

// ---------------------------------------------------------------------------------- glm45

// <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>. Values of
// string-typed parameters are taken as written; others are JSON, else a Python literal, else
// text (vLLM's _deserialize), after trimming.
class Glm45Parser : public XmlCallParser {
 public:
  explicit Glm45Parser(json tools) : XmlCallParser(std::move(tools)) {}

 private:
  enum class State { kText, kName, kBody, kKey, kBeforeValue, kValue };
  static constexpr std::string_view kToolCall = "<tool_call>", kToolEnd = "</tool_call>",
                                    kKeyOpen = "<arg_key>", kKeyEnd = "</arg_key>",
                                    kValueOpen = "<arg_value>", kValueEnd = "</arg_value>";

  void flush(ToolDelta& out) override {
    switch (state_) {
      case State::kText:
        content(out, held_);
        break;
      case State::kName:
        content(out, std::string(kToolCall) + held_);
        break;
      case State::kValue:
        value_text(out, held_);
        value_done(out);
        close_call(out);
        break;
      case State::kBody:
      case State::kKey:
      case State::kBeforeValue:
        close_call(out);
        break;
    }
    state_ = State::kText;
  }

  void run(ToolDelta& out) override {
    for (;;) {
      switch (state_) {
        case State::kText:
          if (!content_until(out, kToolCall)) return;
          state_ = State::kName;
          break;
        case State::kName: {
          // The name runs to the end of its line (or to the first tag).
          const Found f = find_first(held_, {"\n", kKeyOpen, kToolEnd});
          if (!f.found()) {
            if (held_.size() <= kMaxName) return;
          }
          const std::string name = f.found() ? trim(held_.substr(0, f.pos)) : "";
          if (name.empty() || name.size() > kMaxName ||
              name.find_first_of("<>{}\"") != std::string::npos) {
            // Not GLM's format (a JSON call, say): the tag is content, scanning resumes after it.
            content(out, kToolCall);
            state_ = State::kText;
            break;
          }
          held_.erase(0, f.pos);
          open_call(out, name);
          name_ = name;
          state_ = State::kBody;
          break;
        }
        case State::kBody: {
          const Found f = find_first(held_, {kKeyOpen, kToolEnd});
          if (!f.found()) {
            held_.erase(0, held_.size() - partial_tag_suffix(held_, {kKeyOpen, kToolEnd}));
            return;
          }
          if (f.which == 0) {
            held_.erase(0, f.pos + kKeyOpen.size());
            state_ = State::kKey;
          } else {
            held_.erase(0, f.pos + kToolEnd.size());
            close_call(out);
            after_call_ = true;
            state_ = State::kText;
          }
          break;
        }
        case State::kKey: {
          const Found f = find_first(held_, {kKeyEnd, kValueOpen, kToolEnd});
          if (!f.found()) return;
          if (f.which != 0) {  // a key without its end tag: skipped
            state_ = State::kBody;
            break;
          }
          key_ = trim(held_.substr(0, f.pos));
          held_.erase(0, f.pos + kKeyEnd.size());
          state_ = State::kBeforeValue;
          break;
        }
        case State::kBeforeValue: {
          const size_t lead = held_.find_first_not_of(kSpace);
          if (lead == std::string::npos) {
            held_.clear();  // between a key and its value: no one's
            return;
          }
          const std::string_view rest = std::string_view(held_).substr(lead);
          if (starts_with(rest, kValueOpen)) {
            held_.erase(0, lead + kValueOpen.size());
            string_typed_ = is_string_type(key_);
            value_.clear();
            if (string_typed_) argument(out, key_, "\"");  // the value streams as it comes
            state_ = State::kValue;
          } else if (is_partial(rest, kValueOpen)) {
            return;
          } else {
            state_ = State::kBody;  // a key without a value: skipped
          }
          break;
        }
        case State::kValue: {
          const Taken t = take_before(held_, {kValueEnd});
          value_text(out, t.text);
          if (!t.tag.found()) return;
          held_.erase(0, kValueEnd.size());
          value_done(out);
          state_ = State::kBody;
          break;
        }
      }
    }
  }

  // String values stream as they arrive; other values wait for their end.
  void value_text(ToolDelta& out, const std::string& s) {
    if (!string_typed_) {
      value_ += s;
      return;
    }
    stream(out, json_escape(s));
  }

  void value_done(ToolDelta& out) {
    if (string_typed_) {
      stream(out, "\"");
      return;
    }
    const std::string t = trim(value_);
    json v = json_loads(t);
    if (v.is_discarded()) {
      auto lit = py_literal_eval(t);
      v = lit ? *lit : json(t);
    }
    argument(out, key_, py_json_dumps(v, false));
  }

  // vLLM's glm45: a value is taken as written when the tool's schema types it "string".
  bool is_string_type(const std::string& key) const {
    const json* params = tool_parameters(tools_, name_);
    if (!params || !params->contains("properties") || !(*params)["properties"].is_object())
      return false;
    const json& props = (*params)["properties"];
    if (!props.contains(key) || !props[key].is_object()) return false;
    const json& spec = props[key];
    return spec.contains("type") && spec["type"] == "string";
  }

  State state_ = State::kText;
  std::string name_, key_, value_;
  bool string_typed_ = false;
};

}  // namespace

std::unique_ptr<ToolParser> make_qwen3_coder_parser(const nlohmann::ordered_json& tools) {
  return std::make_unique<Qwen3CoderParser>(tools);
}

std::unique_ptr<ToolParser> make_glm45_parser(const nlohmann::ordered_json& tools) {
  return std::make_unique<Glm45Parser>(tools);
}

}  // namespace atom::server
