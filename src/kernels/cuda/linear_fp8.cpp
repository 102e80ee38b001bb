// CUDA FP8 linear: quantise the activations (linear_fp8.cu) into the workspace, then the skinny
// GEMV (M <= 4), the wgmma GEMM (block 128x128 with 1x128 groups, or channel/tensor weights with
// token/static activations; TMA-fed 128x256 tiles, or cp.async-fed 128x128) or the general
// kernel (any other mode or shape), or cuBLASLt's FP8 matmul (linear_fp8_cublaslt.cpp) where the
// measured rule `cublaslt_wins` picks it. kNone skips the quantisation: the skinny and general
// kernels read the BF16 activations (W8A16).
#include "kernels/linear_fp8.h"

#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/host_common.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/linear_fp8_config.h"
#include "kernels/cuda/linear_fp8_launch.h"

namespace atom::kernels::cuda {

namespace {

int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

struct Layout {
  int64_t ldq = 0, ld_sx = 0, groups = 0, group = 0, q_bytes = 0, sx_bytes = 0, total = 0;
  int splits = 1;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Split-K for the cp.async GEMM: enough CTAs per tile to fill the SMs, each split at least four
// k blocks; 1 when the tiles fill the SMs already.
int splits_for(int64_t m, int64_t n, int64_t k) {
  const int64_t tiles = ceil_div(m, 128) * ceil_div(n, 128), sms = sm_count();
  if (tiles >= sms) return 1;
  return static_cast<int>(std::max<int64_t>(1, std::min(sms / tiles, ceil_div(k, 128) / 4)));
}

// Whether the TMA GEMM (128 x 256 tiles) beats the cp.async one (128 x 128, split-K below a
// wave) at this size. Both run whole waves of tiles: a 128 x 256 tile took about 1.6 times a
// 128 x 128 one on the H200 (760-849 against 600-690 TFLOP/s at large M, twice the work), so
// the TMA kernel wins when 1.6 x its waves is under the cp.async kernel's. Of the 38 DeepSeek-V3
// shapes bench/cuda_fp8_bench timed without split-K (2026-12-02, docs/performance.md) this picks
// the faster kernel for 36; the two misses cost 9% and 2%. Split-K (tiles under a wave) goes to
// the cp.async kernel.
bool tma_wins(int64_t m, int64_t n, int splits) {
  if (splits > 1) return false;
  const int64_t sms = sm_count();
  const int64_t waves_tma = ceil_div(ceil_div(m, 128) * ceil_div(n, 256), sms);
  const int64_t waves_cp = ceil_div(ceil_div(m, 128) * ceil_div(n, 128), sms);
  return 16 * waves_tma < 10 * waves_cp;
}

// Whether cuBLASLt's FP8 matmul beats atom's kernels for this product (kAuto). Measured on the
// H100 (docs/performance.md, "cuBLASLt against atom's kernels", CUDA 13.0): at M >= 128 it won
// every one of the 36 block-scaled whole calls (quantisation + GEMM) and of the 108 GEMMs alone
// (block, channel x token, tensor x static) at the DeepSeek-V3 shapes, by 1.1-2.6x; at M = 64 it
// won 11 of 12 block whole calls, losing at N x K = 2112 x 7168 (20.8 against 18.8 us, atom's
// split-K), and lost the channel GEMM at 24576 x 16384 (167 against 154 us). Below M = 64 not
// measured: atom's kernels (the skinny GEMV at M <= 4).
bool cublaslt_wins(const Fp8GemmArgs& g) {
  if (g.m >= 128) return true;
  const int64_t nk = g.n * g.k;
  return g.m >= 64 && nk > int64_t{2112} * 7168 && nk < int64_t{24576} * 16384;
}

Layout layout_of(int64_t m, int64_t k, const Fp8Weight& w) {
  Layout l;
  if (w.activation == Fp8Activation::kNone) return l;
  l.ldq = round_up(k, 16);
  l.ld_sx = round_up(m, 4);
  l.group = w.activation == Fp8Activation::kBlockDynamic ? w.block_k : std::max<int64_t>(k, 1);
  l.groups = (k + l.group - 1) / l.group;
  l.q_bytes = round_up(m * l.ldq, 256);
  l.sx_bytes = round_up(l.groups * l.ld_sx * 4, 256);
  l.splits = splits_for(m, w.w.size(0), k);
  l.total =
      l.q_bytes + l.sx_bytes + (l.splits > 1 ? round_up(l.splits * m * w.w.size(0) * 4, 256) : 0);
  return l;
}

Fp8Act act_of(Fp8Activation a) {
  switch (a) {
    case Fp8Activation::kBlockDynamic:
      return Fp8Act::kBlock;
    case Fp8Activation::kTokenDynamic:
      return Fp8Act::kToken;
    case Fp8Activation::kTensorStatic:
      return Fp8Act::kStatic;
    default:
      return Fp8Act::kNone;
  }
}

// The checkpoint's input_scale of static activations (a device pointer), else null.
const float* static_scale(const Fp8Quant& q) {
  return q.activation == Fp8Activation::kTensorStatic ? q.input_scale.ptr<float>() : nullptr;
}

Fp8Gran gran_of(Fp8Granularity g) {
  switch (g) {
    case Fp8Granularity::kTensor:
      return Fp8Gran::kTensor;
    case Fp8Granularity::kChannel:
      return Fp8Gran::kChannel;
    default:
      return Fp8Gran::kBlock;
  }
}

// The per-(device, stream) buffer used when the caller passes no workspace.
struct Buffers {
  std::mutex mu;
  std::map<std::tuple<int, cudaStream_t>, std::pair<void*, int64_t>> bufs;
};

void* fallback_workspace(int64_t bytes, cudaStream_t s) {
  static Buffers* b = new Buffers;  // never destroyed: graphs may hold the addresses
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(b->mu);
  auto& e = b->bufs[{dev, s}];
  if (e.second >= bytes) return e.first;
  ATOM_CHECK(!stream_capturing(s),
             "linear_fp8: {} bytes of activation workspace needed during CUDA graph capture; pass "
             "a workspace (linear_fp8_workspace_bytes) or run the shape once before capturing",
             bytes);
  if (e.first) {
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaFree(e.first));
  }
  e.first = nullptr;
  CUDA_CHECK(cudaMalloc(&e.first, bytes));
  e.second = bytes;
  return e.first;
}

// The product's description for m rows of k columns (g.x, the 16-bit activations kNone reads,
// is the caller's to set).
Fp8GemmArgs args_of(int64_t m, int64_t k, const Fp8Weight& w, const Layout& l) {
  Fp8GemmArgs g;
  g.m = m;
  g.k = k;
  g.n = w.w.size(0);
  g.act = act_of(w.activation);
  g.gran = gran_of(w.granularity);
  g.bn = w.block_n;
  g.bk = w.block_k;
  g.w = w.w.ptr<uint8_t>();
  g.sw = w.scale.ptr<float>();
  g.a.ldq = l.ldq;
  g.a.ld_sx = l.ld_sx;
  g.a.group = l.group;
  return g;
}

// A plausible 256-byte-aligned address for the workspace, for the alignment checks of the
// kernel choice before the real workspace is known.
uint8_t* const kAlignedProbe = reinterpret_cast<uint8_t*>(uintptr_t{1} << 20);

const char* choose(Fp8GemmArgs g, int splits) {
  if (g.act != Fp8Act::kNone && g.a.xq == nullptr) {
    g.a.xq = kAlignedProbe;
    g.a.sx = reinterpret_cast<float*>(kAlignedProbe);
  }
  const Fp8Path p = cuda_tuning().fp8_path;
  if (p == Fp8Path::kGeneral) return "general";
  const Fp8CublasLt lt = cuda_tuning().fp8_cublaslt;
  if (g.act != Fp8Act::kNone &&
      (lt == Fp8CublasLt::kOn || (lt == Fp8CublasLt::kAuto && cublaslt_wins(g)))) {
    // cuBLASLt reads the 1x128 activation scales as [K / 128, M] (ld_sx = M).
    Fp8GemmArgs q = g;
    if (q.gran == Fp8Gran::kBlock) q.a.ld_sx = q.m;
    if (fp8_gemm_cublaslt_status(q, current_stream()).empty()) return "cublaslt";
  }
  if (p == Fp8Path::kAuto && fp8_gemm_skinny_supported(g)) return "skinny";
  if (!fp8_gemm_wgmma_supported(g)) return "general";
  const Fp8Tiles t = cuda_tuning().fp8_tiles;
  if ((t == Fp8Tiles::kTma || (t == Fp8Tiles::kAuto && tma_wins(g.m, g.n, splits))) &&
      fp8_gemm_tma_supported(g))
    return "wgmma_tma";
  return splits > 1 ? "wgmma_splitk" : "wgmma";
}

// 1x128 activation groups have no cuBLASLt algorithm at M % 4 != 0 (CUDA 13.0, sm_90). From
// kCublasLtSplitMinRows rows on (ATOM_FP8_CUBLASLT_SPLIT, default on) such a call is cut in two:
// rows [0, M - M % 4) through cuBLASLt where the dispatch picks it for them, the last 1-3 rows
// through the kernel their own dispatch picks (skinny), which reads the weight once more: at M =
// 4,097 one more weight read against a GEMM 20-30% faster than atom's (docs/performance.md).
constexpr int64_t kCublasLtSplitMinRows = 1024;

// The rows the cut sends to cuBLASLt for M x K activations, or 0 when the call is not cut.
int64_t cublaslt_head_rows(int64_t M, int64_t K, const Fp8Weight& w, const Tensor& out) {
  const int64_t tail = M % 4;
  if (tail == 0 || M < kCublasLtSplitMinRows || !cuda_tuning().fp8_cublaslt_split ||
      w.granularity != Fp8Granularity::kBlock || w.activation != Fp8Activation::kBlockDynamic)
    return 0;
  const Layout l = layout_of(M - tail, K, w);
  Fp8GemmArgs g = args_of(M - tail, K, w, l);
  g.out = out.defined() ? mat_of(out.narrow(0, 0, M - tail), "linear_fp8")
                        : Mat{kAlignedProbe, g.m, g.n, g.n, Elem::kBF16};
  return std::string(choose(g, l.splits)) == "cublaslt" ? M - tail : 0;
}

// Launches the product by kernel `k` (choose's name); `partial`: split-K's fp32 totals.
void launch_gemm(const std::string& k, Fp8GemmArgs g, int splits, float* partial,
                 cudaStream_t stream) {
  if (k == "cublaslt") {
    launch_fp8_gemm_cublaslt(g, stream);  // the bias too
  } else if (k == "skinny") {
    // Four weight rows per block at M = 1, two above (H200: 2.5/2.3/3.0 against 2.4/1.8/2.9
    // TB/s at M = 1 for 7168x7168, 2112x7168, 4096x14336; two rows faster from M = 3 on).
    const int rows = cuda_tuning().fp8_skinny_rows ? cuda_tuning().fp8_skinny_rows
                     : g.m == 1                    ? 4
                                                   : 2;
    launch_fp8_gemm_skinny(g, stream, rows);
  } else if (k == "wgmma_tma") {
    launch_fp8_gemm_tma(g, stream);
  } else if (k == "wgmma") {
    launch_fp8_gemm_wgmma(g, stream);
  } else if (k == "wgmma_splitk") {
    g.splits = splits;
    g.partial = partial;
    launch_fp8_gemm_wgmma(g, stream);
  } else {
    launch_fp8_gemm_general(g, stream);
  }
  launch_check(("linear_fp8 (" + k + ")").c_str());
}

}  // namespace

int64_t linear_fp8_workspace_bytes(int64_t m, int64_t k, const Fp8Weight& w) {
  return layout_of(m, k, w).total;
}

const char* linear_fp8_kernel_for(const Tensor& x, const Fp8Weight& w, const Tensor& out) {
  if (cublaslt_head_rows(x.size(0), x.size(1), w, out) > 0) return "cublaslt+tail";
  const Layout l = layout_of(x.size(0), x.size(1), w);
  Fp8GemmArgs g = args_of(x.size(0), x.size(1), w, l);
  g.x = mat_of(x, "linear_fp8");
  g.out =
      out.defined() ? mat_of(out, "linear_fp8") : Mat{kAlignedProbe, g.m, g.n, g.n, Elem::kBF16};
  return choose(g, l.splits);
}

std::string linear_fp8_cublaslt_status(const Tensor& x, const Fp8Weight& w, const Tensor& out) {
  const Layout l = layout_of(x.size(0), x.size(1), w);
  Fp8GemmArgs g = args_of(x.size(0), x.size(1), w, l);
  g.x = mat_of(x, "linear_fp8");
  g.out = mat_of(out, "linear_fp8");
  if (g.act != Fp8Act::kNone) {
    g.a.xq = kAlignedProbe;
    g.a.sx = reinterpret_cast<float*>(kAlignedProbe);
  }
  if (g.gran == Fp8Gran::kBlock) g.a.ld_sx = g.m;
  return fp8_gemm_cublaslt_status(g, current_stream());
}

void linear_fp8(Tensor& out, const Tensor& x, const Fp8Weight& w, const Tensor& bias,
                const Tensor& workspace) {
  check_linear_fp8_args(out, x, w, bias);
  ATOM_CHECK(x.dtype() == DType::kBF16 || x.dtype() == DType::kF16,
             "linear_fp8: CUDA activations must be BF16 or F16, got {}", x.str());
  ATOM_CHECK(out.dtype() == DType::kBF16 || out.dtype() == DType::kF32,
             "linear_fp8: CUDA output must be BF16 or F32, got {}", out.str());
  const int64_t M = x.size(0), K = x.size(1), N = w.w.size(0);
  if (M == 0 || N == 0) return;
  ATOM_CHECK(K > 0, "linear_fp8: K = 0");
  if (const int64_t head = cublaslt_head_rows(M, K, w, out); head > 0) {
    // Two calls in stream order on the same workspace (sized for M rows, enough for each part).
    Tensor out_head = out.narrow(0, 0, head), out_tail = out.narrow(0, head, M - head);
    cuda::linear_fp8(out_head, x.narrow(0, 0, head), w, bias, workspace);
    cuda::linear_fp8(out_tail, x.narrow(0, head, M - head), w, bias, workspace);
    return;
  }
  const cudaStream_t stream = current_stream();
  const Layout l = layout_of(M, K, w);
  Fp8GemmArgs g = args_of(M, K, w, l);
  g.x = mat_of(x, "linear_fp8");
  g.out = mat_of(out, "linear_fp8");
  if (bias.defined()) {
    g.bias = bias.data();
    g.bias_type = elem_of(bias.dtype(), "linear_fp8");
  }
  const std::string k = choose(g, l.splits);
  if (k == "cublaslt" && g.gran == Fp8Gran::kBlock) g.a.ld_sx = M;  // cuBLASLt's [K / 128, M]
  if (g.act != Fp8Act::kNone) {
    uint8_t* ws;
    if (workspace.defined()) {
      ATOM_CHECK(workspace.is_contiguous() && static_cast<int64_t>(workspace.nbytes()) >= l.total &&
                     workspace.device() == out.device() &&
                     (reinterpret_cast<uintptr_t>(workspace.data()) & 255) == 0,
                 "linear_fp8: needs a 256-byte aligned workspace of {} bytes on {} "
                 "(linear_fp8_workspace_bytes), got {}",
                 l.total, out.device().str(), workspace.str());
      ws = static_cast<uint8_t*>(workspace.data());
    } else {
      ws = static_cast<uint8_t*>(fallback_workspace(l.total, stream));
    }
    g.a.xq = ws;
    g.a.sx = reinterpret_cast<float*>(ws + l.q_bytes);
    launch_fp8_act_quant(g.x, g.act, static_scale(Fp8Quant::of(w)), g.a, stream);
    launch_check("linear_fp8 (activation quantisation)");
  }
  // Split-K's totals after the quantised activations in the workspace.
  float* partial =
      k == "wgmma_splitk"
          ? reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(g.a.xq) + l.q_bytes + l.sx_bytes)
          : nullptr;
  launch_gemm(k, g, l.splits, partial, stream);
}

namespace {
// The launch description of quantised activations (rows strided by K, scales by
// fp8_scale_ld(M)).
Fp8Act8 act8_of(const Fp8Input& in) {
  Fp8Act8 a;
  a.xq = in.codes.ptr<uint8_t>();
  a.ldq = in.cols();
  a.sx = in.scales.ptr<float>();
  a.ld_sx = fp8_scale_ld(in.rows());
  a.group = in.quant.group(in.cols());
  return a;
}
}  // namespace

void quantize_fp8(Fp8Input& in, const Tensor& x) {
  check_fp8_input("quantize_fp8", in);
  check_rows("quantize_fp8", x, "x");
  ATOM_CHECK(
      x.size(0) == in.rows() && x.size(1) == in.cols() &&
          (x.dtype() == DType::kBF16 || x.dtype() == DType::kF16 || x.dtype() == DType::kF32),
      "quantize_fp8: x {} into codes {}", x.str(), in.codes.str());
  if (in.rows() == 0 || in.cols() == 0) return;
  launch_fp8_act_quant(mat_of(x, "quantize_fp8"), act_of(in.quant.activation),
                       static_scale(in.quant), act8_of(in), current_stream());
  launch_check("quantize_fp8");
}

void linear_fp8(Tensor& out, const Fp8Input& x, const Fp8Weight& w, const Tensor& bias,
                const Tensor& workspace) {
  check_linear_fp8_input(out, x, w, bias);
  ATOM_CHECK(out.dtype() == DType::kBF16 || out.dtype() == DType::kF32,
             "linear_fp8: CUDA output must be BF16 or F32, got {}", out.str());
  const int64_t M = x.rows(), K = x.cols(), N = w.w.size(0);
  if (M == 0 || N == 0) return;
  ATOM_CHECK(K > 0, "linear_fp8: K = 0");
  const cudaStream_t stream = current_stream();
  const Fp8Act8 a = act8_of(x);
  auto run = [&](Tensor& o, int64_t row0, int64_t rows, const Fp8Act8& act) {
    Fp8GemmArgs g = args_of(rows, K, w, Layout{});
    g.a = act;
    g.a.xq += row0 * K;
    g.out = mat_of(o, "linear_fp8");
    if (bias.defined()) {
      g.bias = bias.data();
      g.bias_type = elem_of(bias.dtype(), "linear_fp8");
    }
    const int splits = splits_for(rows, N, K);
    const std::string k = choose(g, splits);
    if (k == "cublaslt" && g.gran == Fp8Gran::kBlock && g.a.ld_sx != rows) {
      // cuBLASLt reads the 1x128 scales as [K / 128, rows]: the grid's first `rows` rows laid
      // out again in the room after it (fp8_input_scale_count).
      const int64_t groups = (K + g.a.group - 1) / g.a.group;
      float* dst = x.scales.ptr<float>() + groups * a.ld_sx;
      CUDA_CHECK(cudaMemcpy2DAsync(dst, rows * sizeof(float), g.a.sx, g.a.ld_sx * sizeof(float),
                                   rows * sizeof(float), groups, cudaMemcpyDeviceToDevice, stream));
      g.a.sx = dst;
      g.a.ld_sx = rows;
    }
    float* partial = nullptr;
    if (k == "wgmma_splitk") {
      const int64_t bytes = round_up(int64_t{splits} * rows * N * 4, 256);
      if (workspace.defined()) {
        ATOM_CHECK(workspace.is_contiguous() && static_cast<int64_t>(workspace.nbytes()) >= bytes &&
                       workspace.device() == out.device(),
                   "linear_fp8: needs a workspace of {} bytes on {} for split-K, got {}", bytes,
                   out.device().str(), workspace.str());
        partial = workspace.ptr<float>();
      } else {
        partial = static_cast<float*>(fallback_workspace(bytes, stream));
      }
    }
    launch_gemm(k, g, splits, partial, stream);
  };
  // The cut of the 16-bit entry point (cublaslt_head_rows): rows [0, head) through cuBLASLt,
  // the rest through the kernel their own dispatch picks; the tail's scales sit at row `head`
  // of the same grid.
  if (const int64_t head = cublaslt_head_rows(M, K, w, out); head > 0) {
    Tensor out_head = out.narrow(0, 0, head), out_tail = out.narrow(0, head, M - head);
    run(out_head, 0, head, a);
    Fp8Act8 tail = a;
    tail.sx += head;
    run(out_tail, head, M - head, tail);
    return;
  }
  run(out, 0, M, a);
}

bool rms_norm_fp8(Fp8Input& in, const Tensor& x, Tensor* residual, const Tensor& w, float eps,
                  RmsNormKind kind) {
  check_fp8_input("rms_norm_fp8", in);
  check_rows("rms_norm_fp8", x, "x");
  const int64_t rows = x.size(0), width = x.size(1);
  ATOM_CHECK(in.rows() == rows && in.cols() == width && w.numel() == width && w.is_contiguous(),
             "rms_norm_fp8: x {} w {} into codes {}", x.str(), w.str(), in.codes.str());
  const Mat res = residual ? residual_mat("rms_norm_fp8", *residual, x) : Mat{};
  const bool done = launch_rms_norm_fp8(mat_of(x, "rms_norm_fp8"), residual ? &res : nullptr,
                                        w.data(), elem_of(w.dtype(), "rms_norm_fp8"), eps,
                                        static_cast<int>(kind), act_of(in.quant.activation),
                                        static_scale(in.quant), act8_of(in), current_stream());
  if (done) launch_check("rms_norm_fp8");
  return done;
}

bool glu_fp8(Fp8Input& in, const Tensor& x, const Glu& a) {
  check_fp8_input("glu_fp8", in);
  check_rows("glu_fp8", x, "x");
  ATOM_CHECK(x.size(1) % 2 == 0 && in.rows() == x.size(0) && in.cols() == x.size(1) / 2,
             "glu_fp8: x {} into codes {}", x.str(), in.codes.str());
  const GluConstants c = glu_constants(a);
  const bool done = launch_glu_fp8(mat_of(x, "glu_fp8"), in.cols(), c.act, c.alpha, c.limit,
                                   act_of(in.quant.activation), static_scale(in.quant), act8_of(in),
                                   current_stream());
  if (done) launch_check("glu_fp8");
  return done;
}

}  // namespace atom::kernels::cuda
