#include "layers/dp_attention.h"

#include "core/error.h"
#include "kernels/elementwise.h"

namespace atom {

Tensor data_parallel_attention(Step& step, const LayerContext& ctx, const Tensor& x,
                               const std::function<Tensor(Step&, const Tensor&)>& attend) {
  if (!ctx.data_parallel_attention) return attend(step, x);
  ATOM_CHECK(step.dp && step.dp->local,
             "data-parallel attention: the step carries no share of this rank's sequences");
  const DataParallelStep& dp = *step.dp;
  const int64_t T = x.size(0), H = x.size(1), L = dp.local_tokens;
  ATOM_CHECK(dp.scatter.defined() && dp.scatter.size(0) == T && dp.rows.size(0) == L,
             "data-parallel attention: {} rows, {} local, scatter of {}", T, L,
             dp.scatter.defined() ? dp.scatter.size(0) : -1);
  // Rows [0, L): this rank's attention output; row L: zeros, for the rows of other ranks.
  Tensor padded = step.empty({L + 1, H}, x.dtype());
  padded.narrow(0, L, 1).zero_();
  if (L > 0) {
    Tensor xs = step.empty({L, H}, x.dtype());
    kernels::gather_rows(xs, x, dp.rows);
    const Tensor a = attend(*dp.local, xs);
    ATOM_CHECK(a.dim() == 2 && a.size(0) == L && a.size(1) == H && a.dtype() == x.dtype(),
               "data-parallel attention: the attention gave {} for {} rows of {}", a.str(), L, H);
    // Attention tensor-parallel within a group of ranks: every rank of the group holds the
    // group's rows whole after its o_proj, and only the group's first adds them in.
    if (ctx.data_parallel_attention->tp_rank == 0)
      padded.narrow(0, 0, L).copy_from(a);
    else
      padded.narrow(0, 0, L).zero_();
  }
  Tensor out = step.empty({T, H}, x.dtype());
  kernels::gather_rows(out, padded, dp.scatter);
  ctx.comm->all_reduce_sum(out);
  return out;
}

}  // namespace atom
