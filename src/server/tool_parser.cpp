#include "server/tool_parser.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "server/tool_parser_util.h"
#include "server/tool_parsers.h"

namespace atom::server {

namespace {

using json = nlohmann::ordered_json;
using namespace parse_util;

// A call of `name` with `args`: a JSON object, or a string holding one.
bool make_call(const std::string& name, const json& args, ToolCall& out) {
  json value = args;
  if (value.is_string()) {  // arguments already serialised by the model
    value = json_loads(args.get_ref<const std::string&>());
    if (value.is_discarded()) return false;
  }
  if (name.empty() || !value.is_object()) return false;
  out.id = tool_call_id();
  out.name = name;
  // As vLLM writes them: Python's json.dumps(arguments, ensure_ascii=False), keys in the model's
  // order.
  out.arguments = py_json_dumps(value, false);
  return true;
}

// A call object {"name": "...", <args_key>: {...}}; false when the text is anything else.
bool call_from_json(const std::string& text, const std::vector<const char*>& args_keys,
                    ToolCall& out) {
  const json j = json_loads(text);
  if (j.is_discarded() || !j.is_object()) return false;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty())
    return false;
  const json* args = nullptr;
  for (const char* k : args_keys) {
    const auto it = j.find(k);
    if (it != j.end()) {
      args = &*it;
      break;
    }
  }
  return args && make_call(name->get<std::string>(), *args, out);
}

// Hermes / Qwen2.5 / Qwen3: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, any
// number of them, text before them is content. Whitespace after a call is dropped.
class HermesParser : public HeldTextParser {
 private:
  void run(ToolDelta& out) override {
    for (;;) {
      if (!in_call_) {
        if (!content_until(out, kOpen)) return;
        in_call_ = true;
        continue;
      }
      const size_t close = find_resuming(held_, kClose, close_scan_);
      if (close == std::string::npos) return;
      const std::string body = held_.substr(0, close);
      held_.erase(0, close + kClose.size());
      in_call_ = false;
      call_out(out, body, true);
    }
  }

  void flush(ToolDelta& out) override {
    if (in_call_) {
      call_out(out, held_, false);  // unclosed: a call if the JSON is complete
    } else {
      content(out, held_);
    }
    in_call_ = false;
    close_scan_ = 0;
  }

  void call_out(ToolDelta& out, const std::string& body, bool closed) {
    ToolCall c;
    if (call_from_json(body, {"arguments"}, c)) {
      whole_call(out, std::move(c.id), std::move(c.name), std::move(c.arguments));
      after_call_ = true;
      return;
    }
    content(out, kOpen + body + (closed ? kClose : ""));
  }

  const std::string kOpen = "<tool_call>", kClose = "</tool_call>";
  size_t close_scan_ = 0;  // where the search for the close tag resumes
  bool in_call_ = false;
};

// Llama 3.1/3.2/3.3 JSON tool calls: the whole answer is {"name": ..., "parameters": {...}} (or
// "arguments"), optionally after <|python_tag|>, several separated by ';'. An answer that does not
// start that way is content; one whose first object is not a call is content as a whole.
class Llama3JsonParser : public HeldTextParser {
 private:
  enum class State { kStart, kExpectObject, kObject, kAfterCall, kContent };

  void flush(ToolDelta& out) override {
    switch (state_) {
      case State::kStart:
      case State::kContent:
        out.content = held_;
        break;
      case State::kExpectObject:
      case State::kAfterCall:
        // Only whitespace is held here: after a call it is dropped.
        if (any_call_ && all_space(held_)) break;
        out.content = raw_ + held_;
        break;
      case State::kObject:
        out.content = raw_ + held_;  // unclosed object
        break;
    }
    raw_.clear();
    state_ = State::kContent;
  }

  void to_content() {
    held_ = raw_ + held_;
    raw_.clear();
    state_ = State::kContent;
  }
  void start_object() {
    state_ = State::kObject;
    scan_ = {};
  }

  void run(ToolDelta& out) override {
    for (;;) {
      switch (state_) {
        case State::kStart: {
          const size_t lead = held_.find_first_not_of(kSpace);
          if (lead == std::string::npos) return;
          const std::string rest = held_.substr(lead);
          if (starts_with(rest, kTag)) {
            raw_ += held_.substr(0, lead + kTag.size());
            held_.erase(0, lead + kTag.size());
            state_ = State::kExpectObject;
          } else if (is_partial(rest, kTag)) {
            return;  // maybe the tag
          } else if (rest[0] == '{') {
            raw_ += held_.substr(0, lead);
            held_.erase(0, lead);
            start_object();
          } else {
            state_ = State::kContent;
          }
          break;
        }
        case State::kExpectObject: {
          const size_t lead = held_.find_first_not_of(kSpace);
          if (lead == std::string::npos) return;
          if (held_[lead] != '{') {
            to_content();
            break;
          }
          raw_ += held_.substr(0, lead);
          held_.erase(0, lead);
          start_object();
          break;
        }
        case State::kObject: {
          // The object that starts at held_[0]; npos while it has not closed.
          const size_t end = json_scan_value(held_, scan_);
          if (end == std::string::npos) return;
          ToolCall c;
          if (!call_from_json(held_.substr(0, end), {"parameters", "arguments"}, c)) {
            to_content();
            break;
          }
          whole_call(out, std::move(c.id), std::move(c.name), std::move(c.arguments));
          any_call_ = true;
          held_.erase(0, end);
          raw_.clear();
          state_ = State::kAfterCall;
          break;
        }
        case State::kAfterCall: {
          const size_t lead = held_.find_first_not_of(kSpace);
          if (lead == std::string::npos) return;
          if (held_[lead] == ';') {
            raw_ += held_.substr(0, lead + 1);
            held_.erase(0, lead + 1);
            state_ = State::kExpectObject;
          } else if (held_[lead] == '{') {
            raw_ += held_.substr(0, lead);
            held_.erase(0, lead);
            start_object();
          } else {
            held_.erase(0, lead);  // trailing text after the calls: content
            to_content();
          }
          break;
        }
        case State::kContent:
          out.content += held_;
          held_.clear();
          return;
      }
    }
  }

  const std::string kTag = "<|python_tag|>";
  State state_ = State::kStart;
  // held_ in kObject: the object so far.
  std::string raw_;  // text consumed since the last call, given back if what follows is no call
  bool any_call_ = false;
  JsonScan scan_;  // of the object in held_, resumed as it grows
};

// DeepSeek-V3.1:
// <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (more
// calls) <｜tool▁calls▁end｜>; text before the section is content.
class DeepSeekV31Parser : public HeldTextParser {
 private:
  enum class State { kText, kSection, kCall };

  void run(ToolDelta& out) override {
    for (;;) {
      if (state_ == State::kText) {
        if (!content_until(out, kCallsBegin)) return;
        state_ = State::kSection;
        continue;
      }
      if (state_ == State::kSection) {
        // Between calls: whitespace, then a call or the end of the section.
        const size_t lead = held_.find_first_not_of(kSpace);
        if (lead == std::string::npos) return;
        const std::string rest = held_.substr(lead);
        if (starts_with(rest, kCallBegin)) {
          held_ = rest.substr(kCallBegin.size());
          state_ = State::kCall;
        } else if (starts_with(rest, kCallsEnd)) {
          held_ = rest.substr(kCallsEnd.size());
          state_ = State::kText;
          after_call_ = true;
        } else if (is_partial(rest, kCallBegin) || is_partial(rest, kCallsEnd)) {
          return;
        } else {
          state_ = State::kText;  // not a call after all: the rest is text
          held_ = rest;
        }
        continue;
      }
      const size_t close = find_resuming(held_, kCallEnd, close_scan_);
      if (close == std::string::npos) return;
      const std::string body = held_.substr(0, close);
      held_.erase(0, close + kCallEnd.size());
      state_ = State::kSection;
      call_out(out, body, true);
    }
  }

  void flush(ToolDelta& out) override {
    if (state_ == State::kCall) {
      call_out(out, held_, false);
    } else if (state_ == State::kText || !all_space(held_)) {
      content(out, held_);
    }
    close_scan_ = 0;
    state_ = State::kText;
  }

  void call_out(ToolDelta& out, const std::string& body, bool closed) {
    const size_t sep = body.find(kSep);
    ToolCall c;
    if (sep != std::string::npos) {
      const std::string name = trim(std::string_view(body).substr(0, sep));
      const json args = json_loads(std::string_view(body).substr(sep + kSep.size()));
      if (!args.is_discarded() && make_call(name, args, c)) {
        whole_call(out, std::move(c.id), std::move(c.name), std::move(c.arguments));
        after_call_ = true;
        return;
      }
    }
    content(out, kCallBegin + body + (closed ? kCallEnd : ""));
  }

  const std::string kCallsBegin = "<｜tool▁calls▁begin｜>", kCallsEnd = "<｜tool▁calls▁end｜>";
  const std::string kCallBegin = "<｜tool▁call▁begin｜>", kCallEnd = "<｜tool▁call▁end｜>";
  const std::string kSep = "<｜tool▁sep｜>";
  State state_ = State::kText;
  size_t close_scan_ = 0;  // where the search for the call's end resumes
};

}  // namespace

void ToolDelta::append(ToolDelta next) {
  content += next.content;
  reasoning += next.reasoning;
  for (auto& d : next.deltas) {
    // Consecutive argument pieces of one call travel as one.
    if (!deltas.empty() && d.id.empty() && deltas.back().index == d.index &&
        deltas.back().id.empty()) {
      deltas.back().arguments += d.arguments;
      continue;
    }
    deltas.push_back(std::move(d));
  }
  for (auto& c : next.calls) calls.push_back(std::move(c));
}

ToolDelta HeldTextParser::feed(const std::string& text) {
  ToolDelta out;
  held_ += text;
  run(out);
  return out;
}

ToolDelta HeldTextParser::finish() {
  ToolDelta out;
  flush(out);
  held_.clear();
  return out;
}

void HeldTextParser::content(ToolDelta& out, std::string_view s) {
  if (after_call_) {
    const size_t first = s.find_first_not_of(kSpace);
    if (first == std::string::npos) return;
    after_call_ = false;
    out.content += s.substr(first);
    return;
  }
  out.content += s;
}

bool HeldTextParser::content_until(ToolDelta& out, std::string_view tag) {
  const Taken t = take_before(held_, {tag});
  content(out, t.text);
  if (!t.tag.found()) return false;
  held_.erase(0, tag.size());
  return true;
}

ToolDelta ToolParser::parse(const std::string& output) {
  ToolDelta a = feed(output);
  a.append(finish());
  return a;
}

int ToolParser::begin_call(ToolDelta& out, std::string id, std::string name) {
  const int index = static_cast<int>(started_.size());
  started_.push_back({id, name, ""});
  ToolCallDelta d;
  d.index = index;
  d.id = std::move(id);
  d.name = std::move(name);
  out.deltas.push_back(std::move(d));
  return index;
}

void ToolParser::call_arguments(ToolDelta& out, int index, const std::string& arguments) {
  if (arguments.empty()) return;
  started_.at(static_cast<size_t>(index)).arguments += arguments;
  if (!out.deltas.empty() && out.deltas.back().index == index && out.deltas.back().id.empty()) {
    out.deltas.back().arguments += arguments;
    return;
  }
  ToolCallDelta d;
  d.index = index;
  d.arguments = arguments;
  out.deltas.push_back(std::move(d));
}

const std::string& ToolParser::streamed_arguments(int index) const {
  return started_.at(static_cast<size_t>(index)).arguments;
}

void ToolParser::end_call(ToolDelta& out, int index) {
  end_call(out, index, std::move(started_.at(static_cast<size_t>(index)).arguments));
}

void ToolParser::end_call(ToolDelta& out, int index, std::string arguments) {
  Started& s = started_.at(static_cast<size_t>(index));
  s.arguments.clear();  // a finished call's arguments are kept once, in `out`
  out.calls.push_back({s.id, s.name, std::move(arguments)});
}

void ToolParser::whole_call(ToolDelta& out, std::string id, std::string name,
                            std::string arguments) {
  const int index = begin_call(out, std::move(id), std::move(name));
  call_arguments(out, index, arguments);
  end_call(out, index);
}

const std::vector<std::string>& tool_parser_names() {
  static const std::vector<std::string> names = {
      "hermes", "llama3_json", "deepseek_v3", "deepseek_v31", "qwen3_coder",
      "glm45",  "kimi_k2",     "mistral",     "pythonic",     "openai"};
  return names;
}

bool tool_parser_known(const std::string& name) {
  const auto& n = tool_parser_names();
  return std::find(n.begin(), n.end(), name) != n.end();
}

std::unique_ptr<ToolParser> make_tool_parser(const std::string& name,
                                             const ToolParserOptions& options) {
  if (name == "hermes") return std::make_unique<HermesParser>();
  if (name == "llama3_json") return std::make_unique<Llama3JsonParser>();
  if (name == "deepseek_v31") return std::make_unique<DeepSeekV31Parser>();
  if (name == "deepseek_v3") return make_deepseek_v3_parser();
  if (name == "qwen3_coder") return make_qwen3_coder_parser(options.tools);
  if (name == "glm45") return make_glm45_parser(options.tools);
  if (name == "kimi_k2") return make_kimi_k2_parser();
  if (name == "mistral") return make_mistral_parser();
  if (name == "pythonic") return make_pythonic_parser();
  if (name == "openai") return make_harmony_parser(options.parse_calls);
  throw std::invalid_argument(fmt::format("invalid tool call parser: {} (choose from {{ {} }})",
                                          name, fmt::join(tool_parser_names(), ", ")));
}

bool tool_parser_keeps_special_tokens(const std::string& name) {
  return name == "hermes" || name == "qwen3_coder" || name == "glm45" || name == "kimi_k2" ||
         name == "mistral" || name == "openai";
}

std::string tool_call_id() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("chatcmpl-tool-{:016x}{:016x}", rng(), rng());
}

std::string mistral_tool_call_id() {
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string id(9, ' ');
  for (char& c : id) c = kAlnum[rng() % (sizeof(kAlnum) - 1)];
  return id;
}

}  // namespace atom::server
