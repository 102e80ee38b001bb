// Data-parallel attention (vLLM's --data-parallel-size with DeepSeek's latent attention, SGLang's
// --enable-dp-attention): under tensor parallelism every rank holds 1/N of the heads but the
// whole latent cache of every sequence, since MLA's one latent row per token serves all heads.
// Here instead every rank holds every head (the attention's weights are built with
// LayerContext::data_parallel_attention, tp 1) and the ranks split the step's sequences: rank r
// attends for the sequences whose KV pages its cache holds (the engine's block partition r), so
// its cache holds only theirs and N ranks hold N times the sequences. With groups of T ranks
// (vLLM's -dp D -tp T) group g attends for partition g, its heads split over its T ranks (that
// context's tp T and the group's communicator); every rank of the group then holds the group's
// rows whole and only its first adds them in below. Around the attention:
//
//   x_local = x[rows]                   (this rank's sequences' token rows)
//   a_local = attention(local step, x_local)
//   out[t]  = a_local[scatter[t]] or 0  (every row of the step, zero where another rank owns it)
//   out     = all_reduce_sum(out)       (each row comes from exactly one rank)
//
// The all-reduce moves the same [T, hidden] as tensor parallelism's o_proj reduction; the layers
// around the attention (norms, dense MLPs, experts, embedding, head) stay tensor- or
// expert-parallel over the same ranks, which all hold every row again after it.
#pragma once

#include <functional>

#include "layers/context.h"

namespace atom {

// The context an attention layer is built in: ctx's data-parallel attention context when it has
// one, else ctx itself.
inline LayerContext& attention_context(LayerContext& ctx) {
  return ctx.data_parallel_attention ? *ctx.data_parallel_attention : ctx;
}

// attend(step, x) [T, hidden] when ctx has no data-parallel attention; otherwise attend on this
// rank's sequences (step.dp, which must be set) and every rank's rows gathered as above. ctx is
// the model's context (the one whose communicator spans the ranks).
Tensor data_parallel_attention(Step& step, const LayerContext& ctx, const Tensor& x,
                               const std::function<Tensor(Step&, const Tensor&)>& attend);

}  // namespace atom
