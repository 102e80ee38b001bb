// `atom chat-template`: prints the prompt a model's chat template makes of a conversation, as
// transformers' apply_chat_template(tokenize=False) and vLLM's chat endpoint would.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace {

using ojson = nlohmann::ordered_json;  // key order kept, as the file has it

struct ChatTemplateArgs {
  std::string conversation;
  std::string model;
  std::string chat_template;
  std::string kwargs;
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

ojson read_conversation(const std::string& path) {
  std::string text;
  if (path == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    text = ss.str();
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) atom::fail("cannot read {}", path);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  try {
    return ojson::parse(text);
  } catch (const ojson::exception& e) {
    atom::fail("{} is not valid JSON: {}", path, e.what());
  }
}

void run(const ChatTemplateArgs& a, bool agp_given, bool continue_given) {
  if (a.model.empty() && a.chat_template.empty())
    atom::fail("give --model, --chat-template, or both");
  using atom::tokenizer::ChatTemplate;
  ChatTemplate ct =
      a.model.empty()
          ? ChatTemplate::from_string(atom::tokenizer::load_chat_template_arg(a.chat_template))
          : ChatTemplate::from_model_dir(a.model, a.chat_template);

  // A list of messages, or a request-like object; other request fields (model, temperature, ...)
  // are ignored, so an OpenAI chat request body can be given as is.
  ojson conv = read_conversation(a.conversation);
  ojson messages;
  atom::tokenizer::ChatRenderOptions o;
  if (conv.is_array()) {
    messages = conv;
  } else if (conv.is_object() && conv.contains("messages")) {
    messages = conv["messages"];
    if (conv.contains("tools")) o.tools = conv["tools"];
    if (conv.contains("documents")) o.documents = conv["documents"];
    if (conv.contains("add_generation_prompt"))
      o.add_generation_prompt = conv["add_generation_prompt"].get<bool>();
    if (conv.contains("continue_final_message"))
      o.continue_final_message = conv["continue_final_message"].get<bool>();
    if (conv.contains("chat_template_kwargs")) {
      if (!conv["chat_template_kwargs"].is_object())
        atom::fail("chat_template_kwargs must be a JSON object");
      o.kwargs = conv["chat_template_kwargs"];
    }
  } else {
    atom::fail("{}: expected a list of messages or an object with \"messages\"", a.conversation);
  }
  if (!a.kwargs.empty()) {
    ojson extra;
    try {
      extra = ojson::parse(a.kwargs);
    } catch (const ojson::exception& e) {
      atom::fail("--chat-template-kwargs is not valid JSON: {}", e.what());
    }
    if (!extra.is_object()) atom::fail("--chat-template-kwargs must be a JSON object");
    for (auto it = extra.begin(); it != extra.end(); ++it) o.kwargs[it.key()] = it.value();
  }
  if (agp_given) o.add_generation_prompt = a.add_generation_prompt;
  if (continue_given) o.continue_final_message = a.continue_final_message;
  // Continuing the final message implies no new assistant header unless asked explicitly.
  if (o.continue_final_message && !agp_given &&
      !(conv.is_object() && conv.contains("add_generation_prompt"))) {
    o.add_generation_prompt = false;
  }
  std::string prompt = ct.render(messages, o);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
}

}  // namespace

ATOM_REGISTER_COMMAND([](CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "chat-template",
      "Print the prompt a model's chat template makes of a conversation (as transformers' "
      "apply_chat_template)");
  auto a = std::make_shared<ChatTemplateArgs>();
  cmd->add_option("conversation", a->conversation,
                  "JSON file (- for stdin): a list of messages, or an object with messages, tools, "
                  "documents, "
                  "add_generation_prompt, continue_final_message, chat_template_kwargs")
      ->required();
  cmd->add_option("--model", a->model,
                  "Model folder (tokenizer_config.json, chat_template.jinja, ...)");
  cmd->add_option("--chat-template", a->chat_template,
                  "Chat template file, or the template text itself (replaces the model's)");
  cmd->add_option("--chat-template-kwargs", a->kwargs,
                  "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'");
  auto* agp =
      cmd->add_flag("--add-generation-prompt,!--no-generation-prompt", a->add_generation_prompt,
                    "Append the assistant turn header (default: on, as vLLM's chat endpoint)");
  auto* cont = cmd->add_flag("--continue-final-message", a->continue_final_message,
                             "Leave the final assistant message open for the model to continue");
  cmd->callback([a, agp, cont] { run(*a, agp->count() > 0, cont->count() > 0); });
});
