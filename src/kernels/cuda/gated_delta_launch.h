// Launchers of the gated delta net kernels (gated_delta.cu), in the style of launch.h: plain
// pointers, sizes and strides; the checks live in the entry points (gated_delta.cpp).
#pragma once

#include "kernels/cuda/launch.h"

namespace atom::kernels::cuda {

// ---- gated_delta.cu (kernels/gated_delta.h). Batch rows come as device arrays: query_start
// [S + 1], context_lens [S], state_slots [S] (-1: a padding row, no state touched, zero outputs),
// and optionally rollback [T] (StateRows::rollback_slots; null: none): row t's state, after its
// token, is also written to slot rollback[t] when >= 0.
struct ShortConvLaunch {
  Mat out, x;                   // [T, channels]
  const float* w = nullptr;     // [channels, kernel]
  float* conv_state = nullptr;  // [slots, channels, kernel - 1]
  const int32_t* query_start = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* state_slots = nullptr;
  const int32_t* rollback = nullptr;
  int64_t channels = 0;
  int kernel = 0, num_seqs = 0;
};
void launch_short_conv(const ShortConvLaunch& p, cudaStream_t s);
// The gated delta rule (per-channel gates: KDA). q, k [T, hk * dk], v, out [T, hv * dv];
// b [T, hv]; a [T, hv] (scalar gates) or [T, hv * dk] (per channel, KDA's f); A_log [hv];
// dt_bias [hv] or [hv * dk]; state [slots, hv, dk, dv] F32.
struct DeltaLaunch {
  Mat out, q, k, v, a, b;
  const float* A_log = nullptr;
  const float* dt_bias = nullptr;
  float* state = nullptr;
  const int32_t* query_start = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* state_slots = nullptr;
  // Sequences with a row of rollback >= 0 run the recurrent kernel whatever their length (the
  // chunked form keeps no per-row state).
  const int32_t* rollback = nullptr;
  int num_seqs = 0, hk = 0, hv = 0, dk = 0, dv = 0;
  int chunk = 64;  // > 0: sequences of more than one token run chunked (chunk <= 64)
  float scale = 1.0f;
  // KDA's decay: < 0 GLM-5.3's safe gate lower_bound · sigmoid(exp(A_log) · (f + dt_bias)); 0
  // Kimi's -exp(A_log) · softplus(f + dt_bias).
  float lower_bound = 0.0f;
  int vtiles = 0;  // set by the launcher
};
// Recurrent kernel for sequences of at most one new token (all of them when chunk == 0) and for
// those with rollback rows, and, when run_chunked, the chunked kernel for the others (the host
// knows the step's longest query).
void launch_delta_rule(DeltaLaunch p, bool per_channel, bool run_chunked, cudaStream_t s);
// Dynamic shared memory of the chunked kernel for key dim dk.
size_t delta_chunked_smem_bytes(int dk, bool per_channel);
inline constexpr int kDeltaMaxChunk = 64;
inline constexpr int kDeltaMaxKeyDim = 256;
// out = (w ⊙ rmsnorm(x)) · act(z) over groups of D columns; gate 0: silu (the normed value
// rounded to out's type first), 1: sigmoid. out may alias x.
void launch_gated_rms_norm(Mat out, Mat x, Mat z, const void* w, Elem w_type, int64_t D, float eps,
                           int gate, cudaStream_t s);
void launch_mul_sigmoid(Mat out, Mat x, Mat gate, cudaStream_t s);

}  // namespace atom::kernels::cuda
