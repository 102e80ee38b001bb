// gpt-oss's harmony format, parsed from the answer's text with its special tokens kept:
//
//   <|channel|>analysis<|message|>...<|end|>
//   <|start|>assistant<|channel|>commentary to=functions.NAME
//   <|constrain|>json<|message|>{...}<|call|>
//   <|start|>assistant<|channel|>final<|message|>...<|return|>
//
// The prompt ends with "<|start|>assistant", so the first message's header follows at once;
// later messages open with <|start|> and their role. A header may name a recipient before the
// channel ("assistant to=functions.x<|channel|>commentary json", as the chat template writes
// calls) or after it (as the model usually does). As vLLM's chat path routes messages: the
// analysis channel is reasoning; final, and commentary without a recipient (preambles), are
// content; a message to functions.NAME is a call of NAME whose arguments are the message text,
// streamed as written and, complete, re-serialised by json.dumps when they are JSON (vLLM's
// openai parser). Messages to other recipients (built-in tools, a tool's reply) carry nothing for
// the client. Messages of one kind are joined with "\n" (vLLM's parse_chat_output).
// <|return|> and <|call|> stop generation and the engine leaves their text out, so an open
// message is complete at the end of output.
#include <string_view>

#include "server/tool_parser_util.h"
#include "server/tool_parsers.h"

namespace atom::server {

namespace {

using namespace parse_util;

constexpr std::string_view kStart = "<|start|>", kChannel = "<|channel|>", kMessage = "<|message|>",
                           kEnd = "<|end|>", kReturn = "<|return|>", kCallEnd = "<|call|>",
                           kConstrain = "<|constrain|>", kTo = " to=";
// A header is a role, a channel, a recipient and a content type: text that goes on without
// <|message|> for longer than this is no header.
constexpr size_t kMaxHeader = 1024;

class HarmonyParser : public HeldTextParser {
 public:
  explicit HarmonyParser(bool parse_calls) : parse_calls_(parse_calls) {}

 private:
  enum class State { kFirst, kHeader, kBody, kBetween, kRaw };
  enum class Route { kReasoning, kContent, kCall, kDrop };

  void flush(ToolDelta& out) override {
    switch (state_) {
      case State::kFirst:
      case State::kHeader:
        break;  // an unfinished header (output cut short) carries no text
      case State::kBody:
        body_text(out, held_);
        end_message(out);
        break;
      case State::kBetween:
        if (!all_space(held_)) out.content += held_;
        break;
      case State::kRaw:
        out.content += held_;
        break;
    }
    state_ = State::kBetween;
  }

  void run(ToolDelta& out) override {
    for (;;) {
      switch (state_) {
        case State::kFirst: {
          // The first message's header, its role given by the prompt.
          bool maybe = false;
          for (std::string_view opener : {kChannel, kMessage, kConstrain, kTo}) {
            if (starts_with(held_, opener)) {
              state_ = State::kHeader;
              header_opener_.clear();
              after_start_ = false;
              break;
            }
            maybe |= is_partial(held_, opener);
          }
          if (state_ == State::kFirst) {
            if (held_.empty() || maybe) return;
            state_ = State::kRaw;  // not harmony: plain text
          }
          break;
        }
        case State::kHeader: {
          const Found f = find_first(held_, {kMessage, kStart, kEnd, kReturn, kCallEnd});
          if (f.which == 0) {
            open_message(out, held_.substr(0, f.pos));
            held_.erase(0, f.pos + kMessage.size());
            state_ = State::kBody;
          } else if (f.found()) {
            // A header that never reached <|message|>: its text is content (an end marker
            // after it is dropped, a <|start|> opens the next header).
            out.content += header_opener_ + held_.substr(0, f.pos);
            held_.erase(0, f.which == 1 ? f.pos : f.end());
            state_ = State::kBetween;
          } else if (held_.size() > kMaxHeader) {
            out.content += header_opener_;
            state_ = State::kRaw;
          } else {
            return;
          }
          break;
        }
        case State::kBody: {
          const Taken t = take_before(held_, {kEnd, kReturn, kCallEnd, kStart});
          body_text(out, t.text);
          if (!t.tag.found()) return;
          // <|start|> without an end marker before it also ends the message.
          if (t.tag.which != 3) held_.erase(0, t.tag.size);
          end_message(out);
          state_ = State::kBetween;
          break;
        }
        case State::kBetween:
        case State::kRaw: {
          const Taken t = take_before(held_, {kStart});
          // Whitespace between messages belongs to no message; other text outside a message is
          // content, and so is what follows it up to the next <|start|>.
          if (state_ == State::kRaw || !all_space(t.text)) {
            out.content += t.text;
            state_ = State::kRaw;
          }
          if (!t.tag.found()) return;
          held_.erase(0, kStart.size());
          header_opener_ = std::string(kStart);
          after_start_ = true;
          state_ = State::kHeader;
          break;
        }
      }
    }
  }

  // Classifies a message by its header (the text before <|message|>).
  void open_message(ToolDelta& out, std::string header) {
    std::string channel;
    if (const size_t c = header.find(kChannel); c != std::string::npos) {
      size_t e = c + kChannel.size();
      while (e < header.size() && header[e] != '<' && !is_space(header[e])) ++e;
      channel = header.substr(c + kChannel.size(), e - c - kChannel.size());
      header.erase(c, e - c);
    }
    // "<|constrain|>json" is the content type "json", constrained.
    for (size_t c; (c = header.find(kConstrain)) != std::string::npos;)
      header.replace(c, kConstrain.size(), " ");
    std::string role, recipient, content_type;
    size_t i = 0;
    bool first = true;
    while ((i = header.find_first_not_of(kSpace, i)) != std::string::npos) {
      size_t e = header.find_first_of(kSpace, i);
      if (e == std::string::npos) e = header.size();
      const std::string word = header.substr(i, e - i);
      if (starts_with(word, "to=")) {
        recipient = word.substr(3);
      } else if (first && after_start_) {
        role = word;
      } else {
        content_type = word;
      }
      first = false;
      i = e;
    }
    pieces_ = 0;
    if (!role.empty() && role != "assistant") {
      route_ = Route::kDrop;  // a tool's reply or another role: nothing the assistant said
    } else if (starts_with(recipient, "functions.")) {
      const std::string name = recipient.substr(std::string_view("functions.").size());
      route_ = parse_calls_ && !name.empty() ? Route::kCall : Route::kDrop;
      if (route_ == Route::kCall) {
        call_index_ = begin_call(out, tool_call_id(), name);
        call_json_ = content_type.empty() || content_type.find("json") != std::string::npos;
      }
    } else if (channel == "analysis") {
      route_ = Route::kReasoning;
    } else if (!recipient.empty()) {
      route_ = Route::kDrop;  // built-in tools (browser, python)
    } else {
      route_ = Route::kContent;  // final, commentary preambles, no channel
    }
  }

  void body_text(ToolDelta& out, const std::string& s) {
    if (s.empty()) return;
    switch (route_) {
      case Route::kReasoning:
        if (pieces_++ == 0 && reasoning_messages_++ > 0) out.reasoning += "\n";
        out.reasoning += s;
        break;
      case Route::kContent:
        if (pieces_++ == 0 && content_messages_++ > 0) out.content += "\n";
        out.content += s;
        break;
      case Route::kCall:
        call_arguments(out, call_index_, s);
        break;
      case Route::kDrop:
        break;
    }
  }

  void end_message(ToolDelta& out) {
    if (route_ == Route::kCall) {
      // vLLM's openai parser: json.dumps(json.loads(text)) when the content type is JSON (or
      // not given), the text itself otherwise or when it does not parse.
      std::string args = streamed_arguments(call_index_);
      if (call_json_) {
        const auto j = json_loads(args);
        if (!j.is_discarded()) args = py_json_dumps(j, /*ensure_ascii=*/true);
      }
      end_call(out, call_index_, std::move(args));
    }
    route_ = Route::kDrop;
  }

  const bool parse_calls_;
  State state_ = State::kFirst;
  std::string header_opener_;  // "<|start|>" when the header being read began with it
  bool after_start_ = false;   // the header begins with its role
  Route route_ = Route::kDrop;
  int pieces_ = 0;  // text pieces of the open message so far
  int reasoning_messages_ = 0, content_messages_ = 0;
  bool call_json_ = true;
  int call_index_ = 0;
};

}  // namespace

std::unique_ptr<ToolParser> make_harmony_parser(bool parse_calls) {
  return std::make_unique<HarmonyParser>(parse_calls);
}

}  // namespace atom::server
