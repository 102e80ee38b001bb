// Formats whose calls are marked by special tokens around a name and JSON arguments: Kimi K2,
// DeepSeek-V3 (and R1), Mistral. As vLLM does, arguments stream as the model writes them once
// the call's name is known, and stay as written (arguments that turn out not to be JSON are
// still the call's: vLLM returns them so, and streamed text cannot be taken back); a call whose
// markers or name are malformed stays content.
#include <cctype>
#include <string_view>
#include <vector>

#include "server/tool_parser_util.h"
#include "server/tool_parsers.h"

namespace atom::server {

namespace {

using json = nlohmann::ordered_json;
using namespace parse_util;

// Streams a call's arguments while holding back trailing whitespace, which vLLM strips before
// the end marker.
class TrimmedArguments {
 public:
  void reset() {
    pending_.clear();
    started_ = false;
  }
  // Returns the piece that can be streamed now.
  std::string add(const std::string& s) {
    std::string piece;
    for (const char c : s) {
      if (!started_) {
        if (is_space(c)) continue;
        started_ = true;
      }
      if (is_space(c)) {
        pending_ += c;
      } else {
        piece += pending_;
        pending_.clear();
        piece += c;
      }
    }
    return piece;
  }

 private:
  std::string pending_;
  bool started_ = false;
};

// Kimi's and DeepSeek-V3's layout: text, then a section (section_begin ... section_end) of calls,
// each call_begin ... call_end, where a call without its end marker ends at the next call or at
// the section's end. Whitespace between calls belongs to none; other text in the section is
// content up to the next marker; a call whose head the format's reader refuses is content up to
// and with its end marker. The format reads the inside of each call.
class SectionParser : public HeldTextParser {
 protected:
  struct Markers {
    std::string_view section_begin, section_end, call_begin, call_end;
  };
  explicit SectionParser(const Markers& m) : m_(m) {}

  // A call_begin marker was read: held_ starts inside its call.
  virtual void call_opened() = 0;
  // Reads the call held_ is in as far as held_ allows; false when it waits for more text. The
  // call ends with call_read() (held_ then after it) or call_refused() (held_ after its head).
  virtual bool read_call(ToolDelta& out) = 0;
  // End of output inside a call: closes it, or returns false when its head was not complete
  // (the call's text is then content).
  virtual bool finish_call(ToolDelta& out) = 0;

  void call_read() { state_ = State::kSection; }
  void call_refused() {
    bad_ = std::string(m_.call_begin);
    state_ = State::kBadCall;
  }

 private:
  enum class State { kText, kSection, kCall, kBadCall };

  void flush(ToolDelta& out) override {
    switch (state_) {
      case State::kText:
        content(out, held_);
        break;
      case State::kSection:
        if (!all_space(held_)) content(out, held_);
        break;
      case State::kCall:
        if (!finish_call(out)) content(out, bad_ + held_);
        break;
      case State::kBadCall:
        content(out, bad_ + held_);
        break;
    }
    state_ = State::kText;
  }

  void run(ToolDelta& out) override {
    for (;;) {
      switch (state_) {
        case State::kText:
          if (!content_until(out, m_.section_begin)) return;
          state_ = State::kSection;
          break;
        case State::kSection: {
          const size_t lead = held_.find_first_not_of(kSpace);
          if (lead == std::string::npos) {
            held_.clear();  // whitespace between calls belongs to none
            return;
          }
          const std::string_view rest = std::string_view(held_).substr(lead);
          if (starts_with(rest, m_.call_begin)) {
            held_.erase(0, lead + m_.call_begin.size());
            state_ = State::kCall;
            call_opened();
          } else if (starts_with(rest, m_.section_end)) {
            held_.erase(0, lead + m_.section_end.size());
            after_call_ = true;
            state_ = State::kText;
          } else if (is_partial(rest, m_.call_begin) || is_partial(rest, m_.section_end)) {
            return;
          } else {
            // Text inside the section that is no call: content, up to the next marker.
            const Found f = find_first(held_, {m_.call_begin, m_.section_end}, lead);
            const size_t upto =
                f.found()
                    ? f.pos
                    : held_.size() - partial_tag_suffix(held_, {m_.call_begin, m_.section_end});
            content(out, std::string_view(held_).substr(lead, upto - lead));
            held_.erase(0, upto);
            if (!f.found()) return;
          }
          break;
        }
        case State::kCall:
          if (!read_call(out)) return;
          break;
        case State::kBadCall: {
          // A call that is not one: its text up to and with its end marker is content (as it
          // comes, up to what may start a marker).
          Taken t = take_before(held_, {m_.call_end, m_.call_begin, m_.section_end});
          if (t.tag.which == 0) {
            t.text += m_.call_end;
            held_.erase(0, m_.call_end.size());
          }
          content(out, bad_ + t.text);
          bad_.clear();
          if (!t.tag.found()) return;
          state_ = State::kSection;
          break;
        }
      }
    }
  }

  const Markers m_;
  State state_ = State::kText;
  std::string bad_;  // the refused call's marker, content before its text
};

// ------------------------------------------------------------------------------- kimi_k2

// <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX <|tool_call_argument_begin|>
// {...}<|tool_call_end|>...<|tool_calls_section_end|>. The id the model wrote
// ("functions.get_weather:0") is the call's id, as vLLM returns it; it must end in ":<digits>".
class KimiK2Parser : public SectionParser {
 public:
  KimiK2Parser() : SectionParser({kSectionBegin, kSectionEnd, kCallBegin, kCallEnd}) {}

 private:
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

  void call_opened() override { in_args_ = false; }

  bool read_call(ToolDelta& out) override {
    if (!in_args_) {
      const Found f = find_first(held_, {kArgBegin, kCallEnd, kCallBegin, kSectionEnd});
      if (!f.found()) {
        if (held_.size() <= kMaxName) return false;
        call_refused();
        return true;
      }
      const std::string id = trim(held_.substr(0, f.pos));
      const std::string name = f.which == 0 ? name_of(id) : "";
      if (name.empty()) {
        call_refused();
        return true;
      }
      held_.erase(0, f.end());
      index_ = begin_call(out, id, name);
      args_.reset();
      in_args_ = true;
      return true;
    }
    const Taken t = take_before(held_, {kCallEnd, kCallBegin, kSectionEnd});
    arguments(out, t.text);
    if (!t.tag.found()) return false;
    // A missing end marker: the next call or the section's end closes this one.
    if (t.tag.which == 0) held_.erase(0, kCallEnd.size());
    end_call(out, index_);
    call_read();
    return true;
  }

  bool finish_call(ToolDelta& out) override {
    if (!in_args_) return false;
    arguments(out, held_);
    end_call(out, index_);
    return true;
  }

  bool in_args_ = false;  // the call's id is read: its arguments follow
  int index_ = 0;
  TrimmedArguments args_;
};

// --------------------------------------------------------------------------- deepseek_v3

// <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
// <｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (DeepSeek-V3-0324 and R1; V3.1 dropped the type and
// the fence: deepseek_v31).
class DeepSeekV3Parser : public SectionParser {
 public:
  DeepSeekV3Parser() : SectionParser({kCallsBegin, kCallsEnd, kCallBegin, kCallEnd}) {}

 private:
  enum class Part { kHead, kArgs, kAfterArgs };
  static constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>",
                                    kCallsEnd = "<｜tool▁calls▁end｜>",
                                    kCallBegin = "<｜tool▁call▁begin｜>",
                                    kCallEnd = "<｜tool▁call▁end｜>", kSep = "<｜tool▁sep｜>",
                                    kFenceOpen = "```json\n", kFenceClose = "\n```";

  void call_opened() override { part_ = Part::kHead; }

  bool read_call(ToolDelta& out) override {
    switch (part_) {
      case Part::kHead: {
        // TYPE<｜tool▁sep｜>NAME\n```json\n: the call is known once its fence opens.
        const Found stop = find_first(held_, {kCallEnd, kCallBegin, kCallsEnd});
        const size_t sep = held_.find(kSep);
        const size_t nl =
            sep == std::string::npos ? std::string::npos : held_.find('\n', sep + kSep.size());
        const bool fence_complete =
            nl != std::string::npos && held_.size() >= nl + 1 + kFenceOpen.size();
        if (!fence_complete && !stop.found()) {
          if (held_.size() <= 2 * kMaxName) return false;
          call_refused();
          return true;
        }
        const std::string name =
            nl == std::string::npos ? ""
                                    : trim(held_.substr(sep + kSep.size(), nl - sep - kSep.size()));
        const bool ok = fence_complete && (!stop.found() || stop.pos > nl) && !name.empty() &&
                        name.size() <= kMaxName && !trim(held_.substr(0, sep)).empty() &&
                        held_.compare(nl + 1, kFenceOpen.size(), kFenceOpen) == 0;
        if (!ok) {
          call_refused();
          return true;
        }
        held_.erase(0, nl + 1 + kFenceOpen.size());
        index_ = begin_call(out, tool_call_id(), name);
        part_ = Part::kArgs;
        return true;
      }
      case Part::kArgs: {
        // JSON strings hold no raw newline, so "\n```" ends the arguments; an end marker before
        // it ends them too (a call's end marker is then passed, the section's is left to read).
        const Taken t = take_before(held_, {kFenceClose, kCallEnd, kCallsEnd});
        call_arguments(out, index_, t.text);
        if (!t.tag.found()) return false;
        end_call(out, index_);
        if (t.tag.which != 2) held_.erase(0, t.tag.size);
        if (t.tag.which == 0) {
          part_ = Part::kAfterArgs;
        } else {
          call_read();
        }
        return true;
      }
      case Part::kAfterArgs: {
        // Up to the call's end marker.
        const Taken t = take_before(held_, {kCallEnd, kCallBegin, kCallsEnd});
        if (!t.tag.found()) return false;
        if (t.tag.which == 0) held_.erase(0, kCallEnd.size());
        call_read();
        return true;
      }
    }
    return false;
  }

  bool finish_call(ToolDelta& out) override {
    switch (part_) {
      case Part::kHead:
        return false;
      case Part::kArgs:
        call_arguments(out, index_, held_);
        end_call(out, index_);
        return true;
      case Part::kAfterArgs:
        return true;  // the call was listed when its arguments ended
    }
    return true;
  }

  Part part_ = Part::kHead;
  int index_ = 0;
};

// ------------------------------------------------------------------------------- mistral

// [TOOL_CALLS] starts the calls. Before tokenizer v11 a JSON array follows:
// [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...], whose calls are listed once the array
// closes (arguments re-serialised by json.dumps(ensure_ascii=False)), or which stays content when
// it is not such an array. From v11 each call is [TOOL_CALLS]NAME{...} (v13 writes
// NAME[ARGS]{...}); its arguments are the JSON object after the name, streamed as written.
// Ids are 9 alphanumeric characters, the only kind Mistral's templates accept.
class MistralParser : public HeldTextParser {
 private:
  enum class State { kText, kAfterBot, kName, kArgs, kArray };
  static constexpr std::string_view kBot = "[TOOL_CALLS]", kArgsTag = "[ARGS]",
                                    kCallId = "[CALL_ID]";

  void flush(ToolDelta& out) override {
    switch (state_) {
      case State::kText:
        content(out, held_);
        break;
      case State::kAfterBot:
      case State::kName:
      case State::kArray:
        content(out, std::string(kBot) + held_);
        break;
      case State::kArgs:
        call_arguments(out, index_, held_);
        end_call(out, index_);
        break;
    }
    state_ = State::kText;
  }

  static bool valid_name(const std::string& n) {
    if (n.empty() || n.size() > kMaxName) return false;
    for (const char c : n)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
        return false;
    return true;
  }

  void run(ToolDelta& out) override {
    for (;;) {
      switch (state_) {
        case State::kText:
          if (!content_until(out, kBot)) return;
          state_ = State::kAfterBot;
          break;
        case State::kAfterBot: {
          const size_t lead = held_.find_first_not_of(kSpace);
          if (lead == std::string::npos) return;
          held_.erase(0, lead);
          if (held_[0] == '[') {  // the JSON array of tokenizers before v11
            scan_ = {};
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
            content(out, kBot);  // no call: scanning resumes
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
            content(out, kBot);
            state_ = State::kText;
            break;
          }
          // The model's own id when it wrote a valid one ([CALL_ID]), else a fresh one.
          bool id_ok = id.size() == 9;
          for (const char c : id) id_ok = id_ok && std::isalnum(static_cast<unsigned char>(c));
          index_ = begin_call(out, id_ok ? id : mistral_tool_call_id(), name);
          held_.erase(0, brace);
          scan_ = {};
          state_ = State::kArgs;
          break;
        }
        case State::kArgs: {
          // The arguments are the JSON object that starts here; the next [TOOL_CALLS] also ends
          // them (arguments that never close run to it or to the end of output).
          const size_t bot = held_.find(kBot);
          const size_t end = json_scan_value(held_, scan_);
          if (end != std::string::npos && (bot == std::string::npos || end <= bot)) {
            call_arguments(out, index_, held_.substr(0, end));
            held_.erase(0, end);
            end_call(out, index_);
            after_call_ = true;
            state_ = State::kText;
            break;
          }
          if (bot != std::string::npos) {
            call_arguments(out, index_, held_.substr(0, bot));
            held_.erase(0, bot);
            end_call(out, index_);
            state_ = State::kText;
            break;
          }
          // Stream what cannot be the start of [TOOL_CALLS]; the scan has covered all of it.
          const Taken t = take_before(held_, {kBot});
          call_arguments(out, index_, t.text);
          scan_.pos -= t.text.size();
          return;
        }
        case State::kArray: {
          const size_t end = json_scan_value(held_, scan_);
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
            content(out, std::string(kBot) + held_.substr(0, end));
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
  int index_ = 0;
  JsonScan scan_;  // of the JSON in held_ (arguments or array), resumed as it grows
};

}  // namespace

std::unique_ptr<ToolParser> make_kimi_k2_parser() { return std::make_unique<KimiK2Parser>(); }
std::unique_ptr<ToolParser> make_deepseek_v3_parser() {
  return std::make_unique<DeepSeekV3Parser>();
}
std::unique_ptr<ToolParser> make_mistral_parser() { return std::make_unique<MistralParser>(); }

}  // namespace atom::server
