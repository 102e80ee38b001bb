// Vocabulary-parallel embedding and LM head. The vocabulary is padded to a multiple of 64 and
// split into equal contiguous row ranges per rank; padding rows are zero.
#pragma once

#include <string>

#include "layers/context.h"

namespace atom {

class VocabParallelEmbedding {
 public:
  static constexpr int64_t kPadding = 64;
  VocabParallelEmbedding(LayerContext& ctx, const std::string& prefix, int64_t vocab,
                         int64_t hidden);

  // ids [T] I32 -> [T, hidden]
  Tensor forward(Step& step, const Tensor& ids);
  Parameter& weight() { return *weight_; }  // [rows_per_rank, hidden]
  int64_t vocab() const { return vocab_; }
  int64_t rows_per_rank() const { return rows_; }
  int64_t shard_start() const { return start_; }

 private:
  LayerContext& ctx_;
  int64_t vocab_, hidden_, rows_, start_;
  Parameter* weight_;
};

class ParallelLMHead {
 public:
  // A head with its own weight ("<prefix>.weight").
  ParallelLMHead(LayerContext& ctx, const std::string& prefix, int64_t vocab, int64_t hidden);
  // A head tied to the input embedding (tie_word_embeddings).
  ParallelLMHead(LayerContext& ctx, VocabParallelEmbedding& tied);

  // hidden [R, hidden] -> logits [R, vocab] F32 (gathered from every rank, padding dropped).
  Tensor forward(Step& step, const Tensor& hidden);

 private:
  LayerContext& ctx_;
  int64_t vocab_, rows_;
  Parameter* weight_;
};

}  // namespace atom
