// The embedded demo model (models/kjv-tiny: a Llama trained on the King James Version by
// tools/train_demo_model.py) against the PyTorch references the same run recorded, from the
// saved folder loaded fresh in fp32 (tests/fixtures/references/kjv-tiny.json): the log-likelihood
// of held-out passages token by token (whole and in prefill chunks), greedy continuations token
// for token (EOS ignored, and stopping at EOS by itself, plain text and chat), top logprobs,
// the tokenizer and chat template against HF tokenizers and transformers, and seeded sampling
// checked by its statistics against the reference's next-token distribution (RNGs differ).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "engine_test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace atom::test {
namespace {

using json = nlohmann::json;

std::string demo_dir() { return source_dir() + "/models/kjv-tiny"; }

const json& refs() {
  static const json r =
      json::parse(read_file(source_dir() + "/tests/fixtures/references/kjv-tiny.json"));
  return r;
}

Model& demo_model() {
  static LoadedModel m = model_load(demo_dir(), ModelOptions{});
  return *m.model;
}

const tokenizer::Tokenizer& demo_tokenizer() {
  static const tokenizer::Tokenizer t = tokenizer::Tokenizer::from_dir(demo_dir());
  return t;
}

std::vector<int32_t> ids(const json& j) { return j.get<std::vector<int32_t>>(); }

// The generated ids without the EOS that ends them (the text a client sees).
std::vector<int32_t> without_eos(std::vector<int32_t> t) {
  if (!t.empty() && (t.back() == 0 || t.back() == 2)) t.pop_back();
  return t;
}

// Whether a greedy run of at most max_tokens ends with "stop" by vLLM's rule: it ends with EOS
// before the length cap (the cap is checked first, so an EOS drawn as the last allowed token ends
// the request with "length"). The references' finish_reason labels HF's view, EOS at any step.
bool stops_at_eos(const std::vector<int32_t>& tokens, size_t max_tokens) {
  return !tokens.empty() && (tokens.back() == 0 || tokens.back() == 2) &&
         tokens.size() < max_tokens;
}

// Largest |atom - PyTorch| per-token log-likelihood. Measured 5.1-8.6e-6 over the four passages,
// whole and in chunks of 7 (fp32 on the CPU against fp32 on the GPU, summed in other orders);
// 2e-5 is about twice the largest.
constexpr double kTokenLogprobTolerance = 2e-5;
// A whole passage's log-likelihood, relative: measured 1.8-9.3e-8, bound 2e-7 (the issue asks for
// 1e-3, which this meets with room to spare; a bound that loose would let planted bugs through).
constexpr double kTotalRelTolerance = 2e-7;

TEST(DemoModel, HeldOutLogLikelihoodsMatchPyTorch) {
  Model& model = demo_model();
  const int64_t V = model.vocab_size();
  ASSERT_GE(refs().at("passages").size(), 4u);
  for (int chunk : {0, 7}) {
    for (const json& p : refs().at("passages")) {
      const auto tokens = ids(p.at("ids"));
      const auto want = p.at("token_logprobs").get<std::vector<double>>();
      ASSERT_EQ(want.size() + 1, tokens.size());
      ASSERT_GT(tokens.size(), 48u) << "passages must cross KV blocks and prefill chunks";
      const Tensor logits = f32_host(score_tokens(model, tokens, chunk));
      ASSERT_EQ(logits.size(0), static_cast<int64_t>(tokens.size()));
      double worst = 0, got_total = 0, want_total = 0;
      for (size_t t = 0; t + 1 < tokens.size(); ++t) {
        const auto ls = log_softmax(logits.ptr<float>() + static_cast<int64_t>(t) * V, V);
        const double got = ls[static_cast<size_t>(tokens[t + 1])];
        ASSERT_TRUE(std::isfinite(got)) << "token " << t;
        worst = std::max(worst, std::abs(got - want[t]));
        got_total += got;
        want_total += want[t];
      }
      const double rel = std::abs(got_total - want_total) / std::abs(want_total);
      std::printf("%s (chunk %d): %zu tokens, log-likelihood %.6f (PyTorch %.6f), rel %.2e, "
                  "max per-token diff %.2e\n",
                  p.at("where").get<std::string>().c_str(), chunk, tokens.size(), got_total,
                  want_total, rel, worst);
      EXPECT_LE(worst, kTokenLogprobTolerance) << p.at("where");
      EXPECT_LE(rel, kTotalRelTolerance) << p.at("where");
    }
  }
}

TEST(DemoModel, TokenizerAndChatTemplateMatchTransformers) {
  const auto& tok = demo_tokenizer();
  EXPECT_EQ(tok.eos_token(), "<|endoftext|>");
  for (const json& p : refs().at("passages")) {
    auto want = ids(p.at("ids"));
    want.pop_back();  // the EOS the tool appends
    EXPECT_EQ(tok.encode(p.at("text").get<std::string>(), false), want) << p.at("where");
  }
  for (const json& g : refs().at("greedy")) {
    EXPECT_EQ(tok.encode(g.at("prompt").get<std::string>(), true), ids(g.at("prompt_ids")));
    EXPECT_EQ(tok.decode(ids(g.at("tokens")), true), g.at("text").get<std::string>());
  }
  const auto tpl = tokenizer::ChatTemplate::from_model_dir(demo_dir());
  for (const json& c : refs().at("chat")) {
    const auto messages = nlohmann::ordered_json::parse(c.at("messages").dump());
    const std::string rendered = tpl.render(messages, {});
    EXPECT_EQ(rendered, c.at("rendered").get<std::string>());
    EXPECT_EQ(tok.encode(rendered, false), ids(c.at("prompt_ids")));
    EXPECT_EQ(tok.decode(without_eos(ids(c.at("tokens"))), true), c.at("text").get<std::string>());
  }
}

// The model must have learnt something for these tests to mean anything: greedy text that is not
// one repeated token, and held-out perplexity far below the vocabulary's 4096.
TEST(DemoModel, ReferencesComeFromATrainedModel) {
  EXPECT_LT(refs().at("held_out_perplexity_fp32").get<double>(), 40.0);
  for (const json& g : refs().at("greedy")) {
    auto t = ids(g.at("tokens"));
    std::sort(t.begin(), t.end());
    EXPECT_GE(std::unique(t.begin(), t.end()) - t.begin(), 10) << g.at("prompt");
  }
  int stopped = 0;
  for (const json& c : refs().at("chat")) stopped += c.at("finish_reason") == "stop";
  EXPECT_GE(stopped, 2) << "chat completions that stop at EOS by themselves";
}

TEST(DemoModel, GreedyContinuationsMatchPyTorch) {
  Model& model = demo_model();
  LLMEngine engine(model, test_config(), generation_config_load(demo_dir()));
  // EOS ignored: a fixed number of tokens, every prompt in one batch.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (const json& g : refs().at("greedy")) {
    prompts.push_back(ids(g.at("prompt_ids")));
    params.push_back(greedy(static_cast<int>(g.at("tokens").size())));
  }
  // Stopping at EOS by itself: text completions and chat turns.
  for (const char* kind : {"completions", "chat"}) {
    for (const json& c : refs().at(kind)) {
      prompts.push_back(ids(c.at("prompt_ids")));
      SamplingParams p = greedy(64);
      p.ignore_eos = false;
      params.push_back(p);
    }
  }
  const auto out = engine.generate(prompts, params);
  size_t i = 0, total = 0, agree = 0;  // tokens, and leading tokens that agree, summed
  for (const char* kind : {"greedy", "completions", "chat"}) {
    for (const json& c : refs().at(kind)) {
      SCOPED_TRACE(std::string(kind) + ": " + c.dump().substr(0, 80));
      const auto& o = out.at(i++).outputs.at(0);
      const auto want = ids(c.at("tokens"));
      EXPECT_EQ(o.token_ids, want);
      size_t k = 0;
      while (k < want.size() && k < o.token_ids.size() && o.token_ids[k] == want[k]) ++k;
      agree += k;
      total += want.size();
      if (std::string(kind) != "greedy") {
        EXPECT_EQ(o.finish_reason,
                  stops_at_eos(want, 64) ? FinishReason::kStop : FinishReason::kLength);
      }
    }
  }
  std::printf("greedy: %zu of %zu tokens identical to PyTorch's over %zu requests\n", agree, total,
              prompts.size());
  expect_engine_idle(engine);
}

// Largest |atom - PyTorch| top logprob: measured 5.9e-6 over 240 (6 prompts x 8 steps x top 5);
// 1.2e-5 is twice that.
constexpr double kTopLogprobTolerance = 1.2e-5;

TEST(DemoModel, TopLogprobsMatchPyTorch) {
  LLMEngine engine(demo_model(), test_config());
  double worst = 0;
  size_t compared = 0;
  for (const json& g : refs().at("greedy")) {
    const auto& tops = g.at("top_logprobs");
    SamplingParams p = greedy(static_cast<int>(tops.size()));
    p.logprobs = static_cast<int>(tops.at(0).size());
    const auto out = engine.generate({ids(g.at("prompt_ids"))}, p).at(0).outputs.at(0);
    ASSERT_EQ(out.logprobs.size(), tops.size());
    for (size_t s = 0; s < tops.size(); ++s) {
      const auto& want = tops[s];
      const auto& got = out.logprobs[s];
      ASSERT_EQ(got.top.size(), want.size()) << "step " << s;
      EXPECT_EQ(got.token_id, want[0][0].get<int32_t>());
      for (size_t k = 0; k < want.size(); ++k) {
        EXPECT_EQ(got.top[k].token_id, want[k][0].get<int32_t>()) << "step " << s << " rank " << k;
        const double d = std::abs(got.top[k].logprob - want[k][1].get<double>());
        ASSERT_TRUE(std::isfinite(d));
        worst = std::max(worst, d);
        ++compared;
      }
    }
  }
  std::printf("top logprobs: %zu compared, max |diff| %.2e\n", compared, worst);
  EXPECT_GT(compared, 100u);
  EXPECT_LE(worst, kTopLogprobTolerance);
}

// Pearson's chi-square of `counts` against `probs` (bins of expected count >= 5, the rest
// pooled), with its degrees of freedom.
std::pair<double, int> chi_square(const std::vector<int>& counts, const std::vector<double>& probs,
                                  int n) {
  double chi = 0, rest_p = 0;
  int rest_n = 0, bins = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] * n >= 5) {
      const double e = probs[i] * n;
      chi += (counts[i] - e) * (counts[i] - e) / e;
      ++bins;
    } else {
      rest_p += probs[i];
      rest_n += counts[i];
    }
  }
  const double e = rest_p * n;
  if (e > 0) {
    chi += (rest_n - e) * (rest_n - e) / e;
    ++bins;
  } else if (rest_n > 0) {
    chi = INFINITY;  // drew a token of probability zero
  }
  return {chi, bins - 1};
}

// The chi-square value exceeded with probability about 1e-6 (Wilson-Hilferty, z = 4.75).
double chi_square_bound(int df) {
  const double k = 2.0 / (9.0 * df);
  return df * std::pow(1 - k + 4.75 * std::sqrt(k), 3);
}

// softmax(logprobs / temperature)
std::vector<double> tempered(const std::vector<double>& lp, double temperature) {
  std::vector<double> p(lp.size());
  const double mx = *std::max_element(lp.begin(), lp.end());
  double sum = 0;
  for (size_t i = 0; i < lp.size(); ++i) sum += p[i] = std::exp((lp[i] - mx) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

TEST(DemoModel, SeededSamplesFollowTheReferenceDistribution) {
  const json& s = refs().at("sample");
  const auto lp = s.at("logprobs").get<std::vector<double>>();
  ASSERT_EQ(static_cast<int64_t>(lp.size()), demo_model().vocab_size());
  const auto prompt = ids(s.at("prompt_ids"));
  constexpr int kDraws = 1000;
  LLMEngine engine(demo_model(), test_config());
  std::map<double, std::vector<int>> counts;
  for (double temperature : {1.0, 0.6}) {
    std::vector<std::vector<int32_t>> prompts(kDraws, prompt);
    std::vector<SamplingParams> params;
    for (int i = 0; i < kDraws; ++i) {
      SamplingParams p;
      p.temperature = temperature;
      p.max_tokens = 1;
      p.ignore_eos = true;
      p.seed = 1000 + i;
      params.push_back(p);
    }
    auto& c = counts[temperature];
    c.assign(lp.size(), 0);
    for (const auto& o : engine.generate(prompts, params)) ++c.at(o.outputs.at(0).token_ids.at(0));
  }
  for (double temperature : {1.0, 0.6}) {
    const auto [chi, df] = chi_square(counts[temperature], tempered(lp, temperature), kDraws);
    std::printf("temperature %.1f: chi-square %.1f on %d degrees of freedom (bound %.1f)\n",
                temperature, chi, df, chi_square_bound(df));
    EXPECT_GE(df, 5);
    EXPECT_LE(chi, chi_square_bound(df)) << "temperature " << temperature;
  }
  // The statistic has the power to tell the two temperatures apart.
  const auto [cross, df] = chi_square(counts[0.6], tempered(lp, 1.0), kDraws);
  std::printf("temperature 0.6 draws against the temperature 1 distribution: chi-square %.1f "
              "(bound %.1f)\n",
              cross, chi_square_bound(df));
  EXPECT_GT(cross, chi_square_bound(df));
  expect_engine_idle(engine);
}

}  // namespace
}  // namespace atom::test
