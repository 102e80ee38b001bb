// CUDA graphs for decode steps. A decode batch (q new tokens per sequence, the same q for every
// sequence: 1 for plain decoding, K + 1 for speculative verification) is padded to the smallest
// bucket of at least its size and replayed through the graph of that (bucket, q); padding
// sequences write no cache slot. The graphs run out of an arena of their own, so the upload
// buffer and every activation sit at the addresses the capture recorded.
//
// What a graph records is a forward function over the step: the target's forward and LM head
// (outputs {logits, hidden states}) or a drafter's pass (engine/spec_decode.h). Its logits rows
// are either every token row (the target: one row per decode token, K + 1 per verified sequence)
// or one row per sequence, anywhere in it (a drafter's first step, whose sequences' accepted runs
// have different lengths).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "layers/batch.h"
#include "layers/context.h"
#include "models/model.h"

namespace atom {

// The step's outputs, tensors in the step's arena; rows follow the padded batch's token rows or
// logits rows.
using GraphForward = std::function<std::vector<Tensor>(Step&)>;

enum class GraphLogitsRows {
  kEveryToken,  // logits_indices = 0, 1, ..., num_tokens - 1
  kOnePerSeq,   // one logits row per sequence, inside its own rows
};

class DecodeGraphs {
 public:
  // The target: model.forward then model.compute_logits, outputs {logits, hidden}; every token
  // row has logits. query_lens: the tokens per sequence graphs are captured for.
  DecodeGraphs(Model& model, KvCache& kv, int max_model_len, int max_num_seqs,
               std::vector<int> query_lens = {1});
  // Any forward over batches on `device` that use `kv`.
  DecodeGraphs(Device device, KvCache& kv, int max_model_len, int max_num_seqs,
               std::vector<int> query_lens, GraphLogitsRows logits_rows, GraphForward forward);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  static std::vector<int> buckets_for(int max_num_seqs);
  const std::vector<int>& buckets() const { return buckets_; }
  const std::vector<int>& query_lens() const { return query_lens_; }

  // Whether `batch` is a decode step a graph can run: the same query length (one of
  // query_lens()) for every sequence, logits rows as this object's GraphLogitsRows, contexts
  // within max_model_len.
  bool accepts(const Batch& batch) const;
  // The outputs of the bucket's graph over `batch` padded (valid until the next run; the real
  // rows come first), captured first if needed. after_upload, when given, runs once the padded
  // batch is on the device and before the graph is launched (a drafter writes the token ids it
  // drew on the device over the uploaded ones). Work goes to the calling thread's current stream.
  const std::vector<Tensor>& run(const Batch& batch,
                                 const std::function<void(Batch& padded)>& after_upload = {});
  // Captures every (bucket, query length), the most tokens first.
  void capture_all();
  // Graph launches so far (captures included).
  int64_t replays() const { return replays_; }
  int num_graphs() const { return static_cast<int>(graphs_.size()); }

 private:
  struct Graph;
  // p = b padded to `bucket` sequences of q tokens.
  void pad(const Batch& b, int bucket, int q, Batch& p) const;
  void upload(Batch& p, int bucket);
  const std::vector<Tensor>& capture(int bucket, int q, Batch& p,
                                     const std::function<void(Batch&)>& after_upload);
  void clear();

  KvCache& kv_;
  int max_model_len_, max_pages_;
  std::vector<int> buckets_;
  std::vector<int> query_lens_;
  GraphLogitsRows logits_rows_;
  GraphForward forward_;
  Arena arena_;
  std::map<std::pair<int, int>, std::unique_ptr<Graph>> graphs_;  // (bucket, q)
  Batch padded_;  // the padded batch of run(), kept so its vectors are reused
  int64_t replays_ = 0;
};

}  // namespace atom
