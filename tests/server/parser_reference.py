#!/usr/bin/python3
"""Reference cases for the server's parsers, rendered with Python's jinja2 the way transformers
renders the real chat templates of tests/fixtures/chat_templates/ (tests/chat_template/hf_jinja.py):

  tool_calls        an assistant turn with tool calls, rendered by each model's own template, cut
                    to what the model writes after the generation prompt (its end-of-turn stop
                    token left out, as the engine leaves it out): the text a parser must turn back
                    into the same calls.
  reasoning_effort  gpt-oss prompts for requests that pass reasoning_effort at the top level, in
                    chat_template_kwargs and in --default-chat-template-kwargs, with vLLM's rule
                    (defaults, then the request's chat_template_kwargs, then reasoning_effort).

Usage: parser_reference.py SOURCE_DIR OUT_DIR   (writes OUT_DIR/cases.json)
"""

import copy
import json
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "chat_template"))

import hf_jinja  # noqa: E402

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}}, "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search_docs", "description": "Search the documentation",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "filters": {"type": "array", "items": {"type": "string"}},
        "limit": {"type": "number"}, "exact": {"type": "boolean"}}, "required": ["query"]}}}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]


def call(name, arguments, call_id, as_string):
    return {"id": call_id, "type": "function",
            "function": {"name": name,
                         "arguments": json.dumps(arguments, ensure_ascii=False) if as_string else arguments}}


CALLS = {
    "one_call": [("get_weather", {"city": "Paris", "unit": "celsius"})],
    "rich_arguments": [("search_docs", {"query": "naïve «café» 東京 \"quoted\"", "filters": ["jinja", "hf"],
                                        "limit": 2.5, "exact": False})],
    "typed_arguments": [("get_weather", {"city": "São Paulo", "days": 3})],
    "two_calls": [("get_weather", {"city": "Paris"}), ("search_docs", {"query": "templates", "filters": []})],
}

# template, parser, the template's end-of-turn stop token, whether tool_calls arguments must be
# strings, whether it renders more than one call, the reasoning parser the server would apply.
TEMPLATES = [
    ("gpt-oss", "openai", "<|call|>", False, False, None),
    ("glm-4.6", "glm45", None, False, True, "glm45"),
    ("mistral-nemo", "mistral", "</s>", False, True, None),
    ("deepseek-v3.1", "deepseek_v31", "<｜end▁of▁sentence｜>", True, True, None),
    ("qwen3", "hermes", "<|im_end|>", False, True, "qwen3"),
]


def render(env, template, special, messages, add_generation_prompt, tools, **kwargs):
    args = dict(special)
    args.update(kwargs)
    return hf_jinja.render_chat(env, template, copy.deepcopy(messages), tools=tools,
                                add_generation_prompt=add_generation_prompt, **args)


def tool_call_cases(fixtures, tokens):
    env = hf_jinja.hf_environment()
    cases = []
    for template_id, parser, stop, as_string, many, reasoning in TEMPLATES:
        with open(os.path.join(fixtures, template_id + ".jinja"), encoding="utf-8", newline="") as f:
            template = f.read()
        special = tokens.get(template_id, {})
        for case_id, calls in CALLS.items():
            if len(calls) > 1 and not many:
                continue
            for content in (None, "Let me check."):
                tool_calls = [call(n, a, "call%05d" % (1000 + i) if template_id != "mistral-nemo" else
                                   "abcDEF12%d" % i, as_string) for i, (n, a) in enumerate(calls)]
                user = {"role": "user", "content": "What do you find?"}
                # The server passes a missing content as "" (as vLLM does).
                assistant = {"role": "assistant", "content": content or "", "tool_calls": tool_calls}
                prompt = render(env, template, special, [user], True, TOOLS)
                full = render(env, template, special, [user, assistant], False, TOOLS)
                if not full.startswith(prompt):
                    raise SystemExit(f"{template_id}/{case_id}: the turn does not follow the generation prompt")
                output = full[len(prompt):]
                # Generation ends at the stop token; the template's text after it is no output.
                if stop and stop in output and not output[output.rindex(stop) + len(stop):].strip():
                    output = output[: output.rindex(stop)]
                shown = content if content and content in output else ""
                cases.append({
                    "template": template_id, "parser": parser, "reasoning_parser": reasoning,
                    "case": f"{case_id}/{'content' if content else 'no_content'}",
                    "prompt": prompt, "output": output, "tools": TOOLS,
                    "calls": [{"name": n, "arguments": a} for n, a in calls],
                    # gpt-oss's template writes an assistant turn's text as its analysis.
                    "content": "" if template_id == "gpt-oss" else shown,
                    "reasoning": shown if template_id == "gpt-oss" else "",
                })
    return cases


def reasoning_effort_cases(fixtures, tokens):
    env = hf_jinja.hf_environment()
    with open(os.path.join(fixtures, "gpt-oss.jinja"), encoding="utf-8", newline="") as f:
        template = f.read()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    requests = [
        ("none", {}, {}),
        ("top_level", {"reasoning_effort": "high"}, {}),
        ("kwargs", {"chat_template_kwargs": {"reasoning_effort": "low"}}, {}),
        ("top_level_wins", {"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}}, {}),
        ("default", {}, {"reasoning_effort": "low"}),
        ("request_over_default", {"reasoning_effort": "high"}, {"reasoning_effort": "low"}),
        ("kwargs_over_default", {"chat_template_kwargs": {"reasoning_effort": "medium", "model_identity": "Atom."}},
         {"reasoning_effort": "low"}),
    ]
    cases = []
    for case_id, body, defaults in requests:
        variables = dict(defaults)
        variables.update(body.get("chat_template_kwargs", {}))
        if "reasoning_effort" in body:
            variables["reasoning_effort"] = body["reasoning_effort"]
        prompt = render(env, template, tokens.get("gpt-oss", {}), messages, True, None, **variables)
        cases.append({"case": case_id, "body": {"messages": messages, **body}, "defaults": defaults,
                      "prompt": prompt})
    return cases


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    source_dir, out_dir = sys.argv[1], sys.argv[2]
    fixtures = os.path.join(source_dir, "tests", "fixtures", "chat_templates")
    with open(os.path.join(fixtures, "special_tokens.json"), encoding="utf-8") as f:
        tokens = json.load(f)
    out = {"tool_calls": tool_call_cases(fixtures, tokens),
           "reasoning_effort": reasoning_effort_cases(fixtures, tokens)}
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "cases.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    os.replace(path + ".tmp", path)
    print(f"jinja2 {hf_jinja.jinja2.__version__}: wrote {len(out['tool_calls'])} tool-call and "
          f"{len(out['reasoning_effort'])} reasoning_effort cases")


if __name__ == "__main__":
    main()
