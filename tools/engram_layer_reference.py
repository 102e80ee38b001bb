#!/usr/bin/python3
"""The Engram module of DeepSeek-V4.1 in plain PyTorch, from its public definition (ROCm/ATOM's
atom/model_ops/engram_layer.py and the V4.1 report, read, not copied), for atom's
src/layers/engram.h: random tables and weights, one sequence of compressed ids, random residual
streams, and the module's output.

  /usr/bin/python3 tools/engram_layer_reference.py [OUT.safetensors]

The hash rows come from tools/engram_reference.py (numpy's generator, the reference's mixing);
the rest is torch: the table gather, the fused key/value projection, the per-stream RMSNorms
with their gains, the signed square root of the scaled dot product, the sigmoid gate.
Writes tests/fixtures/references/engram_layer.safetensors:
  engram.embed.weight [rows, head_dim], engram.wkv.weight [(hc + 1) H, width],
  engram.k_weight, engram.q_weight [hc, H]       the module's parameters
  ids [T] (I64, compressed ids), streams [T, hc, H], rows [T, heads] (I64), out [T, hc, H]
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
import engram_reference as er  # noqa: E402
from moonvit_reference import save_safetensors  # noqa: E402

# The config the test loads (tests/unit/engram_layer_test.cpp writes the same fields).
LAYER, N, VOCAB, HEADS, HEAD_DIM, CVOCAB, PAD, SEED = 3, 3, 50, 2, 8, 40, 0, 7
HIDDEN, HC, EPS = 16, 4, 1e-20


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/references/engram_layer.safetensors"
    mult = er.multipliers(SEED, LAYER, N, CVOCAB)
    sizes = er.head_sizes([LAYER], N, [VOCAB] * (N - 1), HEADS)[LAYER]
    rows_total = int(sizes.sum())
    g = torch.Generator().manual_seed(3)
    width = (N - 1) * HEADS * HEAD_DIM
    table = torch.randn(rows_total, HEAD_DIM, generator=g)
    wkv = torch.randn((HC + 1) * HIDDEN, width, generator=g) / width ** 0.5
    k_weight = 1 + 0.2 * torch.randn(HC, HIDDEN, generator=g)
    q_weight = 1 + 0.2 * torch.randn(HC, HIDDEN, generator=g)
    ids = np.array([5, 17, 17, 3, 39, 0, 22, 8, 8, 8, 31, 2, 14], dtype=np.int64)
    T = len(ids)
    streams = torch.randn(T, HC, HIDDEN, generator=g)
    rows = er.hash_rows(ids, mult, sizes, N, HEADS, PAD)  # [T, heads], absolute
    emb = table[torch.from_numpy(rows)].reshape(T, width)
    kv = emb @ wkv.t()
    keys = kv[:, : HC * HIDDEN].view(T, HC, HIDDEN)
    value = kv[:, HC * HIDDEN:]

    def rms(x, gain):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * gain

    gate = (rms(keys, k_weight) * rms(streams, q_weight)).sum(-1) / HIDDEN ** 0.5
    gate = gate.abs().clamp_min(1e-6).sqrt() * gate.sign()
    result = gate.sigmoid().unsqueeze(-1) * value.unsqueeze(-2)
    save_safetensors({"engram.embed.weight": table, "engram.wkv.weight": wkv,
                      "engram.k_weight": k_weight, "engram.q_weight": q_weight,
                      "ids": torch.from_numpy(ids), "streams": streams,
                      "rows": torch.from_numpy(rows.astype(np.int64)), "out": result}, out)
    print("engram layer reference:", out, "rows", rows_total, "out std", float(result.std()),
          "gates", [round(float(v), 3) for v in gate.sigmoid()[:2].flatten()])


if __name__ == "__main__":
    main()
