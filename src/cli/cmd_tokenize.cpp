// `atom tokenize` and `atom detokenize`: the tokenizer of a model folder from the command line.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {

struct TokenizeArgs {
  std::string model;
  std::string text;
  bool no_special = false;
};

struct DetokenizeArgs {
  std::string model;
  std::string ids;
  bool skip_special = false;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string part = s.substr(i, j - i);
    const auto b = part.find_first_not_of(" \t\n[]");
    const auto e = part.find_last_not_of(" \t\n[]");
    if (b != std::string::npos) {
      part = part.substr(b, e - b + 1);
      size_t used = 0;
      long v = 0;
      try {
        v = std::stol(part, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != part.size() || v < 0 || v > INT32_MAX) atom::fail("not a token id: \"{}\"", part);
      ids.push_back(static_cast<int32_t>(v));
    }
    i = j + 1;
  }
  return ids;
}

}  // namespace

ATOM_REGISTER_COMMAND([](CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text, comma-separated");
  cmd->add_option("--model", args->model, "Model folder with tokenizer.json")->required();
  cmd->add_option("text", args->text, "Text to tokenize")->required();
  auto* no_special =
      cmd->add_flag("--no-special", args->no_special,
                    "Do not add special tokens (BOS etc.; the default adds them as HF does)");
  cmd->add_flag_callback(
         "--add-special-tokens", [args] { args->no_special = false; },
         "Add special tokens (the default)")
      ->excludes(no_special);
  cmd->callback([args] {
    const auto tok = atom::tokenizer::Tokenizer::from_dir(args->model);
    const auto ids = tok.encode(args->text, !args->no_special);
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out.push_back(',');
      out += std::to_string(ids[i]);
    }
    std::printf("%s\n", out.c_str());
  });
});

ATOM_REGISTER_COMMAND([](CLI::App& app) {
  auto args = std::make_shared<DetokenizeArgs>();
  auto* cmd = app.add_subcommand("detokenize", "Print the text of comma-separated token ids");
  cmd->add_option("--model", args->model, "Model folder with tokenizer.json")->required();
  cmd->add_option("ids", args->ids, "Token ids, e.g. 1,2,3")->required();
  cmd->add_flag("--skip-special-tokens", args->skip_special,
                "Leave special tokens out of the text");
  cmd->callback([args] {
    const auto tok = atom::tokenizer::Tokenizer::from_dir(args->model);
    const std::string text = tok.decode(parse_ids(args->ids), args->skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  });
});
