#!/usr/bin/python3
"""Renders the chat-template test corpus with Python's jinja2 (the reference) into JSON files that
atom's tests compare against byte for byte:

  snippets.json   every snippet of snippets.py: the template, its context and jinja2's outcome
  templates.json  every real chat template (tests/fixtures/chat_templates/*.jinja and the
                  tokenizer_config.json of the npm model packages in tests/node/node_modules)
                  rendered over the conversations of conversations.py

Usage: reference.py SOURCE_DIR OUT_DIR
Run with /usr/bin/python3, which has Debian's python3-jinja2.
"""

import json
import os
import sys

# Keep the source tree clean: no __pycache__ next to the test scripts.
sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import conversations  # noqa: E402
import hf_jinja  # noqa: E402
import snippets  # noqa: E402


def render_snippets():
    out = []
    seen = set()
    for name, template, ctx, env_name in snippets.S:
        if name in seen:
            raise SystemExit(f"duplicate snippet name {name}")
        seen.add(name)
        context = dict(snippets.BASE)
        context.update(ctx)
        env = hf_jinja.hf_environment() if env_name == "hf" else hf_jinja.plain_environment()
        result = hf_jinja.outcome(lambda: env.from_string(template).render(**context))
        if "output" in result and " at 0x" in result["output"]:
            raise SystemExit(f"snippet {name} prints an object address; its output is not deterministic")
        out.append({"name": name, "env": env_name, "template": template, "context": context, **result})
    return out


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    source_dir, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    outputs = {"snippets.json": render_snippets(), "templates.json": conversations.render_all(source_dir)}
    for name, data in outputs.items():
        path = os.path.join(out_dir, name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
        os.replace(path + ".tmp", path)
    print(f"jinja2 {hf_jinja.jinja2.__version__}: wrote " + ", ".join(
        f"{name} ({len(data)} entries)" for name, data in outputs.items()))


if __name__ == "__main__":
    main()
