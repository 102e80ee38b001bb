// Runs one Batch through a model on its device: uploads the descriptor, runs forward and the LM
// head, and returns logits (or sampled tokens) on the host. Owns the KV cache, the per-step
// scratch arena and, on CUDA, the runner's stream and the decode CUDA graphs.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dist/stage_link.h"
#include "engine/step_runner.h"
#include "kernels/sampling.h"
#include "layers/batch.h"
#include "layers/context.h"
#include "models/model.h"

namespace atom {

struct RunnerOptions {
  int block_size = 16;
  // KV pages. 0: sized from free GPU memory on CUDA (gpu_memory_utilization), or on the CPU
  // max_num_seqs full-length sequences within 4 GiB (at least one sequence).
  int num_pages = 0;
  int max_model_len = 0;  // tokens one sequence may hold; 0: max_position_embeddings
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;  // tokens of the largest step (activation profiling)
  double gpu_memory_utilization = 0.9;
  bool enforce_eager = false;  // CUDA: run decode without graphs
  // Speculative decoding's draft tokens per step (K): decode graphs are also captured for
  // verification steps of K + 1 tokens per sequence (attention-only models; 0: none).
  int num_speculative_tokens = 0;
  // Per-request state pool of the model's recurrent layers (0 for pure attention models).
  int num_state_slots = 0;
  // Tensor parallelism: every rank passes the page count it sized and all use the result (the
  // smallest), so the engine's block numbers are valid on every rank. Unset: no agreement.
  std::function<int(int pages)> agree_pages;
  // Element type of the attention caches (e.g. F8E4M3); unset: the model's, its activation dtype.
  std::optional<DType> kv_cache_dtype;
  // Pipeline parallelism (the model is one stage of several): where a stage after the first
  // receives the previous stage's IntermediateTensors, and where a stage before the last sends
  // its own (models/model_group.h). A stage before the last computes no logits.
  StageLink* stage_in = nullptr;
  StageLink* stage_out = nullptr;
  // Pipeline micro-batches: a step of several sequences runs as up to this many slices of them
  // (micro_batch_cuts), each handed to the next stage before the next slice starts. Every rank
  // of a group must have the same value. 1: the whole step at once.
  int micro_batches = 1;
  // Speculative block drafting (DSpark): the target layers whose outputs each step keeps
  // (Step::layer_outputs, last_layer_outputs); eager steps of one micro-batch only.
  std::vector<int64_t> layer_outputs;
};

// Where a step's sequences are cut into at most `parts` micro-batches of about equal token counts:
// ascending sequence indices from 0 to num_seqs ({0, num_seqs}: one slice, also when the batch's
// logits rows do not ascend).
std::vector<int> micro_batch_cuts(const Batch& batch, int parts);

class DecodeGraphs;

class ModelRunner final : public StepRunner {
 public:
  // num_pages pages of block_size tokens; sequences up to num_pages * block_size tokens.
  // num_state_slots: size of the per-request state pool of the model's recurrent layers.
  ModelRunner(Model& model, int num_pages, int block_size, int num_state_slots = 0);
  ModelRunner(Model& model, const RunnerOptions& options);
  ~ModelRunner() override;
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Logits [len(batch.logits_indices), vocab] F32 on the host.
  Tensor execute(Batch& batch) override;
  // The argmax token of every logits row (computed on the model's device).
  std::vector<int32_t> execute_greedy(Batch& batch) override;
  // A token per logits row drawn under rows[i] (kernels/sampling.h), on the model's device.
  std::vector<int32_t> execute_sample(Batch& batch, const std::vector<kernels::SamplingRow>& rows);
  // One forward pass; the device rows are sampled where the logits are and only their ids come
  // back, with the host rows' logits. Buffers in `out` are reused.
  void execute_sampling(Batch& batch, const StepSampling& want, StepSamples& out) override;
  // A forward pass whose logits nobody reads: a tensor-parallel rank other than 0 runs its share
  // of the step (collectives included) and returns without waiting for the device.
  void execute_forward(Batch& batch);

  // CUDA: captures the decode graph of every batch-size bucket now (largest first) instead of on
  // first use. No-op on the CPU or with enforce_eager.
  void capture_decode_graphs() override;
  // Batch sizes with a decode graph: 1, 2, 4, 8, 16, 24, 32, ... up to max_num_seqs (empty when
  // decode runs eagerly).
  std::vector<int> graph_buckets() const override;
  // Tokens per sequence with decode graphs: {1}, or {1, K + 1} with speculative decoding (empty
  // when decode runs eagerly).
  std::vector<int> graph_query_lens() const;
  // Steps run through a decode graph so far.
  int64_t graph_steps() const override;

  Model& model() { return model_; }
  KvCache& kv() { return kv_; }
  int block_size() const override { return kv_.block_size; }
  int num_pages() const override { return kv_.num_pages; }
  int max_model_len() const override { return max_model_len_; }
  Tensor last_hidden() const override { return hidden_; }
  Tensor last_layer_outputs() const override { return layer_outputs_out_; }

 private:
  struct Cuda;
  void init(const RunnerOptions& o);
  int pages_from_memory(const RunnerOptions& o);
  // Logits [R, vocab] F32 on the model's device, valid until the next step (undefined on a
  // pipeline stage before the last).
  Tensor forward_logits(Batch& batch);
  // One forward pass of `batch` (a step or one of its micro-batches) through this stage.
  Tensor forward_part(Batch& batch);
  // Pipeline stages: the previous stage's tensors for a step of num_tokens tokens (on a GPU
  // uploaded into the step's arena), and this stage's handed on (written first).
  void receive_stage_input(IntermediateTensors& in, int num_tokens);
  void send_stage_output(const IntermediateTensors& out);
  // Every recurrent layer's state slot `from` copied into slot `to`, pair by pair, in order.
  void copy_state_slots(const std::vector<std::pair<int32_t, int32_t>>& copies);
  void sample_rows(const Tensor& logits, const StepSampling& want, std::vector<int32_t>& tokens);
  Tensor host_rows(const Tensor& logits, const std::vector<int32_t>& rows);
  // Host data copied into the step arena (on the model's device), valid until the next step.
  Tensor upload(const void* data, Shape shape, DType dtype);

  Model& model_;
  std::vector<CacheSpec> cache_specs_;  // the model's, in the KV cache dtype
  KvCache kv_;
  Arena arena_;
  int max_model_len_ = 0;
  std::unique_ptr<Cuda> cuda_;  // stream; null on the CPU
  std::unique_ptr<DecodeGraphs> graphs_;
  // Per-step buffers of execute_sampling, kept so that steps allocate nothing.
  std::vector<kernels::SamplingRow> row_params_;
  std::vector<int32_t> row_index_;
  std::vector<int32_t> ids_host_;
  std::vector<int32_t> mask_index_;  // per drawn row: its row of the mask table, or -1
  Tensor host_logits_;               // [capacity rows, vocab] F32 on the host
  Tensor hidden_;  // the last step's hidden states, in arena_ or the graphs' arena
  StageLink* stage_in_ = nullptr;
  StageLink* stage_out_ = nullptr;
  int micro_batches_ = 1;
  Tensor micro_logits_;  // the micro-batches' logits rows gathered (the last stage)
  // Speculative decoding: the micro-batches' hidden states gathered (the last stage), the
  // drafter's input.
  bool keep_hidden_ = false;
  Tensor micro_hidden_;
  std::vector<int64_t> layer_outputs_;  // RunnerOptions::layer_outputs
  Tensor layer_outputs_out_;            // the last step's, in arena_
  // Data-parallel attention (the model's data_parallel_size / data_parallel_rank): the engine's
  // page numbers span every rank's cache, this rank's being [dp_rank num_pages, (dp_rank + 1)
  // num_pages), and the sequences on them are the ones it attends for (Step::dp); steps run
  // eagerly. This rank's share of the step (Batch::page_share), reused across steps.
  int dp_size_ = 1, dp_rank_ = 0;
  Batch dp_local_;
  std::vector<int32_t> dp_rows_, dp_scatter_;
};

}  // namespace atom
