// What layers are built with (LayerContext) and what a forward step hands them (Step).
#pragma once

#include <string>
#include <vector>

#include "core/arena.h"
#include "dist/communicator.h"
#include "layers/batch.h"
#include "loader/parameter.h"
#include "loader/quantization.h"
#include "loader/weight_names.h"

namespace atom {

class FusedMoE;

// What a layer keeps per token in the paged cache. Every kind is paged by the one block table
// (block b of a sequence holds its tokens [b * block_size, (b + 1) * block_size) in every
// layer's cache, whatever the kind), so the engine sizes, allocates, prefix-caches and frees
// them together: a page of the pool is one block of every layer's planes.
enum class CacheKind : int {
  // Keys and values per kv head: two planes [num_pages, block_size, num_heads, head_dim].
  kKeyValue = 0,
  // Multi-head latent attention: one plane [num_pages, block_size, 1, width] of rows
  // (c_kv | k_pe), width = kv_lora_rank + qk_rope_head_dim; the value is c_kv itself.
  kLatent = 1,
  // A sparse-attention indexer's keys (DeepSeek-V3.2, GLM-5): one plane
  // [num_pages, block_size, 1, index_head_dim].
  kIndexerKey = 2,
  // One row of head_dim values per tokens_per_row tokens (DeepSeek-V4: the shared key/value of
  // every token, and the compressed entries of each window of 4 or 128 tokens): one plane
  // [num_pages, rows_per_page, 1, head_dim]. The row of the window ending at token L lives in
  // the page holding L (layers/compressed_kv.h), so a page's rows depend only on the tokens up to
  // its end, and paging, prefix caching and freeing treat it like any other kind.
  kRows = 3,
};

const char* cache_kind_name(CacheKind k);

// One paged cache a layer declares (LayerContext::cache_specs); a model may declare several
// kinds, one spec per layer and kind.
struct CacheSpec {
  CacheKind kind = CacheKind::kKeyValue;
  int num_heads = 0;  // kKeyValue: kv heads on this rank; the single-row kinds: 1
  int head_dim = 0;   // elements of one head's row (kLatent, kIndexerKey: the whole row)
  DType dtype = DType::kF32;
  int sliding_window = 0;  // kKeyValue: 0 for full attention
  int tokens_per_row = 1;  // kRows: a row per this many tokens (a divisor or multiple of pages)
  // Kept in `dtype` whatever --kv-cache-dtype says (a plane of scores rather than keys and
  // values: GLM-5.3's k-pool gates, which an e4m3 rounding moves enough to change the selection).
  bool keeps_dtype = false;

  static CacheSpec key_value(int num_kv_heads, int head_dim, DType dtype, int sliding_window = 0) {
    return {CacheKind::kKeyValue, num_kv_heads, head_dim, dtype, sliding_window};
  }
  static CacheSpec latent(int width, DType dtype) {
    return {CacheKind::kLatent, 1, width, dtype, 0};
  }
  static CacheSpec indexer_key(int width, DType dtype) {
    return {CacheKind::kIndexerKey, 1, width, dtype, 0};
  }
  static CacheSpec rows(int width, int tokens_per_row, DType dtype, bool keeps_dtype = false) {
    return {CacheKind::kRows, 1, width, dtype, 0, tokens_per_row, keeps_dtype};
  }
  // Rows one page of block_size tokens holds: block_size for the per-token kinds; for kRows
  // block_size / tokens_per_row, or 1 when a row spans several pages. An Error when neither
  // divides the other.
  int rows_per_page(int block_size) const;
  // Tensors of this kind: 2 (K and V) or 1.
  int planes() const { return kind == CacheKind::kKeyValue ? 2 : 1; }
  // Bytes one page (block_size tokens) of this cache takes, over its planes.
  size_t page_bytes(int block_size) const;
};

// One per-request state a recurrent layer keeps (gated delta net, KDA, a test layer): the cache
// holds num_state_slots copies of it, and batch.state_slots says which slot each sequence uses.
// A layer treats a sequence whose step starts at context index 0 as new and resets its slot.
struct StateCacheSpec {
  Shape shape;  // of one slot, e.g. [heads, k_dim, v_dim]
  DType dtype = DType::kF32;
  // The layer also writes its state after each row r into slot batch.state_rollback_slots[r]
  // (when >= 0), so that speculative decoding can roll back to the state after any accepted row.
  bool rollback_rows = false;
};

// Every cache a model needs, side by side: the paged planes of each CacheSpec and a state slot
// pool per recurrent layer.
struct KvCache {
  int block_size = 16;
  int num_pages = 0;
  int num_state_slots = 0;
  std::vector<CacheSpec> specs;
  // planes[i]: spec i's tensors, each [num_pages, block_size, num_heads, head_dim].
  std::vector<std::vector<Tensor>> planes;
  std::vector<Tensor> state;  // one per StateCacheSpec, [num_state_slots, *spec.shape]

  // Spec i's plane p, checked against the kind the caller expects.
  Tensor& plane(size_t i, CacheKind kind, int p = 0);
  Tensor& key(size_t i) { return plane(i, CacheKind::kKeyValue, 0); }
  Tensor& value(size_t i) { return plane(i, CacheKind::kKeyValue, 1); }

  static KvCache allocate(const std::vector<CacheSpec>& specs, int num_pages, int block_size,
                          Device device, const std::vector<StateCacheSpec>& state_specs = {},
                          int num_state_slots = 0);
  // Bytes one page takes over all layers and kinds.
  static size_t page_bytes(const std::vector<CacheSpec>& specs, int block_size);
  // Bytes one state slot takes over all recurrent layers.
  static size_t state_slot_bytes(const std::vector<StateCacheSpec>& specs);
};

// `specs` with every cache stored as `dtype` (the KV cache dtype the runner is given).
inline std::vector<CacheSpec> cache_specs_with_dtype(std::vector<CacheSpec> specs, DType dtype) {
  for (auto& s : specs)
    if (!s.keeps_dtype) s.dtype = dtype;
  return specs;
}

// The layers one pipeline stage runs (vLLM's partition: num_layers / size each, the remainder
// one more each on the stages before the last, which also holds the LM head).
struct PipelineStage {
  int rank = 0, size = 1;
  int64_t first_layer = 0, end_layer = 0;  // [first_layer, end_layer)
  bool first() const { return rank == 0; }
  bool last() const { return rank == size - 1; }
  bool owns(int64_t layer) const { return layer >= first_layer && layer < end_layer; }
};
// Stage `rank` of `size` over num_layers layers; an error when a stage would get no layer.
// partition: the layers of each stage instead (vLLM's VLLM_PP_LAYER_PARTITION), `size` positive
// counts adding up to num_layers, else an error naming them.
PipelineStage pipeline_stage(int64_t num_layers, int rank, int size,
                             const std::vector<int>& partition = {});

// What a pipeline stage hands the next (vLLM's IntermediateTensors): its last layer's output,
// not yet added to the residual stream, and the residual stream ([tokens, hidden] each); for the
// hyper-connection families the streams [tokens, hc, hidden] as `hidden` and no residual.
struct IntermediateTensors {
  Tensor hidden, residual;
  // What the layers hand on within a step beside the hidden state (GLM-5's shared selection).
  std::vector<Tensor> extra;
};

struct LayerContext {
  ParamRegistry& params;
  Device device;
  DType weight_dtype;  // storage of dense weights
  DType act_dtype;     // activations (F32 on the CPU reference, BF16 on CUDA)
  int tp_rank = 0;
  int tp_size = 1;
  Communicator* comm = nullptr;                        // never null once a model is built
  std::vector<CacheSpec>* cache_specs = nullptr;       // paged layers add theirs here
  std::vector<StateCacheSpec>* state_specs = nullptr;  // recurrent layers add theirs here
  // Shared experts load as slots of their layer's fused experts (ModelOptions).
  bool fuse_shared_experts = false;
  // The checkpoint's quantization_config (null: full-precision weights); layers look up their
  // method by checkpoint name (QuantizationConfig::linear).
  const QuantizationConfig* quant = nullptr;
  // Which checkpoint modules a fused layer is fed from (q_proj -> qkv_proj part q, ...), for
  // looking up the parts' quantisation.
  std::vector<PackedModule> packed_modules;
  // FP8 weights stay FP8 on the device (default: on CUDA); otherwise dequantised at load.
  bool fp8_resident = false;
  // Expert parallelism (vLLM's --enable-expert-parallel): the tensor-parallel ranks split a
  // mixture's routed experts between them, each holding whole experts (ExpertShare), instead of
  // every rank holding a slice of every expert. Attention and dense layers stay tensor-parallel.
  bool expert_parallel = false;
  // EPLB's redundant experts (vLLM's num_redundant_experts): extra physical copies of experts
  // spread over the expert-parallel ranks (layers/moe.h). Needs expert_parallel.
  int num_redundant_experts = 0;
  // Layers with redundant experts register here (FusedMoE), for Model::rebalance_experts.
  std::vector<FusedMoE*>* eplb_layers = nullptr;

  // The pipeline stage this model is (the whole model: stage 0 of 1).
  PipelineStage stage{};

  // Data-parallel attention (vLLM's --data-parallel-size for DeepSeek's latent attention): the
  // context attention layers are built in (tp 1 and a solo communicator: every head on every
  // rank; or tp T over a group of T ranks and its communicator), while the ranks (groups) split
  // the step's sequences between them (Step::dp, layers/dp_attention.h) and every other layer
  // stays tensor- or expert-parallel over all of them. Null otherwise.
  LayerContext* data_parallel_attention = nullptr;

  // Expert parallelism in effect: asked for, over more than one rank.
  bool experts_split() const { return expert_parallel && tp_size > 1; }

  // A zero-initialised parameter tensor on the model's device.
  Tensor param_tensor(Shape shape, DType dtype) const {
    return Tensor::zeros(std::move(shape), dtype, device);
  }
};

struct Step;

// Data-parallel attention's share of a step on this rank (the ModelRunner builds it): the
// sequences whose KV pages this rank's cache holds, as a step of their own, and where their token
// rows sit in the step's.
struct DataParallelStep {
  Step* local = nullptr;  // the rank's sequences: their rows, pages rebased to this rank's cache
  Tensor rows;            // [T_local] I32: the step's row of each local row
  // [T] I32: the local row of each of the step's rows, T_local where another rank owns it
  Tensor scatter;
  int64_t local_tokens = 0;
};

// One forward step.
struct Step {
  Batch& batch;
  Arena& arena;
  KvCache* kv = nullptr;
  // Pipeline parallelism: a stage after the first starts from the previous stage's tensors
  // (pp_in: this step's own copies, which the stage may update in place); a stage before the last
  // writes its own into pp_out and computes no logits.
  const IntermediateTensors* pp_in = nullptr;
  IntermediateTensors* pp_out = nullptr;
  // Speculative block drafters (DSpark) read the outputs of some of the target's layers: when
  // layer_outputs is set, a model that hands them over (Model::hands_over_layer_outputs) writes
  // the output of layer (*layer_outputs)[j] at every row into columns [j hidden, (j + 1) hidden)
  // of *layer_outputs_out, [T, size() hidden] F32 in the step's arena (keep_layer_output).
  const std::vector<int64_t>* layer_outputs = nullptr;
  Tensor* layer_outputs_out = nullptr;
  // Data-parallel attention (LayerContext::data_parallel_attention): this rank's sequences.
  // The step's own kv is then null: only the local step addresses this rank's cache.
  const DataParallelStep* dp = nullptr;

  Tensor empty(Shape shape, DType dtype) { return arena.alloc(std::move(shape), dtype); }
};

// "a" + "." + "b", or "b" when a is empty.
inline std::string prefix_join(const std::string& a, const std::string& b) {
  return a.empty() ? b : a + "." + b;
}

}  // namespace atom
