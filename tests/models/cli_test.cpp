// The `atom` program's score and generate commands, run as a user would.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/fixtures.h"
#include "common/test_util.h"

namespace atom::test {
namespace {

struct CmdResult {
  int status;
  std::string out;
};

CmdResult run(const std::string& args) {
  const std::string cmd = std::string(ATOM_BINARY_DIR) + "/atom " + args + " 2>&1";
  CmdResult r{0, ""};
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  r.status = pclose(p);
  return r;
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

TEST(Cli, ScoreWritesTransformersLogits) {
  TempDir d;
  const Reference ref = reference_load("llama3_gqa");
  const CmdResult r = run("score --device cpu --model " + fixture_dir("llama3_gqa") + " --tokens " +
                          join(ref.input_ids) + " --out " + d.file("l.safetensors"));
  ASSERT_EQ(r.status, 0) << r.out;
  SafetensorsFile f(d.file("l.safetensors"), false);
  Tensor logits = f.tensor("logits");
  EXPECT_EQ(logits.dtype(), DType::kF32);
  expect_logits_near(logits, ref.logits, kCpuLogitTolerance, "atom score");
}

TEST(Cli, GenerateJsonGreedyTokens) {
  const Reference ref = reference_load("qwen3_tied");
  const CmdResult r =
      run("generate --device cpu --model " + fixture_dir("qwen3_tied") + " --prompt-tokens " +
          join(ref.greedy_prompt) + " --prompt-tokens " + join(ref.greedy_prompt) +
          " --max-tokens 16 --temperature 0 --ignore-eos --json");
  ASSERT_EQ(r.status, 0) << r.out;
  std::istringstream lines(r.out);
  std::string line;
  int objects = 0;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("token_ids").get<std::vector<int32_t>>(), ref.greedy_tokens);
    ++objects;
  }
  EXPECT_EQ(objects, 2);
}

TEST(Cli, BadInputIsAClearError) {
  CmdResult r = run("score --device cpu --model " + fixture_dir("llama3_gqa") +
                    " --tokens 1,x,3 --out /tmp/x");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--tokens"), std::string::npos) << r.out;
  r = run("score --device cpu --model " + fixture_dir("llama3_gqa") +
          " --tokens 1,5000 --out /tmp/x");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("5000"), std::string::npos) << r.out;
  r = run("generate --device cpu --model /nonexistent --prompt-tokens 1 --json");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("/nonexistent/config.json"), std::string::npos) << r.out;
  r = run("score --device tpu --model " + fixture_dir("llama3_gqa") + " --tokens 1 --out /tmp/x");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("tpu"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace atom::test
