#include "server/reasoning.h"

#include <algorithm>

namespace atom::server {

namespace {
// Length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_tag_suffix(const std::string& s, const std::string& tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.compare(s.size() - n, n, tag, 0, n) == 0) return n;
  return 0;
}
bool all_space(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; });
}
}  // namespace

ReasoningParser::ReasoningParser(bool starts_in_reasoning, std::string start_tag, std::string end_tag)
    : state_(starts_in_reasoning ? State::kReasoning : State::kStart),
      start_(std::move(start_tag)),
      end_(std::move(end_tag)) {}

ReasoningDelta ReasoningParser::feed(const std::string& text) {
  ReasoningDelta out;
  held_ += text;
  for (;;) {
    if (state_ == State::kStart) {
      // Output may open a block with the start tag, after optional whitespace.
      const size_t lead = held_.find_first_not_of(" \t\r\n");
      if (lead == std::string::npos) return out;  // only whitespace so far: undecided
      const std::string rest = held_.substr(lead);
      if (rest.compare(0, start_.size(), start_) == 0) {
        held_ = rest.substr(start_.size());
        state_ = State::kReasoning;
        continue;
      }
      if (rest.size() < start_.size() && start_.compare(0, rest.size(), rest) == 0) return out;
      state_ = State::kContent;
      continue;
    }
    if (state_ == State::kReasoning) {
      const size_t end = held_.find(end_);
      if (end != std::string::npos) {
        out.reasoning += held_.substr(0, end);
        held_ = held_.substr(end + end_.size());
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
      const size_t keep = partial_tag_suffix(held_, end_);
      out.reasoning += held_.substr(0, held_.size() - keep);
      held_ = held_.substr(held_.size() - keep);
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
  if (state_ == State::kReasoning) {
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

bool ReasoningParser::prompt_opens_reasoning(const std::string& prompt) {
  const size_t end = prompt.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return false;
  const std::string tag = "<think>";
  return end + 1 >= tag.size() && prompt.compare(end + 1 - tag.size(), tag.size(), tag) == 0;
}

}  // namespace atom::server
