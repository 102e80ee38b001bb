// tool_choice "required" and a named function, as vLLM serves them: decoding is constrained to
// JSON (forced_tool_schema), and the answer is read back as calls. A named function's answer is
// its arguments object, streamed as the call's arguments; "required" produces a list of
// {"name", "parameters"} objects, each a call with json.dumps(parameters) as its arguments.
#include <nlohmann/json.hpp>

#include "server/tool_parser.h"
#include "server/tool_parser_util.h"

namespace atom::server {

namespace {

using ojson = nlohmann::ordered_json;
using parse_util::json_loads;
using parse_util::py_json_dumps;

class NamedToolParser final : public ToolParser {
 public:
  explicit NamedToolParser(std::string name) : name_(std::move(name)) {}
  ToolDelta feed(const std::string& text) override {
    ToolDelta out;
    if (index_ < 0) index_ = begin_call(out, tool_call_id(), name_);
    if (!text.empty()) call_arguments(out, index_, text);
    return out;
  }
  ToolDelta finish() override {
    ToolDelta out;
    if (index_ < 0) index_ = begin_call(out, tool_call_id(), name_);
    end_call(out, index_);
    return out;
  }

 private:
  std::string name_;
  int index_ = -1;
};

// The list is only known to be calls once whole (a truncated answer is no JSON): the calls come
// at the end, each whole; text that is not the expected list stays content.
class RequiredToolParser final : public ToolParser {
 public:
  ToolDelta feed(const std::string& text) override {
    held_ += text;
    return {};
  }
  ToolDelta finish() override {
    ToolDelta out;
    ojson list;
    try {
      list = json_loads(held_);
    } catch (const std::exception&) {
      out.content = std::move(held_);
      return out;
    }
    bool ok = list.is_array();
    for (const auto& c : list)
      ok = ok && c.is_object() && c.contains("name") && c["name"].is_string() &&
           c.contains("parameters");
    if (!ok) {
      out.content = std::move(held_);
      return out;
    }
    for (const auto& c : list)
      whole_call(out, tool_call_id(), c["name"].get<std::string>(),
                 py_json_dumps(c["parameters"], false));
    held_.clear();
    return out;
  }

 private:
  std::string held_;
};

}  // namespace

std::unique_ptr<ToolParser> make_forced_tool_parser(const std::optional<std::string>& named) {
  if (named) return std::make_unique<NamedToolParser>(*named);
  return std::make_unique<RequiredToolParser>();
}

std::string forced_tool_schema(const nlohmann::ordered_json& tools,
                               const std::optional<std::string>& named) {
  auto params = [](const ojson& fn) {
    if (fn.contains("parameters") && fn["parameters"].is_object()) return fn["parameters"];
    return ojson{{"type", "object"}};
  };
  if (named) {
    for (const auto& t : tools)
      if (t["function"]["name"] == *named) return params(t["function"]).dump();
    return ojson{{"type", "object"}}.dump();
  }
  // vLLM's schema for "required": a non-empty array whose items are any one tool's call.
  ojson any = ojson::array();
  for (const auto& t : tools) {
    const ojson& fn = t["function"];
    any.push_back({{"properties",
                    {{"name", {{"type", "string"}, {"enum", ojson::array({fn["name"]})}}},
                     {"parameters", params(fn)}}},
                   {"required", ojson::array({"name", "parameters"})}});
  }
  ojson schema = {
      {"type", "array"}, {"minItems", 1}, {"items", {{"type", "object"}, {"anyOf", any}}}};
  return schema.dump();
}

}  // namespace atom::server
