#include "server/reasoning.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

#include "server/tool_parser_util.h"

namespace atom::server {

using namespace parse_util;

ReasoningParser::ReasoningParser(bool starts_in_reasoning, std::string start_tag,
                                 std::string end_tag)
    : ReasoningParser(
          ReasoningFormat{std::move(start_tag), std::move(end_tag), starts_in_reasoning, ""}) {}

ReasoningParser::ReasoningParser(ReasoningFormat format)
    : state_(format.starts_in_reasoning ? State::kStartReasoning : State::kStart),
      format_(std::move(format)) {}

ReasoningDelta ReasoningParser::feed(const std::string& text) {
  ReasoningDelta out;
  held_ += text;
  const std::string& start = format_.start;
  const std::string& end = format_.end;
  const std::string& also = format_.also_ends;
  for (;;) {
    if (state_ == State::kStart || state_ == State::kStartReasoning) {
      // Output may open a block with the start tag, after optional whitespace.
      const size_t lead = held_.find_first_not_of(kSpace);
      if (lead == std::string::npos) return out;  // only whitespace so far: undecided
      const std::string rest = held_.substr(lead);
      if (starts_with(rest, start)) {
        held_ = rest.substr(start.size());
        state_ = State::kReasoning;
        continue;
      }
      if (is_partial(rest, start)) return out;
      state_ = state_ == State::kStart ? State::kContent : State::kReasoning;
      continue;
    }
    if (state_ == State::kReasoning) {
      const Taken t = also.empty() ? take_before(held_, {end}) : take_before(held_, {end, also});
      out.reasoning += t.text;
      if (t.tag.which == 0) {
        held_ = held_.substr(end.size());
        // The answer usually starts after blank lines; they belong to neither part.
        const size_t first = held_.find_first_not_of("\r\n");
        held_ = first == std::string::npos ? "" : held_.substr(first);
        state_ = State::kContent;
        if (held_.empty()) {
          skip_newlines_ = true;
          return out;
        }
        continue;
      }
      if (t.tag.which == 1) {
        state_ = State::kContent;  // the tag starts the content, and stays in it
        continue;
      }
      return out;
    }
    // Content.
    if (skip_newlines_) {
      const size_t first = held_.find_first_not_of("\r\n");
      if (first == std::string::npos) {
        held_.clear();
        return out;
      }
      held_ = held_.substr(first);
      skip_newlines_ = false;
    }
    out.content += held_;
    held_.clear();
    return out;
  }
}

ReasoningDelta ReasoningParser::finish() {
  ReasoningDelta out;
  if (state_ == State::kReasoning || state_ == State::kStartReasoning) {
    out.reasoning = held_;
  } else if (!(skip_newlines_ && all_space(held_))) {
    out.content = held_;
  }
  held_.clear();
  return out;
}

ReasoningDelta ReasoningParser::split(const std::string& output, bool starts_in_reasoning) {
  ReasoningParser p(starts_in_reasoning);
  ReasoningDelta a = p.feed(output), b = p.finish();
  return {a.reasoning + b.reasoning, a.content + b.content};
}

namespace {
// True when `prompt` ends with `tag`, trailing whitespace aside.
bool ends_with_tag(const std::string& prompt, const std::string& tag) {
  const size_t end = prompt.find_last_not_of(kSpace);
  if (end == std::string::npos || tag.empty()) return false;
  return end + 1 >= tag.size() && prompt.compare(end + 1 - tag.size(), tag.size(), tag) == 0;
}
}  // namespace

bool ReasoningParser::prompt_opens_reasoning(const std::string& prompt) {
  return ends_with_tag(prompt, "<think>");
}

bool ReasoningParser::prompt_closes_reasoning(const std::string& prompt,
                                              const std::string& end_tag) {
  return ends_with_tag(prompt, end_tag);
}

const std::vector<std::string>& reasoning_parser_names() {
  static const std::vector<std::string> names = {"deepseek_r1", "deepseek_v3",   "glm45",
                                                 "kimi_k2",     "openai_gptoss", "qwen3"};
  return names;
}

bool reasoning_parser_known(const std::string& name) {
  if (name == "none") return true;
  const auto& n = reasoning_parser_names();
  return std::find(n.begin(), n.end(), name) != n.end();
}

namespace {
// Python's bool() of a template variable.
bool truthy(const nlohmann::ordered_json& kwargs, const char* key, bool fallback) {
  if (!kwargs.is_object() || !kwargs.contains(key)) return fallback;
  const auto& v = kwargs[key];
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  if (v.is_array() || v.is_object()) return !v.empty();
  return false;  // null
}
}  // namespace

std::unique_ptr<ReasoningParser> make_reasoning_parser(
    const std::string& name, const std::string& prompt,
    const nlohmann::ordered_json& chat_template_kwargs) {
  ReasoningFormat f;
  if (name == "qwen3" || name == "glm45") {
    // <think> written by the model, or already opened by the prompt; or closed by the prompt
    // (both families' templates write an empty block when enable_thinking is false).
    f.starts_in_reasoning = ReasoningParser::prompt_opens_reasoning(prompt);
    f.ended_in_prompt =
        !f.starts_in_reasoning && (ReasoningParser::prompt_closes_reasoning(prompt, f.end) ||
                                   !truthy(chat_template_kwargs, "enable_thinking", true));
  } else if (name == "deepseek_r1") {
    f.starts_in_reasoning = true;  // R1's templates open <think> in the prompt
  } else if (name == "deepseek_v3") {
    // V3.1/V3.2 think only when asked (`thinking`, or `enable_thinking`), as R1 does then.
    if (!truthy(chat_template_kwargs, "thinking", false) &&
        !truthy(chat_template_kwargs, "enable_thinking", false))
      return nullptr;
    f.starts_in_reasoning = true;
  } else if (name == "kimi_k2") {
    if (!truthy(chat_template_kwargs, "thinking", true)) return nullptr;
    f.starts_in_reasoning = true;
    f.also_ends = "<|tool_calls_section_begin|>";
  } else if (name == "openai_gptoss") {
    return nullptr;
  } else {
    throw std::invalid_argument(fmt::format("invalid reasoning parser: {} (choose from {{ {} }})",
                                            name, fmt::join(reasoning_parser_names(), ", ")));
  }
  return std::make_unique<ReasoningParser>(std::move(f));
}

}  // namespace atom::server
