// CUDA entry points of the encoder ops (kernels/encoder.h). Encoder attention runs either
//   * kFlash: the paged flash-attention kernels (kernels/attention.h) with the causal mask off,
//     q, k and v copied into heads padded to 64 or 128 channels (zeros change no score and give
//     zero output channels, cut on the way out), k and v as a cache of one-token pages; or
//   * kGemm: two strided batched cuBLAS GEMMs per sequence (heads as the batch) around a row
//     softmax: S = scale · Q Kᵀ in F32, P = softmax(S) in the activations' type, O = P V; any
//     dtype and head_dim, the scores written to memory.
#include "kernels/encoder.h"

#include "kernels/attention.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "kernels/cuda/cublaslt_shared.h"
#include "kernels/cuda/encoder_launch.h"
#include "kernels/cuda/host_common.h"

namespace atom::kernels::cuda {

namespace {

constexpr int64_t kScoreBudget = int64_t{256} << 20;  // bytes of S and P at once

const char* cublas_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "alloc failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "arch mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "not supported";
    default:
      return "error";
  }
}

std::mutex& cublas_mutex() {
  static std::mutex mu;
  return mu;
}

// The device's cuBLAS handle (callers hold cublas_mutex()).
cublasHandle_t cublas_handle() {
  static std::map<int, cublasHandle_t> handles;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cublasHandle_t& h = handles[dev];
  if (!h) {
    const cublasStatus_t st = cublasCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS) {
      h = nullptr;
      fail("encoder_attention: cublasCreate failed ({})", cublas_name(st));
    }
  }
  return h;
}

void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("encoder_attention: {} failed ({})", what, cublas_name(st));
}

}  // namespace

namespace {

void gemm_attention(Tensor& out, const Tensor& qkv, const std::vector<int64_t>& starts,
                    const EncoderAttention& a, Arena& scratch) {
  const int64_t H = a.heads, D = a.head_dim, Q = H * D;
  const DType t = qkv.dtype();
  const cudaDataType_t ct = cuda_data_type(t, "encoder_attention");
  const int64_t esize = dtype_bits(t) / 8;
  const int64_t ldq = qkv.size(0) > 1 ? qkv.stride(0) : qkv.size(1);
  const int64_t ldo = out.size(0) > 1 ? out.stride(0) : out.size(1);
  const char* base = static_cast<const char*>(qkv.data());
  char* obase = static_cast<char*>(out.data());
  const float alpha = a.scale, one = 1.0f, zero = 0.0f;
  const cudaStream_t stream = current_stream();
  std::lock_guard<std::mutex> lock(cublas_mutex());
  cublasHandle_t handle = cublas_handle();
  check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  for (size_t s = 0; s + 1 < starts.size(); ++s) {
    const int64_t s0 = starts[s], L = starts[s + 1] - s0;
    // Chunks of heads, then of query rows, whose S (F32) and P fit the budget.
    const int64_t row_bytes = L * (4 + esize);
    int64_t hc = std::clamp<int64_t>(kScoreBudget / std::max<int64_t>(1, L * row_bytes), 1, H);
    int64_t qc = L;
    if (hc == 1) qc = std::clamp<int64_t>(kScoreBudget / row_bytes, 1, L);
    for (int64_t h0 = 0; h0 < H; h0 += hc) {
      const int64_t nh = std::min(hc, H - h0);
      for (int64_t q0 = 0; q0 < L; q0 += qc) {
        const int64_t nq = std::min(qc, L - q0);
        const Arena::Mark m = scratch.mark();
        Tensor S = scratch.alloc({nh * nq, L}, DType::kF32);
        Tensor P = scratch.alloc({nh * nq, L}, t);
        const char* q = base + ((s0 + q0) * ldq + h0 * D) * esize;
        const char* k = base + (s0 * ldq + Q + h0 * D) * esize;
        const char* v = base + (s0 * ldq + 2 * Q + h0 * D) * esize;
        // Column-major: Sᵀ [L, nq] = K [L, D] · Qᵀ [D, nq] per head, i.e. S = Q Kᵀ row-major.
        check_cublas(
            cublasGemmStridedBatchedEx(
                handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(L), static_cast<int>(nq),
                static_cast<int>(D), &alpha, k, ct, static_cast<int>(ldq), D, q, ct,
                static_cast<int>(ldq), D, &zero, S.data(), CUDA_R_32F, static_cast<int>(L), nq * L,
                static_cast<int>(nh), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "the score GEMM");
        launch_softmax_rows(S.ptr<float>(), P.data(), elem_of(t, "encoder_attention"), nh * nq, L,
                            stream);
        launch_check("encoder_attention");
        // Oᵀ [D, nq] = Vᵀ [D, L] · Pᵀ [L, nq] per head, into out's columns h · D.
        check_cublas(cublasGemmStridedBatchedEx(
                         handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(D),
                         static_cast<int>(nq), static_cast<int>(L), &one, v, ct,
                         static_cast<int>(ldq), D, P.data(), ct, static_cast<int>(L), nq * L, &zero,
                         obase + ((s0 + q0) * ldo + h0 * D) * esize, ct, static_cast<int>(ldo), D,
                         static_cast<int>(nh), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "the value GEMM");
        scratch.release(m);
      }
    }
  }
}

// The sequences as a batch of the paged kernels: each sequence's q rows over its own keys, the
// keys held as one-token pages in token order.
void flash_attention(Tensor& out, const Tensor& qkv, const std::vector<int64_t>& starts,
                     const EncoderAttention& a, Arena& scratch) {
  const int64_t T = qkv.size(0), H = a.heads, D = a.head_dim, Q = H * D;
  const int Dp = D <= 64 ? 64 : 128;
  const DType t = qkv.dtype();
  const cudaStream_t stream = current_stream();
  const Arena::Mark m = scratch.mark();
  Tensor qp = scratch.alloc({T, H * Dp}, t), kp = scratch.alloc({T, H * Dp}, t);
  Tensor vp = scratch.alloc({T, H * Dp}, t), op = scratch.alloc({T, H * Dp}, t);
  Tensor* parts[3] = {&qp, &kp, &vp};
  const float* cs = a.rope_cos ? a.rope_cos->ptr<float>() : nullptr;
  const float* sn = a.rope_sin ? a.rope_sin->ptr<float>() : nullptr;
  for (int part = 0; part < 3; ++part) {
    // q and k turned on the way into their padded copies (two channels a thread), else the
    // rotation in place and the plain copy.
    const Mat dst = mat_of(*parts[part], "encoder_attention");
    Tensor src = qkv.narrow(1, part * Q, Q);
    // (The two-channel copies only with tables until their GPU test has run: issue 38.)
    const bool turn = cs && part < 2;
    if (cs && launch_copy_head_pairs(dst, mat_of(src, "encoder_attention"), static_cast<int>(H), Dp,
                                     static_cast<int>(D), turn ? cs : nullptr, turn ? sn : nullptr,
                                     stream))
      continue;
    if (turn) rotate_pairs(src, *a.rope_cos, *a.rope_sin, static_cast<int>(D));
    launch_copy_heads(dst, mat_of(src, "encoder_attention"), static_cast<int>(H), Dp,
                      static_cast<int>(D), stream);
  }
  launch_check("encoder_attention (copy)");
  // query_start (= page_indptr: one page per token) [S + 1], context_lens [S], pages [T].
  const int S = static_cast<int>(starts.size()) - 1;
  std::vector<int32_t> host(static_cast<size_t>(2 * S + 1 + T));
  int max_len = 0;
  for (int s = 0; s <= S; ++s) host[static_cast<size_t>(s)] = static_cast<int32_t>(starts[s]);
  for (int s = 0; s < S; ++s) {
    const int len = static_cast<int>(starts[s + 1] - starts[s]);
    host[static_cast<size_t>(S + 1 + s)] = len;
    max_len = std::max(max_len, len);
  }
  for (int64_t i = 0; i < T; ++i)
    host[static_cast<size_t>(2 * S + 1 + i)] = static_cast<int32_t>(i);
  Tensor idx = scratch.alloc({static_cast<int64_t>(host.size())}, DType::kI32);
  // From pageable memory the copy returns once `host` is staged, so it may go out of scope after.
  CUDA_CHECK(cudaMemcpyAsync(idx.data(), host.data(), host.size() * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream));
  const Tensor starts_dev = idx.narrow(0, 0, S + 1), lens = idx.narrow(0, S + 1, S);
  const Tensor pages = idx.narrow(0, 2 * S + 1, T);
  AttentionArgs args;
  args.num_heads = static_cast<int>(H);
  args.num_kv_heads = static_cast<int>(H);
  args.head_dim = Dp;
  args.scale = a.scale;
  args.causal = false;
  args.max_query_len = max_len;
  args.max_context_len = max_len;
  const AttentionBatch batch{&starts_dev, &lens, &starts_dev, &pages};
  const Tensor kc = kp.view({T, 1, H, Dp}), vc = vp.view({T, 1, H, Dp});
  cuda::paged_attention(op, qp, kc, vc, batch, Tensor(), args);
  if (!cs || !launch_copy_head_pairs(mat_of(out, "encoder_attention"),
                                     mat_of(op, "encoder_attention"), static_cast<int>(H),
                                     static_cast<int>(D), Dp, nullptr, nullptr, stream))
    launch_copy_heads(mat_of(out, "encoder_attention"), mat_of(op, "encoder_attention"),
                      static_cast<int>(H), static_cast<int>(D), Dp, stream);
  launch_check("encoder_attention (copy)");
  scratch.release(m);
}

EncoderAttentionBackend backend_of(const EncoderAttention& a, DType t) {
  EncoderAttentionBackend b = a.backend;
  if (b == EncoderAttentionBackend::kAuto) {
    const char* e = std::getenv("ATOM_ENCODER_ATTENTION");
    ATOM_CHECK(!e || !*e || std::strcmp(e, "flash") == 0 || std::strcmp(e, "gemm") == 0,
               "ATOM_ENCODER_ATTENTION must be flash or gemm, got '{}'", e);
    b = e && std::strcmp(e, "gemm") == 0 ? EncoderAttentionBackend::kGemm
                                         : EncoderAttentionBackend::kFlash;
  }
  const bool flash_ok = (t == DType::kBF16 || t == DType::kF16) && a.head_dim <= 128;
  if (b == EncoderAttentionBackend::kFlash && !flash_ok) {
    ATOM_CHECK(a.backend != EncoderAttentionBackend::kFlash,
               "encoder_attention: the flash path takes BF16/F16 heads of at most 128, got {} "
               "heads of {}",
               dtype_name(t), a.head_dim);
    b = EncoderAttentionBackend::kGemm;
  }
  return b;
}

}  // namespace

void encoder_attention(Tensor& out, const Tensor& qkv, const std::vector<int64_t>& starts,
                       const EncoderAttention& a, Arena& scratch) {
  check_rows("encoder_attention", out, "out");
  check_rows("encoder_attention", qkv, "qkv");
  const int64_t H = a.heads, D = a.head_dim, Q = H * D;
  ATOM_CHECK(H > 0 && D > 0 && qkv.size(1) == 3 * Q && out.size(1) == Q &&
                 out.size(0) == qkv.size(0) && out.dtype() == qkv.dtype() && starts.size() >= 2 &&
                 starts.front() == 0 && starts.back() == qkv.size(0),
             "encoder_attention: qkv {} out {}, {} heads of {}, {} sequence starts", qkv.str(),
             out.str(), H, D, starts.size());
  for (size_t s = 0; s + 1 < starts.size(); ++s)
    ATOM_CHECK(starts[s] < starts[s + 1], "encoder_attention: sequence {} is empty", s);
  if (a.rope_cos)
    for (const Tensor* t : {a.rope_cos, a.rope_sin})
      ATOM_CHECK(t->shape() == Shape({qkv.size(0), D / 2}) && t->dtype() == DType::kF32 &&
                     t->is_contiguous() && D % 2 == 0,
                 "encoder_attention: rope tables {} for {} rows of heads of {}", t->str(),
                 qkv.size(0), D);
  if (backend_of(a, qkv.dtype()) == EncoderAttentionBackend::kFlash) {
    flash_attention(out, qkv, starts, a, scratch);
  } else {
    if (a.rope_cos) {
      Tensor qk = qkv.narrow(1, 0, 2 * Q);
      rotate_pairs(qk, *a.rope_cos, *a.rope_sin, static_cast<int>(D));
    }
    gemm_attention(out, qkv, starts, a, scratch);
  }
}

void rotate_pairs(Tensor& x, const Tensor& cos, const Tensor& sin, int head_dim) {
  check_rows("rotate_pairs", x, "x");
  const int64_t T = x.size(0);
  ATOM_CHECK(head_dim > 0 && head_dim % 2 == 0 && x.size(1) % head_dim == 0 &&
                 cos.shape() == Shape({T, head_dim / 2}) && sin.shape() == cos.shape() &&
                 cos.dtype() == DType::kF32 && sin.dtype() == DType::kF32 && cos.is_contiguous() &&
                 sin.is_contiguous(),
             "rotate_pairs: x {} cos {} sin {} head_dim {}", x.str(), cos.str(), sin.str(),
             head_dim);
  launch_rotate_pairs(mat_of(x, "rotate_pairs"), cos.ptr<float>(), sin.ptr<float>(), head_dim,
                      current_stream());
  launch_check("rotate_pairs");
}

void gelu(Tensor& out, const Tensor& x, bool tanh_approx) {
  check_rows("gelu", out, "out");
  check_rows("gelu", x, "x");
  ATOM_CHECK(out.shape() == x.shape(), "gelu: {} -> {}", x.str(), out.str());
  launch_gelu(mat_of(out, "gelu"), mat_of(x, "gelu"), tanh_approx, current_stream());
  launch_check("gelu");
}

void gather_mean_rows(Tensor& out, const Tensor& x, const Tensor& indices, int n) {
  check_rows("gather_mean_rows", out, "out");
  check_rows("gather_mean_rows", x, "x");
  ATOM_CHECK(
      n > 0 && is_i32(indices) && indices.numel() == out.size(0) * n && out.size(1) == x.size(1),
      "gather_mean_rows: x {} indices {} out {} n {}", x.str(), indices.str(), out.str(), n);
  launch_gather_mean_rows(mat_of(out, "gather_mean_rows"), mat_of(x, "gather_mean_rows"),
                          indices.ptr<int32_t>(), n, current_stream());
  launch_check("gather_mean_rows");
}

}  // namespace atom::kernels::cuda
