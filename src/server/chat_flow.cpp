#include "server/chat_flow.h"

#include <algorithm>

#include "server/reasoning.h"

namespace atom::server {

std::vector<vision::VisionInput> chat_images(HttpServer& s, const ChatRequest& r) {
  std::vector<vision::VisionInput> out;
  if (r.images.empty()) return out;
  const BackendInfo& info = s.backend().info();
  // The parameter the error names: the Responses API's input, else the messages.
  const std::string param = r.images[0].where.rfind("input", 0) == 0 ? "input" : "messages";
  if (info.image_token_id < 0 && !info.images_unavailable.empty())
    bad_request(param, fmt::format("{}: {}", r.images[0].where, info.images_unavailable));
  if (info.image_token_id < 0)
    bad_request(param, fmt::format("{}: this model ({}) takes no images; send text only",
                                   r.images[0].where, info.model_name));
  for (const ChatImage& im : r.images) {
    const std::vector<uint8_t> bytes = image_data_url_decode(im.url, im.where);
    try {
      out.push_back(vision::process_image_bytes(bytes, info.image_processor));
    } catch (const ApiError&) {
      throw;
    } catch (const Error& e) {
      bad_request(param, fmt::format("{}: {}", im.where, e.what()));
    }
  }
  return out;
}

namespace {

// A 400 unless the prompt holds one image placeholder token per image.
void check_placeholders(const BackendInfo& info, const std::vector<int32_t>& ids,
                        const std::vector<vision::VisionInput>& images) {
  const auto placeholders =
      static_cast<size_t>(std::count(ids.begin(), ids.end(), info.image_token_id));
  if (placeholders != images.size())
    bad_request("messages",
                fmt::format("the prompt has {} image placeholder token(s) (id {}) for {} image(s): "
                            "each image part renders one, and text must not contain it",
                            placeholders, info.image_token_id, images.size()));
}

}  // namespace

int64_t chat_image_tokens(HttpServer& s, const std::vector<int32_t>& ids,
                          const std::vector<vision::VisionInput>& images) {
  const BackendInfo& info = s.backend().info();
  if (info.image_token_id < 0) return 0;
  check_placeholders(info, ids, images);
  int64_t extra = 0;
  for (const auto& im : images) extra += im.num_tokens - 1;
  if (!images.empty() && info.max_image_prompt_tokens > 0 &&
      static_cast<int64_t>(ids.size()) + extra > info.max_image_prompt_tokens)
    bad_request(
        "messages",
        fmt::format("a prompt with images is prefilled in one step, and this one's {} "
                    "tokens (its images' included) exceed the server's "
                    "--max-num-batched-tokens ({})",
                    static_cast<int64_t>(ids.size()) + extra, info.max_image_prompt_tokens));
  return extra;
}

std::vector<int32_t> chat_prompt_expand(HttpServer& s, const std::vector<int32_t>& ids,
                                        const std::vector<vision::VisionInput>& images) {
  const BackendInfo& info = s.backend().info();
  if (info.image_token_id < 0) return ids;
  check_placeholders(info, ids, images);
  std::vector<int32_t> out;
  size_t next = 0;
  for (int32_t t : ids) {
    if (t != info.image_token_id) {
      out.push_back(t);
      continue;
    }
    out.insert(out.end(), static_cast<size_t>(images[next++].num_tokens), t);
  }
  return out;
}

ChatFlow chat_flow_start(HttpServer& s, ChatRequest& r, const std::string& id_prefix) {
  s.check_model(r.model);
  r.chat_template_kwargs = chat_template_variables(r, s.options().default_chat_template_kwargs);
  // How answers are taken apart: vLLM's --reasoning-parser, or without one what the chat
  // template shows (<think> blocks; gpt-oss's harmony channels, which vLLM always parses).
  const BackendInfo& info = s.backend().info();
  // Without a parser atom splits what the chat template shows (vLLM splits nothing then);
  // --reasoning-parser none turns that off (harmony models keep their channels, which vLLM
  // always parses).
  std::string reasoning = s.options().reasoning_parser;
  if (reasoning == "none")
    reasoning = info.harmony ? "openai_gptoss" : "";
  else if (reasoning.empty())
    reasoning = info.harmony ? "openai_gptoss" : info.reasoning ? "qwen3" : "";
  const std::string& tool_parser = s.options().tool_call_parser;
  ChatFlow f;
  // One parser splits harmony's reasoning, content and calls, which live in one structure.
  f.harmony = reasoning == "openai_gptoss" || tool_parser == "openai";
  f.reasoning = f.harmony || !reasoning.empty();
  f.named_tool = r.named_tool.has_value();
  // Tools are rendered into the prompt. As vLLM, tool_choice "auto" parses calls back out of the
  // answer only when the server runs with --enable-auto-tool-choice and a --tool-call-parser,
  // except for harmony models, whose calls are part of the format.
  const bool auto_tools = !r.tools.is_null() && r.tool_choice == "auto";
  if (auto_tools && !f.harmony && !(s.options().enable_auto_tool_choice && !tool_parser.empty()))
    bad_request(
        "tool_choice",
        "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set");
  // "required" and a named function constrain decoding to the calls' JSON (vLLM's way), whatever
  // the model's own call format.
  const bool forced_tools =
      !r.tools.is_null() && (r.tool_choice == "required" || r.tool_choice == "named");
  if (forced_tools) {
    if (r.sampling.structured)
      bad_request("tool_choice", fmt::format("tool_choice \"{}\" cannot be combined with '{}'",
                                             r.tool_choice, r.sampling.structured->param));
    r.sampling.structured = StructuredOutput{StructuredOutput::kJsonSchema,
                                             forced_tool_schema(r.tools, r.named_tool),
                                             {},
                                             "tool_choice",
                                             std::nullopt};
  }
  // The parsers read markers that are special tokens in these tokenizers (all of harmony's).
  if (f.harmony || (auto_tools && tool_parser_keeps_special_tokens(tool_parser)))
    r.sampling.skip_special_tokens = false;
  // Images are read before the template runs: a bad one costs no rendering.
  std::vector<vision::VisionInput> images = chat_images(s, r);
  f.prompt = s.backend().render_chat(r);
  // Constrained answers of reasoning models: the block is written freely, the grammar follows it;
  // where the prompt closed the block, or thinking is off, the grammar applies from the first
  // token (vLLM's reasoning end in the prompt).
  if (r.sampling.structured && !f.harmony && !reasoning.empty())
    if (auto probe = make_reasoning_parser(reasoning, f.prompt, r.chat_template_kwargs);
        probe && !probe->format().ended_in_prompt)
      r.sampling.structured->after_reasoning = StructuredOutput::Reasoning{
          probe->format().start, probe->format().end, probe->format().starts_in_reasoning};
  std::vector<int32_t> ids = s.backend().tokenize(f.prompt, r.add_special_tokens);
  check_prompt(s, ids, r.sampling, true, chat_image_tokens(s, ids, images));
  f.job = std::make_shared<Job>(s, r.sampling);
  f.job->set_choice_setup([&](ChoiceState& c) {
    if (f.harmony) {
      ToolParserOptions o;
      o.tools = r.tools;
      o.parse_calls = auto_tools;
      c.tool_parser = make_tool_parser("openai", o);
      return;
    }
    if (!reasoning.empty())
      c.reasoning_parser = make_reasoning_parser(reasoning, f.prompt, r.chat_template_kwargs);
    if (forced_tools) {
      c.tool_parser = make_forced_tool_parser(r.named_tool);
    } else if (auto_tools) {
      ToolParserOptions o;
      o.tools = r.tools;
      c.tool_parser = make_tool_parser(tool_parser, o);
    }
  });
  f.job->add_prompt(std::move(ids), f.prompt, std::move(images));
  f.job->set_choice_setup(nullptr);  // only add_prompt uses it, with this scope's variables
  f.job->submit_all(r.request_id, id_prefix);
  return f;
}

ChatMessage chat_message(ChoiceState& c) {
  ChatMessage m;
  // Reasoning is split off first, then calls are parsed out of what remains.
  m.content = c.text;
  if (c.reasoning_parser) {
    ReasoningDelta d = c.reasoning_parser->feed(c.text);
    const ReasoningDelta rest = c.reasoning_parser->finish();
    m.reasoning = d.reasoning + rest.reasoning;
    m.content = d.content + rest.content;
  }
  if (c.tool_parser) {
    ToolDelta t = c.tool_parser->parse(m.content);
    m.content = std::move(t.content);
    m.reasoning += t.reasoning;
    m.calls = std::move(t.calls);
  }
  return m;
}

ChatDelta chat_delta(ChoiceState& c, const ChoiceDelta& d) {
  ChatDelta out;
  out.content = d.text;
  if (c.reasoning_parser) {
    ReasoningDelta r = c.reasoning_parser->feed(d.text);
    if (d.finish_reason) {
      const ReasoningDelta rest = c.reasoning_parser->finish();
      r.reasoning += rest.reasoning;
      r.content += rest.content;
    }
    out.reasoning = std::move(r.reasoning);
    out.content = std::move(r.content);
  }
  if (c.tool_parser) {
    ToolDelta t = c.tool_parser->feed(out.content);
    if (d.finish_reason) t.append(c.tool_parser->finish());
    out.content = std::move(t.content);
    out.reasoning += t.reasoning;
    out.calls = std::move(t.deltas);
  }
  return out;
}

}  // namespace atom::server
