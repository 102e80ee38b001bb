// The offline engine: requests in, continuous batching over a paged KV cache with prefix caching,
// outputs back. Single-threaded: add_request, abort and step are called from one thread (a server
// puts a queue in front).
//
//   LLMEngine engine(model, config, generation_config_load(dir));
//   SamplingParams p = engine.default_params();   // generation_config.json, then vLLM's
//   p.temperature = 0;
//   auto outs = engine.generate({{1, 2, 3}, {4, 5}}, p);
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/batch_builder.h"
#include "engine/block_manager.h"
#include "engine/engine_config.h"
#include "engine/model_runner.h"
#include "engine/multimodal.h"
#include "engine/request_output.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/spec_decode.h"
#include "engine/state_pool.h"
#include "models/model_group.h"

namespace atom {

struct EngineStats {
  int64_t num_steps = 0;
  int64_t num_preemptions = 0;
  int64_t prefix_cache_queries = 0;  // tokens
  int64_t prefix_cache_hits = 0;     // tokens
  int64_t prompt_tokens = 0;         // computed (not served from the cache)
  int64_t generation_tokens = 0;
  // Speculative decoding (vLLM's spec_decode counters): verification steps of a sequence with
  // drafts, draft tokens verified, of which accepted, and accepted per draft position.
  int64_t spec_num_drafts = 0;
  int64_t spec_num_draft_tokens = 0;
  int64_t spec_num_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_position;  // [num_speculative_tokens]
  // EPLB: re-placements run (every Model::eplb_step_interval() steps) and the layers they moved.
  int64_t eplb_rebalances = 0;
  int64_t eplb_layers_moved = 0;
  // Wall time inside step() that ran a batch, and of it the model's forward with sampling
  // (ModelRunner::execute_sampling: the launches, the device's time, the copy back). The rest,
  // step_seconds - forward_seconds, is the host's own per step: scheduling, building the batch,
  // host-side sampling and logprobs, appending tokens, detokenizing, finishing requests.
  double step_seconds = 0;
  double forward_seconds = 0;
};

class LLMEngine {
 public:
  // text: makes each sequence's detokenizer; without one, outputs carry no text and stop strings
  // are refused.
  // drafter: the target's MTP drafter (drafter_load) when config.speculative_method is "mtp".
  LLMEngine(Model& model, const EngineConfig& config, const GenerationConfig& generation = {},
            TextStreamFactory text = {}, DraftModel* drafter = nullptr);
  // Tensor parallel: each step runs on every rank of `models` (engine/tp_runner.h); rank 0's model
  // is model(). KV blocks are per rank (each holds its kv heads of every block); the count is the
  // smallest any rank's memory allows. With one rank, the same as the constructor above.
  LLMEngine(ModelGroup& models, const EngineConfig& config, const GenerationConfig& generation = {},
            TextStreamFactory text = {}, DraftModel* drafter = nullptr);
  ~LLMEngine();
  LLMEngine(const LLMEngine&) = delete;
  LLMEngine& operator=(const LLMEngine&) = delete;

  // Request defaults: the model's generation_config.json, then vLLM's.
  const SamplingParams& default_params() const { return defaults_; }

  // Queues a request. Errors (atom::Error, naming the parameter) on invalid parameters, an empty
  // or out-of-vocabulary prompt, a prompt longer than max_model_len, a duplicate id, or stop
  // strings without a detokenizer.
  // images: the prompt's images (a model with a vision tower), one image placeholder token in
  // the prompt each, in order; the engine expands the placeholders and computes the features
  // (engine/multimodal.h). Also an error: images for a model without a vision tower, with
  // speculative decoding, or a prompt with images longer than max_num_batched_tokens (it is
  // prefilled in one step).
  void add_request(const std::string& request_id, std::vector<int32_t> prompt_token_ids,
                   const SamplingParams& params, const std::vector<PromptImage>& images = {});
  // The same with the images already expanded and their features computed
  // (prompt_images_expand, which a front end may run on its own thread, off the engine's): the
  // prompt holds each image's placeholder run where `images` places it, and no other
  // placeholder token.
  void add_request(const std::string& request_id, std::vector<int32_t> prompt_token_ids,
                   const SamplingParams& params, std::shared_ptr<const RequestImages> images);
  // Ends a request wherever it is (waiting, prefilling, decoding), returning all its blocks.
  // Returns its final output (finish_reason abort for unfinished samples), or nothing when the
  // id is unknown or already finished.
  std::optional<RequestOutput> abort(const std::string& request_id);
  // Runs one scheduling step and forward pass.
  StepOutput step();
  bool has_unfinished() const;

  // Runs the prompts to completion; outputs in prompt order. Requests queued with add_request run
  // alongside; their outputs come out of the next step().
  std::vector<RequestOutput> generate(const std::vector<std::vector<int32_t>>& prompts,
                                      const SamplingParams& params);
  std::vector<RequestOutput> generate(const std::vector<std::vector<int32_t>>& prompts,
                                      const std::vector<SamplingParams>& params);

  // Called by step() once the batch is scheduled, before its forward runs, with the scheduler's
  // running and waiting counts: a front end's gauges then move during a long prefill.
  void set_on_scheduled(std::function<void(int running, int waiting)> f) {
    on_scheduled_ = std::move(f);
  }

  // Speculative decoding with this proposer and config().num_speculative_tokens (1..4) draft
  // tokens per step, before any request is added (the constructor sets up the MTP drafter's
  // itself). Tests use it for drafters whose proposals they control.
  void set_proposer(std::unique_ptr<DraftProposer> proposer);
  bool speculative() const { return proposer_ != nullptr; }

  // Replaces the CPU sampler of the rows that are not drawn on the model's device.
  void set_sampler(std::unique_ptr<Sampler> sampler) { sampler_ = std::move(sampler); }

  const KvCachePlan& kv_plan() const { return plan_; }
  const EngineConfig& config() const { return config_; }
  Model& model() { return model_; }
  const Model& model() const { return model_; }
  EngineStats stats() const;
  const BlockManager& block_manager() const { return blocks_; }
  const StatePool& state_pool() const { return states_; }
  const Scheduler& scheduler() const { return scheduler_; }
  const StepRunner& runner() const { return *runner_; }
  int num_requests() const { return static_cast<int>(requests_.size()); }

 private:
  LLMEngine(Model& model, ModelGroup* models, const EngineConfig& config,
            const GenerationConfig& generation, TextStreamFactory text, DraftModel* drafter);
  // Speculative decoding (engine/spec_decode.h): drafts appended before scheduling, trimmed to
  // what was scheduled, verified after sampling, then the next drafts proposed.
  bool spec_eligible(const Sequence& seq) const;
  void spec_append_drafts();
  void spec_trim_drafts(const SchedulerOutput& so);
  void spec_verify();
  void spec_propose(const SchedulerOutput& so);
  void append_token(Sequence& seq, int32_t token, Clock::time_point now, StepOutput& out,
                    bool end_after = false);
  void finish_sequence(Sequence& seq, FinishReason reason);
  RequestOutput make_output(const Request& req) const;
  void check_progress(const SchedulerOutput& so);
  // Splits this step's logits rows: drawn on the model's device, or sampled on the host.
  void plan_sampling();

  // The model's vision tower for a request with images; an error naming why there is none.
  VisionEncoder& images_encoder() const;

  Model& model_;
  std::function<void(int, int)> on_scheduled_;
  EngineConfig config_;
  KvCachePlan plan_;
  SamplingParams defaults_;
  std::vector<int32_t> eos_ids_;
  TextStreamFactory text_;
  int ranks_ = 1;  // every rank of the group (tensor x pipeline)
  int pp_size_ = 1;
  std::unique_ptr<StepRunner> runner_;
  BlockManager blocks_;
  StatePool states_;
  Scheduler scheduler_;
  std::unique_ptr<Sampler> sampler_;
  std::mt19937_64 seed_rng_;  // seeds for requests without one (engine-local, not global)

  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;
  std::vector<std::unique_ptr<Request>> done_;      // finished, output not yet returned
  std::vector<std::unique_ptr<Request>> returned_;  // returned last step; events point into them
  std::vector<RequestOutput> parked_;  // others' outputs seen by generate(), for the next step()
  uint64_t next_generate_id_ = 0;
  EngineStats stats_;

  // Per-step scratch, kept to avoid allocations.
  struct PromptRow {
    Sequence* seq;
    int prompt_pos;    // the row scores prompt token prompt_pos + 1
    int32_t host_row;  // its row of samples_.host_logits
  };
  Batch batch_;
  std::vector<LogitsRow> rows_;
  StepSampling sampling_;
  StepSamples samples_;
  std::vector<SampleTask> tasks_;  // rows sampled on the host
  // Structured output: the constrained rows, their masks (one table, [rows, words]), the worker
  // computing them during the forward, and the rows whose mask allows nothing.
  struct ConstrainedRow {
    size_t task;        // index into task_seqs_
    int32_t host_task;  // index into tasks_, or -1: drawn on the model's device
    Sequence* seq;
  };
  std::vector<ConstrainedRow> constrained_;
  std::vector<uint64_t> masks_;
  size_t mask_words_ = 0;
  std::shared_future<void> masks_ready_;
  std::vector<char> blocked_;          // per task
  std::vector<int32_t> host_sampled_;  // their tokens
  std::vector<Sequence*> task_seqs_;   // every sequence that draws a token, in row order
  std::vector<int32_t>
      task_source_;  // its token: >= 0 samples_.tokens[i], < 0 host_sampled_[-1 - i]
  std::vector<PromptRow> prompt_rows_;
  std::vector<int32_t> lp_scratch_;

  std::unique_ptr<DraftProposer> proposer_;
  // This step's verified sequences: the task of their row 0, their draft count and the tokens
  // they emit (accepted drafts, then the target's correction or bonus token).
  struct SpecGroup {
    size_t first_task;
    int num_drafts;
    std::vector<int32_t> emit;
    size_t num_tokens_before = 0;  // the sequence's tokens before its drafts
  };
  std::vector<SpecGroup> spec_groups_;
  std::vector<DraftRequest> spec_reqs_;
  std::vector<std::vector<int32_t>> spec_drafts_;
  Clock::time_point spec_logged_at_{};  // the last periodic acceptance log line
};

}  // namespace atom
