#include "server/bench_serve.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace atom::server {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  // Linear interpolation between closest ranks, as numpy.percentile.
  const double rank = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank)),
               hi = static_cast<size_t>(std::ceil(rank));
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

std::string pct_name(double p) { return fmt::format("{}", p); }

// One streamed request; fills `rec`.
void run_one(const BenchServeOptions& o, const std::string& model,
             const std::vector<int32_t>& prompt, int max_tokens, RequestRecord& rec) {
  httplib::Client cli(o.host, o.port);
  cli.set_read_timeout(3600, 0);
  cli.set_write_timeout(60, 0);
  httplib::Headers headers;
  if (!o.api_key.empty()) headers.emplace("Authorization", "Bearer " + o.api_key);
  json body;
  const bool chat = o.endpoint.find("chat") != std::string::npos;
  if (chat) {
    // Chat prompts are text; the ids become a deterministic string of words.
    std::string text;
    for (int32_t t : prompt) text += fmt::format("w{} ", t % 1000);
    body = {{"model", model},
            {"messages", json::array({{{"role", "user"}, {"content", text}}})},
            {"max_completion_tokens", max_tokens}};
  } else {
    body = {{"model", model}, {"prompt", prompt}, {"max_tokens", max_tokens}};
  }
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  body["ignore_eos"] = o.ignore_eos;
  body["temperature"] = 0.0;
  rec.prompt_len = static_cast<int>(prompt.size());

  httplib::Request req;
  req.method = "POST";
  req.path = o.endpoint;
  req.headers = headers;
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  std::string buffer;
  const auto start = Clock::now();
  auto last = start;
  bool first = true;
  int usage_tokens = -1;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    size_t pos;
    while ((pos = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, pos);
      buffer.erase(0, pos + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") continue;
      json j;
      try {
        j = json::parse(payload);
      } catch (...) {
        rec.error = "bad SSE payload";
        continue;
      }
      if (j.contains("error")) {
        rec.error = j["error"].dump();
        continue;
      }
      if (j.contains("usage") && j["usage"].is_object())
        usage_tokens = j["usage"].value("completion_tokens", -1);
      if (!j.contains("choices") || j["choices"].empty()) continue;
      const json& c = j["choices"][0];
      std::string text;
      if (chat) {
        if (c.contains("delta") && c["delta"].contains("content") &&
            c["delta"]["content"].is_string())
          text = c["delta"]["content"].get<std::string>();
      } else if (c.contains("text") && c["text"].is_string()) {
        text = c["text"].get<std::string>();
      }
      if (text.empty()) continue;
      const auto now = Clock::now();
      if (first) {
        rec.ttft = std::chrono::duration<double>(now - start).count();
        first = false;
      } else {
        rec.itl.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
      rec.generated_text += text;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  const bool ok = cli.send(req, res, err);
  rec.latency = std::chrono::duration<double>(Clock::now() - start).count();
  if (!ok) {
    rec.error = "connection error: " + httplib::to_string(err);
    return;
  }
  if (res.status != 200) {
    rec.error = fmt::format("HTTP {}: {}", res.status, res.body);
    return;
  }
  rec.output_tokens =
      usage_tokens >= 0 ? usage_tokens : static_cast<int>(rec.itl.size() + (first ? 0 : 1));
  rec.success = rec.error.empty() && !first;
  if (!rec.success && rec.error.empty()) rec.error = "no output";
}

}  // namespace

void bench_stats_add(json& r, const std::string& m, std::vector<double> s,
                     const std::vector<double>& percentiles) {
  for (auto& x : s) x *= 1000.0;
  double mean = 0, var = 0;
  for (double x : s) mean += x;
  if (!s.empty()) mean /= static_cast<double>(s.size());
  for (double x : s) var += (x - mean) * (x - mean);
  if (!s.empty()) var /= static_cast<double>(s.size());
  r["mean_" + m + "_ms"] = mean;
  r["median_" + m + "_ms"] = percentile(s, 50);
  r["std_" + m + "_ms"] = std::sqrt(var);
  for (double p : percentiles) r["p" + pct_name(p) + "_" + m + "_ms"] = percentile(s, p);
}

// The server's engine-step counters (atom's /metrics: atom:engine_steps_total,
// atom:engine_step_seconds_total, atom:engine_step_host_seconds_total); nullopt from a server
// without them (another engine) or without /metrics.
static std::optional<EngineStepTotals> engine_step_totals(httplib::Client& cli,
                                                          const httplib::Headers& headers) {
  auto r = cli.Get("/metrics", headers);
  if (!r || r->status != 200) return std::nullopt;
  auto value = [&](const std::string& name) -> std::optional<double> {
    // A sample line: name{labels} value
    size_t at = 0;
    while ((at = r->body.find(name, at)) != std::string::npos) {
      const bool line_start = at == 0 || r->body[at - 1] == '\n';
      const size_t end = r->body.find('\n', at);
      const std::string line = r->body.substr(at, end == std::string::npos ? end : end - at);
      at += name.size();
      if (!line_start || line.size() <= name.size() ||
          (line[name.size()] != '{' && line[name.size()] != ' '))
        continue;
      const size_t sp = line.rfind(' ');
      try {
        return std::stod(line.substr(sp + 1));
      } catch (const std::exception&) {
        return std::nullopt;
      }
    }
    return std::nullopt;
  };
  const auto steps = value("atom:engine_steps_total"),
             secs = value("atom:engine_step_seconds_total"),
             host = value("atom:engine_step_host_seconds_total");
  if (!steps || !secs || !host) return std::nullopt;
  return EngineStepTotals{*steps, *secs, *host};
}

json bench_serve_run(const BenchServeOptions& o) {
  if (o.num_prompts < 1) fail("--num-prompts must be at least 1");
  if (o.random_input_len < 1 || o.random_output_len < 1)
    fail("--random-input-len and --random-output-len must be at least 1");
  httplib::Client probe(o.host, o.port);
  probe.set_read_timeout(30, 0);
  httplib::Headers headers;
  if (!o.api_key.empty()) headers.emplace("Authorization", "Bearer " + o.api_key);
  std::string model = o.model;
  int64_t vocab = o.vocab_size;
  {
    auto r = probe.Get("/v1/models", headers);
    if (!r || r->status != 200) fail("cannot reach http://{}:{}/v1/models", o.host, o.port);
    const json m = json::parse(r->body);
    if (model.empty()) model = m["data"][0]["id"].get<std::string>();
    if (vocab <= 0 && m["data"][0].contains("vocab_size"))
      vocab = m["data"][0]["vocab_size"].get<int64_t>();
  }
  if (vocab <= 0) vocab = 32000;
  const std::optional<EngineStepTotals> steps_before = engine_step_totals(probe, headers);

  // The random dataset: per request an input and output length in [len(1-r), len(1+r)], random ids.
  std::mt19937_64 rng(o.seed);
  auto range = [&](int len) {
    const int lo = std::max(1, static_cast<int>(std::floor(len * (1 - o.random_range_ratio))));
    const int hi = std::max(lo, static_cast<int>(std::ceil(len * (1 + o.random_range_ratio))));
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  std::uniform_int_distribution<int32_t> tok(
      100, static_cast<int32_t>(std::max<int64_t>(101, vocab - 1)));
  std::vector<int32_t> prefix(static_cast<size_t>(o.random_prefix_len));
  for (auto& t : prefix) t = tok(rng);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> outs;
  for (int i = 0; i < o.num_prompts; ++i) {
    std::vector<int32_t> p = prefix;
    const int n = range(o.random_input_len);
    for (int k = 0; k < n; ++k) p.push_back(tok(rng));
    prompts.push_back(std::move(p));
    outs.push_back(range(o.random_output_len));
  }

  // Arrival gaps: gamma(shape = burstiness, scale = 1 / (rate * burstiness)); Poisson at 1.
  std::vector<double> gaps(prompts.size(), 0.0);
  if (o.request_rate > 0) {
    std::gamma_distribution<double> g(o.burstiness, 1.0 / (o.request_rate * o.burstiness));
    for (auto& x : gaps) x = g(rng);
  }

  std::vector<RequestRecord> records(prompts.size());
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  std::vector<std::thread> threads;
  log_info("bench serve: {} prompts, input {} output {}, rate {}, concurrency {}", o.num_prompts,
           o.random_input_len, o.random_output_len,
           o.request_rate > 0 ? fmt::format("{}", o.request_rate) : "inf",
           o.max_concurrency > 0 ? std::to_string(o.max_concurrency) : "unlimited");
  const auto t0 = Clock::now();
  auto next = t0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gaps[i]));
    std::this_thread::sleep_until(next);
    if (o.max_concurrency > 0) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return in_flight < o.max_concurrency; });
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      ++in_flight;
    }
    threads.emplace_back([&, i] {
      run_one(o, model, prompts[i], outs[i], records[i]);
      {
        std::lock_guard<std::mutex> lock(mu);
        --in_flight;
      }
      cv.notify_all();
    });
  }
  for (auto& t : threads) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::optional<EngineStepTotals> steps_after = engine_step_totals(probe, headers);

  int completed = 0;
  int64_t total_in = 0, total_out = 0;
  std::vector<double> ttfts, tpots, itls, e2els;
  json errors = json::array();
  for (const auto& r : records) {
    if (!r.success) {
      errors.push_back(r.error);
      continue;
    }
    ++completed;
    total_in += r.prompt_len;
    total_out += r.output_tokens;
    ttfts.push_back(r.ttft);
    e2els.push_back(r.latency);
    if (r.output_tokens > 1) tpots.push_back((r.latency - r.ttft) / (r.output_tokens - 1));
    itls.insert(itls.end(), r.itl.begin(), r.itl.end());
  }
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y%m%d-%H%M%S", std::localtime(&now));
  json res = {{"date", date},
              {"backend", "openai"},
              {"endpoint", o.endpoint},
              {"model_id", model},
              {"num_prompts", o.num_prompts},
              {"request_rate", o.request_rate > 0 ? json(o.request_rate) : json("inf")},
              {"burstiness", o.burstiness},
              {"max_concurrency", o.max_concurrency > 0 ? json(o.max_concurrency) : json(nullptr)},
              {"duration", duration},
              {"completed", completed},
              {"failed", static_cast<int>(records.size()) - completed},
              {"total_input_tokens", total_in},
              {"total_output_tokens", total_out},
              {"request_throughput", completed / duration},
              {"output_throughput", static_cast<double>(total_out) / duration},
              {"total_token_throughput", static_cast<double>(total_in + total_out) / duration}};
  bench_stats_add(res, "ttft", ttfts, o.metric_percentiles);
  bench_stats_add(res, "tpot", tpots, o.metric_percentiles);
  bench_stats_add(res, "itl", itls, o.metric_percentiles);
  bench_stats_add(res, "e2el", e2els, o.metric_percentiles);
  // The server's own engine steps over the run (atom's /metrics; absent for other servers).
  double step_ms = 0, host_ms = 0, num_steps = 0;
  if (steps_before && steps_after && steps_after->steps > steps_before->steps) {
    num_steps = steps_after->steps - steps_before->steps;
    step_ms = 1e3 * (steps_after->seconds - steps_before->seconds) / num_steps;
    host_ms = 1e3 * (steps_after->host_seconds - steps_before->host_seconds) / num_steps;
    res["server_engine_steps"] = static_cast<int64_t>(num_steps);
    res["server_mean_step_ms"] = step_ms;
    res["server_mean_step_host_ms"] = host_ms;
  }
  res["errors"] = errors;

  std::string t = "============ Serving Benchmark Result ============\n";
  auto line = [&](const std::string& k, const std::string& v) {
    t += fmt::format("{:<40}{:<10}\n", k, v);
  };
  line("Successful requests:", std::to_string(completed));
  line("Failed requests:", std::to_string(static_cast<int>(records.size()) - completed));
  line("Benchmark duration (s):", fmt::format("{:.2f}", duration));
  line("Total input tokens:", std::to_string(total_in));
  line("Total generated tokens:", std::to_string(total_out));
  line("Request throughput (req/s):", fmt::format("{:.2f}", completed / duration));
  line("Output token throughput (tok/s):",
       fmt::format("{:.2f}", static_cast<double>(total_out) / duration));
  line("Total Token throughput (tok/s):",
       fmt::format("{:.2f}", static_cast<double>(total_in + total_out) / duration));
  const std::pair<const char*, const char*> sections[] = {
      {"ttft", "Time to First Token"},
      {"tpot", "Time per Output Token (excl. 1st token)"},
      {"itl", "Inter-token Latency"},
      {"e2el", "End-to-end Latency"}};
  for (const auto& [key, title] : sections) {
    if (std::find(o.percentile_metrics.begin(), o.percentile_metrics.end(), key) ==
        o.percentile_metrics.end())
      continue;
    std::string upper = key;
    for (auto& ch : upper) ch = static_cast<char>(std::toupper(ch));
    t += fmt::format("{:-^50}\n", title);
    line(fmt::format("Mean {} (ms):", upper),
         fmt::format("{:.2f}", res["mean_" + std::string(key) + "_ms"].get<double>()));
    line(fmt::format("Median {} (ms):", upper),
         fmt::format("{:.2f}", res["median_" + std::string(key) + "_ms"].get<double>()));
    for (double p : o.metric_percentiles)
      line(fmt::format("P{} {} (ms):", pct_name(p), upper),
           fmt::format("{:.2f}",
                       res["p" + pct_name(p) + "_" + std::string(key) + "_ms"].get<double>()));
  }
  if (num_steps > 0) {
    t += fmt::format("{:-^50}\n", "Server engine steps");
    line("Steps:", fmt::format("{:.0f}", num_steps));
    line("Mean step (ms):", fmt::format("{:.3f}", step_ms));
    line("Mean host time per step (ms):", fmt::format("{:.3f}", host_ms));
  }
  t += std::string(50, '=') + "\n";
  std::fputs(t.c_str(), stdout);
  if (!o.result_file.empty()) {
    std::ofstream f(o.result_file);
    if (!f) fail("cannot write --result-filename {}", o.result_file);
    f << res.dump(2) << "\n";
  }
  return res;
}

}  // namespace atom::server
