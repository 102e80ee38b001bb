// The jinja engine against Python's jinja2 on the small templates of snippets.py, grouped by the
// category prefix of their names. The expected outputs come from jinja2 (reference.py), never from
// atom.
#include <gtest/gtest.h>

#include <set>

#include "jinja/template.h"
#include "reference_util.h"
#include "tokenizer/chat_template.h"

namespace atom {
namespace {

using json = nlohmann::ordered_json;

const std::vector<std::string> kCategories = {"lit",   "math", "cmp", "logic", "if",   "for", "set",
                                              "macro", "f",    "t",   "m",     "dm",   "lm",  "sl",
                                              "u",     "ws",   "err", "g",     "idiom"};

const json& snippets() {
  static const json j = test::load_reference("snippets.json");
  return j;
}

std::string category_of(const std::string& name) { return name.substr(0, name.find('/')); }

// Renders one snippet with atom; returns "" when it matches jinja2, else what went wrong.
std::string check_snippet(const json& s) {
  jinja::Environment env = s["env"] == "hf"
                               ? tokenizer::chat_template_environment(test::fixed_now())
                               : jinja::Environment();
  std::string out;
  std::optional<jinja::TemplateError> error;
  try {
    out = env.from_string(s["template"].get<std::string>(), s["name"].get<std::string>())
              .render(s["context"]);
  } catch (const jinja::TemplateError& e) {
    error = e;
  }
  if (s.contains("output")) {
    if (error) return "jinja2 renders it, atom raised: " + std::string(error->what());
    return test::first_difference(s["output"].get<std::string>(), out);
  }
  const json& want = s["error"];
  if (!error) {
    return "jinja2 raises " + want["type"].get<std::string>() + " (" +
           want["message"].get<std::string>() + "), atom rendered: " + test::visible(out);
  }
  if (want["raised"].get<bool>()) {
    if (error->kind() != jinja::TemplateError::Kind::kRaised) {
      return "jinja2: raise_exception(), atom: " + std::string(error->what());
    }
    if (error->message() != want["message"].get<std::string>()) {
      return "raise_exception message differs: jinja2 '" + want["message"].get<std::string>() +
             "', atom '" + error->message() + "'";
    }
  }
  return "";
}

class JinjaSnippets : public ::testing::TestWithParam<std::string> {};

TEST_P(JinjaSnippets, MatchJinja2) {
  int count = 0;
  for (const auto& s : snippets()) {
    std::string name = s["name"].get<std::string>();
    if (category_of(name) != GetParam()) continue;
    ++count;
    std::string problem = check_snippet(s);
    EXPECT_TRUE(problem.empty()) << "snippet " << name << "\n  template: "
                                 << test::visible(s["template"].get<std::string>()) << "\n  "
                                 << problem;
  }
  EXPECT_GT(count, 0) << "no snippets in category " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Categories, JinjaSnippets, ::testing::ValuesIn(kCategories),
                         [](const auto& info) { return info.param; });

TEST(JinjaSnippets, EverySnippetHasACategory) {
  std::set<std::string> known(kCategories.begin(), kCategories.end());
  ASSERT_GT(snippets().size(), 300u);
  for (const auto& s : snippets()) {
    EXPECT_TRUE(known.count(category_of(s["name"].get<std::string>())))
        << s["name"] << " has a category this test does not run";
  }
}

}  // namespace
}  // namespace atom
