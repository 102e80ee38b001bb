// The MoE router on the GPU: one warp per token. The warp's scores and choice values live in
// shared memory; each of the top_k picks is a warp-wide argmax over the untaken experts with the
// CPU reference's rules (kernels/cpu/moe.cpp, argmax_untaken): the lowest index among equal
// values, and the first untaken expert when its value is NaN (a strict `>` scan never leaves a
// NaN it starts on, and never moves onto one). Softmax and sigmoid use expf and IEEE division,
// so scores agree with the CPU's to a few ulps; group scores, group picks and the final
// normalisation follow the CPU's order of operations exactly. When no choice value is NaN (the
// rule for NaN is the only one that depends on the order of the untaken experts), the picks run
// on values held in registers instead (warp_topk_finite: one shuffle reduction a pick, no pass
// over shared memory), which gives the same picks.
#include <algorithm>
#include <atomic>
#include <climits>

#include "kernels/cuda/device_common.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxE = kMoeRouteMaxExperts;
constexpr int kMaxK = kMoeRouteMaxTopK;
// Experts of groups not kept: as the CPU reference (kernels/moe.h).
constexpr float kMasked = -INFINITY;

// Every lane's (value, index) candidate merged by a butterfly: the largest value, the lowest index
// among equal ones; INT_MAX marks a lane with none (non-NaN values only). Every lane ends with the
// warp's best.
__device__ __forceinline__ void warp_merge_best(float& bv, int& be) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oe = __shfl_xor_sync(0xffffffffu, be, o);
    if (oe != INT_MAX && (be == INT_MAX || ov > bv || (ov == bv && oe < be))) {
      bv = ov;
      be = oe;
    }
  }
}

// argmax_untaken of the CPU reference over v[0, n) (taken[i] != 0 skipped), by the whole warp:
// the first untaken index if its value is NaN, else the lowest index of the largest non-NaN
// value; -1 when every entry is taken. Every lane returns the same index.
__device__ int warp_argmax_untaken(const float* v, const unsigned char* taken, int n, int lane) {
  int first = INT_MAX, be = INT_MAX;
  float bv = 0.0f;
  for (int i = lane; i < n; i += 32) {
    if (taken[i]) continue;
    const float x = v[i];
    if (first == INT_MAX) first = i;
    if (!isnan(x) && (be == INT_MAX || x > bv)) {
      bv = x;
      be = i;
    }
  }
  first = __reduce_min_sync(0xffffffffu, first);
  warp_merge_best(bv, be);
  if (first == INT_MAX) return -1;
  if (be == INT_MAX || isnan(v[first])) return first;
  return be;
}

// The k < K picks of warp_argmax_untaken over v[0, n) (n <= kMaxE, K <= n) when no v is NaN:
// the largest untaken value, the lowest index among equal ones. Lane l holds v[l + 32 j] in
// x[j], so its own scan in j order already prefers the lower index. ids[k] are written by lane 0.
__device__ void warp_topk_finite(const float* v, int n, int K, int lane, int* ids) {
  constexpr int P = kMaxE / 32;
  float x[P];
  uint32_t avail = 0;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int e = lane + 32 * j;
    x[j] = e < n ? v[e] : 0.0f;
    if (e < n) avail |= 1u << j;
  }
  for (int k = 0; k < K; ++k) {
    float bv = 0.0f;
    int be = INT_MAX;
#pragma unroll
    for (int j = 0; j < P; ++j)
      if (((avail >> j) & 1u) && (be == INT_MAX || x[j] > bv)) {
        bv = x[j];
        be = lane + 32 * j;
      }
    warp_merge_best(bv, be);
    if ((be & 31) == lane) avail &= ~(1u << (be >> 5));
    if (lane == 0) ids[k] = be;
  }
}

// A warp's shared memory for E experts: scores, choice values and group scores (E floats each),
// top_k ids and weights, then the experts' and groups' taken flags (E bytes each).
__host__ __device__ constexpr int scratch_bytes(int E) {
  return (3 * E * 4 + kMaxK * 8 + 2 * E + 15) / 16 * 16;
}

// The scratch is sized by the router's E and the block's tokens (dynamic shared memory), not by
// kMaxE and four warps: with the 29 KB of static shared memory that took, the batch-1 decode step
// ran slower although the kernel's own work is the same (H100, 2026-12-06, A/B in one session:
// Qwen3-30B-A3B 3.94 -> 3.80 ms, DeepSeek-V2-Lite 3.15 -> 3.12 ms; docs/performance.md).
__global__ void __launch_bounds__(kWarps * 32) moe_route_kernel(MoeRouteLaunch a) {
  extern __shared__ __align__(16) char smem[];
  pdl_wait();  // the logits come from the router GEMM
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (t >= a.num_tokens) return;  // warp-level work only below: no block barriers
  const int E = a.num_experts, K = a.top_k, G = a.n_group;
  float* score = reinterpret_cast<float*>(smem + warp * scratch_bytes(E));
  float* choice = score + E;
  float* group_scores = choice + E;
  int* s_id = reinterpret_cast<int*>(group_scores + E);
  float* s_w = reinterpret_cast<float*>(s_id + kMaxK);
  unsigned char* taken = reinterpret_cast<unsigned char*>(s_w + kMaxK);
  unsigned char* group_taken = taken + E;
  const float* row = a.logits + t * a.logits_stride;
  for (int e = lane; e < E; e += 32) {
    score[e] = row[e];
    taken[e] = 0;
  }
  if (a.scoring == 0) {  // softmax: the max ignores NaN (std::max(mx, v) keeps mx)
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = mx < score[e] ? score[e] : mx;
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) {
      const float v = expf(score[e] - mx);
      score[e] = v;
      sum += v;
    }
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) score[e] = score[e] / sum;
  } else if (a.scoring == 1) {
    for (int e = lane; e < E; e += 32) score[e] = 1.0f / (1.0f + expf(-score[e]));
  } else if (a.scoring == 3) {  // sqrt(softplus), torch's threshold of 20
    for (int e = lane; e < E; e += 32) {
      const float v = score[e];
      score[e] = sqrtf(v > 20.0f ? v : log1pf(expf(v)));
    }
  }
  for (int e = lane; e < E; e += 32) choice[e] = score[e] + (a.bias ? a.bias[e] : 0.0f);
  __syncwarp();
  if (G > 1) {
    const int per = E / G;
    float* group = group_scores;
    unsigned char* gtaken = group_taken;
    for (int g = lane; g < G; g += 32) {  // the CPU's loops, one group per lane
      const float* c = choice + g * per;
      float gs;
      if (a.group_score == 1) {
        float m = c[0];
        for (int i = 1; i < per; ++i) m = c[i] > m ? c[i] : m;
        gs = m;
      } else {
        int i0 = 0;
        for (int i = 1; i < per; ++i)
          if (c[i] > c[i0]) i0 = i;
        int i1 = -1;
        for (int i = 0; i < per; ++i)
          if (i != i0 && (i1 < 0 || c[i] > c[i1])) i1 = i;
        gs = c[i0] + c[i1];
      }
      group[g] = gs;
      gtaken[g] = 0;
    }
    __syncwarp();
    for (int k = 0; k < a.topk_group; ++k) {
      const int g = warp_argmax_untaken(group, gtaken, G, lane);
      if (lane == 0) gtaken[g] = 1;
      __syncwarp();
    }
    for (int e = lane; e < E; e += 32)
      if (!gtaken[e / per]) choice[e] = kMasked;
    __syncwarp();
  }
  bool nan = false;
  for (int e = lane; e < E; e += 32) nan = nan || isnan(choice[e]);
  if (a.fixed_ids) {  // hash routing: the given experts (one out of range is written as -1)
    if (lane < K) {
      const int e = a.fixed_ids[t * K + lane];
      const bool ok = e >= 0 && e < E;
      s_id[lane] = ok ? e : -1;
      s_w[lane] = ok ? score[e] : 0.0f;
    }
    __syncwarp();
  } else if (!__any_sync(0xffffffffu, nan)) {
    warp_topk_finite(choice, E, K, lane, s_id);
    __syncwarp();
    if (lane < K) {
      const int e = s_id[lane];
      s_w[lane] = a.scoring == 2 ? choice[e] : score[e];
    }
  } else {
    for (int k = 0; k < K; ++k) {
      const int e = warp_argmax_untaken(choice, taken, E, lane);
      if (lane == 0) {
        taken[e] = 1;
        s_id[k] = e;
        s_w[k] = a.scoring == 2 ? choice[e] : score[e];
      }
      __syncwarp();
    }
  }
  if (lane == 0) {  // the CPU's order of operations
    float* w = s_w;
    if (a.scoring == 2) {
      const float mx = w[0];
      float sum = 0.0f;
      for (int k = 0; k < K; ++k) sum += (w[k] = expf(w[k] - mx));
      for (int k = 0; k < K; ++k) w[k] /= sum;
    }
    if (a.renormalize) {
      float sum = 0.0f;
      for (int k = 0; k < K; ++k) sum += w[k];
      if (a.scoring == 1 || a.scoring == 3) sum += 1e-20f;
      for (int k = 0; k < K; ++k) w[k] /= sum;
    }
    for (int k = 0; k < K; ++k) w[k] *= a.scale;
  }
  __syncwarp();
  const int KT = K + a.num_shared;
  for (int j = lane; j < KT; j += 32) {
    int id = j < K ? s_id[j] : a.shared_first + (j - K);
    if (j < K && id >= 0) {
      if (a.expert_load) atomicAdd(a.expert_load + id, 1ull);
      if (a.replicas)
        id = a.replicas[static_cast<int64_t>(id) * a.max_replicas + t % a.replica_count[id]];
      if (a.local_count != -1)
        id = id >= a.local_first && id < a.local_first + a.local_count ? id - a.local_first : -1;
    }
    a.ids[t * KT + j] = id;
    a.weights[t * KT + j] = j < K ? s_w[j] : 1.0f;
  }
}

}  // namespace

void launch_moe_route(const MoeRouteLaunch& a, cudaStream_t s) {
  if (a.num_tokens <= 0) return;
  const unsigned grid = static_cast<unsigned>((a.num_tokens + kWarps - 1) / kWarps);
  const int64_t warps = std::min<int64_t>(a.num_tokens, kWarps);  // the warps that route
  const size_t bytes = static_cast<size_t>(warps) * scratch_bytes(a.num_experts);
  // Over 48 KB (Kimi-K3's 896 experts: 4 warps of 12.7 KB) needs the opt-in, once per device.
  static std::atomic<uint64_t> opted{0};
  if (bytes > 48 * 1024)
    max_dynamic_smem_once(opted, moe_route_kernel, kWarps * scratch_bytes(kMaxE));
  launch(moe_route_kernel, grid, kWarps * 32, bytes, s, a);
}

}  // namespace atom::kernels::cuda
