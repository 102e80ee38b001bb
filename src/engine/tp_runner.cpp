#include "engine/tp_runner.h"

#include "core/error.h"
#include "engine/engine_config.h"

namespace atom {

namespace {
RankThreads& threads_of(ModelGroup& models) {
  ATOM_CHECK(models.world_size() > 1 && models.threads(),
             "TpRunner needs a group of more than one rank");
  return *models.threads();
}

void put_ints(Wire& w, const std::vector<int32_t>& v) {
  w.put_i64(static_cast<int64_t>(v.size()));
  w.put_bytes(v.data(), v.size() * sizeof(int32_t));
}

void get_ints(Wire& w, std::vector<int32_t>& v) {
  const int64_t n = w.i64();
  if (n < 0 || n > (int64_t{1} << 31)) fail("a step of {} entries", n);
  v.resize(static_cast<size_t>(n));
  w.bytes(v.data(), v.size() * sizeof(int32_t));
}

// The options every rank's ModelRunner is built with, but for the links of its own stage.
std::string options_to_bytes(const RunnerOptions& o) {
  Wire w;
  w.put_str("init");
  for (int64_t v :
       {int64_t{o.block_size}, int64_t{o.num_pages}, int64_t{o.max_model_len},
        int64_t{o.max_num_seqs}, int64_t{o.max_num_batched_tokens}, int64_t{o.enforce_eager},
        int64_t{o.num_speculative_tokens}, int64_t{o.num_state_slots},
        o.kv_cache_dtype ? static_cast<int64_t>(*o.kv_cache_dtype) : int64_t{-1}})
    w.put_i64(v);
  w.put_bytes(&o.gpu_memory_utilization, sizeof(o.gpu_memory_utilization));
  return w.buffer();
}

RunnerOptions options_from_bytes(Wire& w) {
  RunnerOptions o;
  o.block_size = static_cast<int>(w.i64());
  o.num_pages = static_cast<int>(w.i64());
  o.max_model_len = static_cast<int>(w.i64());
  o.max_num_seqs = static_cast<int>(w.i64());
  o.max_num_batched_tokens = static_cast<int>(w.i64());
  o.enforce_eager = w.i64() != 0;
  o.num_speculative_tokens = static_cast<int>(w.i64());
  o.num_state_slots = static_cast<int>(w.i64());
  const int64_t kv = w.i64();
  if (kv >= 0) o.kv_cache_dtype = static_cast<DType>(kv);
  w.bytes(&o.gpu_memory_utilization, sizeof(o.gpu_memory_utilization));
  return o;
}

std::string command(const char* op) {
  Wire w;
  w.put_str(op);
  return w.buffer();
}
}  // namespace

std::string batch_to_bytes(const Batch& b) {
  Wire w;
  w.put_str("step");
#define ATOM_BATCH_PUT_FIELD(name, extent) put_ints(w, b.name);
  ATOM_BATCH_FIELDS(ATOM_BATCH_PUT_FIELD)
#undef ATOM_BATCH_PUT_FIELD
  for (int64_t v : {int64_t{b.block_size}, int64_t{b.max_query_len}, int64_t{b.max_context_len},
                    static_cast<int64_t>(b.state_copies.size())})
    w.put_i64(v);
  for (const auto& [from, to] : b.state_copies) {
    w.put_i64(from);
    w.put_i64(to);
  }
  // Image features at their rows (multimodal prompts), each run's rows as one tensor.
  w.put_i64(b.input_embeds ? static_cast<int64_t>(b.input_embeds->runs.size()) : 0);
  if (b.input_embeds)
    for (const InputEmbeds::Run& r : b.input_embeds->runs) {
      w.put_i64(r.dst_row);
      wire_put_tensor(w, r.values);
    }
  return w.buffer();
}

void batch_from_bytes(Wire& w, Batch& b) {
#define ATOM_BATCH_GET_FIELD(name, extent) get_ints(w, b.name);
  ATOM_BATCH_FIELDS(ATOM_BATCH_GET_FIELD)
#undef ATOM_BATCH_GET_FIELD
  b.block_size = static_cast<int>(w.i64());
  b.max_query_len = static_cast<int>(w.i64());
  b.max_context_len = static_cast<int>(w.i64());
  const int64_t copies = w.i64();
  if (copies < 0 || copies > (int64_t{1} << 24)) fail("a step of {} state copies", copies);
  b.state_copies.clear();
  for (int64_t i = 0; i < copies; ++i) {
    const auto from = static_cast<int32_t>(w.i64());
    b.state_copies.emplace_back(from, static_cast<int32_t>(w.i64()));
  }
  const int64_t runs = w.i64();
  if (runs < 0 || runs > (int64_t{1} << 24)) fail("a step of {} input embedding runs", runs);
  b.input_embeds.reset();
  if (runs > 0) {
    auto e = std::make_shared<InputEmbeds>();
    for (int64_t i = 0; i < runs; ++i) {
      const int64_t row = w.i64();
      e->runs.push_back({row, wire_tensor(w)});
    }
    b.input_embeds = std::move(e);
  }
}

void TpRunner::on_all_nodes(const std::string& cmd, const std::function<void()>& local) {
  if (!head_) {
    local();
    return;
  }
  models_.post(cmd);
  std::exception_ptr error;
  try {
    local();
  } catch (...) {
    error = std::current_exception();
  }
  try {
    models_.collect();
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  if (error) std::rethrow_exception(error);
}

TpRunner::TpRunner(ModelGroup& models, const RunnerOptions& options)
    : models_(models),
      threads_(threads_of(models)),
      leader_(models.leader()),
      head_(models.multi_node() && !models.is_worker()),
      runners_(static_cast<size_t>(models.world_size())),
      copies_(static_cast<size_t>(models.world_size())) {
  RunnerOptions o = options;
  o.agree_pages = [this](int pages) { return threads_.min_over_ranks(pages); };
  for (int r = 0; r < models.world_size(); ++r)
    if (models.holds(r)) {
      dp_ = models.model(r).data_parallel_size();
      break;
    }
  try {
    on_all_nodes(options_to_bytes(options), [&] {
      threads_.run([&](int r) {
        RunnerOptions ro = o;
        ro.stage_in = models_.link_in(r);
        ro.stage_out = models_.link_out(r);
        if (models_.pp_size() > 1) ro.micro_batches = models_.pp_size();
        runners_[static_cast<size_t>(r)] = std::make_unique<ModelRunner>(models_.model(r), ro);
      });
    });
  } catch (...) {
    try {
      on_all_nodes(command("destroy"), [this] {
        threads_.run([this](int r) { runners_[static_cast<size_t>(r)].reset(); });
      });
    } catch (const Error&) {
    }
    throw;
  }
}

TpRunner::~TpRunner() {
  // Each rank's stream, graphs and cache are released on the thread whose device they are on.
  try {
    on_all_nodes(command("destroy"), [this] {
      threads_.run([this](int r) { runners_[static_cast<size_t>(r)].reset(); });
    });
  } catch (const Error&) {
    threads_.run([this](int r) { runners_[static_cast<size_t>(r)].reset(); });
  }
}

void TpRunner::run_step(Batch& batch, const std::function<void(ModelRunner&)>& rank0) {
  // Copied here, before the ranks start: the leader writes into `batch` (its upload) while it
  // runs.
  for (int r = 0; r < ranks(); ++r)
    if (r != leader_ && models_.holds(r)) copies_[static_cast<size_t>(r)].copy_host_from(batch);
  on_all_nodes(head_ ? batch_to_bytes(batch) : std::string(), [&] {
    threads_.run([&](int r) {
      if (r == leader_) {
        rank0(*runners_[static_cast<size_t>(r)]);
      } else {
        runners_[static_cast<size_t>(r)]->execute_forward(copies_[static_cast<size_t>(r)]);
      }
    });
  });
}

Tensor TpRunner::execute(Batch& batch) {
  Tensor logits;
  run_step(batch, [&](ModelRunner& r) { logits = r.execute(batch); });
  return logits;
}

std::vector<int32_t> TpRunner::execute_greedy(Batch& batch) {
  std::vector<int32_t> ids;
  run_step(batch, [&](ModelRunner& r) { ids = r.execute_greedy(batch); });
  return ids;
}

void TpRunner::execute_sampling(Batch& batch, const StepSampling& want, StepSamples& out) {
  run_step(batch, [&](ModelRunner& r) { r.execute_sampling(batch, want, out); });
}

void TpRunner::capture_decode_graphs() {
  on_all_nodes(command("graphs"), [this] {
    threads_.run([this](int r) { runners_[static_cast<size_t>(r)]->capture_decode_graphs(); });
  });
}

int TpRunner::rebalance_experts() {
  std::vector<int> changed(runners_.size(), 0);
  on_all_nodes(command("rebalance"), [&] {
    threads_.run(
        [&](int r) { changed[static_cast<size_t>(r)] = models_.model(r).rebalance_experts(); });
  });
  return models_.holds(leader_) ? changed[static_cast<size_t>(leader_)] : 0;
}

std::unique_ptr<StepRunner> step_runner_create(ModelGroup& models, const RunnerOptions& options) {
  if (models.world_size() == 1) return std::make_unique<ModelRunner>(models.model(0), options);
  return std::make_unique<TpRunner>(models, options);
}

void tp_runner_follow(ModelGroup& models) {
  ATOM_CHECK(models.is_worker(), "tp_runner_follow runs on a worker node");
  std::unique_ptr<TpRunner> runner;
  Batch batch;
  while (std::optional<std::string> c = models.next_command()) {
    std::string payload, error;
    try {
      Wire w(std::move(*c));
      const std::string op = w.str();
      if (op == "plan") {
        payload = kv_cache_plan_reply(models, w);
      } else if (op == "shard") {
        payload = model_group_shard_reply(models, w);
      } else if (op == "init") {
        runner.reset();
        runner = std::make_unique<TpRunner>(models, options_from_bytes(w));
      } else if (!runner) {
        fail("command '{}' before the runners were built", op);
      } else if (op == "step") {
        batch_from_bytes(w, batch);
        runner->run_step(batch, [](ModelRunner&) {});
      } else if (op == "graphs") {
        runner->capture_decode_graphs();
      } else if (op == "rebalance") {
        runner->rebalance_experts();
      } else if (op == "destroy") {
        runner.reset();
      } else {
        fail("unknown command '{}' from the head node", op);
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    models.reply(payload, error);
  }
}

}  // namespace atom
