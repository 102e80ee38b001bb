// `atom chat-template` end to end: conversations from the reference corpus written as files (both
// the plain list form and the request-object form), rendered by the atom program, compared with
// what jinja2 rendered for them (reference.py).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "reference_util.h"

namespace atom {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

struct RunResult {
  int status;
  std::string out;
};

RunResult run_atom(const std::string& args) {
  std::string cmd = std::string(ATOM_BINARY_DIR) + "/atom chat-template " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  return {pclose(p), out};
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("atom_cli_chat_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return (dir_ / name).string();
  }
  // A model folder holding a fixture template in its tokenizer_config.json.
  std::string model_with(const json& entry) {
    std::ifstream in(fs::path(ATOM_SOURCE_DIR) / entry["path"].get<std::string>(),
                     std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    json config = entry["special_tokens"];
    config["chat_template"] = ss.str();
    fs::create_directories(dir_ / "model");
    std::ofstream(dir_ / "model/tokenizer_config.json") << config.dump();
    return (dir_ / "model").string();
  }
  fs::path dir_;
};

const json& entry_for(const std::string& id) {
  static const json refs = test::load_reference("templates.json");
  for (const auto& t : refs) {
    if (t["id"] == id) return t;
  }
  static const json none;
  return none;
}

const json* case_for(const json& entry, const std::string& id) {
  for (const auto& c : entry["cases"]) {
    if (c["id"] == id) return &c;
  }
  return nullptr;
}

TEST_F(CliTest, RequestObjectWithToolsAndKwargs) {
  const json& qwen = entry_for("qwen3");
  ASSERT_FALSE(qwen.is_null());
  const json* c = case_for(qwen, "tool_call_with_content/v1/gen");  // enable_thinking: false
  ASSERT_TRUE(c && c->contains("output"));
  json request = {{"model", "m"},
                  {"messages", (*c)["messages"]},
                  {"tools", (*c)["tools"]},
                  {"chat_template_kwargs", (*c)["kwargs"]}};
  auto r = run_atom("--model " + model_with(qwen) + " " + write("req.json", request.dump()));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(test::first_difference((*c)["output"].get<std::string>(), r.out), "");
}

TEST_F(CliTest, MessageListFlagsAndTemplateFile) {
  const json& oss = entry_for("gpt-oss");
  const json* c = case_for(oss, "multi_turn/v1/nogen");  // reasoning_effort: high
  ASSERT_TRUE(c && c->contains("output"));
  std::string conv = write("conv.json", (*c)["messages"].dump());
  // The fixture file given as --chat-template (no model folder); strftime_now is not pinned on the
  // command line, so compare the output with today's date put in place of the fixed one.
  auto r = run_atom(
      "--chat-template " + (fs::path(ATOM_SOURCE_DIR) / oss["path"].get<std::string>()).string() +
      " --no-generation-prompt --chat-template-kwargs '" + (*c)["kwargs"].dump() + "' " + conv);
  ASSERT_EQ(r.status, 0) << r.out;
  std::string expected = (*c)["output"].get<std::string>();
  char today[16];
  std::time_t t = std::time(nullptr);
  std::tm local{};
  localtime_r(&t, &local);
  std::strftime(today, sizeof today, "%Y-%m-%d", &local);
  size_t at = expected.find("2025-07-04");
  ASSERT_NE(at, std::string::npos);
  expected.replace(at, 10, today);
  EXPECT_EQ(test::first_difference(expected, r.out), "");
}

TEST_F(CliTest, TemplateErrorsExitNonZero) {
  const json& mistral = entry_for("mistral-nemo");
  auto r = run_atom(
      "--model " + model_with(mistral) + " " +
      write("bad.json", R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("conversation roles must alternate"), std::string::npos) << r.out;
  auto missing = run_atom(write("ok.json", "[]"));
  EXPECT_NE(missing.status, 0);
}

}  // namespace
}  // namespace atom
