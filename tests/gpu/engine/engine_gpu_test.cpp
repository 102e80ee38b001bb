// The engine on the GPU: the KV cache sized from GPU memory, tokens drawn on the device agreeing
// with the CPU sampler on the same logits, and steps that mix device-sampled rows with rows the
// host needs (logprobs, penalties, prompt logprobs), structured-output rows masked on the device
// included.
#include <gtest/gtest.h>

#include <cstdio>

#include "common/fixtures.h"
#include "engine/llm_engine.h"
#include "engine/sequence_runner.h"
#include "grammar/matcher.h"
#include "gpu_util.h"
#include "models/loading.h"

namespace atom::test {
namespace {

EngineConfig gpu_config() {
  EngineConfig c;
  c.max_model_len = 256;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 512;
  c.gpu_memory_utilization = 0.5;
  return c;
}

SamplingParams plain(int64_t seed) {
  SamplingParams p;
  p.temperature = 0.8;
  p.top_p = 0.95;
  p.top_k = 60;
  p.seed = seed;
  p.max_tokens = 16;
  p.ignore_eos = true;
  return p;
}

std::vector<int32_t> prompt_of(int len, int mul) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(3 + (i * mul) % 900);
  return p;
}

TEST(GpuEngine, SizesTheKvCacheFromGpuMemory) {
  LoadedModel m = model_load(fixture_dir("llama3_gqa"), on_gpu());
  LLMEngine e(*m.model, gpu_config());
  EXPECT_TRUE(e.kv_plan().from_gpu_memory);
  EXPECT_GE(static_cast<int64_t>(e.kv_plan().num_blocks) * e.kv_plan().block_size, 256);
  EXPECT_EQ(e.block_manager().num_blocks(), e.kv_plan().num_blocks);
  // Bytes given explicitly are honoured on CUDA too.
  EngineConfig bytes = gpu_config();
  bytes.kv_cache_memory = int64_t{64} << 20;
  LLMEngine b(*m.model, bytes);
  EXPECT_FALSE(b.kv_plan().from_gpu_memory);
  EXPECT_EQ(static_cast<size_t>(b.kv_plan().num_blocks),
            std::min<size_t>((size_t{64} << 20) / b.kv_plan().block_bytes, 8 * 16));
}

TEST(GpuEngine, DeviceAndHostSamplersAgreeAndStepsMixThem) {
  LoadedModel m = model_load(fixture_dir("llama3_gqa"), on_gpu());
  for (bool eager : {false, true}) {
    EngineConfig c = gpu_config();
    c.enforce_eager = eager;
    LLMEngine e(*m.model, c);
    EXPECT_EQ(e.config().enforce_eager, eager);
    const std::vector<int32_t> prompt = prompt_of(37, 41);
    const auto device = e.generate({prompt}, plain(9)).at(0).outputs.at(0).token_ids;
    SamplingParams host = plain(9);
    host.logprobs = 0;  // the same draw, on the CPU sampler
    host.logit_bias = {{11, 0.0f}};
    EXPECT_EQ(e.generate({prompt}, host).at(0).outputs.at(0).token_ids, device);

    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> params;
    for (int i = 0; i < 8; ++i) {
      prompts.push_back(prompt_of(10 + 7 * i, 13 + i));
      SamplingParams p = plain(100 + i);
      if (i % 4 == 1) p.logprobs = 3;
      if (i % 4 == 2) p.repetition_penalty = 1.3;
      if (i % 4 == 3) p.prompt_logprobs = 2;
      params.push_back(p);
    }
    const auto outs = e.generate(prompts, params);
    for (int i = 0; i < 8; ++i) {
      const auto& out = outs[i].outputs.at(0);
      EXPECT_EQ(out.token_ids.size(), 16u) << i;
      for (int32_t t : out.token_ids) EXPECT_TRUE(t >= 0 && t < m.model->vocab_size()) << i;
      if (i % 4 == 1) {
        ASSERT_EQ(out.logprobs.size(), 16u);
        for (size_t k = 0; k < 16; ++k) EXPECT_EQ(out.logprobs[k].token_id, out.token_ids[k]);
      }
      if (i % 4 == 3) {
        EXPECT_EQ(outs[i].prompt_logprobs.size(), prompts[i].size());
      }
    }
    EXPECT_EQ(e.block_manager().num_free_blocks(), e.block_manager().num_blocks());
  }
}

// --kv-cache-dtype fp8 on CUDA: the same memory holds twice the blocks, and a greedy batch of
// mixed prompt lengths runs through prefill, chunked steps and graph decode over the FP8 cache.
// (Token-for-token agreement with the single-sequence runner is printed, not required: batched
// GEMMs round keys differently in the last bit, which moves an e4m3 code now and then, and these
// small random models have many near-tied steps; tests/gpu/models/model_gpu_test.cpp checks
// logits.)
TEST(GpuEngine, Fp8KvCacheHoldsTwiceTheBlocks) {
  LoadedModel m = model_load(fixture_dir("llama3_gqa"), on_gpu());
  int bf16_blocks = 0;
  {
    LLMEngine e(*m.model, gpu_config());
    EXPECT_EQ(e.kv_plan().kv_cache_dtype, DType::kBF16);
    bf16_blocks = e.kv_plan().num_blocks;
  }
  EngineConfig c = gpu_config();
  c.kv_cache_dtype = "fp8";
  c.max_num_batched_tokens = 64;  // chunked prefill steps mixed with decodes
  LLMEngine e(*m.model, c);
  EXPECT_EQ(e.kv_plan().kv_cache_dtype, DType::kF8E4M3);
  EXPECT_EQ(e.kv_plan().block_bytes * 2, KvCache::page_bytes(m.model->cache_specs(), 16));
  const double ratio = static_cast<double>(e.kv_plan().num_blocks) / bf16_blocks;
  EXPECT_GT(ratio, 1.9) << e.kv_plan().num_blocks << " vs " << bf16_blocks;
  EXPECT_LT(ratio, 2.1) << e.kv_plan().num_blocks << " vs " << bf16_blocks;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(prompt_of(5 + 23 * i, 17 + i));
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 12;
    p.ignore_eos = true;
    params.push_back(p);
  }
  const auto outs = e.generate(prompts, params);
  int same = 0;
  for (int i = 0; i < 8; ++i) {
    const auto& got = outs[i].outputs.at(0).token_ids;
    ASSERT_EQ(got.size(), 12u) << i;
    for (int32_t t : got) EXPECT_TRUE(t >= 0 && t < m.model->vocab_size()) << i;
    same +=
        got == generate_greedy(*m.model, prompts[i], 12, {}, true, 16, DType::kF8E4M3).token_ids;
  }
  std::printf("fp8 engine: %d of 8 requests equal the single-sequence runner's tokens\n", same);
  EXPECT_EQ(e.block_manager().num_free_blocks(), e.block_manager().num_blocks());
}

// Structured output on the GPU: a constrained row is masked and drawn on the device
// (kernels::mask_logits, then kernels::sample), with graphs and eagerly. A `logit_bias` of 0 sends
// the same requests to the host sampler, which applies the same mask to the same logits, so the
// tokens must be identical; every output is a sentence of the grammar and ends when it does.
TEST(GpuEngine, ConstrainedRowsDrawOnTheDeviceAsOnTheHost) {
  LoadedModel m = model_load(fixture_dir("llama3_gqa"), on_gpu());
  const int64_t V = m.model->vocab_size();
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(V));
  for (int b = 0; b < 256 && b < V; ++b)
    bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
  auto trie = std::make_shared<const grammar::TokenTrie>(bytes);
  auto g = std::make_shared<const grammar::Grammar>(
      grammar::Grammar::from_gbnf("root ::= \"(\" [a-z0-9 ]{2,24} \")\"\n"));
  auto constraint = std::make_shared<const grammar::GrammarConstraint>(g, trie);
  for (bool eager : {false, true}) {
    EngineConfig c = gpu_config();
    c.enforce_eager = eager;
    c.kv_cache_memory = int64_t{64} << 20;  // two engines at once
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> device, host;
    for (int i = 0; i < 6; ++i) {
      prompts.push_back(prompt_of(9 + 5 * i, 17 + i));
      SamplingParams p = plain(200 + i);
      p.ignore_eos = false;
      p.max_tokens = 40;
      if (i % 3 == 0) p.temperature = 0.0;
      p.constraint = constraint;
      device.push_back(p);
      p.logit_bias = {{11, 0.0f}};
      host.push_back(p);
    }
    // An unconstrained neighbour in the same steps as the device-masked rows.
    prompts.push_back(prompt_of(21, 29));
    device.push_back(plain(7));
    host.push_back(plain(7));
    LLMEngine a(*m.model, c), b(*m.model, c);
    const auto on_device = a.generate(prompts, device), on_host = b.generate(prompts, host);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto& got = on_device.at(i).outputs.at(0);
      EXPECT_EQ(got.token_ids, on_host.at(i).outputs.at(0).token_ids)
          << "request " << i << " eager " << eager;
      if (i + 1 == prompts.size()) continue;
      EXPECT_EQ(got.finish_reason, FinishReason::kStop) << "request " << i;
      std::string text;
      for (int32_t t : got.token_ids) text.push_back(static_cast<char>(t));
      grammar::Matcher whole(g);
      EXPECT_TRUE(whole.accept_bytes(text) && whole.accepting()) << "request " << i << ": " << text;
    }
    EXPECT_EQ(a.block_manager().num_free_blocks(), a.block_manager().num_blocks());
  }
}

}  // namespace
}  // namespace atom::test
