// CUDA entry points of the gated delta net ops (kernels in gated_delta.cu): shape checks here, the
// batch rows stay on the device (no host synchronisation: capturable in CUDA graphs).
#include "kernels/gated_delta.h"

#include <cmath>

#include "kernels/cuda/gated_delta_launch.h"
#include "kernels/cuda/host_common.h"

namespace atom::kernels::cuda {

namespace {

// The rollback slots' device array, or null when there are none: [rows] contiguous I32. Their
// values (-1 or a slot of the pool, never the sequence's own) are the host batch's to check
// (Batch::validate; the CPU reference checks them too): reading them here would synchronise.
const int32_t* rollback_of(const char* op, const StateRows& r, int64_t rows) {
  if (!r.has_rollback()) return nullptr;
  ATOM_CHECK(is_i32(*r.rollback_slots) && r.rollback_slots->numel() == rows,
             "{}: {} rollback slots for {} rows (contiguous I32)", op, r.rollback_slots->numel(),
             rows);
  return r.rollback_slots->ptr<int32_t>();
}

void check_rows_batch(const char* op, const StateRows& r) {
  ATOM_CHECK(is_i32(r.query_start) && is_i32(r.context_lens) && is_i32(r.state_slots),
             "{}: batch fields must be contiguous I32", op);
  const int64_t S = r.context_lens.numel();
  ATOM_CHECK(r.query_start.numel() == S + 1 && r.state_slots.numel() == S,
             "{}: {} sequences with {} query offsets and {} state slots", op, S,
             r.query_start.numel(), r.state_slots.numel());
}

bool contiguous_f32(const Tensor& t) { return t.dtype() == DType::kF32 && t.is_contiguous(); }

// Whether the chunked kernel fits this key dim (its shared memory) on this device.
bool chunked_fits(int dk, bool per_channel) {
  int dev = 0, limit = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return delta_chunked_smem_bytes(dk, per_channel) <= static_cast<size_t>(limit);
}

void run_delta(const char* op, DeltaLaunch& l, bool per_channel, const StateRows& rows, int chunk) {
  ATOM_CHECK(chunk >= 0 && chunk <= kDeltaMaxChunk,
             "{}: chunk size {} (the CUDA kernels take chunks of at most {} tokens, or 0)", op,
             chunk, kDeltaMaxChunk);
  ATOM_CHECK(l.dk <= kDeltaMaxKeyDim, "{}: key head dim {} (the CUDA kernels take at most {})", op,
             l.dk, kDeltaMaxKeyDim);
  l.query_start = rows.query_start.ptr<int32_t>();
  l.context_lens = rows.context_lens.ptr<int32_t>();
  l.state_slots = rows.state_slots.ptr<int32_t>();
  l.rollback = rollback_of(op, rows, l.q.rows);
  l.num_seqs = static_cast<int>(rows.context_lens.numel());
  // A key dim too wide for the chunked kernel's shared memory runs every token recurrently (the
  // same values up to fp32 rounding).
  l.chunk = chunk > 0 && chunked_fits(l.dk, per_channel) ? chunk : 0;
  l.scale = 1.0f / std::sqrt(static_cast<float>(l.dk));
  launch_delta_rule(l, per_channel, rows.max_query_len != 1, current_stream());
  launch_check(op);
}

}  // namespace

void short_conv(Tensor& out, const Tensor& x, const Tensor& w, Tensor& conv_state,
                const StateRows& rows) {
  const char* op = "short_conv";
  check_rows(op, out, "out");
  check_rows(op, x, "x");
  check_rows_batch(op, rows);
  const int64_t T = x.size(0), C = x.size(1);
  ATOM_CHECK(w.dim() == 2 && w.size(0) == C && contiguous_f32(w), "{}: weight {} for {} channels",
             op, w.str(), C);
  const int64_t K = w.size(1);
  ATOM_CHECK(out.size(0) == T && out.size(1) == C, "{}: out {} for x {}", op, out.str(), x.str());
  ATOM_CHECK(out.data() != x.data(), "{}: out must not alias x on CUDA", op);
  ATOM_CHECK(conv_state.dim() == 3 && conv_state.size(1) == C && conv_state.size(2) == K - 1 &&
                 contiguous_f32(conv_state),
             "{}: conv state {} for {} channels and kernel {}", op, conv_state.str(), C, K);
  ShortConvLaunch l;
  l.out = mat_of(out, op);
  l.x = mat_of(x, op);
  l.w = w.ptr<float>();
  l.conv_state = conv_state.ptr<float>();
  l.query_start = rows.query_start.ptr<int32_t>();
  l.context_lens = rows.context_lens.ptr<int32_t>();
  l.state_slots = rows.state_slots.ptr<int32_t>();
  l.rollback = rollback_of(op, rows, T);
  l.channels = C;
  l.kernel = static_cast<int>(K);
  l.num_seqs = static_cast<int>(rows.context_lens.numel());
  launch_short_conv(l, current_stream());
  launch_check(op);
}

void gated_delta_rule(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& b, const Tensor& a, const Tensor& A_log, const Tensor& dt_bias,
                      Tensor& state, const StateRows& rows, const GatedDeltaArgs& args) {
  const char* op = "gated_delta_rule";
  check_gated_delta_args(op, out, q, k, v, b, a, A_log, dt_bias, state, args);
  check_rows_batch(op, rows);
  const int Hk = args.num_k_heads, Hv = args.num_v_heads, dk = args.k_dim, dv = args.v_dim;
  ATOM_CHECK(contiguous_f32(A_log) && contiguous_f32(dt_bias),
             "{}: A_log {} and dt_bias {} must be contiguous", op, A_log.str(), dt_bias.str());
  ATOM_CHECK(out.data() != v.data() && out.data() != q.data(), "{}: out must not alias inputs", op);
  DeltaLaunch l;
  l.out = mat_of(out, op);
  l.q = mat_of(q, op);
  l.k = mat_of(k, op);
  l.v = mat_of(v, op);
  l.a = mat_of(a, op);
  l.b = mat_of(b, op);
  l.A_log = A_log.ptr<float>();
  l.dt_bias = dt_bias.ptr<float>();
  l.state = state.ptr<float>();
  l.hk = Hk;
  l.hv = Hv;
  l.dk = dk;
  l.dv = dv;
  run_delta(op, l, false, rows, args.chunk_size);
}

void kda_rule(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& f,
              const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& state,
              const StateRows& rows, const KdaArgs& args) {
  const char* op = "kda_rule";
  check_kda_args(op, out, q, k, v, f, b, A_log, dt_bias, state, args);
  check_rows_batch(op, rows);
  const int H = args.num_heads, d = args.head_dim;
  ATOM_CHECK(contiguous_f32(A_log) && contiguous_f32(dt_bias),
             "{}: A_log {} and dt_bias {} must be contiguous", op, A_log.str(), dt_bias.str());
  ATOM_CHECK(out.data() != v.data() && out.data() != q.data(), "{}: out must not alias inputs", op);
  DeltaLaunch l;
  l.out = mat_of(out, op);
  l.q = mat_of(q, op);
  l.k = mat_of(k, op);
  l.v = mat_of(v, op);
  l.a = mat_of(f, op);
  l.b = mat_of(b, op);
  l.A_log = A_log.ptr<float>();
  l.dt_bias = dt_bias.ptr<float>();
  l.state = state.ptr<float>();
  l.hk = H;
  l.hv = H;
  l.dk = d;
  l.dv = d;
  l.lower_bound = args.gate_lower_bound;
  run_delta(op, l, true, rows, args.chunk_size);
}

void gated_rms_norm(Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w, float eps,
                    NormGate gate) {
  const char* op = "gated_rms_norm";
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &x, &z})
    check_rows(op, *t, "an operand");
  const int64_t T = x.size(0), N = x.size(1), D = w.numel();
  ATOM_CHECK(D > 0 && N % D == 0 && z.size(0) == T && z.size(1) == N && out.size(0) == T &&
                 out.size(1) == N && w.is_contiguous(),
             "{}: x {} z {} out {} w {}", op, x.str(), z.str(), out.str(), w.str());
  launch_gated_rms_norm(mat_of(out, op), mat_of(x, op), mat_of(z, op), w.data(),
                        elem_of(w.dtype(), op), D, eps, gate == NormGate::kSilu ? 0 : 1,
                        current_stream());
  launch_check(op);
}

void mul_sigmoid(Tensor& out, const Tensor& x, const Tensor& gate) {
  const char* op = "mul_sigmoid";
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &x, &gate})
    check_rows(op, *t, "an operand");
  const int64_t T = x.size(0), N = x.size(1);
  ATOM_CHECK(gate.size(0) == T && gate.size(1) == N && out.size(0) == T && out.size(1) == N,
             "{}: x {} gate {} out {}", op, x.str(), gate.str(), out.str());
  launch_mul_sigmoid(mat_of(out, op), mat_of(x, op), mat_of(gate, op), current_stream());
  launch_check(op);
}

}  // namespace atom::kernels::cuda
