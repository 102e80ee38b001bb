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

// Appends text to the content; right after a call (after_call) its leading whitespace is dropped,
// and the flag cleared once non-blank text arrives.
void content_out(ToolDelta& out, const std::string& s, bool& after_call) {
  if (after_call) {
    const size_t first = s.find_first_not_of(kSpace);
    if (first == std::string::npos) return;
    after_call = false;
    out.content += s.substr(first);
    return;
  }
  out.content += s;
}

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
class HermesParser : public ToolParser {
 public:
  ToolDelta feed(const std::string& text) override {
    ToolDelta out;
    held_ += text;
    for (;;) {
      if (!in_call_) {
        const size_t open = held_.find(kOpen);
        if (open != std::string::npos) {
          text_out(out, held_.substr(0, open));
          held_.erase(0, open + kOpen.size());
          in_call_ = true;
          continue;
        }
        const size_t keep = partial_tag_suffix(held_, kOpen);
        text_out(out, held_.substr(0, held_.size() - keep));
        held_.erase(0, held_.size() - keep);
        return out;
      }
      // The search resumes where the last one stopped: a long call is scanned once.
      const size_t close = held_.find(kClose, close_scan_);
      if (close == std::string::npos) {
        close_scan_ = held_.size() >= kClose.size() ? held_.size() - kClose.size() + 1 : 0;
        return out;
      }
      close_scan_ = 0;
      const std::string body = held_.substr(0, close);
      held_.erase(0, close + kClose.size());
      in_call_ = false;
      call_out(out, body, true);
    }
  }

  ToolDelta finish() override {
    ToolDelta out;
    if (in_call_) {
      call_out(out, held_, false);  // unclosed: a call if the JSON is complete
    } else {
      text_out(out, held_);
    }
    held_.clear();
    in_call_ = false;
    close_scan_ = 0;
    return out;
  }

 private:
  void text_out(ToolDelta& out, const std::string& s) { content_out(out, s, after_call_); }
  void call_out(ToolDelta& out, const std::string& body, bool closed) {
    ToolCall c;
    if (call_from_json(body, {"arguments"}, c)) {
      whole_call(out, std::move(c.id), std::move(c.name), std::move(c.arguments));
      after_call_ = true;
      return;
    }
    text_out(out, kOpen + body + (closed ? kClose : ""));
  }

  const std::string kOpen = "<tool_call>", kClose = "</tool_call>";
  std::string held_;
  size_t close_scan_ = 0;  // where the search for the close tag resumes
  bool in_call_ = false;
  bool after_call_ = false;
};

// Llama 3.1/3.2/3.3 JSON tool calls: the whole answer is {"name": ..., "parameters": {...}} (or
// "arguments"), optionally after <|python_tag|>, several separated by ';'. An answer that does not
// start that way is content; one whose first object is not a call is content as a whole.
class Llama3JsonParser : public ToolParser {
 public:
  ToolDelta feed(const std::string& text) override {
    ToolDelta out;
    held_ += text;
    run(out);
    return out;
  }

  ToolDelta finish() override {
    ToolDelta out;
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
    held_.clear();
    raw_.clear();
    state_ = State::kContent;
    return out;
  }

 private:
  enum class State { kStart, kExpectObject, kObject, kAfterCall, kContent };

  void to_content() {
    held_ = raw_ + held_;
    raw_.clear();
    state_ = State::kContent;
  }
  void start_object() {
    state_ = State::kObject;
    depth_ = 0;
    scanned_ = 0;
    in_string_ = escaped_ = false;
  }

  void run(ToolDelta& out) {
    for (;;) {
      switch (state_) {
        case State::kStart: {
          const size_t lead = held_.find_first_not_of(kSpace);
          if (lead == std::string::npos) return;
          const std::string rest = held_.substr(lead);
          if (rest.compare(0, kTag.size(), kTag) == 0) {
            raw_ += held_.substr(0, lead + kTag.size());
            held_.erase(0, lead + kTag.size());
            state_ = State::kExpectObject;
          } else if (rest.size() < kTag.size() && kTag.compare(0, rest.size(), rest) == 0) {
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
          const size_t end = scan();
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

  // Scans the object that starts at held_[0]; returns one past its closing brace, or npos when it
  // has not closed yet.
  size_t scan() {
    for (; scanned_ < held_.size(); ++scanned_) {
      const char ch = held_[scanned_];
      if (in_string_) {
        if (escaped_) {
          escaped_ = false;
        } else if (ch == '\\') {
          escaped_ = true;
        } else if (ch == '"') {
          in_string_ = false;
        }
      } else if (ch == '"') {
        in_string_ = true;
      } else if (ch == '{' || ch == '[') {
        ++depth_;
      } else if (ch == '}' || ch == ']') {
        if (--depth_ == 0) return ++scanned_;
      }
    }
    return std::string::npos;
  }

  const std::string kTag = "<|python_tag|>";
  State state_ = State::kStart;
  std::string held_;  // text not yet attributed (in kObject: the object so far)
  std::string raw_;   // text consumed since the last call, given back if what follows is no call
  bool any_call_ = false;
  int depth_ = 0;
  size_t scanned_ = 0;
  bool in_string_ = false, escaped_ = false;
};

// DeepSeek-V3.1:
// <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (more
// calls) <｜tool▁calls▁end｜>; text before the section is content.
class DeepSeekV31Parser : public ToolParser {
 public:
  ToolDelta feed(const std::string& text) override {
    ToolDelta out;
    held_ += text;
    for (;;) {
      if (state_ == State::kText) {
        const size_t open = held_.find(kCallsBegin);
        if (open != std::string::npos) {
          text_out(out, held_.substr(0, open));
          held_.erase(0, open + kCallsBegin.size());
          state_ = State::kSection;
          continue;
        }
        const size_t keep = partial_tag_suffix(held_, kCallsBegin);
        text_out(out, held_.substr(0, held_.size() - keep));
        held_.erase(0, held_.size() - keep);
        return out;
      }
      if (state_ == State::kSection) {
        // Between calls: whitespace, then a call or the end of the section.
        const size_t lead = held_.find_first_not_of(kSpace);
        if (lead == std::string::npos) return out;
        const std::string rest = held_.substr(lead);
        if (rest.compare(0, kCallBegin.size(), kCallBegin) == 0) {
          held_ = rest.substr(kCallBegin.size());
          state_ = State::kCall;
        } else if (rest.compare(0, kCallsEnd.size(), kCallsEnd) == 0) {
          held_ = rest.substr(kCallsEnd.size());
          state_ = State::kText;
          after_call_ = true;
        } else if (is_prefix(rest, kCallBegin) || is_prefix(rest, kCallsEnd)) {
          return out;
        } else {
          state_ = State::kText;  // not a call after all: the rest is text
          held_ = rest;
        }
        continue;
      }
      const size_t close = held_.find(kCallEnd, close_scan_);
      if (close == std::string::npos) {
        close_scan_ = held_.size() >= kCallEnd.size() ? held_.size() - kCallEnd.size() + 1 : 0;
        return out;
      }
      close_scan_ = 0;
      const std::string body = held_.substr(0, close);
      held_.erase(0, close + kCallEnd.size());
      state_ = State::kSection;
      call_out(out, body, true);
    }
  }

  ToolDelta finish() override {
    ToolDelta out;
    if (state_ == State::kCall) {
      call_out(out, held_, false);
    } else if (state_ == State::kText || !all_space(held_)) {
      text_out(out, held_);
    }
    held_.clear();
    close_scan_ = 0;
    state_ = State::kText;
    return out;
  }

 private:
  enum class State { kText, kSection, kCall };
  static bool is_prefix(const std::string& s, const std::string& tag) {
    return s.size() < tag.size() && tag.compare(0, s.size(), s) == 0;
  }
  void text_out(ToolDelta& out, const std::string& s) { content_out(out, s, after_call_); }
  void call_out(ToolDelta& out, const std::string& body, bool closed) {
    const size_t sep = body.find(kSep);
    ToolCall c;
    if (sep != std::string::npos) {
      std::string name = body.substr(0, sep);
      const size_t a = name.find_first_not_of(kSpace), b = name.find_last_not_of(kSpace);
      name = a == std::string::npos ? "" : name.substr(a, b - a + 1);
      const json args = json_loads(std::string_view(body).substr(sep + kSep.size()));
      if (!args.is_discarded() && make_call(name, args, c)) {
        whole_call(out, std::move(c.id), std::move(c.name), std::move(c.arguments));
        after_call_ = true;
        return;
      }
    }
    text_out(out, kCallBegin + body + (closed ? kCallEnd : ""));
  }

  const std::string kCallsBegin = "<｜tool▁calls▁begin｜>", kCallsEnd = "<｜tool▁calls▁end｜>";
  const std::string kCallBegin = "<｜tool▁call▁begin｜>", kCallEnd = "<｜tool▁call▁end｜>";
  const std::string kSep = "<｜tool▁sep｜>";
  State state_ = State::kText;
  std::string held_;
  size_t close_scan_ = 0;  // where the search for the call's end resumes
  bool after_call_ = false;
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

ToolDelta ToolParser::parse(const std::string& output) {
  ToolDelta a = feed(output);
  a.append(finish());
  return a;
}

int ToolParser::begin_call(ToolDelta& out, std::string id, std::string name) {
  const int index = static_cast<int>(started_.size());
  started_.push_back({id, name});
  ToolCallDelta d;
  d.index = index;
  d.id = std::move(id);
  d.name = std::move(name);
  out.deltas.push_back(std::move(d));
  return index;
}

void ToolParser::call_arguments(ToolDelta& out, int index, const std::string& arguments) {
  if (arguments.empty()) return;
  if (!out.deltas.empty() && out.deltas.back().index == index && out.deltas.back().id.empty()) {
    out.deltas.back().arguments += arguments;
    return;
  }
  ToolCallDelta d;
  d.index = index;
  d.arguments = arguments;
  out.deltas.push_back(std::move(d));
}

void ToolParser::end_call(ToolDelta& out, int index, std::string arguments) {
  const Started& s = started_.at(static_cast<size_t>(index));
  out.calls.push_back({s.id, s.name, std::move(arguments)});
}

void ToolParser::whole_call(ToolDelta& out, std::string id, std::string name,
                            std::string arguments) {
  const int index = begin_call(out, std::move(id), std::move(name));
  call_arguments(out, index, arguments);
  end_call(out, index, std::move(arguments));
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
