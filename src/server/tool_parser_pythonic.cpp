// vLLM's pythonic format (Llama 3.2 and 4, ToolACE and others): the whole answer is a Python list
// of calls with literal keyword arguments, [get_weather(city="Paris"), f(x=[1, 2], y=None)].
// Each call is listed as soon as its closing parenthesis arrives, its arguments json.dumps(...,
// ensure_ascii=False) of the values. An answer that does not start with "[" is content; so is
// everything from the first item of the list that is no such call (a positional argument, a
// name or an expression as a value).
#include <cctype>
#include <string_view>

#include "server/py_literal.h"
#include "server/tool_parser_util.h"
#include "server/tool_parsers.h"

namespace atom::server {

namespace {

using namespace parse_util;

bool ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

class PythonicParser : public HeldTextParser {
 private:
  enum class State { kStart, kList, kCall, kAfterCall, kDone, kContent };

  void flush(ToolDelta& out) override {
    switch (state_) {
      case State::kStart:
      case State::kContent:
        out.content += held_;
        break;
      case State::kList:
      case State::kCall:
      case State::kAfterCall:
        out.content += raw_ + held_;  // the list never closed
        break;
      case State::kDone:
        if (!all_space(held_)) out.content += trim_front(held_);
        break;
    }
    raw_.clear();
    state_ = State::kContent;
  }

  static std::string trim_front(const std::string& s) {
    const size_t a = s.find_first_not_of(kSpace);
    return a == std::string::npos ? "" : s.substr(a);
  }

  void malformed(ToolDelta& out) {
    out.content += raw_ + held_;
    raw_.clear();
    held_.clear();
    state_ = State::kContent;
  }

  // Moves leading whitespace from held_ to raw_; false when nothing else is held yet.
  bool skip_space() { return move_leading_space(held_, raw_); }

  void run(ToolDelta& out) override {
    for (;;) {
      switch (state_) {
        case State::kStart:
          if (held_.empty()) return;
          if (held_[0] != '[') {
            state_ = State::kContent;
            break;
          }
          raw_ = "[";
          held_.erase(0, 1);
          state_ = State::kList;
          break;
        case State::kList:
          if (!skip_space()) return;
          if (ident_start(held_[0])) {
            state_ = State::kCall;
          } else if (held_[0] == ']' && any_call_) {  // [f(), ] ends after its trailing comma
            held_.erase(0, 1);
            raw_.clear();
            state_ = State::kDone;
          } else {
            malformed(out);  // includes "[]": a list without calls is no call
          }
          break;
        case State::kCall: {
          size_t i = 0;
          while (i < held_.size() && ident(held_[i])) ++i;
          if (i > kMaxName) {
            malformed(out);
            break;
          }
          while (i < held_.size() && is_space(held_[i])) ++i;
          if (i == held_.size()) return;
          if (held_[i] != '(') {
            malformed(out);
            break;
          }
          if (scan_from_ != i) {  // the call's "(" found: its scan starts (then resumes)
            scan_ = PyScanState{};
            scan_from_ = i;
          }
          const size_t end = py_scan_bracket(std::string_view(held_).substr(i), scan_);
          if (end == std::string::npos) return;
          if (end == kPyScanError) {
            malformed(out);
            break;
          }
          const auto call = py_parse_call(std::string_view(held_).substr(0, i + end));
          if (!call) {
            malformed(out);
            break;
          }
          whole_call(out, tool_call_id(), call->name, py_json_dumps(call->arguments, false));
          any_call_ = true;
          held_.erase(0, i + end);
          scan_from_ = std::string::npos;
          raw_.clear();
          state_ = State::kAfterCall;
          break;
        }
        case State::kAfterCall:
          if (!skip_space()) return;
          if (held_[0] == ',') {
            raw_ += ',';
            held_.erase(0, 1);
            state_ = State::kList;
          } else if (held_[0] == ']') {
            held_.erase(0, 1);
            raw_.clear();
            state_ = State::kDone;
          } else {
            malformed(out);
          }
          break;
        case State::kDone: {
          // Text after the list is content, without the whitespace that separates it.
          const size_t lead = held_.find_first_not_of(kSpace);
          if (lead == std::string::npos) return;
          held_.erase(0, lead);
          state_ = State::kContent;
          break;
        }
        case State::kContent:
          out.content += held_;
          held_.clear();
          return;
      }
    }
  }

  State state_ = State::kStart;
  bool any_call_ = false;
  PyScanState scan_;                      // the open call's scan, resumed as text arrives
  size_t scan_from_ = std::string::npos;  // where in held_ that call's "(" is
  std::string raw_;  // list text consumed since the last call (content if what follows is none)
};

}  // namespace

std::unique_ptr<ToolParser> make_pythonic_parser() { return std::make_unique<PythonicParser>(); }

}  // namespace atom::server
