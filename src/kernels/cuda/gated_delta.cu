// CUDA kernels of the gated delta net and Kimi delta attention (kernels/gated_delta.h): the
// short causal conv with its conv state, the delta rule recurrent (decode: one token per
// sequence, many sequences) and chunked (prefill: chunks of up to 64 tokens in the WY form of
// transformers' torch_chunk_gated_delta_rule / chunk_kimi_delta_attention), the gated RMSNorm and
// the sigmoid gate. Every kernel reads the batch's rows (query_start, context_lens, state_slots)
// from device memory: no host synchronisation, so all of them can be captured in CUDA graphs.
// A sequence whose state slot is -1 (a decode graph's padding row) reads and writes no state and
// gets zero outputs. Rollback slots (speculative verification rows): the state after row t is
// also written to slot rollback[t] when >= 0; such a sequence runs the recurrent kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/gated_delta_launch.h"

namespace atom::kernels::cuda {

namespace {

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20), as the CPU reference.
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
// KDA's per-channel log decay from pre = f + dt_bias and A = exp(A_log): Kimi's -A · softplus(pre),
// or GLM-5.3's safe gate lb · sigmoid(A · pre) when lb < 0 (as the CPU reference).
__device__ __forceinline__ float kda_decay_(float A, float pre, float lb) {
  return lb < 0.0f ? lb * sigmoidf_(A * pre) : -A * softplusf_(pre);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Whether any row of [q0, q1) has a rollback slot, block-wide (every thread of the block calls
// it). Strided over the block, so a long prefill beside verification rows costs few loads.
__device__ __forceinline__ bool block_keeps_rows(const int32_t* rb, int q0, int q1) {
  bool any = false;
  for (int t = q0 + threadIdx.x; t < q1 && !any; t += blockDim.x) any = rb[t] >= 0;
  return __syncthreads_or(any) != 0;
}

// ---- short conv
// One thread per (row, channel): out[t, c] = silu(Σ_i w[c, i] x_{t-K+1+i}[c]), the inputs before
// the step read from the slot's conv state (zeros for a new sequence).
__global__ void short_conv_kernel(ShortConvLaunch p) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.channels) return;
  for (int t = blockIdx.y; t < p.out.rows; t += gridDim.y) {
    const int s = seq_of_row(p.query_start, p.num_seqs, t);
    const int q0 = p.query_start[s], q1 = p.query_start[s + 1];
    if (t >= q1) continue;  // rows past the last sequence's
    const int slot = p.state_slots[s];
    char* orow = row_of(p.out, t);
    if (slot < 0) {
      store_elem(orow, p.out.type, c, 0.0f);
      continue;
    }
    const bool fresh = p.context_lens[s] == q1 - q0;
    const int K = p.kernel;
    const float* st = p.conv_state + (static_cast<int64_t>(slot) * p.channels + c) * (K - 1);
    const float* w = p.w + c * K;
    float acc = 0;
    for (int i = 0; i < K; ++i) {
      const int u = t - K + 1 + i;  // the input row
      float xv;
      if (u >= q0)
        xv = load_elem(row_of(p.x, u), p.x.type, c);
      else
        xv = fresh ? 0.0f : st[u - q0 + K - 1];
      acc += w[i] * xv;
    }
    store_elem(orow, p.out.type, c, acc / (1.0f + expf(-acc)));
  }
}

// One thread per (sequence, channel), after the conv: the state keeps the last K-1 inputs.
__global__ void short_conv_state_kernel(ShortConvLaunch p) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int s = blockIdx.y;
  if (c >= p.channels) return;
  const int slot = p.state_slots[s];
  if (slot < 0) return;
  const int q0 = p.query_start[s], q1 = p.query_start[s + 1], L = q1 - q0;
  const bool fresh = p.context_lens[s] == L;
  const int K = p.kernel;
  float* st = p.conv_state + (static_cast<int64_t>(slot) * p.channels + c) * (K - 1);
  // Rollback slots first (they read the old entries): after row q0 + t the last K-1 inputs are
  // window entries t + 1 .. t + K - 1, the window being the old state then the step's rows.
  if (p.rollback)
    for (int t = 0; t < L; ++t) {
      const int rb = p.rollback[q0 + t];
      if (rb < 0) continue;
      float* kept = p.conv_state + (static_cast<int64_t>(rb) * p.channels + c) * (K - 1);
      for (int i = 0; i < K - 1; ++i) {
        const int j = t + 1 + i;  // window entry
        kept[i] = j >= K - 1 ? load_elem(row_of(p.x, q0 + j - (K - 1)), p.x.type, c)
                             : (fresh ? 0.0f : st[j]);
      }
    }
  // New entry i is input row q1 - (K-1) + i: from x, or the old entry i + L (read before any
  // lower entry is overwritten, so increasing i is safe in place).
  for (int i = 0; i < K - 1; ++i) {
    const int u = q1 - (K - 1) + i;
    float v;
    if (u >= q0)
      v = load_elem(row_of(p.x, u), p.x.type, c);
    else
      v = fresh ? 0.0f : st[i + L];
    st[i] = v;
  }
}

// ---- the delta rule, recurrent
// A CTA per (sequence, head, tile of kRecBV value columns); 4 warps; lane = column, warp w holds
// key rows w, w + 4, ... (R of them) of the state tile in registers.
constexpr int kRecBV = 32;
constexpr int kRecWarps = 4;

struct RecShared {
  float q[256], k[256], g[256];
  float red[kRecWarps][kRecBV];
  float scal[4];  // beta, scalar gate, q and k norms
};

// kKeep: p.rollback is set (speculative verification rows); without it the kernel is the plain
// decode one, untouched by the rollback writes (their registers would spill some instances).
template <int R, bool kPerChannel, bool kKeep>
__global__ void __launch_bounds__(kRecWarps * 32) delta_recurrent_kernel(DeltaLaunch p) {
  const int s = blockIdx.y;
  const int h = blockIdx.x / p.vtiles, vt = blockIdx.x % p.vtiles;
  const int q0 = p.query_start[s], q1 = p.query_start[s + 1], L = q1 - q0;
  if (p.chunk > 0 && L > 1 && !(kKeep && block_keeps_rows(p.rollback, q0, q1)))
    return;  // the chunked kernel's
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int e = vt * kRecBV + lane;
  const bool ev = e < p.dv;
  const int slot = p.state_slots[s];
  const int dk = p.dk;
  if (slot < 0) {
    for (int t = q0 + warp; t < q1; t += kRecWarps)
      if (ev) store_elem(row_of(p.out, t), p.out.type, static_cast<int64_t>(h) * p.dv + e, 0.0f);
    return;
  }
  __shared__ RecShared sh;
  const bool fresh = p.context_lens[s] == L;
  float* St = p.state + (static_cast<int64_t>(slot) * p.hv + h) * dk * p.dv;
  float S[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int d = warp + kRecWarps * r;
    S[r] = (!fresh && ev && d < dk) ? St[static_cast<int64_t>(d) * p.dv + e] : 0.0f;
  }
  const int jk = h / (p.hv / p.hk);  // the k-head of v-head h
  const float A = expf(p.A_log[h]);
  for (int t = q0; t < q1; ++t) {
    // Gather and normalise q and k (block-wide: dk <= 256 values), the gate and beta.
    const char* qr = row_of(p.q, t);
    const char* kr = row_of(p.k, t);
    float sq = 0, sk = 0;
    for (int d = threadIdx.x; d < dk; d += blockDim.x) {
      const float a = load_elem(qr, p.q.type, static_cast<int64_t>(jk) * dk + d);
      const float b = load_elem(kr, p.k.type, static_cast<int64_t>(jk) * dk + d);
      sh.q[d] = a;
      sh.k[d] = b;
      sq += a * a;
      sk += b * b;
      if (kPerChannel)
        sh.g[d] = kda_decay_(A,
                             load_elem(row_of(p.a, t), p.a.type, static_cast<int64_t>(h) * dk + d) +
                                 p.dt_bias[h * dk + d],
                             p.lower_bound);
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    if (lane == 0) {
      sh.red[warp][0] = sq;
      sh.red[warp][1] = sk;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float a = 0, b = 0;
      for (int w = 0; w < kRecWarps; ++w) {
        a += sh.red[w][0];
        b += sh.red[w][1];
      }
      sh.scal[2] = 1.0f / sqrtf(a + 1e-6f);
      sh.scal[3] = 1.0f / sqrtf(b + 1e-6f);
      sh.scal[0] = sigmoidf_(load_elem(row_of(p.b, t), p.b.type, h));
      if (!kPerChannel)
        sh.scal[1] = -A * softplusf_(load_elem(row_of(p.a, t), p.a.type, h) + p.dt_bias[h]);
    }
    __syncthreads();
    const float iq = sh.scal[2], ik = sh.scal[3], beta = sh.scal[0];
    const float decay = kPerChannel ? 1.0f : expf(sh.scal[1]);
    float kv = 0;
    float kd[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int d = warp + kRecWarps * r;
      kd[r] = d < dk ? sh.k[d] * ik : 0.0f;
      S[r] *= kPerChannel ? (d < dk ? expf(sh.g[d]) : 0.0f) : decay;
      kv += S[r] * kd[r];
    }
    sh.red[warp][lane] = kv;
    __syncthreads();
    float tot = 0;
    for (int w = 0; w < kRecWarps; ++w) tot += sh.red[w][lane];
    const float vt_ =
        ev ? load_elem(row_of(p.v, t), p.v.type, static_cast<int64_t>(h) * p.dv + e) : 0.0f;
    const float delta = beta * (vt_ - tot);
    float o = 0;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int d = warp + kRecWarps * r;
      S[r] += kd[r] * delta;
      const float qd = d < dk ? sh.q[d] * iq * p.scale : 0.0f;
      o += S[r] * qd;
    }
    __syncthreads();  // everyone has read red
    sh.red[warp][lane] = o;
    __syncthreads();
    if (warp == 0 && ev) {
      float tot_o = 0;
      for (int w = 0; w < kRecWarps; ++w) tot_o += sh.red[w][lane];
      store_elem(row_of(p.out, t), p.out.type, static_cast<int64_t>(h) * p.dv + e, tot_o);
    }
    if (kKeep && p.rollback[t] >= 0) {  // the state after row t, kept
      float* Kt = p.state + (static_cast<int64_t>(p.rollback[t]) * p.hv + h) * dk * p.dv;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int d = warp + kRecWarps * r;
        if (ev && d < dk) Kt[static_cast<int64_t>(d) * p.dv + e] = S[r];
      }
    }
    __syncthreads();  // red and q/k reused by the next token
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int d = warp + kRecWarps * r;
    if (ev && d < dk) St[static_cast<int64_t>(d) * p.dv + e] = S[r];
  }
}

// The same with 16-byte state accesses (dv % 4 == 0): a CTA of 128 threads per (sequence, head,
// tile of BV value columns); thread t holds columns 4 (t % (BV/4)) .. + 3 of key rows
// t / (BV/4) + (128 / (BV/4)) i, i < RPT, as float4s. BV 8 spreads a small batch over more CTAs.
template <int BV, int RPT, bool kPerChannel, bool kKeep>
__global__ void __launch_bounds__(kRecWarps * 32) delta_recurrent_vec_kernel(DeltaLaunch p) {
  constexpr int CG = BV / 4, NRG = kRecWarps * 32 / CG;
  const int s = blockIdx.y;
  const int h = blockIdx.x / p.vtiles, vt = blockIdx.x % p.vtiles;
  const int q0 = p.query_start[s], q1 = p.query_start[s + 1], L = q1 - q0;
  if (p.chunk > 0 && L > 1 && !(kKeep && block_keeps_rows(p.rollback, q0, q1)))
    return;  // the chunked kernel's
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int cg = tid % CG, rg = tid / CG;
  const int e = vt * BV + cg * 4;  // first of this thread's 4 columns
  const bool ev = e < p.dv;
  const int slot = p.state_slots[s];
  const int dk = p.dk;
  const int64_t ocol = static_cast<int64_t>(h) * p.dv + e;
  if (slot < 0) {
    if (rg == 0 && ev)
      for (int t = q0; t < q1; ++t)
        for (int u = 0; u < 4; ++u) store_elem(row_of(p.out, t), p.out.type, ocol + u, 0.0f);
    return;
  }
  __shared__ float shq[256], shk[256], shg[256];
  __shared__ float4 red[kRecWarps][CG];
  __shared__ float nred[kRecWarps][2];
  __shared__ float scal[4];
  const bool fresh = p.context_lens[s] == L;
  float* St = p.state + (static_cast<int64_t>(slot) * p.hv + h) * dk * p.dv;
  float4 S[RPT];
#pragma unroll
  for (int r = 0; r < RPT; ++r) {
    const int d = rg + NRG * r;
    S[r] = (!fresh && ev && d < dk)
               ? *reinterpret_cast<const float4*>(St + static_cast<int64_t>(d) * p.dv + e)
               : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const int jk = h / (p.hv / p.hk);
  const float A = expf(p.A_log[h]);
  // Sums a float4 over the lanes sharing this thread's columns (xor over lane bits >= CG), then
  // over the warps; every thread gets its columns' totals.
  auto block_sum = [&](float4 v) -> float4 {
#pragma unroll
    for (int o = CG; o < 32; o <<= 1) {
      v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
      v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
      v.z += __shfl_xor_sync(0xffffffffu, v.z, o);
      v.w += __shfl_xor_sync(0xffffffffu, v.w, o);
    }
    if (lane < CG) red[warp][lane] = v;
    __syncthreads();
    float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kRecWarps; ++w) {
      const float4 x = red[w][cg];
      t.x += x.x;
      t.y += x.y;
      t.z += x.z;
      t.w += x.w;
    }
    __syncthreads();  // red is reused
    return t;
  };
  for (int t = q0; t < q1; ++t) {
    const char* qr = row_of(p.q, t);
    const char* kr = row_of(p.k, t);
    float sq = 0, sk = 0;
    for (int d = tid; d < dk; d += kRecWarps * 32) {
      const float a = load_elem(qr, p.q.type, static_cast<int64_t>(jk) * dk + d);
      const float b = load_elem(kr, p.k.type, static_cast<int64_t>(jk) * dk + d);
      shq[d] = a;
      shk[d] = b;
      sq += a * a;
      sk += b * b;
      if (kPerChannel)
        shg[d] = kda_decay_(A,
                            load_elem(row_of(p.a, t), p.a.type, static_cast<int64_t>(h) * dk + d) +
                                p.dt_bias[h * dk + d],
                            p.lower_bound);
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    if (lane == 0) {
      nred[warp][0] = sq;
      nred[warp][1] = sk;
    }
    __syncthreads();
    if (tid == 0) {
      float a = 0, b = 0;
      for (int w = 0; w < kRecWarps; ++w) {
        a += nred[w][0];
        b += nred[w][1];
      }
      scal[2] = 1.0f / sqrtf(a + 1e-6f);
      scal[3] = 1.0f / sqrtf(b + 1e-6f);
      scal[0] = sigmoidf_(load_elem(row_of(p.b, t), p.b.type, h));
      if (!kPerChannel)
        scal[1] = -A * softplusf_(load_elem(row_of(p.a, t), p.a.type, h) + p.dt_bias[h]);
    }
    __syncthreads();
    const float iq = scal[2], ik = scal[3], beta = scal[0];
    const float decay = kPerChannel ? 1.0f : expf(scal[1]);
    float4 kv = make_float4(0.f, 0.f, 0.f, 0.f);
    float kd[RPT];
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
      const int d = rg + NRG * r;
      kd[r] = d < dk ? shk[d] * ik : 0.0f;
      const float dec = kPerChannel ? (d < dk ? expf(shg[d]) : 0.0f) : decay;
      S[r].x *= dec;
      S[r].y *= dec;
      S[r].z *= dec;
      S[r].w *= dec;
      kv.x += S[r].x * kd[r];
      kv.y += S[r].y * kd[r];
      kv.z += S[r].z * kd[r];
      kv.w += S[r].w * kd[r];
    }
    kv = block_sum(kv);
    float4 vt4 = make_float4(0.f, 0.f, 0.f, 0.f);
    if (ev) {
      const char* vr = row_of(p.v, t);
      vt4.x = load_elem(vr, p.v.type, ocol);
      vt4.y = load_elem(vr, p.v.type, ocol + 1);
      vt4.z = load_elem(vr, p.v.type, ocol + 2);
      vt4.w = load_elem(vr, p.v.type, ocol + 3);
    }
    const float4 dl = make_float4(beta * (vt4.x - kv.x), beta * (vt4.y - kv.y),
                                  beta * (vt4.z - kv.z), beta * (vt4.w - kv.w));
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
      const int d = rg + NRG * r;
      S[r].x += kd[r] * dl.x;
      S[r].y += kd[r] * dl.y;
      S[r].z += kd[r] * dl.z;
      S[r].w += kd[r] * dl.w;
      const float qd = d < dk ? shq[d] * iq * p.scale : 0.0f;
      o.x += S[r].x * qd;
      o.y += S[r].y * qd;
      o.z += S[r].z * qd;
      o.w += S[r].w * qd;
    }
    o = block_sum(o);  // its barriers also order this token's shq/shk reads before the next's
    if (rg == 0 && ev) {
      char* orow = row_of(p.out, t);
      store_elem(orow, p.out.type, ocol, o.x);
      store_elem(orow, p.out.type, ocol + 1, o.y);
      store_elem(orow, p.out.type, ocol + 2, o.z);
      store_elem(orow, p.out.type, ocol + 3, o.w);
    }
    if (kKeep && p.rollback[t] >= 0) {  // the state after row t, kept
      float* Kt = p.state + (static_cast<int64_t>(p.rollback[t]) * p.hv + h) * dk * p.dv;
#pragma unroll
      for (int r = 0; r < RPT; ++r) {
        const int d = rg + NRG * r;
        if (ev && d < dk)
          *reinterpret_cast<float4*>(Kt + static_cast<int64_t>(d) * p.dv + e) = S[r];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RPT; ++r) {
    const int d = rg + NRG * r;
    if (ev && d < dk) *reinterpret_cast<float4*>(St + static_cast<int64_t>(d) * p.dv + e) = S[r];
  }
}

// ---- the delta rule, chunked
// A CTA per (sequence, head, tile of kChBV value columns) walks the sequence's chunks; its state
// tile [dk, kChBV] stays in shared memory across them. Per chunk of n <= 64 tokens, with gc the
// within-chunk cumulative log decays (per key channel for KDA):
//   L[i][j] (j < i) = -β_i Σ_c k_i[c] k_j[c] exp(gc_i[c] - gc_j[c]),  T = (I - L)^-1,
//   v_new = T (β v - (β exp(gc) ⊙ k) S)      (= U - W S of the WY form),
//   out_i = (q_i ⊙ exp(gc_i)) S + Σ_{j<=i} (Σ_c q_i[c] k_j[c] exp(gc_i[c] - gc_j[c])) v_new_j,
//   S ← diag(exp(gc_last)) S + Σ_j (k_j ⊙ exp(gc_last - gc_j)) ⊗ v_new_j.
constexpr int kChBV = 32;
constexpr int kChC = 64;
constexpr int kChThreads = 512;
constexpr int kChWarps = kChThreads / 32;

struct ChLayout {
  int kp;                                                    // padded key row
  int q, k, kb, g, lmat, nmat, pmat, x, u, st, beta, total;  // float offsets
};

__host__ __device__ inline ChLayout ch_layout(int dk, bool per_channel) {
  ChLayout l;
  l.kp = dk + 1;
  int o = 0;
  l.q = o;
  o += kChC * l.kp;
  l.k = o;
  o += kChC * l.kp;
  l.kb = o;
  o += kChC * l.kp;
  l.g = o;
  o += per_channel ? kChC * l.kp : kChC;
  l.lmat = o;
  o += kChC * (kChC + 1);
  l.nmat = o;
  o += kChC * (kChC + 1);
  l.pmat = o;
  o += kChC * (kChC + 1);
  l.x = o;
  o += kChC * (kChBV + 1);
  l.u = o;
  o += kChC * (kChBV + 1);
  l.st = o;
  o += dk * (kChBV + 1);
  l.beta = o;
  o += kChC;
  l.total = o;
  return l;
}

template <bool kPerChannel>
__global__ void __launch_bounds__(kChThreads) delta_chunked_kernel(DeltaLaunch p) {
  const int s = blockIdx.y;
  const int h = blockIdx.x / p.vtiles, vt = blockIdx.x % p.vtiles;
  const int q0 = p.query_start[s], q1 = p.query_start[s + 1], L = q1 - q0;
  if (p.chunk <= 0 || L <= 1) return;                              // the recurrent kernel's
  if (p.rollback && block_keeps_rows(p.rollback, q0, q1)) return;  // so are rows kept
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int dk = p.dk, dv = p.dv;
  const int e0 = vt * kChBV;
  const int e = e0 + lane;
  const bool ev = e < dv;
  const int slot = p.state_slots[s];
  if (slot < 0) {
    for (int t = q0 + warp; t < q1; t += kChWarps)
      if (ev) store_elem(row_of(p.out, t), p.out.type, static_cast<int64_t>(h) * dv + e, 0.0f);
    return;
  }
  extern __shared__ float smem[];
  const ChLayout ly = ch_layout(dk, kPerChannel);
  const int KP = ly.kp, CP = kChC + 1, BP = kChBV + 1;
  float* Qs = smem + ly.q;
  float* Ks = smem + ly.k;
  float* KBs = smem + ly.kb;
  float* Gs = smem + ly.g;
  float* Ls = smem + ly.lmat;
  float* Ns = smem + ly.nmat;
  float* Ps = smem + ly.pmat;
  float* Xs = smem + ly.x;
  float* Us = smem + ly.u;
  float* Ss = smem + ly.st;
  float* Bs = smem + ly.beta;
  auto G = [&](int i, int c) -> float { return kPerChannel ? Gs[i * KP + c] : Gs[i]; };

  const bool fresh = p.context_lens[s] == L;
  float* St = p.state + (static_cast<int64_t>(slot) * p.hv + h) * dk * dv;
  for (int idx = tid; idx < dk * kChBV; idx += kChThreads) {
    const int c = idx / kChBV, ee = idx % kChBV;
    Ss[c * BP + ee] = (fresh || e0 + ee >= dv) ? 0.0f : St[static_cast<int64_t>(c) * dv + e0 + ee];
  }
  const int jk = h / (p.hv / p.hk);
  const float A = expf(p.A_log[h]);
  const int C = p.chunk;
  for (int c0 = 0; c0 < L; c0 += C) {
    const int n = min(C, L - c0);
    __syncthreads();  // the last chunk is done with every buffer
    // q, k, beta and the gates: every load of the chunk issued at once (flat over its rows).
    for (int idx = tid; idx < n * dk; idx += kChThreads) {
      const int i = idx / dk, c = idx % dk;
      const int t = q0 + c0 + i;
      Qs[i * KP + c] = load_elem(row_of(p.q, t), p.q.type, static_cast<int64_t>(jk) * dk + c);
      Ks[i * KP + c] = load_elem(row_of(p.k, t), p.k.type, static_cast<int64_t>(jk) * dk + c);
      if (kPerChannel)
        Gs[i * KP + c] =
            kda_decay_(A,
                       load_elem(row_of(p.a, t), p.a.type, static_cast<int64_t>(h) * dk + c) +
                           p.dt_bias[h * dk + c],
                       p.lower_bound);
    }
    if (tid < n) {
      const int t = q0 + c0 + tid;
      Bs[tid] = sigmoidf_(load_elem(row_of(p.b, t), p.b.type, h));
      if (!kPerChannel)
        Gs[tid] = -A * softplusf_(load_elem(row_of(p.a, t), p.a.type, h) + p.dt_bias[h]);
    }
    __syncthreads();
    // Normalise q and k (q scaled), a warp per row; the cumulative gates within the chunk.
    for (int i = warp; i < n; i += kChWarps) {
      float sq = 0, sk = 0;
      for (int c = lane; c < dk; c += 32) {
        const float a = Qs[i * KP + c], b = Ks[i * KP + c];
        sq += a * a;
        sk += b * b;
      }
      sq = warp_sum(sq);
      sk = warp_sum(sk);
      const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
      for (int c = lane; c < dk; c += 32) {
        Qs[i * KP + c] = Qs[i * KP + c] * iq * p.scale;
        Ks[i * KP + c] *= ik;
      }
    }
    if (kPerChannel) {
      for (int c = tid; c < dk; c += kChThreads) {
        float acc = 0;
        for (int i = 0; i < n; ++i) Gs[i * KP + c] = acc += Gs[i * KP + c];
      }
    } else if (warp == kChWarps - 1) {
      // Sequential sums in row order (as the CPU's): lane 0 walks the chunk.
      if (lane == 0) {
        float acc = 0;
        for (int i = 0; i < n; ++i) Gs[i] = acc += Gs[i];
      }
    }
    __syncthreads();
    // L (strict lower) and P (lower with the diagonal) in one pass over the key dim: 16 x 16
    // tiles of 4 x 4 (i, j) pairs, one per thread of the first 256; and β exp(gc) ⊙ k.
    if (tid < 256) {
      const int i0 = (tid >> 4) * 4, j0 = (tid & 15) * 4;
      float l[4][4], pp[4][4];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int u = 0; u < 4; ++u) l[r][u] = pp[r][u] = 0.0f;
      if (j0 <= i0 + 3 && i0 < n) {
#pragma unroll 2
        for (int c = 0; c < dk; ++c) {
          float ki[4], qi[4], kj[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            ki[r] = Ks[(i0 + r) * KP + c];
            qi[r] = Qs[(i0 + r) * KP + c];
            kj[r] = Ks[(j0 + r) * KP + c];
          }
          if (kPerChannel) {
            float gi[4], gj[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              gi[r] = Gs[(i0 + r) * KP + c];
              gj[r] = Gs[(j0 + r) * KP + c];
            }
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
              for (int u = 0; u < 4; ++u) {
                const float d = expf(gi[r] - gj[u]);
                l[r][u] += ki[r] * kj[u] * d;
                pp[r][u] += qi[r] * kj[u] * d;
              }
          } else {
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
              for (int u = 0; u < 4; ++u) {
                l[r][u] += ki[r] * kj[u];
                pp[r][u] += qi[r] * kj[u];
              }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int i = i0 + r, j = j0 + u;
          if (i >= n || j >= n) continue;
          float lv = 0, pv = 0;
          if (kPerChannel) {
            if (j < i) lv = -Bs[i] * l[r][u];
            if (j <= i) pv = pp[r][u];
          } else {
            const float e = j <= i ? expf(Gs[i] - Gs[j]) : 0.0f;
            if (j < i) lv = -Bs[i] * l[r][u] * e;
            if (j <= i) pv = pp[r][u] * e;
          }
          Ls[i * CP + j] = lv;
          Ns[i * CP + j] = lv;
          Ps[i * CP + j] = pv;
        }
    }
    for (int idx = tid; idx < n * dk; idx += kChThreads) {
      const int i = idx / dk, c = idx % dk;
      KBs[i * KP + c] = Bs[i] * expf(G(i, c)) * Ks[i * KP + c];
    }
    __syncthreads();
    // N = T - I by forward substitution, row by row: N[i][j] = L[i][j] + Σ_{j<m<i} L[i][m] N[m][j]
    // (rows m < i final). Column j's entries depend on column j alone: warp 0, lane j (and
    // j + 32), with no barrier; meanwhile the other warps compute X = β v - KB S (lane = column,
    // rows spread over the 7 warps: one S load feeds each warp's rows).
    if (warp == 0) {
      for (int jj = lane; jj < n; jj += 32)
        for (int i = jj + 2; i < n; ++i) {
          float v = Ls[i * CP + jj];
#pragma unroll 4
          for (int m = jj + 1; m < i; ++m) v += Ls[i * CP + m] * Ns[m * CP + jj];
          Ns[i * CP + jj] = v;
        }
    } else {
      constexpr int XW = kChWarps - 1;
      constexpr int RW = (kChC + XW - 1) / XW;
      const int w = warp - 1;
      float x[RW];
#pragma unroll
      for (int r = 0; r < RW; ++r) x[r] = 0.0f;
#pragma unroll 4
      for (int c = 0; c < dk; ++c) {
        const float sv = Ss[c * BP + lane];
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          const int i = w + XW * r;
          if (i < kChC) x[r] += KBs[i * KP + c] * sv;
        }
      }
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        const int i = w + XW * r;
        if (i >= n) continue;
        const float vv =
            ev ? load_elem(row_of(p.v, q0 + c0 + i), p.v.type, static_cast<int64_t>(h) * dv + e)
               : 0.0f;
        Xs[i * BP + lane] = ev ? Bs[i] * vv - x[r] : 0.0f;
      }
    }
    __syncthreads();
    // v_new = T X = X + N X.
    for (int i = warp; i < n; i += kChWarps) {
      float u = Xs[i * BP + lane];
#pragma unroll 4
      for (int j = 0; j < i; ++j) u += Ns[i * CP + j] * Xs[j * BP + lane];
      Us[i * BP + lane] = u;
    }
    __syncthreads();
    // q ⊙ exp(gc), and the decayed keys of the state update over KB's buffer.
    for (int idx = tid; idx < n * dk; idx += kChThreads) {
      const int i = idx / dk, c = idx % dk;
      Qs[i * KP + c] *= expf(G(i, c));
      KBs[i * KP + c] = Ks[i * KP + c] * expf(G(n - 1, c) - G(i, c));
    }
    __syncthreads();
    // out_i = (q_i ⊙ exp(gc_i)) S + Σ_{j<=i} P[i][j] v_new_j (rows as X's).
    {
      constexpr int RW = kChC / kChWarps;
      float o[RW];
#pragma unroll
      for (int r = 0; r < RW; ++r) o[r] = 0.0f;
#pragma unroll 4
      for (int c = 0; c < dk; ++c) {
        const float sv = Ss[c * BP + lane];
#pragma unroll
        for (int r = 0; r < RW; ++r) o[r] += Qs[(warp + kChWarps * r) * KP + c] * sv;
      }
#pragma unroll 4
      for (int j = 0; j < n; ++j) {
        const float uv = Us[j * BP + lane];
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          const int i = warp + kChWarps * r;
          if (j <= i) o[r] += Ps[i * CP + j] * uv;
        }
      }
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        const int i = warp + kChWarps * r;
        if (ev && i < n)
          store_elem(row_of(p.out, q0 + c0 + i), p.out.type, static_cast<int64_t>(h) * dv + e,
                     o[r]);
      }
    }
    __syncthreads();  // S read by every output
    // S ← diag(exp(gc_last)) S + Σ_j K2_j ⊗ v_new_j (warp w: rows w, w + 8, ... in groups of 8).
    for (int cb = warp; cb < dk; cb += 8 * kChWarps) {
      float acc[8];
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const int c = cb + kChWarps * r;
        acc[r] = c < dk ? Ss[c * BP + lane] * expf(G(n - 1, c)) : 0.0f;
      }
#pragma unroll 4
      for (int j = 0; j < n; ++j) {
        const float uv = Us[j * BP + lane];
#pragma unroll
        for (int r = 0; r < 8; ++r) {
          const int c = cb + kChWarps * r;
          if (c < dk) acc[r] += KBs[j * KP + c] * uv;
        }
      }
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const int c = cb + kChWarps * r;
        if (c < dk) Ss[c * BP + lane] = acc[r];
      }
    }
  }
  __syncthreads();
  for (int idx = tid; idx < dk * kChBV; idx += kChThreads) {
    const int c = idx / kChBV, ee = idx % kChBV;
    if (e0 + ee < dv) St[static_cast<int64_t>(c) * dv + e0 + ee] = Ss[c * BP + ee];
  }
}

// ---- gated RMSNorm: a warp per (row, group of D channels).
__global__ void gated_rms_norm_kernel(Mat out, Mat x, Mat z, const void* w, Elem w_type, int64_t D,
                                      float eps, int gate) {
  const int64_t groups = x.cols / D;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (gw >= x.rows * groups) return;
  const int64_t r = gw / groups, g0 = (gw % groups) * D;
  const char* xr = row_of(x, r);
  const char* zr = row_of(z, r);
  char* orow = row_of(out, r);
  float ss = 0;
  for (int64_t i = lane; i < D; i += 32) {
    const float v = load_elem(xr, x.type, g0 + i);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  // Every lane read its x values before any lane writes (out may alias x): the reduction above
  // is a full-warp exchange.
  for (int64_t i = lane; i < D; i += 32) {
    const float v = load_elem(xr, x.type, g0 + i);
    const float zi = load_elem(zr, z.type, g0 + i);
    const float wi = load_elem(w, w_type, i);
    float o;
    if (gate == 0) {
      float n = v * inv;
      if (out.type == Elem::kBF16)
        n = __bfloat162float(__float2bfloat16_rn(n));
      else if (out.type == Elem::kF16)
        n = __half2float(__float2half_rn(n));
      o = (wi * n) * (zi / (1.0f + expf(-zi)));
    } else {
      o = wi * (v * inv) * sigmoidf_(zi);
    }
    store_elem(orow, out.type, g0 + i, o);
  }
}

__global__ void mul_sigmoid_kernel(Mat out, Mat x, Mat gate) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= x.cols) return;
  for (int64_t r = blockIdx.y; r < x.rows; r += gridDim.y) {
    const float v = load_elem(row_of(x, r), x.type, i);
    const float g = load_elem(row_of(gate, r), gate.type, i);
    store_elem(row_of(out, r), out.type, i, v * sigmoidf_(g));
  }
}

template <int BV, bool kPerChannel, bool kKeep>
void launch_recurrent_vec(DeltaLaunch p, cudaStream_t st) {
  p.vtiles = (p.dv + BV - 1) / BV;
  const dim3 grid(p.hv * p.vtiles, p.num_seqs);
  const int nrg = kRecWarps * 32 / (BV / 4);
  const int rpt = (p.dk + nrg - 1) / nrg;
  if (rpt <= 1)
    delta_recurrent_vec_kernel<BV, 1, kPerChannel, kKeep><<<grid, kRecWarps * 32, 0, st>>>(p);
  else if (rpt <= 2)
    delta_recurrent_vec_kernel<BV, 2, kPerChannel, kKeep><<<grid, kRecWarps * 32, 0, st>>>(p);
  else if (rpt <= 4)
    delta_recurrent_vec_kernel<BV, 4, kPerChannel, kKeep><<<grid, kRecWarps * 32, 0, st>>>(p);
  else if (rpt <= 8)
    delta_recurrent_vec_kernel<BV, 8, kPerChannel, kKeep><<<grid, kRecWarps * 32, 0, st>>>(p);
  else
    delta_recurrent_vec_kernel<BV, 16, kPerChannel, kKeep><<<grid, kRecWarps * 32, 0, st>>>(p);
}

template <bool kPerChannel, bool kKeep>
void launch_recurrent_kept(DeltaLaunch p, cudaStream_t st) {
  if (p.dv % 4 == 0 && reinterpret_cast<uintptr_t>(p.state) % 16 == 0) {
    // 32-column tiles once they give a few CTAs per multiprocessor, else 8-column ones.
    if (static_cast<int64_t>(p.num_seqs) * p.hv * ((p.dv + 31) / 32) >= 1024)
      launch_recurrent_vec<32, kPerChannel, kKeep>(p, st);
    else
      launch_recurrent_vec<8, kPerChannel, kKeep>(p, st);
    return;
  }
  p.vtiles = (p.dv + kRecBV - 1) / kRecBV;
  const dim3 grid(p.hv * p.vtiles, p.num_seqs);
  const int R = (p.dk + kRecWarps - 1) / kRecWarps;
  if (R <= 4)
    delta_recurrent_kernel<4, kPerChannel, kKeep><<<grid, kRecWarps * 32, 0, st>>>(p);
  else if (R <= 8)
    delta_recurrent_kernel<8, kPerChannel, kKeep><<<grid, kRecWarps * 32, 0, st>>>(p);
  else if (R <= 16)
    delta_recurrent_kernel<16, kPerChannel, kKeep><<<grid, kRecWarps * 32, 0, st>>>(p);
  else if (R <= 32)
    delta_recurrent_kernel<32, kPerChannel, kKeep><<<grid, kRecWarps * 32, 0, st>>>(p);
  else
    delta_recurrent_kernel<64, kPerChannel, kKeep><<<grid, kRecWarps * 32, 0, st>>>(p);
}

// The recurrent kernels with rollback writes only when the step has rollback slots.
template <bool kPerChannel>
void launch_recurrent(DeltaLaunch p, cudaStream_t st) {
  if (p.rollback)
    launch_recurrent_kept<kPerChannel, true>(p, st);
  else
    launch_recurrent_kept<kPerChannel, false>(p, st);
}

template <bool kPerChannel>
void launch_chunked(DeltaLaunch p, cudaStream_t st) {
  p.vtiles = (p.dv + kChBV - 1) / kChBV;
  const dim3 grid(p.hv * p.vtiles, p.num_seqs);
  const size_t bytes = static_cast<size_t>(ch_layout(p.dk, kPerChannel).total) * sizeof(float);
  cudaFuncSetAttribute(delta_chunked_kernel<kPerChannel>,
                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  delta_chunked_kernel<kPerChannel><<<grid, kChThreads, bytes, st>>>(p);
}

}  // namespace

size_t delta_chunked_smem_bytes(int dk, bool per_channel) {
  return static_cast<size_t>(ch_layout(dk, per_channel).total) * sizeof(float);
}

void launch_short_conv(const ShortConvLaunch& p, cudaStream_t s) {
  if (p.num_seqs == 0) return;
  const int threads = 128;
  const unsigned cb = static_cast<unsigned>((p.channels + threads - 1) / threads);
  if (p.out.rows > 0)
    short_conv_kernel<<<dim3(cb, static_cast<unsigned>(std::min<int64_t>(p.out.rows, 65535))),
                        threads, 0, s>>>(p);
  short_conv_state_kernel<<<dim3(cb, static_cast<unsigned>(p.num_seqs)), threads, 0, s>>>(p);
}

void launch_delta_rule(DeltaLaunch p, bool per_channel, bool run_chunked, cudaStream_t s) {
  if (p.num_seqs == 0) return;
  if (per_channel)
    launch_recurrent<true>(p, s);
  else
    launch_recurrent<false>(p, s);
  if (!run_chunked || p.chunk <= 0) return;
  if (per_channel)
    launch_chunked<true>(p, s);
  else
    launch_chunked<false>(p, s);
}

void launch_gated_rms_norm(Mat out, Mat x, Mat z, const void* w, Elem w_type, int64_t D, float eps,
                           int gate, cudaStream_t s) {
  const int64_t warps = x.rows * (x.cols / D);
  if (warps == 0) return;
  const int per_block = 8;
  gated_rms_norm_kernel<<<static_cast<unsigned>((warps + per_block - 1) / per_block),
                          per_block * 32, 0, s>>>(out, x, z, w, w_type, D, eps, gate);
}

void launch_mul_sigmoid(Mat out, Mat x, Mat gate, cudaStream_t s) {
  if (x.rows == 0 || x.cols == 0) return;
  const int threads = 256;
  mul_sigmoid_kernel<<<dim3(static_cast<unsigned>((x.cols + threads - 1) / threads),
                            static_cast<unsigned>(std::min<int64_t>(x.rows, 65535))),
                       threads, 0, s>>>(out, x, gate);
}

}  // namespace atom::kernels::cuda
