#!/usr/bin/env python3
"""The peer and the ceiling of cuda_fp8_bench's FP8 GEMMs, in the same run:
  * the FP8 matmul peak of this machine: torch._scaled_mm (cuBLASLt) on a large square e4m3
    GEMM with tensorwise scales, with and without fast accumulation; the larger is printed as
    `PEAK_FLOPS <value>` for cuda_fp8_bench --peak;
  * torch._scaled_mm at the DeepSeek-V3 shapes with rowwise scales (per-token x per-channel,
    the nearest cuBLASLt recipe), and blockwise (1x128 activations, 128x128 weights) where this
    torch supports it on the GPU (checked against a dequantised matmul first).

    python3 bench/fp8_gemm_torch.py [--quick]
"""
import sys

import torch

import torch_timing

F8 = torch.float8_e4m3fn


def timed(fn, iters=10, reps=5):
    return torch_timing.timed(fn, iters, reps, warmup=3)


def rand_f8(rows, cols, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand(rows, cols, device="cuda", generator=g) * 4 - 2).to(F8)


def blockwise_fn(a, w, sa, sw):
    """A blockwise (1x128 x 128x128) scaled product: sw is [N/128, K/128]; torch 2.11 asked for
    the weight scales as [K/128, N/128] (run of 2026-12-02), so they are passed transposed."""
    F = torch.nn.functional
    if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
        ST = F.ScalingType
        return lambda: F.scaled_mm(a, w.t(), sa, ST.BlockWise1x128, sw.t(), ST.BlockWise128x128,
                                   output_dtype=torch.bfloat16)
    return lambda: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sw.t(),
                                    out_dtype=torch.bfloat16)


def check_blockwise():
    """Whether the blockwise product is right on a small case (against dequantised fp32)."""
    M, N, K = 256, 384, 512
    a, w = rand_f8(M, K, 1), rand_f8(N, K, 2)
    sa = (torch.rand(M, K // 128, device="cuda") + 0.5)
    sw = (torch.rand(N // 128, K // 128, device="cuda") + 0.5)
    sa_t = sa.t().contiguous().t()  # M-major (outer-dim-major) activation scales
    ref = (a.float() * sa.repeat_interleave(128, 1)) @ (
        w.float() * sw.repeat_interleave(128, 0).repeat_interleave(128, 1)).t()
    errs = []
    for name, s_a in (("M-major scales", sa_t), ("K-major scales", sa)):
        try:
            out = blockwise_fn(a, w, s_a, sw)().float()
            err = ((out - ref).norm() / ref.norm()).item()
            if err < 1e-2:
                return name, s_a is sa_t, None
            errs.append(f"{name}: rel err {err:.3g}")
        except Exception as e:  # noqa: BLE001 - report what torch says
            errs.append(f"{name}: " + str(e).splitlines()[0][:160])
    return None, None, "; ".join(errs)


def main():
    quick = "--quick" in sys.argv
    print(f"== torch._scaled_mm (torch {torch.__version__}, {torch.cuda.get_device_name()})")
    n = 8192
    a, b = rand_f8(n, n, 1), rand_f8(n, n, 2)
    one = torch.ones((), device="cuda")
    peak = 0.0
    for fast in (False, True):
        t = timed(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one,
                                           out_dtype=torch.bfloat16, use_fast_accum=fast))
        f = 2.0 * n ** 3 / t
        peak = max(peak, f)
        print(f"peak: {n}^3 tensorwise, fast_accum={fast}: {t * 1e6:9.1f} us {f / 1e12:8.1f} TFLOP/s")
    print(f"PEAK_FLOPS {peak:.4g}")
    del a, b

    bw_name, bw_mmajor, bw_err = check_blockwise()
    print("blockwise 1x128 x 128x128:", bw_name if bw_name else f"unsupported ({bw_err})")
    ms = [128, 4096] if quick else [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    for N, K in ((2112, 7168), (7168, 7168), (24576, 7168), (2112, 16384), (7168, 16384),
                 (24576, 16384)):
        w = rand_f8(N, K, 3)
        sw_row = torch.rand(1, N, device="cuda") + 0.5
        sw_blk = torch.rand((N + 127) // 128, K // 128, device="cuda") + 0.5
        for M in ms:
            x = rand_f8(M, K, 4)
            sa_row = torch.rand(M, 1, device="cuda") + 0.5
            flops = 2.0 * M * N * K
            iters = 3 if flops > 2e12 else 10 if flops > 2e11 else 30
            t = timed(lambda: torch._scaled_mm(x, w.t(), scale_a=sa_row, scale_b=sw_row,
                                               out_dtype=torch.bfloat16), iters)
            line = (f"torch rowwise M={M} N={N} K={K}: {t * 1e6:9.1f} us "
                    f"{flops / t / 1e12:8.1f} TFLOP/s {100 * flops / t / peak:6.1f}% of FP8 peak")
            if bw_name:
                sa = torch.rand(M, K // 128, device="cuda") + 0.5
                if bw_mmajor:
                    sa = sa.t().contiguous().t()
                try:
                    tb = timed(blockwise_fn(x, w, sa, sw_blk), iters)
                    line += (f" | blockwise {tb * 1e6:9.1f} us {flops / tb / 1e12:8.1f} TFLOP/s "
                             f"{100 * flops / tb / peak:6.1f}%")
                except Exception as e:  # noqa: BLE001
                    line += f" | blockwise failed: {str(e).splitlines()[0][:80]}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
