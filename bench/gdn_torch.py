#!/usr/bin/env python3
"""The peer of cuda_gdn_bench: transformers' PyTorch gated delta rule at the same shapes
(Qwen3-Next-80B-A3B / Qwen3.5-35B-A3B linear attention: 16 key heads, 32 value heads,
dk = dv = 128): torch_chunk_gated_delta_rule on one sequence of 4k and 16k tokens (chunk 64) and
torch_recurrent_gated_delta_rule for one decode token at batch 1, 32 and 128, with the same FLOP
and byte counts and hardware limits as cuda_gdn_bench (bench_util.h). transformers runs these in
fp32 (it upcasts q, k, v, g and beta). If flash-linear-attention (fla) is importable, its
chunk_gated_delta_rule and fused_recurrent_gated_delta_rule are timed too.

    python3 bench/gdn_torch.py
"""
import torch

import torch_timing

BANDWIDTH, MATMUL = torch_timing.BANDWIDTH, torch_timing.MATMUL
HK, HV, DK, DV = 16, 32, 128, 128


def timed(fn, iters=3, reps=5):
    return torch_timing.timed(fn, iters, reps, warmup=1)


def report(what, s, nbytes, flops):
    t_mem, t_math = nbytes / BANDWIDTH, flops / MATMUL
    pct = 100 * max(t_mem, t_math) / s
    kind = "bandwidth" if t_mem >= t_math else "matmul"
    print(f"{what:<58} {s * 1e6:10.1f} us {nbytes / s / 1e12:8.3f} TB/s {flops / s / 1e12:8.1f} "
          f"TFLOP/s {pct:6.1f}% of {kind} limit", flush=True)


def chunk_flops(T, C=64):
    return T * HV * (6.0 * DK * DV + C * (3.0 * DK + 2.0 * DV))


def inputs(B, T, dev="cuda"):
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.rand(B, T, HV, DK, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1
    k = torch.rand(B, T, HV, DK, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1
    v = torch.rand(B, T, HV, DV, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1
    beta = torch.rand(B, T, HV, device=dev, generator=g).sigmoid()
    gate = -torch.rand(B, T, HV, device=dev, generator=g)
    return q, k, v, gate, beta


def main():
    from transformers.models.qwen3_next import modeling_qwen3_next as m
    import transformers
    chunk = getattr(m.torch_chunk_gated_delta_rule, "__wrapped__", m.torch_chunk_gated_delta_rule)
    rec = getattr(m.torch_recurrent_gated_delta_rule, "__wrapped__",
                  m.torch_recurrent_gated_delta_rule)
    print(f"== transformers {transformers.__version__} torch {torch.__version__} on "
          f"{torch.cuda.get_device_name()}")
    try:
        import fla.ops.gated_delta_rule as fla_gdr  # noqa: F401
        have_fla = True
    except Exception as e:  # noqa: BLE001
        have_fla = False
        print(f"fla not importable here ({type(e).__name__}: {e})")
    # q and k per v-head (repeat_interleave of the 16 key heads, as the layer does).
    print(f"\n== torch_chunk_gated_delta_rule, one sequence, Hv {HV} dk {DK} dv {DV} (fp32 inside)")
    for T in (4096, 16384):
        q, k, v, g, beta = inputs(1, T)
        state = torch.zeros(1, HV, DK, DV, device="cuda")
        s = timed(lambda: chunk(q, k, v, g, beta, chunk_size=64, initial_state=state,
                                output_final_state=True, use_qk_l2norm_in_kernel=True), 1, 3)
        nbytes = T * (2 * HK * DK + 2 * HV * DV + 2 * HV) * 2 + 2.0 * HV * DK * DV * 4
        report(f"torch chunk prefill T={T}", s, nbytes, chunk_flops(T))
        if have_fla:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
            s = timed(lambda: chunk_gated_delta_rule(q, k, v, g, beta, initial_state=state,
                                                     output_final_state=True,
                                                     use_qk_l2norm_in_kernel=True))
            report(f"fla chunk prefill T={T}", s, nbytes, chunk_flops(T))
    print(f"\n== torch_recurrent_gated_delta_rule, one token per sequence")
    for B in (1, 32, 128):
        q, k, v, g, beta = inputs(B, 1)
        state = torch.rand(B, HV, DK, DV, device="cuda")
        s = timed(lambda: rec(q, k, v, g, beta, initial_state=state, output_final_state=True,
                              use_qk_l2norm_in_kernel=True), 10, 5)
        per_seq = HV * DK * DV * 4
        nbytes = 2.0 * B * per_seq + B * (2 * HK * DK + 2 * HV * DV + 2 * HV) * 2
        report(f"torch recurrent decode B={B}", s, nbytes, B * HV * 8.0 * DK * DV)


if __name__ == "__main__":
    main()
