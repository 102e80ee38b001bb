// CUDA entry points of moe_route and fused_moe (kernels in moe_route.cu, fused_moe.cu and
// fused_moe_gemm.cu): the shape, dtype and alignment checks, then the launchers.
#include "kernels/moe.h"

#include <algorithm>
#include <vector>

#include "kernels/activation.h"
#include "kernels/cuda/host_common.h"
#include "kernels/cuda/launch_moe_quant.h"
#include "kernels/cuda/moe_dense.h"
#include "kernels/cuda_tuning.h"
#include "kernels/linear.h"

namespace atom::kernels::cuda {

namespace {

constexpr int kTileRowsFrom = 8192;  // routed rows from which the default tile is 128 rows

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The per-slot dense path: the counting sort, its tile table read on the host (the one sync),
// then per slot and chunk of at most chunk_rows sorted positions (a multiple of 64, padding rows
// included, so the products' row counts take few values): gather x, gate | up = x w13[e]ᵀ
// (cuBLASLt), act = silu(gate) * up, y = act w2[e]ᵀ (cuBLASLt), scattered to the routed rows;
// then the weighted combine.
void fused_moe_dense(const MoeLaunch& l, const Tensor& w13, const Tensor& w2, Device dev,
                     DType dt) {
  const cudaStream_t s = current_stream();
  const MoeDense d = moe_dense_begin(l, s);
  std::vector<int> tile_e(static_cast<size_t>(d.max_tiles)), tile_n(tile_e.size());
  int num_tiles = 0;
  CUDA_CHECK(cudaMemcpyAsync(&num_tiles, d.num_tiles, sizeof(int), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaMemcpyAsync(tile_e.data(), d.tile_expert, tile_e.size() * sizeof(int),
                             cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaMemcpyAsync(tile_n.data(), d.tile_rows, tile_n.size() * sizeof(int),
                             cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  ATOM_CHECK(num_tiles >= 0 && num_tiles <= d.max_tiles, "fused_moe: {} tiles (at most {})",
             num_tiles, d.max_tiles);
  const int64_t H = l.H, I = l.I, eb = 2;
  char* act = static_cast<char*>(d.act);
  for (int t0 = 0; t0 < num_tiles;) {
    const int e = tile_e[static_cast<size_t>(t0)];
    int64_t count = 0;
    int t1 = t0;
    for (; t1 < num_tiles && tile_e[static_cast<size_t>(t1)] == e; ++t1)
      count += tile_n[static_cast<size_t>(t1)];
    const int64_t first = static_cast<int64_t>(t0) * d.tile;
    const Tensor we13 = w13.select(0, e), we2 = w2.select(0, e);
    for (int64_t c0 = 0; c0 < count; c0 += d.chunk_rows) {
      const int64_t n = std::min(d.chunk_rows, (count - c0 + 63) / 64 * 64);
      moe_dense_gather(l, d, first + c0, n, s);
      Tensor xs = Tensor::wrap(d.x_chunk, {n, H}, dt, dev, nullptr);
      Tensor h = Tensor::wrap(d.h_chunk, {n, 2 * I}, dt, dev, nullptr);
      Tensor a = Tensor::wrap(act + (first + c0) * I * eb, {n, I}, dt, dev, nullptr);
      linear(h, xs, we13, Tensor());
      cuda::glu(a, h, Glu());
      linear(xs, a, we2, Tensor());  // w2's outputs reuse the gathered rows' buffer
      moe_dense_scatter(l, d, first + c0, n, s);
    }
    t0 = t1;
  }
  moe_dense_combine(l, d, s);
}

}  // namespace

void moe_route(Tensor& topk_ids, Tensor& topk_weights, const Tensor& logits,
               const Tensor& correction_bias, const RouterArgs& a) {
  moe_route_check(topk_ids, topk_weights, logits, correction_bias, a);
  static_assert(static_cast<int>(RouterScoring::kSqrtSoftplus) == 3 &&
                static_cast<int>(MoeActivation::kSiluMulClamped) == 2 &&
                static_cast<int>(MoeActivation::kSitu) == 3);
  const int64_t T = logits.size(0), E = logits.size(1);
  ATOM_CHECK(E <= kMoeRouteMaxExperts && a.top_k <= kMoeRouteMaxTopK,
             "moe_route: the CUDA router takes up to {} experts and top_k {}, got {} and {}",
             kMoeRouteMaxExperts, kMoeRouteMaxTopK, E, a.top_k);
  if (T == 0) return;
  MoeRouteLaunch l;
  l.ids = topk_ids.ptr<int32_t>();
  l.weights = topk_weights.ptr<float>();
  l.logits = logits.ptr<float>();
  l.logits_stride = T > 1 ? logits.stride(0) : E;
  l.bias = correction_bias.defined() ? correction_bias.ptr<float>() : nullptr;
  l.num_tokens = T;
  l.num_experts = static_cast<int>(E);
  l.scoring = static_cast<int>(a.scoring);
  l.top_k = a.top_k;
  l.renormalize = a.renormalize;
  l.n_group = a.n_group;
  l.topk_group = a.topk_group;
  l.group_score = static_cast<int>(a.group_score);
  l.scale = a.routed_scaling_factor;
  l.num_shared = a.num_fused_shared;
  l.shared_first = a.shared_slot_first;
  l.local_first = a.local_first;
  l.local_count = a.local_count;
  if (a.replicas) {
    l.replicas = a.replicas->ptr<int32_t>();
    l.replica_count = a.replica_count->ptr<int32_t>();
    l.max_replicas = static_cast<int>(a.replicas->size(1));
  }
  if (a.expert_load)
    l.expert_load = reinterpret_cast<unsigned long long*>(a.expert_load->ptr<int64_t>());
  if (a.fixed_ids) l.fixed_ids = a.fixed_ids->ptr<int32_t>();
  launch_moe_route(l, current_stream());
  launch_check("moe_route");
}

int64_t fused_moe_workspace_bytes(int64_t num_tokens, int64_t k, const MoeExperts& w,
                                  DType act_dtype) {
  ATOM_CHECK(w.w13 && w.w2 && w.w13->dim() == 3 && w.w2->dim() == 3,
             "fused_moe_workspace_bytes: expert weights missing");
  const int64_t S = w.w13->size(0), I = w.intermediate(), H = w.hidden();
  return moe_workspace_bytes(num_tokens, static_cast<int>(k), static_cast<int>(S), H, I,
                             static_cast<int>(dtype_bytes(act_dtype, 1)));
}

void fused_moe(Tensor& out, const Tensor& x, const MoeExperts& w, const Tensor& topk_ids,
               const Tensor& topk_weights, Tensor* workspace) {
  fused_moe_check(out, x, w, topk_ids, topk_weights);
  const Tensor& w13 = *w.w13;
  const Tensor& w2 = *w.w2;
  const int64_t T = x.size(0), H = x.size(1), S = w13.size(0), I = w13.size(1) / 2;
  if (w.mxfp4())
    ATOM_CHECK(x.dtype() == DType::kBF16 && aligned16(w.w13_scales->data()) &&
                   aligned16(w.w2_scales->data()),
               "fused_moe: MXFP4 experts take BF16 activations and 16-byte aligned scales, got "
               "x {}",
               x.str());
  else if (w.fp8())
    // A lane's 32 codes (decode) and a 64-wide k step (GEMMs) lie in one scale block.
    ATOM_CHECK(x.dtype() == DType::kBF16 && H % 64 == 0 && I % 64 == 0 && w.fp8_block_k % 64 == 0,
               "fused_moe: FP8 experts on CUDA take BF16 activations, hidden and intermediate "
               "sizes that are multiples of 64 and scale blocks of a multiple of 64 columns, got "
               "x {}, I {}, blocks of {} x {}",
               x.str(), I, w.fp8_block_n, w.fp8_block_k);
  else
    ATOM_CHECK((x.dtype() == DType::kBF16 || x.dtype() == DType::kF16) &&
                   w13.dtype() == x.dtype() && w2.dtype() == x.dtype(),
               "fused_moe: the CUDA kernels take BF16 or F16 activations and weights of one dtype, "
               "got x {}, w13 {}, w2 {}",
               x.str(), w13.str(), w2.str());
  ATOM_CHECK(
      out.dtype() == DType::kF32 || out.dtype() == DType::kBF16 || out.dtype() == DType::kF16,
      "fused_moe: out {} must be F32, BF16 or F16", out.str());
  // The expert biases: the weights' dtype, contiguous, 4-byte aligned (read in pairs).
  ATOM_CHECK(
      !w.w13_bias || (w.w13_bias->is_contiguous() && w.w13_bias->shape() == Shape{S, 2 * I} &&
                      w.w13_bias->dtype() == x.dtype() &&
                      reinterpret_cast<uintptr_t>(w.w13_bias->data()) % 4 == 0),
      "fused_moe: w13 bias {} for w13 {} (contiguous [S, 2I] of the weights' dtype)",
      w.w13_bias ? w.w13_bias->str() : "", w13.str());
  ATOM_CHECK(!w.w2_bias || (w.w2_bias->is_contiguous() && w.w2_bias->shape() == Shape{S, H} &&
                            w.w2_bias->dtype() == x.dtype() &&
                            reinterpret_cast<uintptr_t>(w.w2_bias->data()) % 4 == 0),
             "fused_moe: w2 bias {} for w2 {} (contiguous [S, H] of the weights' dtype)",
             w.w2_bias ? w.w2_bias->str() : "", w2.str());
  ATOM_CHECK(H % 8 == 0 && I % 8 == 0,
             "fused_moe: the CUDA kernels need the hidden size {} and the intermediate size {} "
             "to be multiples of 8",
             H, I);
  const int64_t K = topk_ids.size(1);
  ATOM_CHECK(S <= kMoeMaxSlots && T * K <= (int64_t{1} << 30) && K <= (int64_t{1} << 20),
             "fused_moe: at most {} expert slots and 2^30 routed rows on CUDA, got {} and {}",
             kMoeMaxSlots, S, T * K);
  Mat xm = mat_of(x, "fused_moe");
  ATOM_CHECK(
      xm.stride % 8 == 0 && aligned16(x.data()) && aligned16(w13.data()) && aligned16(w2.data()),
      "fused_moe: x rows and the expert weights must be 16-byte aligned (x {} stride {})", x.str(),
      xm.stride);
  if (T == 0) return;
  const int64_t need = moe_workspace_bytes(T, static_cast<int>(K), static_cast<int>(S), H, I, 2);
  void* ws = nullptr;
  if (need > 0) {
    ATOM_CHECK(workspace && workspace->defined() && workspace->is_contiguous() &&
                   static_cast<int64_t>(workspace->nbytes()) >= need &&
                   workspace->device() == out.device() && aligned16(workspace->data()),
               "fused_moe: a 16-byte aligned workspace of {} bytes on {} is needed for {} tokens "
               "of {} choices (fused_moe_workspace_bytes), got {}",
               need, out.device().str(), T, K, workspace ? workspace->str() : std::string("none"));
    ws = workspace->data();
  }
  MoeLaunch l;
  l.out = mat_of(out, "fused_moe");
  l.x = xm;
  l.w13 = w13.data();
  l.w2 = w2.data();
  l.ids = topk_ids.ptr<int32_t>();
  l.weights = topk_weights.ptr<float>();
  l.T = T;
  l.H = H;
  l.I = I;
  l.K = static_cast<int>(K);
  l.S = static_cast<int>(S);
  l.type = elem_of(x.dtype(), "fused_moe");
  l.workspace = ws;
  const CudaTuning& tuning = cuda_tuning();
  l.decode = T * K <= (w.fp8()     ? tuning.moe_decode_max_rows_fp8
                       : w.mxfp4() ? tuning.moe_decode_max_rows_mxfp4
                                   : tuning.moe_decode_max_rows) &&
             T * K <= kMoeDecodeMaxRowsCap;
  l.decode_depth = tuning.moe_decode_depth;
  const int tile_rows = tuning.moe_gemm_tile_rows;
  l.gemm_tile_rows = tile_rows ? tile_rows : T * K >= kTileRowsFrom ? 128 : 64;
  l.b13 = w.w13_bias ? w.w13_bias->data() : nullptr;
  l.b2 = w.w2_bias ? w.w2_bias->data() : nullptr;
  const GluConstants act = glu_constants(w.activation);
  l.act = act.act;
  l.alpha = act.alpha;
  l.limit = act.limit;
  const int64_t R = T * K, in_use = std::min<int64_t>(S, R);
  const bool dense = !w.quantized() && !l.decode && !l.b13 && !l.b2 && l.act == 0 &&
                     tuning.moe_dense_min_rows > 0 && R >= kMoeDenseMinRoutedRows &&
                     R >= int64_t{tuning.moe_dense_min_rows} * in_use &&
                     in_use <= tuning.moe_dense_max_slots && !stream_capturing(current_stream());
  if (dense) {
    fused_moe_dense(l, w13, w2, out.device(), x.dtype());
  } else if (w.quantized()) {
    MoeQuantScales sc;
    sc.s13 = w.w13_scales->data();
    sc.s2 = w.w2_scales->data();
    if (w.fp8()) {
      sc.fp8_bn = w.fp8_block_n;
      sc.fp8_bk = w.fp8_block_k;
    }
    launch_fused_moe_quant(l, sc, current_stream());
  } else {
    launch_fused_moe(l, current_stream());
  }
  launch_check("fused_moe");
}

}  // namespace atom::kernels::cuda
