// The FP8 linear through cuBLASLt (linear_fp8_launch.h): out [M, N] = (xq, sx) · (w, sw)ᵀ on the
// activations linear_fp8.cpp quantised. Column-major view, as linear.cpp: outᵀ [N, M] = op(A) ·
// B with A = w (K x N column-major, transposed: the "TN" layout FP8 needs) and B = xqᵀ (K x M,
// leading dimension ldq). So cuBLASLt's A scales are the weight's and its B scales the tokens':
//   SCALAR_32F        one float (sw[0]; sx[0], which is the static input scale in that mode);
//   OUTER_VEC_32F     one per row of op(A) (sw[n], the channel scales) or column of B (sx[m]);
//   BLK128x128_32F    one per 128 x 128 block of A, the K blocks of a row of blocks contiguous and
//                     that row padded to a multiple of 4: atom's [ceil(N/128), ceil(K/128)] grid
//                     when ceil(K/128) % 4 == 0;
//   VEC128_32F        one per 128 K of each column of B, the columns contiguous: sx[g * M + m], the
//                     quantisation's layout with ld_sx = M.
// Plans (descriptors and the heuristic's first algorithm, or why there is none) are cached per
// shape, dtypes and alignment; the scale pointers are set on the cached descriptor at each call.
// The handle and the workspace, one per (device, stream) allocated outside graph capture, are
// those every cuBLASLt call shares (cublaslt_shared.h).
#include <cublasLt.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/cuda/cublaslt_shared.h"
#include "kernels/cuda/host_common.h"
#include "kernels/cuda/linear_fp8_launch.h"

namespace atom::kernels::cuda {

namespace {

// The scaling pair of a product: A (weight) mode and B (activation) mode.
struct Scaling {
  cublasLtMatmulMatrixScale_t a = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
                              b = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
};

int align_of(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (v % a) != 0) a /= 2;
  return a;
}

struct Key {
  int64_t m, n, k, ldq, ldo;
  int out_type, scale_a, scale_b;
  int align_w, align_x, align_o, align_sw, align_sx;
  auto tie() const {
    return std::tie(m, n, k, ldq, ldo, out_type, scale_a, scale_b, align_w, align_x, align_o,
                    align_sw, align_sx);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Plan {
  std::string why;  // "" when usable
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct LtFp8Device {
  std::mutex mu;
  int device = 0;
  cublasLtHandle_t handle = nullptr;  // lt_handle's
  std::map<Key, Plan> plans;
};

LtFp8Device& lt_device(int device) {
  static LtFp8Device* devices = [] {  // never destroyed: graphs hold its plans' workspaces
    auto* d = new LtFp8Device[64];
    for (int i = 0; i < 64; ++i) d[i].device = i;
    return d;
  }();
  return devices[device];
}

std::string status_name(cublasStatus_t st) {
  return std::string(cublasLtGetStatusName(st)) + " (" + cublasLtGetStatusString(st) + ")";
}

// The scalings of `g`, or why cuBLASLt has none for it.
std::string scaling_of(const Fp8GemmArgs& g, Scaling& s) {
  if (g.act == Fp8Act::kNone) return "BF16 activations (W8A16)";
  if (g.k % 16 != 0 || g.a.ldq % 16 != 0) return "K not a multiple of 16";
  if (g.out.type != Elem::kBF16 && g.out.type != Elem::kF32) return "output not BF16 or F32";
  switch (g.gran) {
    case Fp8Gran::kBlock:
      if (g.bn != 128 || g.bk != 128 || g.act != Fp8Act::kBlock || g.a.group != 128)
        return "blocks other than 128x128 weights with 1x128 activation groups";
      if (((g.k + 127) / 128) % 4 != 0) return "ceil(K / 128) not a multiple of 4";
      if (g.a.ld_sx != g.m) return "activation scales not laid out [K / 128, M]";
      s.a = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
      s.b = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      return "";
    case Fp8Gran::kChannel:
      if (g.act == Fp8Act::kBlock) return "channel weights with 1x128 activation groups";
      s.a = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      s.b = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      return "";
    case Fp8Gran::kTensor:
      if (g.act == Fp8Act::kBlock) return "tensor weights with 1x128 activation groups";
      s.a = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
      s.b = g.act == Fp8Act::kStatic ? CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
                                     : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      return "";
  }
  return "unknown weight granularity";
}

Key key_of(const Fp8GemmArgs& g, const Scaling& s) {
  return Key{g.m,
             g.n,
             g.k,
             g.a.ldq,
             g.out.stride,
             static_cast<int>(g.out.type),
             static_cast<int>(s.a),
             static_cast<int>(s.b),
             align_of(g.w),
             align_of(g.a.xq),
             align_of(g.out.data),
             align_of(g.sw),
             align_of(g.a.sx)};
}

template <typename T>
cublasStatus_t set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const T& v) {
  return cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v));
}

// Builds the descriptors and asks the heuristic; a failure is kept in `why`.
Plan make_plan(cublasLtHandle_t h, const Fp8GemmArgs& g, const Key& key, const Scaling& s) {
  Plan p;
  auto check = [&](cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS && p.why.empty())
      p.why = std::string(what) + ": " + status_name(st);
    return st == CUBLAS_STATUS_SUCCESS;
  };
  const cudaDataType_t od = g.out.type == Elem::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  if (!check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate"))
    return p;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const void* sw = g.sw;
  const void* sx = g.a.sx;
  check(set_attr(p.op, CUBLASLT_MATMUL_DESC_TRANSA, ta), "TRANSA");
  check(set_attr(p.op, CUBLASLT_MATMUL_DESC_TRANSB, tb), "TRANSB");
  check(set_attr(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, s.a), "A_SCALE_MODE");
  check(set_attr(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, s.b), "B_SCALE_MODE");
  check(set_attr(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sw), "A_SCALE_POINTER");
  check(set_attr(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sx), "B_SCALE_POINTER");
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  check(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, u(g.k), u(g.n), g.k), "layout A");
  check(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, u(g.k), u(g.m), g.a.ldq), "layout B");
  check(cublasLtMatrixLayoutCreate(&p.d, od, u(g.n), u(g.m), g.out.stride), "layout D");
  if (!p.why.empty()) return p;
  cublasLtMatmulPreference_t pref = nullptr;
  if (!check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate")) return p;
  const uint64_t ws = kLtWorkspaceBytes;
  const uint32_t aw = static_cast<uint32_t>(key.align_w), ax = static_cast<uint32_t>(key.align_x),
                 ao = static_cast<uint32_t>(key.align_o);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw,
                                       sizeof(aw));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax,
                                       sizeof(ax));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ao,
                                       sizeof(ao));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ao,
                                       sizeof(ao));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(h, p.op, p.a, p.b, p.d, p.d, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS)
    p.why = "heuristic: " + status_name(st);
  else if (found == 0)
    p.why = "heuristic: no algorithm";
  else
    p.algo = res.algo;
  return p;
}

// The plan of `g` (created unless capturing), or nullptr with `why`.
Plan* plan_for(LtFp8Device& d, const Fp8GemmArgs& g, cudaStream_t s, std::string& why) {
  Scaling sc;
  why = scaling_of(g, sc);
  if (!why.empty()) return nullptr;
  const Key key = key_of(g, sc);
  auto it = d.plans.find(key);
  const bool capturing = stream_capturing(s);
  if (it == d.plans.end()) {
    if (capturing) {
      why = "shape not planned before stream capture";
      return nullptr;
    }
    if (!d.handle && !(d.handle = lt_handle(d.device, &why))) return nullptr;
    it = d.plans.emplace(key, make_plan(d.handle, g, key, sc)).first;
  }
  if (!it->second.why.empty()) {
    why = it->second.why;
    return nullptr;
  }
  if (!lt_workspace(d.device, s, !capturing)) {
    why = "no cuBLASLt workspace for this stream before capture";
    return nullptr;
  }
  return &it->second;
}

LtFp8Device& current_device() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return lt_device(device);
}

}  // namespace

std::string fp8_gemm_cublaslt_status(const Fp8GemmArgs& g, cudaStream_t s) {
  LtFp8Device& d = current_device();
  std::lock_guard<std::mutex> lock(d.mu);
  std::string why;
  plan_for(d, g, s, why);
  return why;
}

void launch_fp8_gemm_cublaslt(const Fp8GemmArgs& g, cudaStream_t s) {
  LtFp8Device& d = current_device();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    std::string why;
    Plan* p = plan_for(d, g, s, why);
    ATOM_CHECK(p != nullptr, "linear_fp8 (cuBLASLt): [{}, {}] x [{}, {}]^T: {}", g.m, g.k, g.n, g.k,
               why);
    const void* sw = g.sw;
    const void* sx = g.a.sx;
    auto ok = [](cublasStatus_t st, const char* what) {
      ATOM_CHECK(st == CUBLAS_STATUS_SUCCESS, "linear_fp8 (cuBLASLt): {}: {}", what,
                 status_name(st));
    };
    ok(set_attr(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sw), "A_SCALE_POINTER");
    ok(set_attr(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sx), "B_SCALE_POINTER");
    const float alpha = 1.0f, beta = 0.0f;
    ok(cublasLtMatmul(d.handle, p->op, &alpha, g.w, p->a, g.a.xq, p->b, &beta, g.out.data, p->d,
                      g.out.data, p->d, &p->algo, lt_workspace(d.device, s, false),
                      kLtWorkspaceBytes, s),
       "cublasLtMatmul");
  }
  if (g.bias) launch_add_bias(g.out, g.bias, g.bias_type, s);
}

}  // namespace atom::kernels::cuda
