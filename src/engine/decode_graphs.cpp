#include "engine/decode_graphs.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

#ifdef ATOM_HAVE_CUDA
#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#endif

namespace atom {

std::vector<int> DecodeGraphs::buckets_for(int max_num_seqs) {
  std::vector<int> b;
  for (int n : {1, 2, 4, 8})
    if (n <= max_num_seqs) b.push_back(n);
  for (int n = 16; n <= max_num_seqs; n += 8) b.push_back(n);
  if (b.empty() || b.back() < max_num_seqs) b.push_back(max_num_seqs);
  return b;
}

bool DecodeGraphs::accepts(const Batch& batch) const {
  const int S = batch.num_seqs();
  if (S < 1 || S > buckets_.back() || batch.num_tokens() != S ||
      static_cast<int>(batch.logits_indices.size()) != S)
    return false;
  for (int s = 0; s < S; ++s) {
    if (batch.query_start[s + 1] != s + 1 || batch.logits_indices[s] != s) return false;
    if (batch.context_lens[s] > max_model_len_) return false;
    if (batch.page_indptr[s + 1] - batch.page_indptr[s] > max_pages_) return false;
  }
  return true;
}

void DecodeGraphs::pad(const Batch& b, int bucket, Batch& p) const {
  const int S = b.num_seqs();
  // Assignments into p's vectors reuse their capacity: a steady stream of decode steps
  // allocates nothing here.
  p.copy_host_from(b);
  p.state_slots.resize(S, 0);
  // Padding sequences: token 0 at position 0 over a one-token context on page 0, written
  // nowhere (cache slot -1) and with no recurrent state (state slot -1: a live request's state is
  // never touched); their logits rows are dropped.
  for (int s = S; s < bucket; ++s) {
    p.token_ids.push_back(0);
    p.positions.push_back(0);
    p.query_start.push_back(s + 1);
    p.context_lens.push_back(1);
    p.slot_mapping.push_back(-1);
    p.page_indices.push_back(0);
    p.page_indptr.push_back(static_cast<int32_t>(p.page_indices.size()));
    p.state_slots.push_back(-1);
  }
  p.logits_indices.resize(bucket);
  for (int s = 0; s < bucket; ++s) p.logits_indices[s] = s;
}

void DecodeGraphs::upload(Batch& p, int bucket) {
  // The page table is uploaded last with room for bucket x max_pages entries, so every field
  // lands at the offset the capture recorded whatever the contexts' lengths; only the pages in
  // use are copied.
  p.upload(arena_, static_cast<int64_t>(bucket) * max_pages_);
  p.max_context_len = max_model_len_;  // the bound every replay honours
}

#ifdef ATOM_HAVE_CUDA

struct DecodeGraphs::Graph {
  cudaGraphExec_t exec = nullptr;
  Tensor logits;                // [bucket, vocab] in the arena
  const void* input = nullptr;  // where the capture's batch upload sat
  uint64_t generation = 0;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

DecodeGraphs::DecodeGraphs(Model& model, KvCache& kv, int max_model_len, int max_num_seqs)
    : model_(model),
      kv_(kv),
      max_model_len_(max_model_len),
      max_pages_((max_model_len + kv.block_size - 1) / kv.block_size),
      buckets_(buckets_for(max_num_seqs)),
      arena_(model.device(), 1 << 20) {}

DecodeGraphs::~DecodeGraphs() = default;

void DecodeGraphs::clear() { graphs_.clear(); }

Tensor DecodeGraphs::capture(int bucket, Batch& p) {
  const cudaStream_t stream = cuda_current_stream();
  ATOM_CHECK(stream != nullptr, "decode graphs need a runner stream (not the legacy stream)");
  // Warm-up: grows the arena to this bucket's need and creates every cuBLASLt plan, workspace
  // and kernel attribute outside the capture. Its sequences hold no recurrent state (slot -1):
  // the replay after the capture applies this step's recurrent update, once.
  {
    Batch w;
    w.copy_host_from(p);
    std::fill(w.state_slots.begin(), w.state_slots.end(), -1);
    arena_.reset();
    upload(w, bucket);
    Step step{w, arena_, &kv_};
    Tensor h = model_.forward(step);
    model_.compute_logits(step, h);
  }
  const uint64_t before = arena_.generation();
  arena_.reset();
  if (arena_.generation() != before)
    clear();  // blocks replaced: older graphs point at freed memory
  upload(p, bucket);
  auto g = std::make_unique<Graph>();
  g->input = p.dev.token_ids.data();
  g->generation = arena_.generation();
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    Step step{p, arena_, &kv_};
    Tensor h = model_.forward(step);
    g->logits = model_.compute_logits(step, h);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  const cudaError_t inst = cudaGraphInstantiate(&g->exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(inst);
  CUDA_CHECK(cudaGraphLaunch(g->exec, stream));
  Tensor logits = g->logits;
  log_debug("captured the decode graph of batch size {}", bucket);
  graphs_[bucket] = std::move(g);
  return logits;
}

Tensor DecodeGraphs::run(const Batch& batch) {
  const int S = batch.num_seqs();
  const int bucket = *std::lower_bound(buckets_.begin(), buckets_.end(), S);
  Batch& p = padded_;
  pad(batch, bucket, p);
  auto it = graphs_.find(bucket);
  Tensor logits;
  if (it == graphs_.end() || it->second->generation != arena_.generation()) {
    logits = capture(bucket, p);
  } else {
    arena_.reset();
    upload(p, bucket);
    ATOM_CHECK(p.dev.token_ids.data() == it->second->input &&
                   arena_.generation() == it->second->generation,
               "decode graph of batch size {}: the upload moved", bucket);
    CUDA_CHECK(cudaGraphLaunch(it->second->exec, cuda_current_stream()));
    logits = it->second->logits;
  }
  return logits.narrow(0, 0, S);
}

void DecodeGraphs::capture_all() {
  for (auto b = buckets_.rbegin(); b != buckets_.rend(); ++b) {
    if (graphs_.count(*b)) continue;
    // A batch of `bucket` padding sequences: nothing is written to the cache.
    Batch empty;
    empty.block_size = kv_.block_size;
    empty.query_start = {0};
    empty.page_indptr = {0};
    Batch p;
    pad(empty, *b, p);
    capture(*b, p);
  }
  CUDA_CHECK(cudaStreamSynchronize(cuda_current_stream()));
}

#else

struct DecodeGraphs::Graph {};
DecodeGraphs::DecodeGraphs(Model& model, KvCache& kv, int max_model_len, int max_num_seqs)
    : model_(model),
      kv_(kv),
      max_model_len_(max_model_len),
      max_pages_(1),
      buckets_(buckets_for(max_num_seqs)),
      arena_(model.device()) {
  fail("decode graphs need the CUDA backend");
}
DecodeGraphs::~DecodeGraphs() = default;
void DecodeGraphs::clear() {}
Tensor DecodeGraphs::capture(int, Batch&) { fail("decode graphs need the CUDA backend"); }
Tensor DecodeGraphs::run(const Batch&) { fail("decode graphs need the CUDA backend"); }
void DecodeGraphs::capture_all() {}

#endif

}  // namespace atom
