// The `atom generate` and `atom bench` command lines, run as a user (and acceptance checks) would:
// --prompt-tokens ... --json keeps printing exactly {prompt_token_ids, token_ids, finish_reason}
// per prompt with the fixture's transformers greedy tokens; JSONL input and bench JSON work; the
// prefix-cache TTFT bench shares exactly the prefix's full blocks.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <utility>

#include "common/fixtures.h"
#include "common/nodes_util.h"
#include "common/test_util.h"
#include "engine/sequence_runner.h"
#include "loader/safetensors.h"
#include "models/loading.h"

namespace atom::test {
namespace {

// Runs the atom binary; returns stdout lines (stderr carries logs; with_stderr: its lines too).
// `prefix`: what the shell runs the program under (variables, a launcher).
std::vector<std::string> run_atom(const std::string& args, int* status = nullptr,
                                  bool with_stderr = false, const std::string& prefix = "") {
  const std::string cmd = fmt::format("{} {}/atom {} {}", prefix, ATOM_BINARY_DIR, args,
                                      with_stderr ? "2>&1" : "2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (p && fgets(buf, sizeof buf, p)) out += buf;
  const int rc = p ? pclose(p) : -1;
  if (status) *status = rc;
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::string join(const std::vector<int32_t>& v) { return fmt::format("{}", fmt::join(v, ",")); }

TEST(EngineCli, GeneratePromptTokensJsonMatchesTransformers) {
  const Reference ref = reference_load("llama3_gqa");
  const auto lines = run_atom(
      fmt::format("generate --model {} --prompt-tokens {} --prompt-tokens 1,2,3 --max-tokens {} "
                  "--temperature 0 "
                  "--ignore-eos --json",
                  fixture_dir("llama3_gqa"), join(ref.greedy_prompt), ref.greedy_tokens.size()));
  ASSERT_EQ(lines.size(), 2u);
  const auto j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j.size(), 3u) << lines[0];
  EXPECT_EQ(j.at("prompt_token_ids").get<std::vector<int32_t>>(), ref.greedy_prompt);
  EXPECT_EQ(j.at("token_ids").get<std::vector<int32_t>>(), ref.greedy_tokens);
  EXPECT_EQ(j.at("finish_reason"), "length");
  EXPECT_EQ(nlohmann::json::parse(lines[1]).at("prompt_token_ids").get<std::vector<int32_t>>(),
            (std::vector<int32_t>{1, 2, 3}));
  // Without --json: the generated ids, comma-separated.
  const auto plain = run_atom(fmt::format(
      "generate --model {} --prompt-tokens {} --max-tokens 16 --temperature 0 --ignore-eos",
      fixture_dir("llama3_gqa"), join(ref.greedy_prompt)));
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0], join(ref.greedy_tokens));
}

// --speculative-config reaches generate and bench: the same tokens as without it (greedy), the
// drafter's counters in bench's JSON, and bad configurations refused by name.
TEST(EngineCli, SpeculativeConfigForGenerateAndBench) {
  const std::string model = fixture_dir("deepseek_v3_mtp");
  const std::string gen = fmt::format(
      "generate --model {} --prompt-tokens 5,6,7,8,9 --prompt-tokens 300,2,41 --max-tokens 14 "
      "--temperature 0 --ignore-eos",
      model);
  const auto plain = run_atom(gen);
  ASSERT_EQ(plain.size(), 2u);
  for (int k = 1; k <= 4; ++k)
    EXPECT_EQ(
        run_atom(gen + fmt::format(" --speculative-config "
                                   "'{{\"method\": \"mtp\", \"num_speculative_tokens\": {}}}'",
                                   k)),
        plain)
        << "K = " << k;
  // Over two tensor-parallel ranks and over two pipeline stages: the drafter whole on the leader.
  EXPECT_EQ(run_atom(gen + " -tp 2 --speculative-config "
                           "'{\"method\": \"mtp\", \"num_speculative_tokens\": 2}'"),
            plain)
      << "tp 2";
  EXPECT_EQ(run_atom(gen + " -pp 2 --speculative-config "
                           "'{\"method\": \"mtp\", \"num_speculative_tokens\": 2}'"),
            plain)
      << "pp 2";
  TempDir dir;
  const std::string out = dir.file("bench.json");
  int rc = 0;
  run_atom(
      fmt::format("bench throughput --model {} --input-len 12 --output-len 9 --num-prompts 3 "
                  "--speculative-config '{{\"method\": \"mtp\", \"num_speculative_tokens\": 2}}' "
                  "--spec-decode-acceptance-rate 1 --output-json {}",
                  model, out),
      &rc);
  EXPECT_EQ(rc, 0);
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(out));
  EXPECT_EQ(j.at("total_output_tokens"), 3 * 9);
  EXPECT_GT(j.at("spec_decode_num_draft_tokens").get<int64_t>(), 0);
  EXPECT_EQ(j.at("spec_decode_num_accepted_tokens"), j.at("spec_decode_num_draft_tokens"));
  EXPECT_GT(j.at("spec_decode_mean_acceptance_length").get<double>(), 2.0);
  for (const char* bad : {R"('{"method": "mtp", "num_speculative_tokens": 0}')",
                          R"('{"method": "ngram", "num_speculative_tokens": 2}')"}) {
    run_atom(gen + " --speculative-config " + bad, &rc);
    EXPECT_NE(rc, 0) << bad;
  }
  run_atom(fmt::format("generate --model {} --prompt-tokens 5 --speculative-config "
                       "'{{\"method\": \"mtp\", \"num_speculative_tokens\": 2}}'",
                       fixture_dir("llama3_gqa")),
           &rc);
  EXPECT_NE(rc, 0) << "a target without a drafter";
}

// vLLM's pipeline flags: -pp 2 (and --pipeline-parallel-size 3 with -tp 2), vLLM's even split
// or VLLM_PP_LAYER_PARTITION's, each giving transformers' greedy tokens and logging the stages'
// layers; a partition that does not fit, or is not a list of counts, refused by name.
TEST(EngineCli, PipelineParallelFlagsAndLayerPartition) {
  const Reference ref = reference_load("llama3_gqa");  // 3 layers
  const std::string gen = fmt::format(
      "generate --model {} --prompt-tokens {} --max-tokens {} --temperature 0 --ignore-eos",
      fixture_dir("llama3_gqa"), join(ref.greedy_prompt), ref.greedy_tokens.size());
  struct Case {
    const char* partition;  // VLLM_PP_LAYER_PARTITION, or null
    std::string flags, log;
  };
  for (const Case& c : {Case{nullptr, " -pp 2", "2 pipeline stages (layers [0, 2) [2, 3))"},
                        Case{"1,2", " -pp 2", "2 pipeline stages (layers [0, 1) [1, 3))"},
                        Case{nullptr, " --pipeline-parallel-size 3 -tp 2",
                             "3 pipeline stages (layers [0, 1) [1, 2) [2, 3))"}}) {
    if (c.partition) setenv("VLLM_PP_LAYER_PARTITION", c.partition, 1);  // the child inherits it
    int rc = 0;
    const auto out = run_atom(gen + c.flags, &rc, /*with_stderr=*/true);
    unsetenv("VLLM_PP_LAYER_PARTITION");
    EXPECT_EQ(rc, 0) << c.flags;
    std::string all;
    for (const auto& l : out) all += l + "\n";
    EXPECT_NE(all.find(c.log), std::string::npos) << all;
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back(), join(ref.greedy_tokens)) << c.flags;
  }
  for (const auto& [partition, message] :
       {std::pair{"1,1", "must be 2 positive layer counts adding up to the model's 3 layers"},
        std::pair{"1,x", "VLLM_PP_LAYER_PARTITION '1,x': 'x' is not a positive layer count"}}) {
    setenv("VLLM_PP_LAYER_PARTITION", partition, 1);
    int rc = 0;
    const auto out = run_atom(gen + " -pp 2", &rc, /*with_stderr=*/true);
    unsetenv("VLLM_PP_LAYER_PARTITION");
    EXPECT_NE(rc, 0) << partition;
    std::string all;
    for (const auto& l : out) all += l + "\n";
    EXPECT_NE(all.find(message), std::string::npos) << all;
  }
}

// vLLM's data-parallel flags for DeepSeek: -dp 2 (and --data-parallel-size 2 with -ep) run
// attention data-parallel over two CPU ranks, each holding every head and its own sequences' KV,
// giving transformers' greedy tokens and saying so in the load log; -dp 2 -tp 2: two groups of two
// ranks, each group's heads split over its ranks. Heads that do not split over -tp, or a model
// whose attention cannot run data-parallel, refused by name.
TEST(EngineCli, DataParallelAttentionFlags) {
  const Reference ref = reference_load("deepseek_v3");
  const std::string gen = fmt::format(
      "generate --model {} --prompt-tokens {} --max-tokens {} --temperature 0 --ignore-eos",
      fixture_dir("deepseek_v3"), join(ref.greedy_prompt), ref.greedy_tokens.size());
  for (const auto& [flags, ranks] : {std::pair{std::string(" -dp 2"), 2},
                                     std::pair{std::string(" --data-parallel-size 2 -ep"), 2},
                                     std::pair{std::string(" -dp 2 -tp 2 -ep"), 4}}) {
    int rc = 0;
    const auto out = run_atom(gen + flags, &rc, /*with_stderr=*/true);
    EXPECT_EQ(rc, 0) << flags;
    std::string all;
    for (const auto& l : out) all += l + "\n";
    EXPECT_NE(all.find(std::to_string(ranks) + " data-parallel attention"), std::string::npos)
        << all;
    EXPECT_NE(all.find("data-parallel attention, each rank"), std::string::npos) << all;
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back(), join(ref.greedy_tokens)) << flags;
  }
  const Reference llama = reference_load("llama3_gqa");
  const std::pair<std::string, const char*> bad[] = {
      {gen + " -dp 2 -tp 3", "must be a positive multiple of the tensor-parallel size 3"},
      {gen + " -dp 0", "--data-parallel-size must be at least 1, got 0"},
      {fmt::format("generate --model {} --prompt-tokens {} --max-tokens 2 -dp 2",
                   fixture_dir("llama3_gqa"), join(llama.greedy_prompt)),
       "runs attention tensor-parallel only (--data-parallel-size 2)"}};
  for (const auto& [args, message] : bad) {
    int rc = 0;
    const auto out = run_atom(args, &rc, /*with_stderr=*/true);
    EXPECT_NE(rc, 0) << args;
    std::string all;
    for (const auto& l : out) all += l + "\n";
    EXPECT_NE(all.find(message), std::string::npos) << args << ":\n" << all;
  }
}

// Two processes on one machine as two hosts (--nnodes 2 over loopback): the worker
// (--node-rank 1 --headless) runs its ranks for the head, which prints transformers' greedy
// tokens; -tp 2 puts one rank on each node, -pp 2 -tp 2 a stage on each. The worker ends when
// the head is done. A --headless head is refused by name.
TEST(EngineCli, TwoNodesOverLoopback) {
  const Reference ref = reference_load("llama3_gqa");
  const std::string gen = fmt::format(
      "generate --model {} --device cpu --prompt-tokens {} --max-tokens {} --temperature 0 "
      "--ignore-eos",
      fixture_dir("llama3_gqa"), join(ref.greedy_prompt), ref.greedy_tokens.size());
  for (const std::string parallel : {" -tp 2", " -pp 2 -tp 2"}) {
    const std::string nodes = fmt::format(" --nnodes 2 --master-port {}", free_port());
    int worker_rc = -1;
    std::vector<std::string> worker_out;
    std::thread worker([&] {
      worker_out = run_atom(gen + parallel + nodes + " --node-rank 1 --headless", &worker_rc,
                            /*with_stderr=*/true);
    });
    int rc = -1;
    const auto out = run_atom(gen + parallel + nodes + " --node-rank 0", &rc, true);
    worker.join();
    std::string all, worker_all;
    for (const auto& l : out) all += l + "\n";
    for (const auto& l : worker_out) worker_all += l + "\n";
    EXPECT_EQ(rc, 0) << all;
    EXPECT_EQ(worker_rc, 0) << worker_all;
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back(), join(ref.greedy_tokens)) << parallel;
    EXPECT_NE(worker_all.find("node 1: the head node is done"), std::string::npos) << worker_all;
  }
  int rc = 0;
  const auto out = run_atom(gen + " -tp 2 --headless", &rc, true);
  EXPECT_NE(rc, 0);
  std::string all;
  for (const auto& l : out) all += l + "\n";
  EXPECT_NE(all.find("--headless is a worker's flag"), std::string::npos) << all;
}

// Launched by mpirun as TensorRT-LLM is (Debian's Open MPI): no --nnodes, one node per MPI
// process from the launcher's environment, node 0 printing transformers' greedy tokens; and the
// launcher's variables when they cannot work (several hosts without MASTER_ADDR, a rank that is
// not a number) refused by name.
TEST(EngineCli, NodesFromAnMpiLauncher) {
  const Reference ref = reference_load("llama3_gqa");
  const std::string gen = fmt::format(
      "generate --model {} --device cpu --prompt-tokens {} --max-tokens {} --temperature 0 "
      "--ignore-eos -tp 2",
      fixture_dir("llama3_gqa"), join(ref.greedy_prompt), ref.greedy_tokens.size());
  auto text = [](const std::vector<std::string>& lines) {
    std::string all;
    for (const auto& l : lines) all += l + "\n";
    return all;
  };
  int rc = 0;
  auto out = run_atom(gen, &rc, true,
                      "OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(text(out).find("give node 0's address with --master-addr or MASTER_ADDR"),
            std::string::npos)
      << text(out);
  out = run_atom(gen, &rc, true, "OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=one");
  EXPECT_NE(rc, 0);
  EXPECT_NE(text(out).find("OMPI_COMM_WORLD_RANK='one'"), std::string::npos) << text(out);
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "mpirun is not installed (Debian's openmpi-bin; scripts/install_deps.sh "
                    "installs it for the tests)";
  out = run_atom(gen, &rc, true,
                 fmt::format("mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_PORT={}",
                             free_port()));
  EXPECT_EQ(rc, 0) << text(out);
  EXPECT_NE(text(out).find(join(ref.greedy_tokens) + "\n"), std::string::npos) << text(out);
  EXPECT_NE(text(out).find("node 1: the head node is done"), std::string::npos) << text(out);
}

// vLLM's expert-parallel flags reach the model: -tp 2 with -ep (and --enable-expert-parallel),
// with EPLB's --enable-eplb / --eplb-config re-placing every 2 steps: transformers' greedy tokens
// each way; EPLB without expert parallelism, an unknown key, a non-JSON config, a step interval
// out of range and redundant experts without --enable-eplb are refused, each naming what is wrong.
TEST(EngineCli, ExpertParallelAndEplbFlags) {
  const Reference ref = reference_load("qwen3_moe");
  const std::string gen = fmt::format(
      "generate --model {} --prompt-tokens {} --max-tokens {} --temperature 0 --ignore-eos -tp 2",
      fixture_dir("qwen3_moe"), join(ref.greedy_prompt), ref.greedy_tokens.size());
  for (const std::string& flags :
       {std::string(""), std::string(" -ep"), std::string(" --enable-expert-parallel"),
        std::string(" -ep --enable-eplb --eplb-config "
                    "'{\"num_redundant_experts\": 2, \"step_interval\": 2}'"),
        std::string(" -ep --enable-eplb --num-redundant-experts 2")}) {
    int rc = 0;
    const auto out = run_atom(gen + flags, &rc);
    EXPECT_EQ(rc, 0) << flags;
    ASSERT_EQ(out.size(), 1u) << flags;
    EXPECT_EQ(out[0], join(ref.greedy_tokens)) << flags;
  }
  const std::pair<const char*, const char*> bad[] = {
      {" --enable-eplb --num-redundant-experts 2", "--enable-eplb needs --enable-expert-parallel"},
      {" -ep --enable-eplb --eplb-config '{\"redundant\": 2}'",
       "--eplb-config: unknown key 'redundant'"},
      {" -ep --enable-eplb --eplb-config 'not json'", "--eplb-config is not JSON"},
      {" -ep --enable-eplb --eplb-config '{\"step_interval\": 0}'",
       "step_interval must be an integer in [1, 2^30]"},
      {" -ep --num-redundant-experts 2", "redundant experts (2) need --enable-eplb"}};
  for (const auto& [flags, message] : bad) {
    int rc = 0;
    const auto out = run_atom(gen + flags, &rc, /*with_stderr=*/true);
    EXPECT_NE(rc, 0) << flags;
    std::string all;
    for (const auto& l : out) all += l + "\n";
    EXPECT_NE(all.find(message), std::string::npos) << flags << ":\n" << all;
  }
}

// --kv-cache-dtype fp8 reaches the engine's cache: the tokens are those of the single-sequence
// runner over an FP8 cache (no scheduler or CLI code), and a bad value is refused.
TEST(EngineCli, GenerateWithAnFp8KvCache) {
  const Reference ref = reference_load("qwen3_sliding");
  LoadedModel m = model_load(fixture_dir("qwen3_sliding"), ModelOptions{});
  const auto want =
      generate_greedy(*m.model, ref.greedy_prompt, 16, {}, true, 16, DType::kF8E4M3).token_ids;
  const auto exact = generate_greedy(*m.model, ref.greedy_prompt, 16, {}, true).token_ids;
  int rc = 0;
  const auto lines =
      run_atom(fmt::format("generate --model {} --prompt-tokens {} --max-tokens 16 --temperature 0 "
                           "--ignore-eos --kv-cache-dtype fp8",
                           fixture_dir("qwen3_sliding"), join(ref.greedy_prompt)),
               &rc);
  EXPECT_EQ(rc, 0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], join(want));
  EXPECT_NE(want, exact) << "this fixture's greedy tokens should show the FP8 cache";
  for (const char* bad : {"fp8_e5m2", "int8"}) {
    const auto out = run_atom(fmt::format("generate --model {} --prompt-tokens 1,2 --max-tokens 2 "
                                          "--kv-cache-dtype {}",
                                          fixture_dir("qwen3_sliding"), bad),
                              &rc);
    EXPECT_NE(rc, 0) << bad;
    EXPECT_TRUE(out.empty()) << bad;
  }
}

TEST(EngineCli, GenerateJsonlInput) {
  const Reference ref = reference_load("qwen3_tied");
  TempDir dir;
  const std::string path = dir.file("requests.jsonl");
  {
    std::ofstream f(path);
    f << nlohmann::json{{"prompt_token_ids", ref.greedy_prompt},
                        {"max_tokens", 16},
                        {"ignore_eos", true}}
             .dump()
      << "\n\n";
    f << R"({"prompt_token_ids": [5, 6, 7], "max_tokens": 4, "temperature": 0.8, "seed": 3, "n": 2, "logprobs": 2})"
      << "\n";
  }
  int rc = 0;
  const auto lines = run_atom(fmt::format("generate --model {} --input {} --json --metrics",
                                          fixture_dir("qwen3_tied"), path),
                              &rc);
  EXPECT_EQ(rc, 0);
  ASSERT_EQ(lines.size(), 3u);
  const auto a = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(a.at("token_ids").get<std::vector<int32_t>>(), ref.greedy_tokens);
  EXPECT_TRUE(a.at("metrics").contains("ttft"));
  const auto b0 = nlohmann::json::parse(lines[1]), b1 = nlohmann::json::parse(lines[2]);
  EXPECT_EQ(b0.at("index"), 0);
  EXPECT_EQ(b1.at("index"), 1);
  EXPECT_EQ(b0.at("token_ids").size(), 4u);
  EXPECT_EQ(b0.at("logprobs").size(), 4u);
  EXPECT_EQ(b0.at("logprobs")[0].at("top_logprobs").size(), 2u);

  std::ofstream(path) << R"({"prompt_token_ids": [5], "top_p": 1.5})"
                      << "\n";
  run_atom(fmt::format("generate --model {} --input {}", fixture_dir("qwen3_tied"), path), &rc);
  EXPECT_NE(rc, 0) << "an invalid request is an error";
}

TEST(EngineCli, BenchThroughputAndLatencyWriteJson) {
  TempDir dir;
  const std::string out = dir.file("bench.json");
  int rc = 0;
  auto lines = run_atom(fmt::format("bench throughput --model {} --input-len 20 --output-len 4 "
                                    "--num-prompts 6 --output-json {}",
                                    fixture_dir("llama3_gqa"), out),
                        &rc);
  EXPECT_EQ(rc, 0);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0].rfind("Throughput: ", 0), 0u) << lines[0];
  nlohmann::json j = nlohmann::json::parse(std::ifstream(out));
  EXPECT_EQ(j.at("num_requests"), 6);
  EXPECT_EQ(j.at("total_num_tokens"), 6 * 24);
  EXPECT_GT(j.at("tokens_per_second").get<double>(), 0);
  lines =
      run_atom(fmt::format("bench latency --model {} --input-len 8 --output-len 3 --batch-size 2 "
                           "--num-iters 2 --num-iters-warmup 1 --output-json {}",
                           fixture_dir("llama3_gqa"), out),
               &rc);
  EXPECT_EQ(rc, 0);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0].rfind("Avg latency: ", 0), 0u) << lines[0];
  j = nlohmann::json::parse(std::ifstream(out));
  EXPECT_EQ(j.at("latencies").size(), 2u);
  EXPECT_TRUE(j.at("percentiles").contains("99"));
}

TEST(EngineCli, BenchPrefixReportsColdAndCachedTtft) {
  TempDir dir;
  const std::string out = dir.file("prefix.json");
  int rc = 0;
  const auto lines = run_atom(fmt::format("bench prefix --model {} --prefix-len 40 --suffix-len 5 "
                                          "--num-iters 2 --num-iters-warmup 1 --max-model-len 128 "
                                          "--output-json {}",
                                          fixture_dir("llama3_gqa"), out),
                              &rc);
  EXPECT_EQ(rc, 0);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("Cold TTFT (45-token prompt", 0), 0u) << lines[0];
  // The prefix's full 16-token blocks are shared: 32 of its 40 tokens.
  EXPECT_EQ(lines[1].rfind("Warm TTFT (32 of 45 prompt tokens", 0), 0u) << lines[1];
  nlohmann::json j = nlohmann::json::parse(std::ifstream(out));
  EXPECT_EQ(j.at("cached_tokens"), 32);
  EXPECT_EQ(j.at("cold_ttft_ms").size(), 2u);
  EXPECT_EQ(j.at("warm_ttft_ms").size(), 2u);
  EXPECT_GT(j.at("mean_cold_ttft_ms").get<double>(), 0);
  // Flags of the CUDA configuration are accepted (and checked) on any device.
  run_atom(fmt::format("bench throughput --model {} --input-len 8 --output-len 2 --num-prompts 2 "
                       "--gpu-memory-utilization 0.9 --enforce-eager",
                       fixture_dir("llama3_gqa")),
           &rc);
  EXPECT_EQ(rc, 0);
  run_atom(fmt::format("bench throughput --model {} --input-len 8 --output-len 2 --num-prompts 2 "
                       "--gpu-memory-utilization 1.5",
                       fixture_dir("llama3_gqa")),
           &rc);
  EXPECT_NE(rc, 0) << "gpu_memory_utilization above 1 is refused";
}

// --tensor-parallel-size (or --tp, or vLLM's -tp) on the CPU: the ranks are threads, each holding
// its shards.
TEST(EngineCli, TensorParallelRanksOnTheCpu) {
  const Reference ref = reference_load("llama3_gqa");
  for (const std::string flag : {"--tensor-parallel-size 2", "--tp 4", "-tp 2", "-tp=4"}) {
    int rc = 0;
    const auto lines = run_atom(
        fmt::format("generate --model {} --device cpu {} --prompt-tokens {} --max-tokens {} "
                    "--ignore-eos --json",
                    fixture_dir("llama3_gqa"), flag, join(ref.greedy_prompt),
                    ref.greedy_tokens.size()),
        &rc);
    EXPECT_EQ(rc, 0) << flag;
    ASSERT_EQ(lines.size(), 1u) << flag;
    EXPECT_EQ(nlohmann::json::parse(lines[0]).at("token_ids").get<std::vector<int32_t>>(),
              ref.greedy_tokens)
        << flag;
  }
  TempDir dir;
  int rc = 0;
  run_atom(
      fmt::format("score --model {} --device cpu --tp 2 --tokens {} --prefill-chunk 5 --out {}",
                  fixture_dir("qwen3_tied"), join(reference_load("qwen3_tied").input_ids),
                  dir.file("logits.safetensors")),
      &rc);
  ASSERT_EQ(rc, 0);
  SafetensorsFile f(dir.file("logits.safetensors"), /*use_mmap=*/false);
  expect_logits_near(f.tensor("logits").clone(), reference_load("qwen3_tied").logits,
                     kCpuLogitTolerance, "atom score --tp 2 --prefill-chunk 5");

  const std::string out = dir.file("bench.json");
  run_atom(fmt::format("bench throughput --model {} --device cpu --tp 2 --input-len 20 "
                       "--output-len 4 --num-prompts 6 --output-json {}",
                       fixture_dir("llama3_gqa"), out),
           &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(out)).at("total_num_tokens"), 6 * 24);
  run_atom(fmt::format("bench latency --model {} --device cpu --tp 2 --input-len 8 --output-len 3 "
                       "--batch-size 2 --num-iters 1 --num-iters-warmup 1",
                       fixture_dir("llama3_gqa")),
           &rc);
  EXPECT_EQ(rc, 0);
  const auto prefix = run_atom(fmt::format("bench prefix --model {} --device cpu --tp 2 "
                                           "--prefix-len 40 --suffix-len 5 --num-iters 1 "
                                           "--max-model-len 128",
                                           fixture_dir("llama3_gqa")),
                               &rc);
  EXPECT_EQ(rc, 0);
  ASSERT_EQ(prefix.size(), 3u);
  EXPECT_EQ(prefix[1].rfind("Warm TTFT (32 of 45 prompt tokens", 0), 0u) << prefix[1];
  // 8 heads and 2 kv heads do not split over 3 ranks.
  run_atom(fmt::format("generate --model {} --device cpu --tp 3 --prompt-tokens 1,2",
                       fixture_dir("llama3_gqa")),
           &rc);
  EXPECT_NE(rc, 0);
}

}  // namespace
}  // namespace atom::test
