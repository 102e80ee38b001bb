// CUDA graphs for decode steps. A decode batch (one new token and one logits row per sequence)
// is padded to the smallest bucket of at least its size and replayed through that bucket's
// graph; padding sequences write no cache slot. The graphs run out of an arena of their own, so
// the upload buffer and every activation sit at the addresses the capture recorded.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "layers/batch.h"
#include "layers/context.h"
#include "models/model.h"

namespace atom {

class DecodeGraphs {
 public:
  // Sequences up to max_model_len tokens; buckets up to max_num_seqs.
  DecodeGraphs(Model& model, KvCache& kv, int max_model_len, int max_num_seqs);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  static std::vector<int> buckets_for(int max_num_seqs);
  const std::vector<int>& buckets() const { return buckets_; }

  // Whether `batch` is a decode step a graph can run.
  bool accepts(const Batch& batch) const;
  // Logits [num_seqs, vocab] F32 on the device (valid until the next run), through the bucket's
  // graph, which is captured first if needed. Work goes to the calling thread's current stream.
  Tensor run(const Batch& batch);
  // Captures every bucket, largest first.
  void capture_all();

 private:
  struct Graph;
  // p = b padded to `bucket` sequences.
  void pad(const Batch& b, int bucket, Batch& p) const;
  void upload(Batch& p, int bucket);
  Tensor capture(int bucket, Batch& p);
  void clear();

  Model& model_;
  KvCache& kv_;
  int max_model_len_, max_pages_;
  std::vector<int> buckets_;
  Arena arena_;
  std::map<int, std::unique_ptr<Graph>> graphs_;
  Batch padded_;  // the padded batch of run(), kept so its vectors are reused
};

}  // namespace atom
