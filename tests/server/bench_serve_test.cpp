// `atom bench serve` against a fake backend: every request completes and the report adds up.
#include <gtest/gtest.h>

#include <thread>

#include "common/test_util.h"
#include "server/bench_serve.h"
#include "server/fake_backend.h"
#include "server/http_server.h"

namespace atom::test {
namespace {

TEST(BenchServe, RandomDatasetConcurrencyAndReport) {
  FakeBackend backend;
  backend.reply = std::string(64, 'z');
  backend.delay = std::chrono::milliseconds(1);
  server::Metrics metrics("fake-model");
  server::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  server::HttpServer srv(backend, metrics, so);
  ASSERT_TRUE(srv.bind());
  std::thread t([&] { srv.serve(); });

  TempDir d;
  server::BenchServeOptions o;
  o.port = srv.port();
  o.num_prompts = 12;
  o.random_input_len = 20;
  o.random_output_len = 8;
  o.random_range_ratio = 0.25;
  o.max_concurrency = 4;
  o.request_rate = 200;
  o.percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  o.metric_percentiles = {50, 99};
  o.result_file = d.file("result.json");
  const auto r = server::bench_serve_run(o);
  srv.stop();
  t.join();

  EXPECT_EQ(r["completed"], 12);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["model_id"], "fake-model");
  EXPECT_GE(r["total_output_tokens"].get<int64_t>(), 12 * 6);
  EXPECT_LE(r["total_output_tokens"].get<int64_t>(), 12 * 10);
  EXPECT_GT(r["output_throughput"].get<double>(), 0);
  for (const char* k :
       {"mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "p50_e2el_ms", "std_ttft_ms"})
    EXPECT_TRUE(r.contains(k)) << k;
  EXPECT_LE(r["median_ttft_ms"].get<double>(), r["p99_ttft_ms"].get<double>());
  // The server's engine steps over the run, from its /metrics counters (the fake's rule: a step
  // per request, 4 ms, 1 ms of it host).
  EXPECT_EQ(r["server_engine_steps"], 12);
  EXPECT_NEAR(r["server_mean_step_ms"].get<double>(), 4.0, 1e-6);
  EXPECT_NEAR(r["server_mean_step_host_ms"].get<double>(), 1.0, 1e-6);
  const auto saved = nlohmann::json::parse(read_file(o.result_file));
  EXPECT_EQ(saved["completed"], 12);
}

TEST(BenchServe, PercentilesInterpolateLikeNumpy) {
  nlohmann::ordered_json r;
  server::bench_stats_add(r, "x", {0.001, 0.002, 0.003, 0.004}, {50, 99});
  EXPECT_DOUBLE_EQ(r["mean_x_ms"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(r["median_x_ms"].get<double>(), 2.5);
  EXPECT_NEAR(r["p99_x_ms"].get<double>(), 3.97, 1e-9);
}

}  // namespace
}  // namespace atom::test
