"""Shared by the PyTorch peers of atom's CUDA benchmarks (fp8_gemm_torch, moe_grouped_mm_torch,
mla_decode_torch, gdn_torch): the H200's measured limits (bench_util.h) and one way of timing a
CUDA callable."""
import torch

BANDWIDTH = 4.29e12  # bytes/s, the project's H200 weight-read bandwidth (bench_util.h)
MATMUL = 797e12      # bf16 FLOP/s, likewise


def timed(fn, iters=10, reps=5, warmup=3):
    """Median over `reps` of the mean seconds per call of `iters` back-to-back calls, timed with
    CUDA events after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / iters)
    times.sort()
    return times[len(times) // 2]
