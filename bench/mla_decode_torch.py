#!/usr/bin/env python3
"""The PyTorch peer of cuda_mla_bench: absorbed MLA decode in eager bf16 PyTorch (what
transformers-style code does once W_UK / W_UV are absorbed: scores = q . latentᵀ over a
contiguous per-sequence latent [B, N, 576], softmax in fp32, out = P . c_kv), and
F.scaled_dot_product_attention with the 128 heads sharing one K/V head (MQA, 576 / 512 wide),
at the shapes and against atom's times in FILE (lines: heads batch ctx atom_us).

    python3 bench/mla_decode_torch.py FILE
"""
import sys

import torch

import torch_timing
import torch.nn.functional as F

BW = torch_timing.BANDWIDTH


def timed(fn, iters=10, reps=5):
    return torch_timing.timed(fn, iters, reps, warmup=2)


def main():
    print(f"== PyTorch MLA decode peer (torch {torch.__version__}, {torch.cuda.get_device_name()})")
    for line in open(sys.argv[1]):
        if not line.strip():
            continue
        H, B, N, atom_us = line.split()
        H, B, N, atom_us = int(H), int(B), int(N), float(atom_us)
        lat = torch.randn(B, N, 576, device="cuda", dtype=torch.bfloat16)
        q = torch.randn(B, H, 576, device="cuda", dtype=torch.bfloat16)
        scale = 192 ** -0.5
        byts = B * N * 576 * 2

        def eager():
            s = torch.einsum("bhd,bnd->bhn", q, lat).float() * scale
            p = torch.softmax(s, dim=-1).to(torch.bfloat16)
            return torch.einsum("bhn,bnd->bhd", p, lat[..., :512])

        def sdpa():
            return F.scaled_dot_product_attention(
                q.unsqueeze(2), lat.unsqueeze(1), lat[..., :512].unsqueeze(1), scale=scale,
                enable_gqa=True)

        for name, fn in (("eager", eager), ("sdpa", sdpa)):
            try:
                t = timed(fn)
                print(f"torch {name:5s} {H} heads batch {B} ctx {N}: {t * 1e6:9.1f} us "
                      f"{byts / t / 1e12:6.3f} TB/s ({100 * byts / t / BW:5.1f}% of bandwidth); "
                      f"atom {atom_us:9.1f} us, {t * 1e6 / atom_us:5.2f}x")
            except Exception as e:  # noqa: BLE001 (out of memory, unsupported shape)
                print(f"torch {name} {H} heads batch {B} ctx {N}: failed: {e}")
        del lat, q
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
