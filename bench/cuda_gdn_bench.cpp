// The gated delta rule's CUDA kernels at the Qwen3-Next-80B-A3B / Qwen3.5-35B-A3B linear-attention
// shape (16 key heads, 32 value heads, dk = dv = 128; ../shared/reference/architectures.md §5):
// the chunked prefill kernel on one sequence of 4k and 16k tokens, and the recurrent decode
// kernel at batch 1, 32 and 128 (one token per sequence, the fp32 state in the slot pool). Also
// the short conv (conv_dim 8192) and the gated RMSNorm at the same shapes. Each line prints the
// fraction of the binding hardware limit (bench_util.h): for decode the state bytes read and
// written (plus q, k, v, out); for prefill the FLOPs of the chunked form against the bf16 matmul
// rate, or its bytes, whichever binds. The PyTorch peer is bench/gdn_torch.py (transformers'
// torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule), run in the same session.
//   cuda_gdn_bench [prefill|decode|all]
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/gated_delta.h"
#include "kernels/random.h"

using namespace atom;
using bench::report;
using bench::time_op;

namespace {

const Device kGpu = Device::cuda(0);
constexpr int kHk = 16, kHv = 32, kDk = 128, kDv = 128;

Tensor rnd(Shape s, DType dt, uint64_t seed, float lo = -1, float hi = 1) {
  Tensor t = Tensor::empty(std::move(s), dt, kGpu);
  kernels::fill_uniform(t, seed, lo, hi);
  return t;
}

Tensor i32_gpu(const std::vector<int32_t>& v) {
  Tensor h = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::memcpy(h.data(), v.data(), v.size() * 4);
  return h.to(kGpu);
}

// FLOPs of the chunked form per token and v-head (chunk C): the three state products (W S,
// q S, the state update kᵀ v_new: 2 dk dv each) and the intra-chunk lower-triangular products
// (K Kᵀ, Q Kᵀ, T K over dk; T V and P V_new over dv: C/2 rows each on average).
double chunk_flops(int64_t T, int C) {
  return static_cast<double>(T) * kHv * (6.0 * kDk * kDv + C * (3.0 * kDk + 2.0 * kDv));
}

void bench_prefill() {
  std::printf("\n== gated delta rule, chunked prefill (chunk 64), one sequence, Hk %d Hv %d dk %d "
              "dv %d, bf16 q/k/v/out, fp32 state\n",
              kHk, kHv, kDk, kDv);
  for (int64_t T : {4096, 16384}) {
    Tensor q = rnd({T, kHk * kDk}, DType::kBF16, 1), k = rnd({T, kHk * kDk}, DType::kBF16, 2);
    Tensor v = rnd({T, kHv * kDv}, DType::kBF16, 3);
    Tensor b = rnd({T, kHv}, DType::kBF16, 4, -2, 2), a = rnd({T, kHv}, DType::kBF16, 5, -2, 2);
    Tensor A_log = rnd({kHv}, DType::kF32, 6, -1, 0.5f), dt = rnd({kHv}, DType::kF32, 7, -.5f, .5f);
    Tensor out = Tensor::empty({T, kHv * kDv}, DType::kBF16, kGpu);
    Tensor state = rnd({2, kHv, kDk, kDv}, DType::kF32, 8);
    Tensor qs = i32_gpu({0, static_cast<int32_t>(T)}), cl = i32_gpu({static_cast<int32_t>(T)});
    Tensor sl = i32_gpu({1});
    const kernels::StateRows rows{qs, cl, sl, static_cast<int>(T)};
    kernels::GatedDeltaArgs args{kHk, kHv, kDk, kDv, 64};
    const double s = time_op(
        [&](int) { kernels::gated_delta_rule(out, q, k, v, b, a, A_log, dt, state, rows, args); },
        3, 5, 1);
    const double bytes = static_cast<double>(T) * (2 * kHk * kDk + 2 * kHv * kDv + 2 * kHv) * 2 +
                         2.0 * kHv * kDk * kDv * 4;
    report("gdn chunked prefill T=" + std::to_string(T), s, bytes, chunk_flops(T, 64));
  }
}

void bench_decode() {
  std::printf("\n== gated delta rule, recurrent decode (one token per sequence), Hv %d, fp32 state "
              "%d KiB per sequence\n",
              kHv, kHv * kDk * kDv * 4 / 1024);
  for (int B : {1, 32, 128}) {
    // Enough slot sets that the states rotated through exceed L2 (60 MB) several times over.
    const int64_t per_seq = static_cast<int64_t>(kHv) * kDk * kDv * 4;
    const int sets = std::max(2, static_cast<int>((512ll << 20) / (per_seq * B)));
    Tensor state = rnd({static_cast<int64_t>(sets) * B, kHv, kDk, kDv}, DType::kF32, 9);
    Tensor q = rnd({B, kHk * kDk}, DType::kBF16, 10), k = rnd({B, kHk * kDk}, DType::kBF16, 11);
    Tensor v = rnd({B, kHv * kDv}, DType::kBF16, 12);
    Tensor b = rnd({B, kHv}, DType::kBF16, 13), a = rnd({B, kHv}, DType::kBF16, 14);
    Tensor A_log = rnd({kHv}, DType::kF32, 15, -1, 0.5f), dt = rnd({kHv}, DType::kF32, 16);
    Tensor out = Tensor::empty({B, kHv * kDv}, DType::kBF16, kGpu);
    std::vector<int32_t> qsv, clv(B, 100);
    for (int i = 0; i <= B; ++i) qsv.push_back(i);
    Tensor qs = i32_gpu(qsv), cl = i32_gpu(clv);
    std::vector<Tensor> slots;
    for (int st = 0; st < sets; ++st) {
      std::vector<int32_t> sv;
      for (int i = 0; i < B; ++i) sv.push_back(st * B + i);
      slots.push_back(i32_gpu(sv));
    }
    kernels::GatedDeltaArgs args{kHk, kHv, kDk, kDv, 64};
    const double s = time_op(
        [&](int i) {
          const kernels::StateRows rows{qs, cl, slots[static_cast<size_t>(i % sets)], 1};
          kernels::gated_delta_rule(out, q, k, v, b, a, A_log, dt, state, rows, args);
        },
        20, 5, 3);
    const double bytes =
        2.0 * B * per_seq + static_cast<double>(B) * (2 * kHk * kDk + 2 * kHv * kDv + 2 * kHv) * 2;
    const double flops = static_cast<double>(B) * kHv * 8.0 * kDk * kDv;
    report("gdn recurrent decode B=" + std::to_string(B), s, bytes, flops);
  }
}

// The conv and the norm around the rule (conv_dim 2·16·128 + 32·128 = 8192, bf16).
void bench_small() {
  std::printf("\n== short conv (8192 channels, K 4) and gated RMSNorm (32 x 128), bf16\n");
  const int64_t C = 2 * kHk * kDk + kHv * kDv;
  for (int64_t T : {1, 128, 16384}) {
    Tensor x = rnd({T, C}, DType::kBF16, 20), w = rnd({C, 4}, DType::kF32, 21);
    Tensor out = Tensor::empty({T, C}, DType::kBF16, kGpu);
    Tensor st = rnd({2, C, 3}, DType::kF32, 22);
    const int32_t Ti = static_cast<int32_t>(T);
    Tensor qs = i32_gpu({0, Ti}), cl = i32_gpu({Ti + 5}), sl = i32_gpu({1});
    const kernels::StateRows rows{qs, cl, sl, Ti};
    const double s = time_op([&](int) { kernels::short_conv(out, x, w, st, rows); }, 20, 5, 3);
    report("short_conv T=" + std::to_string(T), s, 2.0 * T * C * 2, 2.0 * T * C * 4);
    Tensor o = rnd({T, kHv * kDv}, DType::kBF16, 23), z = rnd({T, kHv * kDv}, DType::kBF16, 24);
    Tensor nw = rnd({kDv}, DType::kF32, 25);
    const double s2 = time_op([&](int) { kernels::gated_rms_norm(o, o, z, nw, 1e-6f); }, 20, 5, 3);
    report("gated_rms_norm T=" + std::to_string(T), s2, 3.0 * T * kHv * kDv * 2,
           6.0 * T * kHv * kDv);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "all";
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  if (what == "prefill" || what == "all") bench_prefill();
  if (what == "decode" || what == "all") bench_decode();
  if (what == "small" || what == "all") bench_small();
  return 0;
}
