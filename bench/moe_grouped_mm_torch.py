#!/usr/bin/env python3
"""The peer of cuda_moe_bench's grouped GEMMs: torch._grouped_mm (bf16) on the same routed-row
distribution (the per-expert counts cuda_moe_bench --counts wrote), at Qwen3-30B-A3B's expert
shapes. Times the w13 product, SiLU*mul, and the w2 product on rows already sorted by expert
(torch does no routing, sort or combine here; atom's figure is its whole fused_moe), and prints
TFLOP/s (6 H I per routed row) against atom's time from the same file.

    python3 bench/moe_grouped_mm_torch.py COUNTS_FILE
"""
import sys

import torch

import torch_timing

PEAK = 797e12  # bf16 GEMM measured on the project's H200 (bench_util.h)


def timed(fn, iters=20, reps=5):
    return torch_timing.timed(fn, iters, reps, warmup=3)


def main():
    lines = [l.split() for l in open(sys.argv[1]) if l.strip()]
    print(f"== torch._grouped_mm (torch {torch.__version__}, {torch.cuda.get_device_name()})")
    for f in lines:
        rows, H, I, atom_us = int(f[0]), int(f[1]), int(f[2]), float(f[3])
        counts = [int(c) for c in f[4:]]
        E = len(counts)
        assert sum(counts) == rows
        note = ""
        try:
            torch._grouped_mm(torch.zeros(rows, H, device="cuda", dtype=torch.bfloat16),
                              torch.zeros(E, 2 * I, H, device="cuda",
                                          dtype=torch.bfloat16).transpose(-2, -1),
                              offs=torch.cumsum(torch.tensor(counts, device="cuda",
                                                             dtype=torch.int32), 0,
                                                dtype=torch.int32))
        except RuntimeError as e:  # groups padded to multiples of 16 rows
            note = f" (groups padded to 16 rows: {str(e).splitlines()[0]})"
            counts = [(c + 15) // 16 * 16 for c in counts]
            rows = sum(counts)
        torch.manual_seed(0)
        w13 = (torch.randn(E, 2 * I, H, device="cuda") * 0.02).to(torch.bfloat16)
        w2 = (torch.randn(E, H, I, device="cuda") * 0.02).to(torch.bfloat16)
        x = torch.randn(rows, H, device="cuda").to(torch.bfloat16)
        offs = torch.cumsum(torch.tensor(counts, device="cuda", dtype=torch.int32), 0,
                            dtype=torch.int32)
        w13t, w2t = w13.transpose(-2, -1), w2.transpose(-2, -1)  # [E, H, 2I], [E, I, H]

        def gemms():
            h = torch._grouped_mm(x, w13t, offs=offs)
            a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
            return torch._grouped_mm(a, w2t, offs=offs)

        a = torch.nn.functional.silu(torch._grouped_mm(x, w13t, offs=offs)[:, :I])

        def only_mm():
            torch._grouped_mm(x, w13t, offs=offs)
            torch._grouped_mm(a, w2t, offs=offs)

        flops = 6.0 * H * I * rows
        iters = 10 if rows > 10000 else 20
        t_all = timed(gemms, iters)
        t_mm = timed(only_mm, iters)
        print(f"torch._grouped_mm {rows} routed rows: w13 + silu*mul + w2 {t_all * 1e6:9.1f} us "
              f"{flops / t_all / 1e12:7.1f} TFLOP/s ({100 * flops / t_all / PEAK:5.1f}%); "
              f"the two GEMMs alone {t_mm * 1e6:9.1f} us {flops / t_mm / 1e12:7.1f} TFLOP/s "
              f"({100 * flops / t_mm / PEAK:5.1f}%){note}")
        print(f"atom fused_moe    {rows} routed rows: {atom_us:9.1f} us "
              f"{flops / (atom_us * 1e-6) / 1e12:7.1f} TFLOP/s "
              f"({100 * flops / (atom_us * 1e-6) / PEAK:5.1f}%): atom / torch time "
              f"{atom_us * 1e-6 / t_all:.2f} (whole op vs GEMMs + silu), "
              f"{atom_us * 1e-6 / t_mm:.2f} (vs GEMMs alone)")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
