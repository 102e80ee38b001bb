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

namespace {
std::vector<int> sorted_query_lens(std::vector<int> q) {
  std::sort(q.begin(), q.end());
  q.erase(std::unique(q.begin(), q.end()), q.end());
  ATOM_CHECK(!q.empty() && q.front() >= 1, "decode graphs: query lengths must be >= 1");
  return q;
}

GraphForward target_forward(Model& model) {
  return [&model](Step& step) {
    Tensor h = model.forward(step);
    Tensor logits = model.compute_logits(step, h);
    return std::vector<Tensor>{logits, h};
  };
}
}  // namespace

DecodeGraphs::DecodeGraphs(Model& model, KvCache& kv, int max_model_len, int max_num_seqs,
                           std::vector<int> query_lens)
    : DecodeGraphs(model.device(), kv, max_model_len, max_num_seqs, std::move(query_lens),
                   GraphLogitsRows::kEveryToken, target_forward(model)) {}

bool DecodeGraphs::accepts(const Batch& batch) const {
  const int S = batch.num_seqs(), T = batch.num_tokens();
  if (S < 1 || S > buckets_.back() || T % S != 0) return false;
  const int q = T / S;
  if (!std::binary_search(query_lens_.begin(), query_lens_.end(), q)) return false;
  const bool every = logits_rows_ == GraphLogitsRows::kEveryToken;
  if (static_cast<int>(batch.logits_indices.size()) != (every ? T : S)) return false;
  // Rollback slots come with verification steps only (q > 1): a graph of q > 1 always uploads
  // them (pad), one of q == 1 never, so every field stays where its capture recorded it.
  if (q == 1 && !batch.state_rollback_slots.empty()) return false;
  for (int s = 0; s < S; ++s) {
    if (batch.query_start[s + 1] != (s + 1) * q) return false;
    if (batch.context_lens[s] > max_model_len_) return false;
    if (batch.page_indptr[s + 1] - batch.page_indptr[s] > max_pages_) return false;
    if (!every && (batch.logits_indices[s] < s * q || batch.logits_indices[s] >= (s + 1) * q))
      return false;
  }
  if (every)
    for (int i = 0; i < T; ++i)
      if (batch.logits_indices[i] != i) return false;
  return true;
}

void DecodeGraphs::pad(const Batch& b, int bucket, int q, Batch& p) const {
  const int S = b.num_seqs();
  const bool every = logits_rows_ == GraphLogitsRows::kEveryToken;
  // Assignments into p's vectors reuse their capacity: a steady stream of decode steps
  // allocates nothing here.
  p.copy_host_from(b);
  p.state_slots.resize(S, 0);
  // Padding sequences: q tokens 0 at positions 0.. over a q-token context on page 0, written
  // nowhere (cache slot -1) and with no recurrent state (state slot -1: a live request's state is
  // never touched); their logits rows are dropped.
  const int pages = (q + p.block_size - 1) / p.block_size;
  for (int s = S; s < bucket; ++s) {
    for (int i = 0; i < q; ++i) {
      p.token_ids.push_back(0);
      p.positions.push_back(i);
      p.slot_mapping.push_back(-1);
      if (every) p.logits_indices.push_back(s * q + i);
    }
    if (!every) p.logits_indices.push_back(s * q + q - 1);
    p.query_start.push_back((s + 1) * q);
    p.context_lens.push_back(q);
    for (int i = 0; i < pages; ++i) p.page_indices.push_back(0);
    p.page_indptr.push_back(static_cast<int32_t>(p.page_indices.size()));
    p.state_slots.push_back(-1);
  }
  // Verification steps (q > 1) always carry rollback slots, -1 where the batch has none (its
  // model keeps no recurrent state, or a capture's batch of padding sequences) and on padding
  // rows, so the upload's layout and the kernels' arguments are the same at every replay.
  if (q > 1) p.state_rollback_slots.resize(static_cast<size_t>(bucket) * q, -1);
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
  std::vector<Tensor> outputs;  // the forward's outputs, in the arena
  const void* input = nullptr;  // where the capture's batch upload sat
  uint64_t generation = 0;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

DecodeGraphs::DecodeGraphs(Device device, KvCache& kv, int max_model_len, int max_num_seqs,
                           std::vector<int> query_lens, GraphLogitsRows logits_rows,
                           GraphForward forward)
    : kv_(kv),
      max_model_len_(max_model_len),
      max_pages_((max_model_len + kv.block_size - 1) / kv.block_size),
      buckets_(buckets_for(max_num_seqs)),
      query_lens_(sorted_query_lens(std::move(query_lens))),
      logits_rows_(logits_rows),
      forward_(std::move(forward)),
      arena_(device, 1 << 20) {}

DecodeGraphs::~DecodeGraphs() = default;

void DecodeGraphs::clear() { graphs_.clear(); }

const std::vector<Tensor>& DecodeGraphs::capture(int bucket, int q, Batch& p,
                                                 const std::function<void(Batch&)>& after_upload) {
  const cudaStream_t stream = cuda_current_stream();
  ATOM_CHECK(stream != nullptr, "decode graphs need a runner stream (not the legacy stream)");
  // Warm-up: grows the arena to this shape's need and creates every cuBLASLt plan, workspace
  // and kernel attribute outside the capture. Its sequences hold no recurrent state (slot -1):
  // the replay after the capture applies this step's recurrent update, once.
  {
    Batch w;
    w.copy_host_from(p);
    std::fill(w.state_slots.begin(), w.state_slots.end(), -1);
    std::fill(w.state_rollback_slots.begin(), w.state_rollback_slots.end(), -1);
    arena_.reset();
    upload(w, bucket);
    if (after_upload) after_upload(w);
    Step step{w, arena_, &kv_};
    forward_(step);
  }
  const uint64_t before = arena_.generation();
  arena_.reset();
  if (arena_.generation() != before)
    clear();  // blocks replaced: older graphs point at freed memory
  upload(p, bucket);
  if (after_upload) after_upload(p);
  auto g = std::make_unique<Graph>();
  g->input = p.dev.token_ids.data();
  g->generation = arena_.generation();
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    Step step{p, arena_, &kv_};
    g->outputs = forward_(step);
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
  ++replays_;
  log_debug("captured the decode graph of batch size {}, {} tokens per sequence", bucket, q);
  auto& slot = graphs_[{bucket, q}];
  slot = std::move(g);
  return slot->outputs;
}

const std::vector<Tensor>& DecodeGraphs::run(const Batch& batch,
                                             const std::function<void(Batch&)>& after_upload) {
  const int S = batch.num_seqs();
  const int q = batch.num_tokens() / S;
  const int bucket = *std::lower_bound(buckets_.begin(), buckets_.end(), S);
  Batch& p = padded_;
  pad(batch, bucket, q, p);
  auto it = graphs_.find({bucket, q});
  if (it == graphs_.end() || it->second->generation != arena_.generation())
    return capture(bucket, q, p, after_upload);
  arena_.reset();
  upload(p, bucket);
  ATOM_CHECK(
      p.dev.token_ids.data() == it->second->input && arena_.generation() == it->second->generation,
      "decode graph of batch size {} ({} tokens per sequence): the upload moved", bucket, q);
  if (after_upload) after_upload(p);
  CUDA_CHECK(cudaGraphLaunch(it->second->exec, cuda_current_stream()));
  ++replays_;
  return it->second->outputs;
}

void DecodeGraphs::capture_all() {
  // The most tokens first: the arena grows to its largest need once, so no graph captured
  // earlier is dropped for a later one.
  for (auto q = query_lens_.rbegin(); q != query_lens_.rend(); ++q)
    for (auto b = buckets_.rbegin(); b != buckets_.rend(); ++b) {
      if (graphs_.count({*b, *q})) continue;
      // A batch of `bucket` padding sequences: nothing is written to the cache.
      Batch empty;
      empty.block_size = kv_.block_size;
      empty.query_start = {0};
      empty.page_indptr = {0};
      Batch p;
      pad(empty, *b, *q, p);
      capture(*b, *q, p, {});
    }
  CUDA_CHECK(cudaStreamSynchronize(cuda_current_stream()));
}

#else

struct DecodeGraphs::Graph {};
DecodeGraphs::DecodeGraphs(Device device, KvCache& kv, int max_model_len, int max_num_seqs,
                           std::vector<int> query_lens, GraphLogitsRows logits_rows,
                           GraphForward forward)
    : kv_(kv),
      max_model_len_(max_model_len),
      max_pages_(1),
      buckets_(buckets_for(max_num_seqs)),
      query_lens_(sorted_query_lens(std::move(query_lens))),
      logits_rows_(logits_rows),
      forward_(std::move(forward)),
      arena_(device) {
  fail("decode graphs need the CUDA backend");
}
DecodeGraphs::~DecodeGraphs() = default;
void DecodeGraphs::clear() {}
const std::vector<Tensor>& DecodeGraphs::capture(int, int, Batch&,
                                                 const std::function<void(Batch&)>&) {
  fail("decode graphs need the CUDA backend");
}
const std::vector<Tensor>& DecodeGraphs::run(const Batch&, const std::function<void(Batch&)>&) {
  fail("decode graphs need the CUDA backend");
}
void DecodeGraphs::capture_all() {}

#endif

}  // namespace atom
