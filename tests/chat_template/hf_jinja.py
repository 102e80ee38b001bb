"""The reference renderer: Python's jinja2 set up exactly as Hugging Face transformers sets it up
for chat templates (transformers/utils/chat_template_utils.py: _compile_jinja_template and
render_jinja_template), with the clock pinned so that strftime_now is deterministic.

Only the standard library and jinja2 are used; run with /usr/bin/python3 (Debian's python3-jinja2).
"""

import json
from copy import deepcopy
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The fixed "now" both renderers use (atom gets it through RenderOptions::now).
FIXED_NOW = datetime(2025, 7, 4, 15, 30, 5)


class AssistantTracker(Extension):
    """transformers' {% generation %} tag. When no assistant mask is requested (always, here) it
    renders its body through a CallBlock, which is what this does."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return FIXED_NOW.strftime(format)


def hf_environment():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def plain_environment():
    """jinja2's defaults (no trim_blocks/lstrip_blocks, jinja2's own tojson), still sandboxed."""
    return ImmutableSandboxedEnvironment()


CONTINUE_FINAL_MESSAGE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_compiled = {}


def compile_template(env, template):
    """transformers caches compiled templates (lru_cache); so does this, per environment."""
    key = (id(env), template)
    if key not in _compiled:
        _compiled[key] = (env, env.from_string(template))
    return _compiled[key][1]


def render_chat(env, template, messages, tools=None, documents=None, add_generation_prompt=False,
                continue_final_message=False, **template_kwargs):
    """transformers' render_jinja_template for one conversation (string output)."""
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible.")
    compiled = compile_template(env, template)
    chat = messages
    if continue_final_message:
        chat = deepcopy(chat)
        final_message = chat[-1]["content"]
        if isinstance(final_message, (list, tuple)):
            for block in reversed(final_message):
                if "text" in block:
                    final_message = block["text"]
                    block["text"] = block["text"] + CONTINUE_FINAL_MESSAGE_TAG
                    break
            else:
                raise ValueError("continue_final_message is set but we could not find any text to continue")
        else:
            chat[-1]["content"] = chat[-1]["content"] + CONTINUE_FINAL_MESSAGE_TAG
    rendered = compiled.render(messages=chat, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **template_kwargs)
    if continue_final_message:
        if final_message.strip() not in rendered or CONTINUE_FINAL_MESSAGE_TAG.strip() not in rendered:
            raise ValueError("continue_final_message is set but the final message does not appear in the chat")
        tag_loc = rendered.rindex(CONTINUE_FINAL_MESSAGE_TAG.strip())
        if rendered[tag_loc: tag_loc + len(CONTINUE_FINAL_MESSAGE_TAG)] == CONTINUE_FINAL_MESSAGE_TAG:
            rendered = rendered[:tag_loc]
        else:
            rendered = rendered[:tag_loc].rstrip()
    return rendered


def special_tokens_from_config(config):
    """transformers' special_tokens_map: the named special tokens that are set, as strings."""
    out = {}
    for key in ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value:
            out[key] = value
    extra = config.get("additional_special_tokens")
    if extra:
        out["additional_special_tokens"] = [t["content"] if isinstance(t, dict) else t for t in extra]
    return out


def outcome(fn):
    """Runs fn; returns {"output": str} or {"error": {...}} describing what Python raised."""
    try:
        return {"output": fn()}
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"error": {"type": "TemplateSyntaxError", "message": str(e), "raised": False}}
    except jinja2.exceptions.TemplateError as e:
        # Exactly TemplateError means raise_exception(); subclasses are jinja2's own errors.
        raised = type(e) is jinja2.exceptions.TemplateError
        return {"error": {"type": type(e).__name__, "message": str(e), "raised": raised}}
    except Exception as e:  # TypeError, ValueError, ... from Python operations
        return {"error": {"type": type(e).__name__, "message": str(e), "raised": False}}
