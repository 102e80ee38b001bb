// CUDA linear: out = x · wᵀ (+ bias) through cuBLASLt (BF16/F16 in, FP32 accumulate, output BF16,
// F16 or F32), or the skinny kernel for decode-sized M. cuBLASLt plans (descriptors + the
// heuristic's algorithm) are cached per shape, strides, dtypes and pointer alignment; the handle
// and the workspace, fixed per (device, stream) so that calls can be captured into CUDA graphs,
// are those every cuBLASLt call shares (cublaslt_shared.h).
#include "kernels/linear.h"

#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/cuda/cublaslt_shared.h"
#include "kernels/cuda/host_common.h"
#include "kernels/cuda_tuning.h"
#include "kernels/elementwise.h"

#define CUBLAS_CHECK(expr)                                                                     \
  do {                                                                                         \
    cublasStatus_t atom_st_ = (expr);                                                          \
    if (atom_st_ != CUBLAS_STATUS_SUCCESS)                                                     \
      ::atom::fail("{}:{}: cuBLASLt error {} ({}) in {}", __FILE__, __LINE__,                  \
                   cublasLtGetStatusName(atom_st_), cublasLtGetStatusString(atom_st_), #expr); \
  } while (0)

namespace atom::kernels::cuda {

namespace {

// What cuBLASLt applies after the product: nothing, or GELU (tanh form); either with the bias
// when bias_type >= 0. The accumulating form (out += x · wᵀ) is beta = 1 on the same plan.
enum class Epi { kNone = 0, kGelu = 1 };

struct PlanKey {
  int64_t m, n, k, ldx, ldo;
  int in_type, out_type, bias_type;  // bias_type -1: no bias epilogue
  int align_x, align_w, align_o;
  int epi;  // Epi
  auto tie() const {
    return std::tie(m, n, k, ldx, ldo, in_type, out_type, bias_type, align_x, align_w, align_o,
                    epi);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, o = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct LtDevice {
  std::mutex mu;
  cublasLtHandle_t handle = nullptr;  // lt_handle's
  std::map<PlanKey, Plan> plans;
};

LtDevice& lt_device(int device) {
  static LtDevice* devices = new LtDevice[64];  // never destroyed: handles outlive statics
  LtDevice& d = devices[device];
  if (!d.handle) {
    std::string why;
    d.handle = lt_handle(device, &why);
    ATOM_CHECK(d.handle != nullptr, "linear: {}", why);
  }
  return d;
}

int alignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (v % a) != 0) a /= 2;
  return a;
}

Plan make_plan(cublasLtHandle_t h, const PlanKey& key, DType in, DType out, DType bias) {
  Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const bool gelu = key.epi == static_cast<int>(Epi::kGelu);
  if (key.bias_type >= 0 || gelu) {
    const cublasLtEpilogue_t ep =
        key.bias_type >= 0 ? (gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                           : CUBLASLT_EPILOGUE_GELU;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
  }
  if (key.bias_type >= 0) {
    const cudaDataType_t bt = cuda_data_type(bias, "linear");
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  // Column-major view: outᵀ [N, M] = w [N, K] (stored as Kx N col-major, transposed) · xᵀ [K, M].
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.w, cuda_data_type(in, "linear"),
                                          static_cast<uint64_t>(key.k),
                                          static_cast<uint64_t>(key.n), key.k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.x, cuda_data_type(in, "linear"),
                                          static_cast<uint64_t>(key.k),
                                          static_cast<uint64_t>(key.m), key.ldx));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.o, cuda_data_type(out, "linear"),
                                          static_cast<uint64_t>(key.n),
                                          static_cast<uint64_t>(key.m), key.ldo));
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kLtWorkspaceBytes;
  const uint32_t ax = static_cast<uint32_t>(key.align_x), aw = static_cast<uint32_t>(key.align_w),
                 ao = static_cast<uint32_t>(key.align_o);
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof(aw)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax, sizeof(ax)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ao, sizeof(ao)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ao, sizeof(ao)));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(h, p.op, p.w, p.x, p.o, p.o, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    fail("linear: cuBLASLt has no algorithm for [{}, {}] x [{}, {}]^T ({} -> {}, alignments "
         "{}/{}/{}): {}",
         key.m, key.k, key.n, key.k, dtype_name(in), dtype_name(out), ax, aw, ao,
         cublasLtGetStatusString(st));
  p.algo = res.algo;
  return p;
}

}  // namespace

namespace {
bool skinny_applies(const Tensor& x, const Tensor& w) {
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t ldx = M > 1 ? x.stride(0) : K;
  return (x.dtype() == DType::kBF16 || x.dtype() == DType::kF16) &&
         M <= std::min(cuda_tuning().skinny_max_m, 4) && K % 8 == 0 && ldx % 8 == 0 &&
         alignment(x.data()) >= 16 && alignment(w.data()) >= 16;
}

// The skinny kernel for `op` (linear, its SiLU·mul or its RoPE + cache-write form) on checked
// tensors: out [M, ·] = x [M, K] · w [n, K]ᵀ (+ bias) and the form's epilogue.
void launch_skinny(const char* op, Tensor& out, const Tensor& x, const Tensor& w, int64_t n,
                   const Tensor& bias, bool silu_mul_pairs = false, const SkinnyRope& rope = {},
                   int early_loads = kSkinnyEarlyLoadsAll) {
  launch_linear_skinny(mat_of(out, op), mat_of(x, op), w.data(), n, x.size(1),
                       bias.defined() ? bias.data() : nullptr,
                       bias.defined() ? elem_of(bias.dtype(), op) : Elem::kF32, current_stream(),
                       silu_mul_pairs, rope, early_loads);
  launch_check((std::string(op) + " (skinny)").c_str());
}
}  // namespace

bool linear_silu_mul(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_rows("linear_silu_mul", out, "out");
  check_rows("linear_silu_mul", x, "x");
  ATOM_CHECK(w.dim() == 2 && w.is_contiguous() && w.size(0) % 2 == 0 && w.size(1) == x.size(1) &&
                 out.size(0) == x.size(0) && out.size(1) == w.size(0) / 2,
             "linear_silu_mul: x {} · w {}ᵀ -> out {} (half the columns)", x.str(), w.str(),
             out.str());
  ATOM_CHECK(!bias.defined() || (bias.numel() == w.size(0) && bias.is_contiguous()),
             "linear_silu_mul: bias {} for N={}", bias.str(), w.size(0));
  if (x.dtype() != w.dtype() || out.dtype() != x.dtype() || !skinny_applies(x, w)) return false;
  if (x.size(0) == 0) return true;
  launch_skinny("linear_silu_mul", out, x, w, w.size(0), bias, true);
  return true;
}

bool linear_rope_kv(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const QkvRope& r) {
  check_rows("linear_rope_kv", out, "out");
  check_rows("linear_rope_kv", x, "x");
  const int64_t width = static_cast<int64_t>(r.kv_heads) * r.head_dim;
  const int64_t N = static_cast<int64_t>(r.q_heads) * r.head_dim + 2 * width;
  ATOM_CHECK(w.dim() == 2 && w.is_contiguous() && w.size(0) == N && w.size(1) == x.size(1) &&
                 out.size(0) == x.size(0) && out.size(1) == N,
             "linear_rope_kv: x {} · w {}ᵀ -> out {} for {} + 2 x {} heads of {}", x.str(), w.str(),
             out.str(), r.q_heads, r.kv_heads, r.head_dim);
  ATOM_CHECK(!bias.defined() || (bias.numel() == N && bias.is_contiguous()),
             "linear_rope_kv: bias {} for N={}", bias.str(), N);
  ATOM_CHECK(r.positions && r.inv_freq && r.k_cache && r.v_cache && r.slot_mapping,
             "linear_rope_kv: positions, inv_freq, caches and slot_mapping are required");
  const Tensor &kc = *r.k_cache, &vc = *r.v_cache;
  const bool applies = x.dtype() == w.dtype() && out.dtype() == x.dtype() &&
                       kc.dtype() == x.dtype() && vc.dtype() == x.dtype() && !r.interleaved &&
                       r.rot_dim == r.head_dim && r.head_dim % 2 == 0 && kc.is_contiguous() &&
                       vc.is_contiguous() && kc.numel() == vc.numel() && kc.numel() % width == 0 &&
                       is_i32(*r.positions) && is_i32(*r.slot_mapping) &&
                       r.inv_freq->dtype() == DType::kF32 && skinny_applies(x, w);
  if (!applies || !cuda_tuning().fuse_qkv_rope) return false;
  if (x.size(0) == 0) return true;
  SkinnyRope p;
  p.on = true;
  p.q_heads = r.q_heads;
  p.kv_heads = r.kv_heads;
  p.head_dim = r.head_dim;
  p.positions = r.positions->ptr<int32_t>();
  p.inv_freq = r.inv_freq->ptr<float>();
  p.scale = r.scale;
  p.k_cache = r.k_cache->data();
  p.v_cache = r.v_cache->data();
  p.slot_mapping = r.slot_mapping->ptr<int32_t>();
  p.num_slots = kc.numel() / width;
  launch_skinny("linear_rope_kv", out, x, w, N, bias, false, p);
  return true;
}

namespace {

// The argument checks of linear() and its epilogue forms, errors named by `what`.
void check_linear(const char* what, const Tensor& out, const Tensor& x, const Tensor& w,
                  const Tensor& bias) {
  check_rows(what, out, "out");
  check_rows(what, x, "x");
  ATOM_CHECK(w.dim() == 2 && w.is_contiguous(), "{}: weight must be contiguous 2-D, got {}", what,
             w.str());
  ATOM_CHECK(w.size(1) == x.size(1) && out.size(0) == x.size(0) && out.size(1) == w.size(0),
             "{}: x {} · w {}ᵀ -> out {}", what, x.str(), w.str(), out.str());
  ATOM_CHECK(!bias.defined() || (bias.numel() == w.size(0) && bias.is_contiguous()),
             "{}: bias {} for N={}", what, bias.str(), w.size(0));
  ATOM_CHECK(x.dtype() == w.dtype(), "{}: x {} and w {} must share a dtype on CUDA", what, x.str(),
             w.str());
}

// out = epi(x · wᵀ + bias) (+ out when accumulate) through cuBLASLt, for linear()'s checked
// arguments. Returns false, computing nothing, when the bias cannot ride in the epilogue and the
// epilogue is not the plain one (the caller then runs the ops apart).
bool lt_linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, Epi epi,
               bool accumulate) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const DType in = x.dtype(), od = out.dtype();
  const int64_t ldx = M > 1 ? x.stride(0) : K, ldo = M > 1 ? out.stride(0) : N;
  const cudaStream_t stream = current_stream();
  // The bias epilogue takes a bias of the output's dtype; any other bias is added afterwards.
  const bool fuse_bias = bias.defined() && bias.dtype() == od && alignment(bias.data()) >= 16;
  if (bias.defined() && !fuse_bias && (epi != Epi::kNone || accumulate)) return false;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  LtDevice& d = lt_device(device);
  const PlanKey key{M,
                    N,
                    K,
                    ldx,
                    ldo,
                    static_cast<int>(in),
                    static_cast<int>(od),
                    fuse_bias ? static_cast<int>(bias.dtype()) : -1,
                    alignment(x.data()),
                    alignment(w.data()),
                    alignment(out.data()),
                    static_cast<int>(epi)};
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.plans.find(key);
  if (it == d.plans.end())
    it = d.plans.emplace(key, make_plan(d.handle, key, in, od, bias.dtype())).first;
  Plan& p = it->second;
  if (fuse_bias) {
    const void* bp = bias.data();
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
  }
  // D = epilogue(alpha · w x + beta · C) with C = D = out: beta = 1 adds what out holds.
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(d.handle, p.op, &alpha, w.data(), p.w, x.data(), p.x, &beta,
                              out.data(), p.o, out.data(), p.o, &p.algo,
                              lt_workspace(device, stream, true), kLtWorkspaceBytes, stream));
  if (bias.defined() && !fuse_bias) add_bias(out, bias);
  return true;
}

}  // namespace

void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
            const LinearHints& hints) {
  check_linear("linear", out, x, w, bias);
  const int64_t M = x.size(0), N = w.size(0);
  const DType in = x.dtype(), od = out.dtype();
  ATOM_CHECK(in == od || od == DType::kF32, "linear: {} inputs cannot write {}", dtype_name(in),
             dtype_name(od));
  if (M == 0 || N == 0) return;
  if (skinny_applies(x, w)) {
    // After decode attention: one of the four first weight loads before the wait. H200, batch-1
    // decode: 4.150-4.183 ms against 4.199-4.250 with all four (docs/performance.md, fifth pass);
    // fewer early loads for the other products were slower.
    launch_skinny("linear", out, x, w, N, bias, false, {},
                  hints.after_latency_bound ? 1 : kSkinnyEarlyLoadsAll);
    return;
  }

  lt_linear(out, x, w, bias, Epi::kNone, false);
}

bool linear_gelu(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_linear("linear_gelu", out, x, w, bias);
  if (out.dtype() != x.dtype() || skinny_applies(x, w)) return false;
  if (x.size(0) == 0 || w.size(0) == 0) return true;
  return lt_linear(out, x, w, bias, Epi::kGelu, false);
}

bool linear_accumulate(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_linear("linear_accumulate", out, x, w, bias);
  if (out.dtype() != x.dtype() || skinny_applies(x, w)) return false;
  if (x.size(0) == 0 || w.size(0) == 0) return true;
  return lt_linear(out, x, w, bias, Epi::kNone, true);
}

bool linear_heads(Tensor& out, const Tensor& x, const Tensor& w, int heads, int64_t out_head_stride,
                  int64_t x_head_stride, int64_t w_head_stride) {
  check_rows("linear_heads", out, "out");
  check_rows("linear_heads", x, "x");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  ATOM_CHECK(w.dim() == 2 && w.size(1) == K && (N <= 1 || w.stride(0) == K) && w.stride(1) == 1 &&
                 out.size(0) == M && out.size(1) == N && heads > 0,
             "linear_heads: x {} · w {}ᵀ -> out {} over {} heads", x.str(), w.str(), out.str(),
             heads);
  auto aligned = [](const void* p, int64_t elems) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0 && elems % 8 == 0;
  };
  const int64_t xs = M > 1 ? x.stride(0) : K, os = M > 1 ? out.stride(0) : N;
  const bool applies =
      (x.dtype() == DType::kBF16 || x.dtype() == DType::kF16) && w.dtype() == x.dtype() &&
      out.dtype() == x.dtype() && M <= kLinearHeadsMaxM && K % 8 == 0 && aligned(x.data(), xs) &&
      aligned(w.data(), w_head_stride) && x_head_stride % 8 == 0 &&
      (reinterpret_cast<uintptr_t>(out.data()) & 3) == 0 && os % 2 == 0 && out_head_stride % 2 == 0;
  if (!applies) return false;
  if (M == 0) return true;
  launch_linear_heads(mat_of(out, "linear_heads"), mat_of(x, "linear_heads"), w.data(), heads, N, K,
                      out_head_stride, x_head_stride, w_head_stride, current_stream());
  launch_check("linear_heads");
  return true;
}

}  // namespace atom::kernels::cuda
