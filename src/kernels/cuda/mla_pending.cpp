// Placeholder until the CUDA multi-head latent attention kernels land (issue 16, item 5): the
// entry points fail clearly, so an MLA model on a GPU stops at its first step, naming the op.
#include "kernels/layer_norm.h"
#include "kernels/mla.h"

namespace atom::kernels::cuda {

void mla_rope_cache_write(Tensor&, Tensor&, const Tensor&, const Tensor&, const MlaRopeArgs&,
                          Tensor&, const Tensor&) {
  fail("mla_rope_cache_write: not implemented on CUDA yet (multi-head latent attention runs on "
       "the CPU backend only)");
}
void cache_rows_write(Tensor&, const Tensor&, const Tensor&) {
  fail("cache_rows_write: not implemented on CUDA yet (multi-head latent attention runs on the "
       "CPU backend only)");
}
void mla_paged_attention(Tensor&, const Tensor&, const Tensor&, const AttentionBatch&,
                         const Tensor&, const MlaArgs&) {
  fail("mla_paged_attention: not implemented on CUDA yet (multi-head latent attention runs on "
       "the CPU backend only)");
}
void indexer_topk(Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionBatch&,
                  const IndexerArgs&) {
  fail("indexer_topk: not implemented on CUDA yet (sparse attention runs on the CPU backend "
       "only)");
}

void layer_norm(Tensor&, const Tensor&, const Tensor&, const Tensor&, float) {
  fail("layer_norm: not implemented on CUDA yet (the sparse-attention indexer's k_norm runs on "
       "the CPU backend only)");
}

}  // namespace atom::kernels::cuda
