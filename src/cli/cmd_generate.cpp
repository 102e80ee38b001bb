// atom generate --model DIR --prompt-tokens 1,2,3 --max-tokens N --temperature 0 --ignore-eos --json
#include <fmt/ranges.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/command.h"
#include "core/error.h"
#include "engine/sequence_runner.h"

namespace {
struct GenerateArgs {
  atom::cli::ModelArgs model;
  std::vector<std::string> prompts;
  int max_tokens = 16;
  double temperature = 0.0;
  bool ignore_eos = false;
  bool json = false;
};
}  // namespace

ATOM_REGISTER_COMMAND([](CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate tokens for one or more prompts");
  atom::cli::model_args_add(cmd, args->model);
  cmd->add_option("--prompt-tokens", args->prompts, "comma-separated prompt token ids (repeatable)")
      ->required();
  cmd->add_option("--max-tokens", args->max_tokens, "tokens to generate per prompt");
  cmd->add_option("--temperature", args->temperature, "sampling temperature (0: greedy)");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->add_flag("--json", args->json, "print one JSON object per prompt");
  cmd->callback([args] {
    if (args->temperature != 0.0)
      atom::fail("--temperature {}: only greedy decoding (0) is available in this build",
                 args->temperature);
    if (args->max_tokens < 0) atom::fail("--max-tokens {} must be >= 0", args->max_tokens);
    std::vector<std::vector<int32_t>> prompts;
    for (const auto& p : args->prompts) prompts.push_back(atom::cli::token_list_parse(p, "--prompt-tokens"));
    auto m = atom::cli::model_args_load(args->model);
    const auto gen = atom::generation_config_load(args->model.model);
    for (const auto& prompt : prompts) {
      const auto r = atom::generate_greedy(*m.model, prompt, args->max_tokens, gen.eos_token_ids,
                                           args->ignore_eos);
      if (args->json) {
        nlohmann::json j = {{"prompt_token_ids", prompt},
                            {"token_ids", r.token_ids},
                            {"finish_reason", r.finish_reason}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%s\n", fmt::format("{}", fmt::join(r.token_ids, ",")).c_str());
      }
    }
  });
});
