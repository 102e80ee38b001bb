// What the engine drives each step: a ModelRunner on one device, or a TpRunner over the ranks of
// a tensor-parallel group (engine/tp_runner.h). Both take the same Batch and give back the same
// host results, so the scheduler, block manager and sampler never know how many ranks there are.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "kernels/sampling.h"
#include "layers/batch.h"

namespace atom {

// What one step wants from its logits rows: some drawn on the model's device, the others copied
// to the host (for the CPU sampler, logprobs, prompt logprobs). Rows named in neither are dropped.
struct StepSampling {
  std::vector<int32_t> device_rows;                 // logits rows drawn by kernels::sample
  std::vector<kernels::SamplingRow> device_params;  // how each device row is drawn
  std::vector<int32_t> host_rows;                   // logits rows needed on the host
  // Structured output on the device: device row i is drawn only among the tokens of row
  // device_mask[i] of the mask table (-1: unconstrained; empty: no row is). The table,
  // [rows, mask_words] bit sets (bit t of a row: word t / 64, bit t % 64; set: token t allowed),
  // is filled on the host while the forward runs: masks() waits for it and returns it. The runner
  // calls it after launching the forward, so the two overlap. It may be called more than once.
  std::vector<int32_t> device_mask;
  int64_t mask_words = 0;
  std::function<std::span<const uint64_t>()> masks;
  void clear() {
    device_rows.clear();
    device_params.clear();
    host_rows.clear();
    device_mask.clear();
    mask_words = 0;
    masks = nullptr;
  }
};

struct StepSamples {
  std::vector<int32_t> tokens;  // one per device row
  Tensor host_logits;  // [host rows, vocab] F32 on the host, valid until the runner's next step
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Logits [len(batch.logits_indices), vocab] F32 on the host.
  virtual Tensor execute(Batch& batch) = 0;
  // The argmax token of every logits row (computed on the model's device).
  virtual std::vector<int32_t> execute_greedy(Batch& batch) = 0;
  // One forward pass; the device rows are sampled where the logits are and only their ids come
  // back, with the host rows' logits. Buffers in `out` are reused.
  virtual void execute_sampling(Batch& batch, const StepSampling& want, StepSamples& out) = 0;
  // CUDA: captures the decode graph of every batch-size bucket now instead of on first use.
  virtual void capture_decode_graphs() = 0;
  // Batch sizes with a decode graph (empty when decode runs eagerly).
  virtual std::vector<int> graph_buckets() const = 0;
  // Steps run through a decode graph so far (0 without graphs).
  virtual int64_t graph_steps() const { return 0; }
  virtual int block_size() const = 0;
  virtual int num_pages() const = 0;
  // The page numbers split into this many equal partitions, each held by one data-parallel
  // attention rank (a sequence's pages all come from one: BlockManager partitions).
  virtual int page_partitions() const { return 1; }
  virtual int max_model_len() const = 0;
  // Hidden states [num_tokens, hidden] (after the final norm) of the last step, eager or from a
  // decode graph, on the model's device, valid until the next step; undefined when the runner
  // keeps none (tensor parallelism). Speculative decoding's drafter reads it.
  virtual Tensor last_hidden() const { return Tensor(); }
  // The outputs of RunnerOptions::layer_outputs' target layers [num_tokens, n hidden] F32 of the
  // last step (Step::layer_outputs), valid until the next; undefined when the runner keeps none.
  // A block drafter (DSpark) reads them.
  virtual Tensor last_layer_outputs() const { return Tensor(); }
  // EPLB: re-places the model's redundant experts from their load on every rank at once
  // (Model::rebalance_experts); the layers whose placement changed.
  virtual int rebalance_experts() { return 0; }
};

}  // namespace atom
