// atom score --model DIR --tokens 1,2,3 --out FILE.safetensors
// Writes tensor `logits` (F32 [num_tokens, vocab_size]) for every position of one sequence.
#include "cli/common.h"
#include "cli/command.h"
#include "core/log.h"
#include "engine/sequence_runner.h"
#include "loader/safetensors.h"

namespace {
struct ScoreArgs {
  atom::cli::ModelArgs model;
  std::string tokens, out;
  int chunk = 0;
};
}  // namespace

ATOM_REGISTER_COMMAND([](CLI::App& app) {
  auto args = std::make_shared<ScoreArgs>();
  auto* cmd = app.add_subcommand("score", "Write the logits of every position of a token sequence");
  atom::cli::model_args_add(cmd, args->model);
  cmd->add_option("--tokens", args->tokens, "comma-separated token ids")->required();
  cmd->add_option("--out", args->out, "output .safetensors file (tensor 'logits')")->required();
  cmd->add_option("--prefill-chunk", args->chunk, "prefill in chunks of this many tokens (0: one)");
  cmd->callback([args] {
    const auto tokens = atom::cli::token_list_parse(args->tokens, "--tokens");
    auto m = atom::cli::model_args_load(args->model);
    if (atom::cli::worker_ran(*m)) return;
    atom::Tensor logits = atom::score_tokens(*m, tokens, args->chunk);
    atom::safetensors_write(args->out, {{"logits", logits}});
    atom::log_info("wrote logits {} to {}", atom::shape_str(logits.shape()), args->out);
  });
});
