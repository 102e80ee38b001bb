// libFuzzer harness: a Jinja template lexed, parsed and rendered (the interpreter) with a chat
// conversation as its variables, under the template limits a server applies.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Cap: deeply nested expressions overflow the stack before the parser's own depth limit
  // exists (issue 22; that limit lands on the harden-input branch). Until then the harness
  // keeps inputs short enough not to reach it.
  if (size > 4096) return 0;
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                 {"role": "assistant", "content": "Hello", "tool_calls": [{"type": "function",
                  "function": {"name": "f", "arguments": {"a": 1}}}]},
                 {"role": "tool", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true, "n": 3})");
  atom::jinja::Options o;
  o.trim_blocks = true;
  o.lstrip_blocks = true;
  o.loop_controls = true;
  o.limits.max_steps = 100000;  // keeps each input fast; the limit itself is what is tested
  o.limits.max_output_bytes = 1 << 20;
  o.limits.max_call_depth = 64;
  try {
    const atom::jinja::Environment env(o);
    const atom::jinja::Template t =
        env.from_string(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.jinja");
    t.render(context);
  } catch (const atom::Error&) {
  }
  return 0;
}
