// Guards against runaway templates (Python's jinja2 has none, so there is no reference to compare
// with): output size, macro recursion, steps, and oversized strings all stop with a clear error.
// Also: concurrent rendering of one template, and error locations.
#include <gtest/gtest.h>
#include <pthread.h>

#include <thread>

#include "jinja/template.h"

namespace atom {
namespace {

using jinja::TemplateError;

jinja::Environment env_with(jinja::Limits limits) {
  jinja::Options o;
  o.limits = limits;
  return jinja::Environment(o);
}

std::string error_of(const jinja::Environment& env, const std::string& src) {
  try {
    env.from_string(src).render(nlohmann::ordered_json::object());
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(JinjaLimits, OutputSize) {
  jinja::Limits l;
  l.max_output_bytes = 1000;
  auto env = env_with(l);
  EXPECT_NE(error_of(env, "{% for i in range(2000) %}x{% endfor %}").find("output exceeds"),
            std::string::npos);
  EXPECT_NE(error_of(env, "{{ 'x' * 5000 }}").find("limit"), std::string::npos);
  EXPECT_NE(
      error_of(env, "{% set ns = namespace(s='x') %}{% for i in range(20) %}{% set ns.s = ns.s + "
                    "ns.s %}{% endfor %}")
          .find("limit"),
      std::string::npos);
  EXPECT_EQ(env.from_string("{{ 'x' * 999 }}").render(nlohmann::ordered_json::object()).size(),
            999u);
}

TEST(JinjaLimits, RecursionDepth) {
  jinja::Limits l;
  l.max_call_depth = 50;
  auto env = env_with(l);
  EXPECT_NE(error_of(env, "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")
                .find("nest deeper than 50"),
            std::string::npos);
  EXPECT_EQ(env.from_string(
                   "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}.{% endmacro %}{{ f(40) }}")
                .render(nlohmann::ordered_json::object())
                .size(),
            41u);
}

TEST(JinjaLimits, Steps) {
  jinja::Limits l;
  l.max_steps = 100000;
  auto env = env_with(l);
  EXPECT_NE(
      error_of(env, "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}")
          .find("steps"),
      std::string::npos);
}

TEST(JinjaErrors, SyntaxErrorsNameTheLine) {
  jinja::Environment env;
  try {
    env.from_string("ok\n{{ 1 + }}\n", "my template");
    FAIL();
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.kind(), TemplateError::Kind::kSyntax);
    EXPECT_EQ(e.line(), 2);
    EXPECT_EQ(std::string(e.what()).rfind("my template, line 2: syntax error:", 0), 0u) << e.what();
  }
}

TEST(JinjaErrors, UndefinedAttributeNamesTheValue) {
  jinja::Environment env;
  std::string msg = error_of(env, "{{ x }}\n{{ message.tool_calls.function }}");
  EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'message' is undefined"), std::string::npos) << msg;
}

TEST(JinjaTemplate, ConcurrentRenders) {
  jinja::Environment env;
  auto tpl = env.from_string(
      "{% for i in range(n) %}{{ i }}{% endfor %}{% set ns = namespace(c=0) %}{{ ns.c }}");
  std::vector<std::thread> threads;
  std::vector<std::string> outs(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 200; ++k) outs[t] = tpl.render(nlohmann::ordered_json{{"n", t}});
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(outs[3], "0120");
  EXPECT_EQ(outs[0], "0");
}

TEST(JinjaTemplate, CustomFiltersTestsAndGlobals) {
  jinja::Environment env;
  env.set_filter("twice", [](jinja::Interpreter&, const jinja::Value& v, jinja::CallArgs&) {
    return jinja::Value::string(jinja::to_str(v) + jinja::to_str(v));
  });
  env.set_test("short", [](jinja::Interpreter&, const jinja::Value& v, jinja::CallArgs&) {
    return jinja::length(v) < 3;
  });
  env.set_global("answer", jinja::Value::integer(42));
  EXPECT_EQ(env.from_string("{{ 'ab'|twice }} {{ 'ab' is short }} {{ answer }}")
                .render(nlohmann::ordered_json::object()),
            "abab True 42");
  // A template parsed before a change keeps the environment it was parsed with.
  auto before = env.from_string("{{ answer }}");
  env.set_global("answer", jinja::Value::integer(7));
  EXPECT_EQ(before.render(nlohmann::ordered_json::object()), "42");
}

}  // namespace
}  // namespace atom

namespace atom {
namespace {

TEST(JinjaLimits, DeepNesting) {
  jinja::Environment env;
  // Deeply nested source is a syntax error, not a stack overflow.
  std::string parens = std::string(5000, '(') + "1" + std::string(5000, ')');
  EXPECT_THROW(env.from_string("{{ " + parens + " }}"), TemplateError);
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  EXPECT_THROW(env.from_string(ifs), TemplateError);
  // Values nested deeper than Python's recursion limit stop with an error when walked.
  std::string deep =
      "{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = [ns.v] %}{% endfor %}";
  EXPECT_NE(error_of(env, deep + "{{ ns.v }}").find("nested"), std::string::npos);
  EXPECT_NE(error_of(env, deep + "{{ ns.v == [ns.v] }}").find("nested"), std::string::npos);
  // And so does deeply nested JSON input.
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (int i = 0; i < 5000; ++i) j = nlohmann::ordered_json::array({j});
  EXPECT_THROW(env.from_string("{{ x|length }}").render(nlohmann::ordered_json{{"x", j}}),
               TemplateError);
}

}  // namespace
}  // namespace atom

namespace atom {
namespace {

std::string chain(const std::string& first, const std::string& link, int n) {
  std::string s = first;
  s.reserve(first.size() + link.size() * n);
  for (int i = 0; i < n; ++i) s += link;
  return s;
}

std::string parse_error_of(const jinja::Environment& env, const std::string& src) {
  try {
    env.from_string(src);
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.kind(), TemplateError::Kind::kSyntax) << e.what();
    return e.what();
  }
  return "(no error)";
}

// Chains the parser builds in a loop nest the tree one level per link: 40,000 attribute links or
// 30,000 additions once overflowed the stack when the tree was rendered or freed.
TEST(JinjaLimits, LongChainsHitTheDepthLimit) {
  jinja::Environment env;
  for (const std::string& src :
       {"{{ " + chain("a", ".b", 40000) + " }}", "{{ " + chain("1", " + 1", 30000) + " }}",
        "{{ " + chain("x", "[0]", 40000) + " }}", "{{ " + chain("x", "()", 40000) + " }}",
        "{{ " + chain("x", "|string", 40000) + " }}", "{{ " + chain("1", " * 1", 40000) + " }}",
        "{{ " + chain("1", " ** 1", 40000) + " }}", "{{ " + chain("x", " or x", 40000) + " }}",
        "{{ " + chain("x", " and x", 40000) + " }}", "{{ " + chain("", "not ", 40000) + "x }}",
        "{{ " + chain("", "-", 40000) + "x }}", "{{ " + chain("1", " if x", 40000) + " }}",
        "{% set " + std::string(40000, '(') + "a" + std::string(40000, ')') + " = 1 %}",
        "{% filter " + chain("upper", "|lower", 40000) + " %}{% endfilter %}"}) {
    const std::string msg = parse_error_of(env, src);
    EXPECT_NE(msg.find("depth limit of 256"), std::string::npos) << msg.substr(0, 200);
  }
}

TEST(JinjaLimits, DepthLimitIsConfigurable) {
  jinja::Limits l;
  l.max_depth = 1000;
  auto env = env_with(l);
  // 900 terms fit under a limit of 1000 (and evaluate right), 1100 do not.
  EXPECT_EQ(env.from_string("{{ " + chain("1", " + 1", 899) + " }}")
                .render(nlohmann::ordered_json::object()),
            "900");
  EXPECT_NE(
      parse_error_of(env, "{{ " + chain("1", " + 1", 1100) + " }}").find("depth limit of 1000"),
      std::string::npos);
  l.max_depth = 10;
  EXPECT_NE(
      parse_error_of(env_with(l), "{{ " + chain("a", ".b", 12) + " }}").find("depth limit of 10"),
      std::string::npos);
  EXPECT_NO_THROW(env_with(l).from_string("{{ " + chain("a", ".b", 5) + " }}"));
}

// Deep expressions around the calls of a macro that recurses multiply their stack use: the
// evaluation depth bound stops that with an error, not a stack overflow (run on a thread with the
// default stack, as the server's handler threads are).
TEST(JinjaLimits, EvaluationDepthBoundsRecursionTimesNesting) {
  jinja::Environment env;
  const std::string src =
      "{% macro f(n) %}{{ " + chain("f(n + 1)", " + 0", 200) + " }}{% endmacro %}{{ f(0) }}";
  std::string msg;
  std::thread t([&] { msg = error_of(env, src); });
  t.join();
  EXPECT_NE(msg.find("evaluation depth limit of 4096"), std::string::npos) << msg;
  jinja::Limits l;
  l.max_eval_depth = 100;
  EXPECT_NE(error_of(env_with(l),
                     "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}")
                .find("evaluation depth limit of 100"),
            std::string::npos);
  EXPECT_EQ(env.from_string(
                   "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}.{% endmacro %}{{ f(60) }}")
                .render(nlohmann::ordered_json::object())
                .size(),
            61u);
}

// A thread with a smaller stack than the depth limit assumes (768 KB here; the sanitizers' larger
// frames did the same on 8 MB): the stack runs out before the evaluation depth limit. The render
// used to overflow it (SIGSEGV; under ASan, EvaluationDepthBoundsRecursionTimesNesting above); it
// now ends with an error naming the bound.
TEST(JinjaLimits, ASmallThreadStackEndsTheRenderWithAnError) {
  struct Job {
    jinja::Environment env;
    std::string src, msg;
  } job;
  job.src = "{% macro f(n) %}{{ " + chain("f(n + 1)", " + 0", 200) + " }}{% endmacro %}{{ f(0) }}";
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 768 << 10), 0);
  pthread_t t;
  ASSERT_EQ(pthread_create(
                &t, &attr,
                [](void* p) -> void* {
                  auto* j = static_cast<Job*>(p);
                  j->msg = error_of(j->env, j->src);
                  return nullptr;
                },
                &job),
            0);
  pthread_join(t, nullptr);
  pthread_attr_destroy(&attr);
  EXPECT_NE(job.msg.find("deeper than this thread's stack allows"), std::string::npos) << job.msg;
  EXPECT_NE(job.msg.find("evaluation depth limit of 4096"), std::string::npos) << job.msg;
}

}  // namespace
}  // namespace atom
