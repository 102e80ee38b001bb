#include "layers/embedding.h"

#include "core/convert.h"
#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"

namespace atom {

namespace {
int64_t padded_rows_per_rank(int64_t vocab, int tp) {
  const int64_t padded = (vocab + VocabParallelEmbedding::kPadding - 1) /
                         VocabParallelEmbedding::kPadding * VocabParallelEmbedding::kPadding;
  return (padded + tp - 1) / tp;
}

WeightLoader vocab_loader(int64_t vocab, int64_t start, int64_t rows) {
  return [vocab, start, rows](Parameter& p, const Tensor& ckpt, const std::string&, int) {
    param_check_shape(p, ckpt, {vocab, p.data().size(1)}, "");
    const int64_t n = std::max<int64_t>(0, std::min(rows, vocab - start));
    if (n == 0) return;
    Tensor d = p.data().narrow(0, 0, n);
    tensor_assign(d, ckpt.narrow(0, start, n));
  };
}
}  // namespace

VocabParallelEmbedding::VocabParallelEmbedding(LayerContext& ctx, const std::string& prefix,
                                               int64_t vocab, int64_t hidden)
    : ctx_(ctx), vocab_(vocab), hidden_(hidden) {
  rows_ = padded_rows_per_rank(vocab, ctx.tp_size);
  start_ = ctx.tp_rank * rows_;
  weight_ = &ctx.params.add(prefix_join(prefix, "weight"),
                            ctx.param_tensor({rows_, hidden}, ctx.weight_dtype),
                            vocab_loader(vocab, start_, rows_));
}

Tensor VocabParallelEmbedding::forward(Step& step, const Tensor& ids) {
  Tensor out = step.empty({ids.numel(), hidden_}, ctx_.act_dtype);
  kernels::embedding(out, ids, weight_->data(), start_);
  if (ctx_.tp_size > 1) ctx_.comm->all_reduce_sum(out);
  if (step.batch.input_embeds) {
    for (const InputEmbeds::Run& r : step.batch.input_embeds->runs) {
      const int64_t n = r.values.dim() == 2 ? r.values.size(0) : -1;
      ATOM_CHECK(
          n >= 0 && r.values.size(1) == hidden_ && r.dst_row >= 0 && r.dst_row + n <= out.size(0),
          "input embeddings: {} at row {} do not fit the step's {} tokens of width {}",
          r.values.str(), r.dst_row, out.size(0), hidden_);
      Tensor dst = out.narrow(0, r.dst_row, n);
      tensor_assign(
          dst, r.values.device().is_cpu() ? r.values : tensor_cast_cpu(r.values, r.values.dtype()));
    }
  }
  return out;
}

ParallelLMHead::ParallelLMHead(LayerContext& ctx, const std::string& prefix, int64_t vocab,
                               int64_t hidden)
    : ctx_(ctx), vocab_(vocab) {
  rows_ = padded_rows_per_rank(vocab, ctx.tp_size);
  weight_ = &ctx.params.add(prefix_join(prefix, "weight"),
                            ctx.param_tensor({rows_, hidden}, ctx.weight_dtype),
                            vocab_loader(vocab, ctx.tp_rank * rows_, rows_));
}

ParallelLMHead::ParallelLMHead(LayerContext& ctx, VocabParallelEmbedding& tied)
    : ctx_(ctx), vocab_(tied.vocab()), rows_(tied.rows_per_rank()), weight_(&tied.weight()) {}

Tensor ParallelLMHead::forward(Step& step, const Tensor& hidden) {
  const int64_t R = hidden.size(0);
  Tensor local = step.empty({R, rows_}, DType::kF32);
  kernels::linear(local, hidden, weight_->data());
  Tensor full = local;
  if (ctx_.tp_size > 1) {
    full = step.empty({R, rows_ * ctx_.tp_size}, DType::kF32);
    ctx_.comm->all_gather_last_dim(local, full);
  }
  if (full.size(1) == vocab_) return full;
  Tensor logits = step.empty({R, vocab_}, DType::kF32);
  kernels::cast(logits, full.narrow(1, 0, vocab_));
  return logits;
}

}  // namespace atom
