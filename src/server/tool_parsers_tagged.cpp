// Formats whose calls are marked by special tokens around a name and JSON arguments: Kimi K2,
// DeepSeek-V3 (and R1), Mistral. As vLLM does, arguments stream as the model writes them once
// the call's name is known, and stay as written (arguments that turn out not to be JSON are
// still the call's: vLLM returns them so, and streamed text cannot be taken back); a call whose
// markers or name are malformed stays content.
#include <algorithm>
#include <cctype>
#include <string_view>
#include <vector>

#include "server/tool_parser_util.h"
#include "server/tool_parsers.h"

namespace atom::server {

namespace {

using json = nlohmann::ordered_json;
using namespace parse_util;

// Appends text to the content; right after a call its leading whitespace is dropped.
void content_text(ToolDelta& out, const std::string& s, bool& after_call) {
  if (after_call) {
    const size_t first = s.find_first_not_of(kSpace);
    if (first == std::string::npos) return;
    after_call = false;
    out.content += s.substr(first);
    return;
  }
  out.content += s;
}

// Streams a call's arguments while holding back trailing whitespace, which vLLM strips before
// the end marker.
class TrimmedArguments {
 public:
  void reset() {
    text_.clear();
    pending_.clear();
    started_ = false;
  }
  // Returns the piece that can be streamed now.
  std::string add(const std::string& s) {
    std::string piece;
    for (const char c : s) {
      if (!started_) {
        if (std::string_view(kSpace).find(c) != std::string_view::npos) continue;
        started_ = true;
      }
      if (std::string_view(kSpace).find(c) != std::string_view::npos) {
        pending_ += c;
      } else {
        piece += pending_;
        pending_.clear();
        piece += c;
      }
    }
    text_ += piece;
    return piece;
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_, pending_;
  bool started_ = false;
};

// ------------------------------------------------------------------------------- kimi_k2

// <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX <|tool_call_argument_begin|>
// {...}<|tool_call_end|>...<|tool_calls_section_end|>. The id the model wrote
// ("functions.get_weather:0") is the call's id, as vLLM returns it; it must end in ":<digits>".
class KimiK2Parser : public ToolParser {
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
      case State::kText:
        content_text(out, held_, after_call_);
        break;
      case State::kSection:
        if (!all_space(held_)) content_text(out, held_, after_call_);
        break;
      case State::kId:
      case State::kBadCall:
        content_text(out, bad_ + held_, after_call_);
        break;
      case State::kArgs:
        arguments(out, held_);
        end_call(out, index_, args_.text());
        break;
    }
    held_.clear();
    state_ = State::kText;
    return out;
  }

 private:
  enum class State { kText, kSection, kId, kArgs, kBadCall };
  static constexpr std::string_view kSectionBegin = "<|tool_calls_section_begin|>",
                                    kSectionEnd = "<|tool_calls_section_end|>",
                                    kCallBegin = "<|tool_call_begin|>",
                                    kArgBegin = "<|tool_call_argument_begin|>",
                                    kCallEnd = "<|tool_call_end|>";

  void arguments(ToolDelta& out, const std::string& s) {
    call_arguments(out, index_, args_.add(s));
  }

  // functions.NAME:IDX or NAME:IDX (vLLM's `[^<]+:\d+`); the name is what precedes the last ':'
  // after the last '.'.
  static std::string name_of(const std::string& id) {
    const size_t colon = id.rfind(':');
    if (colon == std::string::npos || colon + 1 == id.size() || colon == 0 ||
        id.find('<') != std::string::npos || id.size() > kMaxName)
      return "";
    for (size_t i = colon + 1; i < id.size(); ++i)
      if (id[i] < '0' || id[i] > '9') return "";
    const std::string head = id.substr(0, colon);
    const size_t dot = head.rfind('.');
    return trim(dot == std::string::npos ? head : head.substr(dot + 1));
  }

  void run(ToolDelta& out) {
    for (;;) {
      switch (state_) {
        case State::kText: {
          const size_t open = held_.find(kSectionBegin);
          if (open == std::string::npos) {
            const size_t keep = partial_tag_suffix(held_, kSectionBegin);
            content_text(out, held_.substr(0, held_.size() - keep), after_call_);
            held_.erase(0, held_.size() - keep);
            return;
          }
          content_text(out, held_.substr(0, open), after_call_);
          held_.erase(0, open + kSectionBegin.size());
          state_ = State::kSection;
          break;
        }
        case State::kSection: {
          const size_t lead = held_.find_first_not_of(kSpace);
          if (lead == std::string::npos) {
            held_.clear();  // whitespace between calls belongs to none
            return;
          }
          const std::string_view rest = std::string_view(held_).substr(lead);
          if (starts_with(rest, kCallBegin)) {
            held_.erase(0, lead + kCallBegin.size());
            state_ = State::kId;
          } else if (starts_with(rest, kSectionEnd)) {
            held_.erase(0, lead + kSectionEnd.size());
            after_call_ = true;
            state_ = State::kText;
          } else if (is_partial(rest, kCallBegin) || is_partial(rest, kSectionEnd)) {
            return;
          } else {
            // Text inside the section that is no call: content, up to the next marker.
            const Found f = find_first(held_, {kCallBegin, kSectionEnd}, lead);
            const size_t upto =
                f.found() ? f.pos
                          : held_.size() - partial_tag_suffix(held_, {kCallBegin, kSectionEnd});
            content_text(out, held_.substr(lead, upto - lead), after_call_);
            held_.erase(0, upto);
            if (!f.found()) return;
          }
          break;
        }
        case State::kId: {
          const Found f = find_first(held_, {kArgBegin, kCallEnd, kCallBegin, kSectionEnd});
          if (!f.found()) {
            if (held_.size() <= kMaxName) return;
            bad_ = std::string(kCallBegin);
            state_ = State::kBadCall;
            break;
          }
          const std::string id = trim(held_.substr(0, f.pos));
          const std::string name = f.which == 0 ? name_of(id) : "";
          if (name.empty()) {
            bad_ = std::string(kCallBegin);
            state_ = State::kBadCall;
            break;
          }
          held_.erase(0, f.pos + kArgBegin.size());
          index_ = begin_call(out, id, name);
          args_.reset();
          state_ = State::kArgs;
          break;
        }
        case State::kArgs: {
          const Found f = find_first(held_, {kCallEnd, kCallBegin, kSectionEnd});
          if (!f.found()) {
            const size_t keep = partial_tag_suffix(held_, {kCallEnd, kCallBegin, kSectionEnd});
            arguments(out, held_.substr(0, held_.size() - keep));
            held_.erase(0, held_.size() - keep);
            return;
          }
          arguments(out, held_.substr(0, f.pos));
          // A missing end marker: the next call or the section's end closes this one.
          held_.erase(0, f.which == 0 ? f.pos + kCallEnd.size() : f.pos);
          end_call(out, index_, args_.text());
          state_ = State::kSection;
          break;
        }
        case State::kBadCall: {
          // A call that is not one: its text up to and with its end marker is content.
          const Found f = find_first(held_, {kCallEnd, kCallBegin, kSectionEnd});
          if (!f.found()) {  // content as it comes, up to what may start a marker
            const size_t keep = partial_tag_suffix(held_, {kCallEnd, kCallBegin, kSectionEnd});
            content_text(out, bad_ + held_.substr(0, held_.size() - keep), after_call_);
            bad_.clear();
            held_.erase(0, held_.size() - keep);
            return;
          }
          const size_t upto = f.which == 0 ? f.pos + kCallEnd.size() : f.pos;
          content_text(out, bad_ + held_.substr(0, upto), after_call_);
          bad_.clear();
          held_.erase(0, upto);
          state_ = State::kSection;
          break;
        }
      }
    }
  }

  State state_ = State::kText;
  std::string held_, bad_;
  bool after_call_ = false;
  int index_ = 0;
  TrimmedArguments args_;
};

// --------------------------------------------------------------------------- deepseek_v3

// <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
// <｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (DeepSeek-V3-0324 and R1; V3.1 dropped the type and
// the fence: deepseek_v31).
class DeepSeekV3Parser : public ToolParser {
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
      case State::kText:
        content_text(out, held_, after_call_);
        break;
      case State::kSection:
        if (!all_space(held_)) content_text(out, held_, after_call_);
        break;
      case State::kHead:
      case State::kBadCall:
        content_text(out, bad_ + held_, after_call_);
        break;
      case State::kArgs:
        arguments(out, held_);
        end_call(out, index_, args_);
        break;
      case State::kAfterArgs:
        break;
    }
    held_.clear();
    state_ = State::kText;
    return out;
  }

 private:
  enum class State { kText, kSection, kHead, kArgs, kAfterArgs, kBadCall };
  static constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>",
                                    kCallsEnd = "<｜tool▁calls▁end｜>",
                                    kCallBegin = "<｜tool▁call▁begin｜>",
                                    kCallEnd = "<｜tool▁call▁end｜>", kSep = "<｜tool▁sep｜>",
                                    kFenceOpen = "```json\n", kFenceClose = "\n```";

  void arguments(ToolDelta& out, const std::string& s) {
    args_ += s;
    call_arguments(out, index_, s);
  }

  void run(ToolDelta& out) {
    for (;;) {
      switch (state_) {
        case State::kText: {
          const size_t open = held_.find(kCallsBegin);
          if (open == std::string::npos) {
            const size_t keep = partial_tag_suffix(held_, kCallsBegin);
            content_text(out, held_.substr(0, held_.size() - keep), after_call_);
            held_.erase(0, held_.size() - keep);
            return;
          }
          content_text(out, held_.substr(0, open), after_call_);
          held_.erase(0, open + kCallsBegin.size());
          state_ = State::kSection;
          break;
        }
        case State::kSection: {
          const size_t lead = held_.find_first_not_of(kSpace);
          if (lead == std::string::npos) {
            held_.clear();  // whitespace between calls belongs to none
            return;
          }
          const std::string_view rest = std::string_view(held_).substr(lead);
          if (starts_with(rest, kCallBegin)) {
            held_.erase(0, lead + kCallBegin.size());
            state_ = State::kHead;
          } else if (starts_with(rest, kCallsEnd)) {
            held_.erase(0, lead + kCallsEnd.size());
            after_call_ = true;
            state_ = State::kText;
          } else if (is_partial(rest, kCallBegin) || is_partial(rest, kCallsEnd)) {
            return;
          } else {
            const Found f = find_first(held_, {kCallBegin, kCallsEnd}, lead);
            const size_t upto =
                f.found() ? f.pos
                          : held_.size() - partial_tag_suffix(held_, {kCallBegin, kCallsEnd});
            content_text(out, held_.substr(lead, upto - lead), after_call_);
            held_.erase(0, upto);
            if (!f.found()) return;
          }
          break;
        }
        case State::kHead: {
          // TYPE<｜tool▁sep｜>NAME\n```json\n: the call is known once its fence opens.
          const Found stop = find_first(held_, {kCallEnd, kCallBegin, kCallsEnd});
          const size_t sep = held_.find(kSep);
          const size_t nl =
              sep == std::string::npos ? std::string::npos : held_.find('\n', sep + kSep.size());
          const bool fence_complete =
              nl != std::string::npos && held_.size() >= nl + 1 + kFenceOpen.size();
          if (!fence_complete && !stop.found()) {
            if (held_.size() <= 2 * kMaxName) return;
            bad_ = std::string(kCallBegin);
            state_ = State::kBadCall;
            break;
          }
          const std::string name =
              nl == std::string::npos
                  ? ""
                  : trim(held_.substr(sep + kSep.size(), nl - sep - kSep.size()));
          const bool ok = fence_complete && (!stop.found() || stop.pos > nl) && !name.empty() &&
                          name.size() <= kMaxName && !trim(held_.substr(0, sep)).empty() &&
                          held_.compare(nl + 1, kFenceOpen.size(), kFenceOpen) == 0;
          if (!ok) {
            bad_ = std::string(kCallBegin);
            state_ = State::kBadCall;
            break;
          }
          held_.erase(0, nl + 1 + kFenceOpen.size());
          index_ = begin_call(out, tool_call_id(), name);
          args_.clear();
          state_ = State::kArgs;
          break;
        }
        case State::kArgs: {
          // JSON strings hold no raw newline, so "\n```" ends the arguments.
          const Found f = find_first(held_, {kFenceClose, kCallEnd, kCallsEnd});
          if (!f.found()) {
            const size_t keep = partial_tag_suffix(held_, {kFenceClose, kCallEnd, kCallsEnd});
            arguments(out, held_.substr(0, held_.size() - keep));
            held_.erase(0, held_.size() - keep);
            return;
          }
          arguments(out, held_.substr(0, f.pos));
          held_.erase(0, f.which == 0 ? f.pos + kFenceClose.size() : f.pos);
          end_call(out, index_, args_);
          state_ = f.which == 0 ? State::kAfterArgs : State::kSection;
          if (f.which == 1) held_.erase(0, kCallEnd.size());
          break;
        }
        case State::kAfterArgs: {
          // Up to the call's end marker.
          const Found f = find_first(held_, {kCallEnd, kCallBegin, kCallsEnd});
          if (!f.found()) {
            held_.erase(
                0, held_.size() - partial_tag_suffix(held_, {kCallEnd, kCallBegin, kCallsEnd}));
            return;
          }
          held_.erase(0, f.which == 0 ? f.pos + kCallEnd.size() : f.pos);
          state_ = State::kSection;
          break;
        }
        case State::kBadCall: {
          const Found f = find_first(held_, {kCallEnd, kCallBegin, kCallsEnd});
          if (!f.found()) {  // content as it comes, up to what may start a marker
            const size_t keep = partial_tag_suffix(held_, {kCallEnd, kCallBegin, kCallsEnd});
            content_text(out, bad_ + held_.substr(0, held_.size() - keep), after_call_);
            bad_.clear();
            held_.erase(0, held_.size() - keep);
            return;
          }
          const size_t upto = f.which == 0 ? f.pos + kCallEnd.size() : f.pos;
          content_text(out, bad_ + held_.substr(0, upto), after_call_);
          bad_.clear();
          held_.erase(0, upto);
          state_ = State::kSection;
          break;
        }
      }
    }
  }

  State state_ = State::kText;
  std::string held_, bad_, args_;
  bool after_call_ = false;
  int index_ = 0;
};

// ------------------------------------------------------------------------------- mistral

// [TOOL_CALLS] starts the calls. Before tokenizer v11 a JSON array follows:
// [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...], whose calls are listed once the array
// closes (arguments re-serialised by json.dumps(ensure_ascii=False)), or which stays content when
// it is not such an array. From v11 each call is [TOOL_CALLS]NAME{...} (v13 writes
// NAME[ARGS]{...}); its arguments are the JSON object after the name, streamed as written.
// Ids are 9 alphanumeric characters, the only kind Mistral's templates accept.
class MistralParser : public ToolParser {
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
      case State::kText:
        content_text(out, held_, after_call_);
        break;
      case State::kAfterBot:
      case State::kName:
      case State::kArray:
        content_text(out, std::string(kBot) + held_, after_call_);
        break;
      case State::kArgs:
        arguments(out, held_);
        end_call(out, index_, args_);
        break;
    }
    held_.clear();
    state_ = State::kText;
    return out;
  }

 private:
  enum class State { kText, kAfterBot, kName, kArgs, kArray };
  static constexpr std::string_view kBot = "[TOOL_CALLS]", kArgsTag = "[ARGS]",
                                    kCallId = "[CALL_ID]";

  void arguments(ToolDelta& out, const std::string& s) {
    args_ += s;
    call_arguments(out, index_, s);
  }

  // Scans JSON from held_[0] (an object or array) to its end, across feeds; npos while open.
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
  void start_scan() {
    depth_ = 0;
    scanned_ = 0;
    in_string_ = escaped_ = false;
  }

  static bool valid_name(const std::string& n) {
    if (n.empty() || n.size() > kMaxName) return false;
    for (const char c : n)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
        return false;
    return true;
  }

  void run(ToolDelta& out) {
    for (;;) {
      switch (state_) {
        case State::kText: {
          const size_t bot = held_.find(kBot);
          if (bot == std::string::npos) {
            const size_t keep = partial_tag_suffix(held_, kBot);
            content_text(out, held_.substr(0, held_.size() - keep), after_call_);
            held_.erase(0, held_.size() - keep);
            return;
          }
          content_text(out, held_.substr(0, bot), after_call_);
          held_.erase(0, bot + kBot.size());
          state_ = State::kAfterBot;
          break;
        }
        case State::kAfterBot: {
          const size_t lead = held_.find_first_not_of(kSpace);
          if (lead == std::string::npos) return;
          held_.erase(0, lead);
          if (held_[0] == '[') {  // the JSON array of tokenizers before v11
            start_scan();
            state_ = State::kArray;
          } else {
            state_ = State::kName;
          }
          break;
        }
        case State::kName: {
          const size_t brace = held_.find('{');
          if (brace == std::string::npos) {
            if (held_.size() <= kMaxName + kCallId.size() + 16 &&
                held_.find('\n') == std::string::npos)
              return;
            content_text(out, std::string(kBot), after_call_);  // no call: scanning resumes
            state_ = State::kText;
            break;
          }
          std::string head = held_.substr(0, brace);
          std::string id;
          if (const size_t a = head.find(kArgsTag); a != std::string::npos)
            head.erase(a, kArgsTag.size());
          if (const size_t c = head.find(kCallId); c != std::string::npos) {
            id = trim(head.substr(c + kCallId.size()));
            head.erase(c);
          }
          const std::string name = trim(head);
          if (!valid_name(name)) {
            content_text(out, std::string(kBot), after_call_);
            state_ = State::kText;
            break;
          }
          // The model's own id when it wrote a valid one ([CALL_ID]), else a fresh one.
          bool id_ok = id.size() == 9;
          for (const char c : id) id_ok = id_ok && std::isalnum(static_cast<unsigned char>(c));
          index_ = begin_call(out, id_ok ? id : mistral_tool_call_id(), name);
          held_.erase(0, brace);
          args_.clear();
          start_scan();
          state_ = State::kArgs;
          break;
        }
        case State::kArgs: {
          // The arguments are the JSON object that starts here; the next [TOOL_CALLS] also ends
          // them (arguments that never close run to it or to the end of output).
          const size_t bot = held_.find(kBot);
          const size_t end = scan();
          if (end != std::string::npos && (bot == std::string::npos || end <= bot)) {
            arguments(out, held_.substr(0, end));
            held_.erase(0, end);
            end_call(out, index_, args_);
            after_call_ = true;
            state_ = State::kText;
            break;
          }
          if (bot != std::string::npos) {
            arguments(out, held_.substr(0, bot));
            held_.erase(0, bot);
            end_call(out, index_, args_);
            state_ = State::kText;
            break;
          }
          // Stream what cannot be the start of [TOOL_CALLS]; the scan has covered all of it.
          const size_t n = held_.size() - partial_tag_suffix(held_, kBot);
          arguments(out, held_.substr(0, n));
          held_.erase(0, n);
          scanned_ -= n;
          return;
        }
        case State::kArray: {
          const size_t end = scan();
          if (end == std::string::npos) return;
          const json a = json_loads(std::string_view(held_).substr(0, end));
          std::vector<std::pair<std::string, std::string>> calls;
          bool ok = a.is_array() && !a.empty();
          if (ok) {
            for (const auto& c : a) {
              if (!c.is_object() || !c.contains("name") || !c["name"].is_string() ||
                  c["name"].get_ref<const std::string&>().empty()) {
                ok = false;
                break;
              }
              json args = c.contains("arguments") ? c["arguments"] : json::object();
              if (args.is_string()) args = json_loads(args.get<std::string>());
              if (!args.is_object()) {
                ok = false;
                break;
              }
              calls.emplace_back(c["name"].get<std::string>(), py_json_dumps(args, false));
            }
          }
          if (!ok) {
            content_text(out, std::string(kBot) + held_.substr(0, end), after_call_);
          } else {
            for (auto& [name, args] : calls)
              whole_call(out, mistral_tool_call_id(), name, std::move(args));
            after_call_ = true;
          }
          held_.erase(0, end);
          state_ = State::kText;
          break;
        }
      }
    }
  }

  State state_ = State::kText;
  std::string held_, args_;
  bool after_call_ = false;
  int index_ = 0;
  int depth_ = 0;
  size_t scanned_ = 0;
  bool in_string_ = false, escaped_ = false;
};

}  // namespace

std::unique_ptr<ToolParser> make_kimi_k2_parser() { return std::make_unique<KimiK2Parser>(); }
std::unique_ptr<ToolParser> make_deepseek_v3_parser() {
  return std::make_unique<DeepSeekV3Parser>();
}
std::unique_ptr<ToolParser> make_mistral_parser() { return std::make_unique<MistralParser>(); }

}  // namespace atom::server
