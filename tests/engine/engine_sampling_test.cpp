// The engine's sampling-facing behaviour on a real model: seeded sampling is identical across
// batch compositions, tokens drawn on the model's device and by the CPU sampler agree (and equal
// an independent derivation of the scheme over score_tokens logits), n > 1 shares the prompt's
// blocks and matches seed + i, logprobs equal log_softmax of the model's own logits (score_tokens),
// stop strings split across tokens, abort frees everything, and bad requests or configurations fail
// naming the problem.
#include <set>

#include "common/sampling_reference.h"
#include "grammar/matcher.h"
#include "engine_test_util.h"

namespace atom::test {
namespace {

SamplingParams seeded(int64_t seed, int max_tokens) {
  SamplingParams p;
  p.temperature = 0.9;
  p.top_p = 0.9;
  p.top_k = 40;
  p.min_p = 0.01;
  p.repetition_penalty = 1.1;
  p.presence_penalty = 0.2;
  p.frequency_penalty = 0.1;
  p.seed = seed;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

TEST(EngineSampling, SeededSamplingIsIdenticalAcrossBatchCompositions) {
  Model& model = fixture_model("llama3_gqa");
  std::vector<int32_t> prompt = {5, 17, 300, 42, 42, 9, 77, 123, 31, 8, 64, 200, 11, 13};
  for (int i = 0; i < 26; ++i) prompt.push_back(3 + (i * 31) % 700);
  const SamplingParams p = seeded(1234, 24);
  LLMEngine alone_engine(model, test_config());
  const auto alone = alone_engine.generate({prompt}, p).at(0).outputs.at(0).token_ids;
  ASSERT_EQ(alone.size(), 24u);
  // The draw is a pure function of (seed, position); a different seed must change it.
  SamplingParams other = p;
  other.seed = 99;
  EXPECT_NE(alone_engine.generate({prompt}, other).at(0).outputs.at(0).token_ids, alone);

  Workload w = random_workload(30, 80, 16, model.vocab_size(), 5);
  for (size_t i = 0; i < w.params.size(); ++i)
    if (i % 2) w.params[i] = seeded(static_cast<int64_t>(i), w.params[i].max_tokens);
  w.prompts.insert(w.prompts.begin() + 7, prompt);
  w.params.insert(w.params.begin() + 7, p);

  EngineConfig chunked = test_config();
  chunked.max_num_seqs = 6;
  chunked.max_num_batched_tokens = 12;
  EngineConfig preempt = test_config();
  preempt.max_model_len = 112;
  preempt.num_gpu_blocks_override = 9;
  preempt.max_num_seqs = 8;
  preempt.max_num_batched_tokens = 40;
  for (const EngineConfig& c : {test_config(), chunked, preempt}) {
    LLMEngine engine(model, c);
    const auto out = engine.generate(w.prompts, w.params);
    EXPECT_EQ(out[7].outputs.at(0).token_ids, alone);
    // Served from the prefix cache on a second pass, with a different neighbourhood.
    const auto again = engine.generate({w.prompts[3], prompt}, {w.params[3], p});
    if (!c.num_gpu_blocks_override) {  // (nine blocks cannot keep it cached)
      EXPECT_GT(again[1].outputs[0].num_cached_tokens, 0);
    }
    EXPECT_EQ(again[1].outputs.at(0).token_ids, alone);
    if (c.num_gpu_blocks_override) {
      EXPECT_GT(engine.stats().num_preemptions, 0);
    }
    expect_engine_idle(engine);
  }
}

// Sampling that the device sampler can do alone: no penalties, bias or logprobs.
SamplingParams plain(int64_t seed, int max_tokens) {
  SamplingParams p;
  p.temperature = 0.8;
  p.top_p = 0.95;
  p.top_k = 60;
  p.min_p = 0.01;
  p.seed = seed;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// The same draws forced onto the CPU sampler: a zero bias and logprobs change no logit.
SamplingParams on_host(SamplingParams p) {
  p.logit_bias = {{11, 0.0f}};
  p.logprobs = 0;
  return p;
}

std::vector<int32_t> prompt_of(int len, int mul) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(3 + (i * mul) % 900);
  return p;
}

TEST(EngineSampling, DeviceAndHostSamplersDrawTheModelsTokens) {
  Model& model = fixture_model("llama3_gqa");
  const std::vector<int32_t> prompt = prompt_of(29, 53);
  for (const SamplingParams& p : {plain(77, 20), plain(3, 20)}) {
    ASSERT_TRUE(device_sampleable(p));
    ASSERT_FALSE(device_sampleable(on_host(p)));
    LLMEngine engine(model, test_config());
    const auto device = engine.generate({prompt}, p).at(0).outputs.at(0).token_ids;
    const auto host = engine.generate({prompt}, on_host(p)).at(0).outputs.at(0).token_ids;
    ASSERT_EQ(device.size(), 20u);
    EXPECT_EQ(host, device);
    // Independently: the scheme derived in common/sampling_reference.h (not kernels::sample,
    // which on a CPU build is the very row function both samplers call) over the model's own
    // logits of each prefix, keyed by (seed, output index).
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), device.begin(), device.end() - 1);
    const Tensor logits = score_tokens(model, seq);
    const int64_t V = model.vocab_size(), P = static_cast<int64_t>(prompt.size());
    RefSamplingParams r;
    r.temperature = static_cast<float>(p.temperature);
    r.top_p = static_cast<float>(p.top_p);
    r.top_k = p.top_k;
    r.min_p = static_cast<float>(p.min_p);
    r.seed = static_cast<uint64_t>(*p.seed);
    std::set<int32_t> distinct(device.begin(), device.end());
    for (size_t i = 0; i < device.size(); ++i) {
      r.step = i;
      const float* row = logits.ptr<float>() + (P - 1 + static_cast<int64_t>(i)) * V;
      EXPECT_EQ(device[i], reference_sample(row, V, r)) << "token " << i << " of vocab " << V;
    }
    EXPECT_GE(distinct.size(), 10u) << "a seeded run at temperature 0.8 should vary";
    expect_engine_idle(engine);
  }
}

TEST(EngineSampling, TokensDoNotDependOnWhichSamplerTheNeighboursNeed) {
  Model& model = fixture_model("llama3_gqa");
  const std::vector<int32_t> prompt = prompt_of(35, 29);
  const SamplingParams p = plain(2024, 18);
  LLMEngine alone_engine(model, test_config());
  const auto alone = alone_engine.generate({prompt}, p).at(0).outputs.at(0).token_ids;
  ASSERT_EQ(alone.size(), 18u);

  // Neighbours of every kind: greedy and plain (device), penalties, logprobs, prompt_logprobs,
  // min_tokens with stop ids (host); the request itself on either side.
  Workload w = random_workload(24, 60, 14, model.vocab_size(), 12);
  for (size_t i = 0; i < w.params.size(); ++i) {
    const int max_tokens = w.params[i].max_tokens;
    switch (i % 6) {
      case 0:
        w.params[i] = plain(static_cast<int64_t>(i), max_tokens);
        break;
      case 1:
        w.params[i] = seeded(static_cast<int64_t>(i), max_tokens);
        break;
      case 2:
        w.params[i].logprobs = 2;
        break;
      case 3:
        w.params[i].prompt_logprobs = 1;
        break;
      case 4:
        w.params[i] = plain(static_cast<int64_t>(i), max_tokens);
        w.params[i].min_tokens = max_tokens / 2;
        w.params[i].stop_token_ids = {5, 6};
        break;
      default:
        break;  // greedy
    }
  }
  w.prompts.insert(w.prompts.begin() + 5, prompt);
  w.params.insert(w.params.begin() + 5, p);
  w.prompts.insert(w.prompts.begin() + 17, prompt);
  w.params.insert(w.params.begin() + 17, on_host(p));

  EngineConfig chunked = test_config();
  chunked.max_num_seqs = 5;
  chunked.max_num_batched_tokens = 16;
  EngineConfig preempt = test_config();
  preempt.max_model_len = 112;
  preempt.num_gpu_blocks_override = 10;
  preempt.max_num_seqs = 8;
  preempt.max_num_batched_tokens = 40;
  for (const EngineConfig& c : {test_config(), chunked, preempt}) {
    LLMEngine engine(model, c);
    const auto out = engine.generate(w.prompts, w.params);
    EXPECT_EQ(out[5].outputs.at(0).token_ids, alone);
    EXPECT_EQ(out[17].outputs.at(0).token_ids, alone);
    if (c.num_gpu_blocks_override) {
      EXPECT_GT(engine.stats().num_preemptions, 0);
    }
    expect_engine_idle(engine);
  }
}

TEST(EngineSampling, MinTokensMovesARequestBetweenSamplersWithoutChangingItsDraws) {
  // While min_tokens suppresses its stop ids a request is sampled on the host; afterwards on the
  // device. Masking ids that would not have been drawn leaves a filterless Gumbel-max draw
  // unchanged, so the tokens are those of the unmasked request until the first stop id.
  Model& model = fixture_model("llama3_gqa");
  const std::vector<int32_t> prompt = prompt_of(21, 71);
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 31;
  p.max_tokens = 24;
  p.ignore_eos = true;
  LLMEngine engine(model, test_config());
  const auto free = engine.generate({prompt}, p).at(0).outputs.at(0).token_ids;
  ASSERT_EQ(free.size(), 24u);
  // The first id that appears at index >= 8 and not before it.
  size_t j = 8;
  while (j < free.size() && std::find(free.begin(), free.begin() + j, free[j]) != free.begin() + j)
    ++j;
  ASSERT_LT(j, free.size()) << "no fresh token after index 8 in this draw";
  SamplingParams q = p;
  q.min_tokens = 8;
  q.stop_token_ids = {free[j]};
  const auto out = engine.generate({prompt}, q).at(0).outputs.at(0);
  EXPECT_EQ(out.token_ids, std::vector<int32_t>(free.begin(), free.begin() + j + 1));
  EXPECT_EQ(out.finish_reason, FinishReason::kStop);
  EXPECT_EQ(std::get<int32_t>(out.stop_reason), free[j]);
  expect_engine_idle(engine);
}

TEST(EngineSampling, ParallelSamplesShareThePromptAndMatchSeedPlusIndex) {
  Model& model = fixture_model("llama3_gqa");
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(3 + (i * 37) % 900);
  LLMEngine engine(model, test_config());
  SamplingParams p = seeded(500, 10);
  p.n = 3;
  const auto out = engine.generate({prompt}, p).at(0);
  ASSERT_EQ(out.outputs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    SamplingParams single = seeded(500 + i, 10);
    EXPECT_EQ(out.outputs[i].index, i);
    EXPECT_EQ(out.outputs[i].token_ids,
              engine.generate({prompt}, single).at(0).outputs.at(0).token_ids)
        << "sample " << i;
    if (i > 0) {
      EXPECT_EQ(out.outputs[i].num_cached_tokens, 32) << "the prompt's full blocks are shared";
    }
  }
  EXPECT_NE(out.outputs[0].token_ids, out.outputs[1].token_ids);
  // The same with every sample drawn on the device.
  SamplingParams d = plain(900, 10);
  d.n = 3;
  const auto dout = engine.generate({prompt}, d).at(0);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(dout.outputs.at(i).token_ids,
              engine.generate({prompt}, plain(900 + i, 10)).at(0).outputs.at(0).token_ids)
        << "device sample " << i;
  SamplingParams g = greedy(8);
  g.n = 4;
  const auto gout = engine.generate({prompt}, g).at(0);
  const auto want = generate_greedy(model, prompt, 8, {}, true).token_ids;
  for (const auto& c : gout.outputs) EXPECT_EQ(c.token_ids, want);
  expect_engine_idle(engine);
}

TEST(EngineSampling, LogprobsEqualLogSoftmaxOfTheModelsLogits) {
  Model& model = fixture_model("llama3_gqa");
  const int64_t V = model.vocab_size();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 37; ++i) prompt.push_back(3 + (i * 101) % 997);
  SamplingParams p = seeded(8, 12);
  p.logprobs = 5;
  p.prompt_logprobs = 3;
  // Chunked and crowded, so prompt rows arrive over several steps and share batches.
  EngineConfig c = test_config();
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 9;
  LLMEngine engine(model, c);
  Workload w = random_workload(6, 30, 8, V, 3);
  w.prompts.insert(w.prompts.begin() + 2, prompt);
  w.params.insert(w.params.begin() + 2, p);
  const RequestOutput o = engine.generate(w.prompts, w.params).at(2);
  const CompletionOutput& out = o.outputs.at(0);
  ASSERT_EQ(out.logprobs.size(), out.token_ids.size());

  std::vector<int32_t> all = prompt;
  all.insert(all.end(), out.token_ids.begin(), out.token_ids.end() - 1);
  const Tensor logits = score_tokens(model, all);  // [T, V], the model's own forward
  const int P = static_cast<int>(prompt.size());
  for (size_t i = 0; i < out.token_ids.size(); ++i)
    expect_logprob_matches(out.logprobs[i], logits.ptr<float>() + (P - 1 + i) * V, V,
                           out.token_ids[i], 5, "output " + std::to_string(i));
  ASSERT_EQ(o.prompt_logprobs.size(), prompt.size());
  EXPECT_FALSE(o.prompt_logprobs[0].has_value());
  for (int j = 1; j < P; ++j) {
    ASSERT_TRUE(o.prompt_logprobs[j].has_value()) << j;
    expect_logprob_matches(*o.prompt_logprobs[j], logits.ptr<float>() + (j - 1) * V, V, prompt[j],
                           3, "prompt " + std::to_string(j));
  }
  // A second identical request is scored again (no cache hit may skip its prompt rows).
  const RequestOutput o2 = engine.generate({prompt}, p).at(0);
  for (int j = 1; j < P; ++j)
    EXPECT_EQ(o2.prompt_logprobs[j]->logprob, o.prompt_logprobs[j]->logprob);
  expect_engine_idle(engine);
}

// Detokenizer where token t is the t-th piece: short strings, so stop strings span tokens.
std::vector<std::string> fake_pieces(int64_t V) {
  static const std::vector<std::string> syll = {"a", "be", "cid", "o", "r", "st", "u ", "xy"};
  std::vector<std::string> pieces;
  for (int64_t t = 0; t < V; ++t) {
    std::string s = syll[static_cast<size_t>(t % 8)];
    s.append(syll[static_cast<size_t>((t / 8) % 8)]);
    pieces.push_back(std::move(s));
  }
  return pieces;
}

TEST(EngineSampling, StopStringsSplitAcrossTokens) {
  Model& model = fixture_model("llama3_gqa");
  const auto pieces = fake_pieces(model.vocab_size());
  std::vector<int32_t> prompt = {1, 50, 60, 70, 80};
  const auto full = generate_greedy(model, prompt, 20, {}, true).token_ids;
  std::vector<size_t> ends;  // text length after each token
  std::string text;
  for (int32_t t : full) ends.push_back((text += pieces[t]).size());
  // A stop string made of the last character of token 3 and the first two of token 4.
  const std::string stop = text.substr(ends[3] - 1, 3);
  const size_t pos = text.find(stop);
  size_t k = 0;
  while (ends[k] < pos + stop.size()) ++k;  // the token that completes the first match

  LLMEngine engine(model, test_config(), {}, piece_text_stream_factory(pieces));
  SamplingParams p = greedy(20);
  p.stop = {"never-there", stop};
  auto out = engine.generate({prompt}, p).at(0).outputs.at(0);
  EXPECT_EQ(out.finish_reason, FinishReason::kStop);
  EXPECT_EQ(std::get<std::string>(out.stop_reason), stop);
  EXPECT_EQ(out.text, text.substr(0, pos));
  EXPECT_EQ(out.token_ids, std::vector<int32_t>(full.begin(), full.begin() + k + 1));
  p.include_stop_str_in_output = true;
  out = engine.generate({prompt}, p).at(0).outputs.at(0);
  EXPECT_EQ(out.text, text.substr(0, pos + stop.size()));
  // Without a stop, the text is every piece.
  out = engine.generate({prompt}, greedy(20)).at(0).outputs.at(0);
  EXPECT_EQ(out.text, text);
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
  // Stop strings need a detokenizer.
  LLMEngine plain(model, test_config());
  EXPECT_THROW(plain.add_request("x", prompt, p), Error);
}

TEST(EngineSampling, AbortAtEveryStageFreesEverything) {
  Model& model = fixture_model("qwen3_sliding");
  EngineConfig c = test_config();
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 16;
  LLMEngine engine(model, c);
  Workload w = random_workload(10, 60, 30, model.vocab_size(), 9);
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    w.params[i].max_tokens = 30;
    engine.add_request(fmt::format("r{}", i), w.prompts[i], w.params[i]);
  }
  for (int i = 0; i < 6; ++i) engine.step();
  EXPECT_GT(engine.scheduler().num_running(), 0);
  EXPECT_GT(engine.scheduler().num_waiting(), 0);
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    auto o = engine.abort(fmt::format("r{}", i));
    ASSERT_TRUE(o.has_value()) << i;
    EXPECT_EQ(o->outputs.at(0).finish_reason, FinishReason::kAbort);
  }
  EXPECT_FALSE(engine.abort("r0").has_value());
  expect_engine_idle(engine);
  // Still serves correctly afterwards.
  EXPECT_EQ(engine.generate({w.prompts[0]}, greedy(5)).at(0).outputs.at(0).token_ids,
            generate_greedy(model, w.prompts[0], 5, {}, true).token_ids);
}

TEST(EngineSampling, BadRequestsAndConfigurationsFailNamingTheProblem) {
  Model& model = fixture_model("llama3_gqa");
  LLMEngine engine(model, test_config());
  auto msg = [&](const std::vector<int32_t>& prompt, const SamplingParams& p) -> std::string {
    try {
      engine.add_request("bad", prompt, p);
    } catch (const Error& e) {
      return e.what();
    }
    engine.abort("bad");
    return "";
  };
  SamplingParams p = greedy(4);
  p.top_p = 1.5;
  EXPECT_EQ(msg({1, 2}, p), "top_p must be in (0, 1], got 1.5");
  EXPECT_NE(msg({1, 5000}, greedy(4)).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(msg({}, greedy(4)).find("empty"), std::string::npos);
  EXPECT_NE(msg(std::vector<int32_t>(300, 1), greedy(4)).find("maximum model length of 256"),
            std::string::npos);
  engine.add_request("dup", {1, 2}, greedy(1));
  EXPECT_THROW(engine.add_request("dup", {1, 2}, greedy(1)), Error);
  engine.abort("dup");
  expect_engine_idle(engine);

  EngineConfig tiny = test_config();
  tiny.kv_cache_memory = 100000;  // ~8 blocks of 12 KiB; 256 tokens need 16
  try {
    LLMEngine e(model, tiny);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("max_model_len 256"), std::string::npos) << m;
    EXPECT_NE(m.find("needs 16 blocks"), std::string::npos) << m;
    EXPECT_NE(m.find("100000"), std::string::npos) << m;
  }
  EngineConfig too_long = test_config();
  too_long.max_model_len = 100000;
  EXPECT_THROW(LLMEngine(model, too_long), Error);
}

TEST(EngineSampling, MaxTokensZeroScoresThePromptOnly) {
  Model& model = fixture_model("llama3_gqa");
  LLMEngine engine(model, test_config());
  SamplingParams p = greedy(0);
  auto o = engine.generate({{4, 5, 6}}, p).at(0);
  EXPECT_TRUE(o.outputs.at(0).token_ids.empty());
  EXPECT_EQ(o.outputs[0].finish_reason, FinishReason::kLength);
  p.prompt_logprobs = 0;
  o = engine.generate({{4, 5, 6}}, p).at(0);
  EXPECT_TRUE(o.outputs.at(0).token_ids.empty());
  ASSERT_EQ(o.prompt_logprobs.size(), 3u);
  EXPECT_TRUE(o.prompt_logprobs[2].has_value());
  expect_engine_idle(engine);
}

}  // namespace
}  // namespace atom::test

namespace atom::test {
namespace {

// Structured output through the engine: a grammar over a vocabulary whose first 256 ids are the
// bytes. Greedy picks, at every step, the most likely token the grammar allows (checked against
// the model's own logits and a per-token grammar check), a sampled run stays inside the grammar,
// the output ends (finish "stop") once the grammar is complete, and an unconstrained neighbour's
// tokens are the ones it draws alone.
TEST(EngineStructured, GrammarConstrainsEveryDraw) {
  Model& model = fixture_model("llama3_gqa");
  const int64_t V = model.vocab_size();
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(V));
  for (int b = 0; b < 256 && b < V; ++b)
    bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
  auto trie = std::make_shared<const grammar::TokenTrie>(bytes);
  auto g = std::make_shared<const grammar::Grammar>(grammar::Grammar::from_gbnf(
      "root ::= \"{\\\"n\\\": \" [0-9]{1,3} \", \\\"ok\\\": \" ( \"true\" | \"false\" ) \"}\"\n"));
  auto constraint = std::make_shared<const grammar::GrammarConstraint>(g, trie);
  const std::vector<int32_t> prompt = prompt_of(17, 31), other = prompt_of(23, 41);

  SamplingParams free_run = greedy(12);
  free_run.ignore_eos = true;
  LLMEngine alone_engine(model, test_config());
  const auto alone = alone_engine.generate({other}, free_run).at(0).outputs.at(0).token_ids;

  for (bool sampled : {false, true}) {
    SamplingParams p = sampled ? seeded(5, 64) : greedy(64);
    p.repetition_penalty = 1.0, p.presence_penalty = 0, p.frequency_penalty = 0;
    p.constraint = constraint;
    LLMEngine engine(model, test_config());
    const auto outs = engine.generate({prompt, other}, std::vector<SamplingParams>{p, free_run});
    const auto& got = outs.at(0).outputs.at(0);
    EXPECT_EQ(got.finish_reason, FinishReason::kStop);
    std::string text;
    for (int32_t t : got.token_ids) {
      ASSERT_LT(t, 256) << "a token without text was drawn";
      text.push_back(static_cast<char>(t));
    }
    grammar::Matcher whole(g);
    EXPECT_TRUE(whole.accept_bytes(text) && whole.accepting()) << text;
    EXPECT_EQ(outs.at(1).outputs.at(0).token_ids, alone) << "the neighbour's draws changed";
    if (!sampled) {
      // Each greedy token is the argmax of the model's logits over what the grammar allows.
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), got.token_ids.begin(), got.token_ids.end() - 1);
      const Tensor logits = score_tokens(model, seq);
      grammar::Matcher m(g);
      for (size_t i = 0; i < got.token_ids.size(); ++i) {
        const float* row = logits.ptr<float>() +
                           (static_cast<int64_t>(prompt.size()) - 1 + static_cast<int64_t>(i)) * V;
        int32_t best = -1;
        for (int32_t t = 0; t < 256; ++t) {
          grammar::Matcher c = m;
          if (c.accept_bytes(std::string(1, static_cast<char>(t))) &&
              (best < 0 || row[t] > row[best]))
            best = t;
        }
        EXPECT_EQ(got.token_ids[i], best) << "step " << i;
        ASSERT_TRUE(m.accept_bytes(std::string(1, static_cast<char>(got.token_ids[i]))));
      }
    }
    expect_engine_idle(engine);
  }
}

// Many constrained rows in one step: their masks are computed in parallel, and each request's
// output is what it decodes alone (sampled with its own seed), every one a sentence.
TEST(EngineStructured, ManyConstrainedRowsAtOnceDecodeAsAlone) {
  Model& model = fixture_model("llama3_gqa");
  const int64_t V = model.vocab_size();
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(V));
  for (int b = 0; b < 256 && b < V; ++b)
    bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
  auto trie = std::make_shared<const grammar::TokenTrie>(bytes);
  auto g = std::make_shared<const grammar::Grammar>(grammar::Grammar::from_gbnf(
      "root ::= \"[\" ( [a-z]{1,4} ( \",\" [a-z]{1,4} ){0,3} )? \"]\"\n"));
  auto constraint = std::make_shared<const grammar::GrammarConstraint>(g, trie);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(prompt_of(13 + i, 27 + 2 * i));
    SamplingParams p = seeded(100 + i, 48);
    p.repetition_penalty = 1.0, p.presence_penalty = 0, p.frequency_penalty = 0;
    p.constraint = constraint;
    params.push_back(p);
  }
  LLMEngine engine(model, test_config());
  const auto together = engine.generate(prompts, params);
  for (size_t i = 0; i < prompts.size(); ++i) {
    LLMEngine one(model, test_config());
    const auto alone = one.generate({prompts[i]}, params[i]).at(0).outputs.at(0);
    const auto& got = together.at(i).outputs.at(0);
    EXPECT_EQ(got.token_ids, alone.token_ids) << "request " << i;
    EXPECT_EQ(got.finish_reason, FinishReason::kStop) << "request " << i;
    std::string text;
    for (int32_t t : got.token_ids) text.push_back(static_cast<char>(t));
    grammar::Matcher whole(g);
    EXPECT_TRUE(whole.accept_bytes(text) && whole.accepting()) << text;
  }
  expect_engine_idle(engine);
}

// A constrained row is drawn where its logits are, under its mask (kernels::mask_logits), unless
// it asks for something only the host sampler does; then the host sampler applies the same mask.
// Both must draw the same tokens: a `logit_bias` of 0 moves the same requests to the host path.
TEST(EngineStructured, DeviceAndHostMaskedDrawsAgree) {
  Model& model = fixture_model("llama3_gqa");
  const int64_t V = model.vocab_size();
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(V));
  for (int b = 0; b < 256 && b < V; ++b)
    bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
  auto trie = std::make_shared<const grammar::TokenTrie>(bytes);
  auto g = std::make_shared<const grammar::Grammar>(
      grammar::Grammar::from_gbnf("root ::= \"(\" [a-z0-9 ]{2,24} \")\"\n"));
  auto constraint = std::make_shared<const grammar::GrammarConstraint>(g, trie);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> device, host;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(prompt_of(7 + i, 19 + 3 * i));
    SamplingParams p = i % 2 ? seeded(40 + i, 40) : greedy(40);
    p.repetition_penalty = 1.0, p.presence_penalty = 0, p.frequency_penalty = 0;
    p.constraint = constraint;
    ASSERT_TRUE(device_sampleable(p));
    device.push_back(p);
    p.logit_bias.push_back({300, 0.0f});
    ASSERT_FALSE(device_sampleable(p));
    host.push_back(p);
  }
  LLMEngine a(model, test_config()), b(model, test_config());
  const auto on_device = a.generate(prompts, device), on_host = b.generate(prompts, host);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& got = on_device.at(i).outputs.at(0);
    EXPECT_EQ(got.token_ids, on_host.at(i).outputs.at(0).token_ids) << "request " << i;
    EXPECT_EQ(got.finish_reason, FinishReason::kStop) << "request " << i;
    std::string text;
    for (int32_t t : got.token_ids) text.push_back(static_cast<char>(t));
    grammar::Matcher whole(g);
    EXPECT_TRUE(whole.accept_bytes(text) && whole.accepting()) << "request " << i << ": " << text;
  }
  expect_engine_idle(a);
  expect_engine_idle(b);
}

}  // namespace
}  // namespace atom::test
