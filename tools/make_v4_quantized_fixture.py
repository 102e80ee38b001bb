#!/usr/bin/python3
"""DeepSeek-V4's official quantised checkpoint format, made from the BF16 fixture (issues 35, 39).

Reads tests/fixtures/models/deepseek_v4 (transformers' tiny DeepSeek-V4, made by make_fixtures.py)
and writes, for each variant, into tests/fixtures/models/deepseek_v4_fp8/<variant>/:

  quantized/    DeepSeek's release layout: names without "model." (embed, hc_head_*, layers.N.*),
                the FP8 linears (attn.wq_a, wq_b, wkv, wo_a, wo_b, indexer.wq_b, the shared
                expert's w1/w2/w3) as F8_E4M3 "weight" with block scales "scale" beside it, the
                routed experts as FP4 E2M1 "weight" [rows, K/2] I8 (two values a byte, the low
                nibble the even column) with F8_E8M0 "scale" [rows, K/32] (one per 32 values along
                K, the input axis), the rest as in the BF16 fixture; config.json with the
                quantization_config.
  dequantized/  the same values dequantised here (numpy, independently of atom) in the BF16
                fixture's own names and config: every dequantised value is exactly a BF16 value
                (E4M3 has 4 significant bits and the scales at most 4; E2M1 2 bits times a power of
                two), so the BF16 file holds them without rounding.

Variants:
  ue8m0  V4.1-style: weight_block_size [32, 32], scale_fmt ue8m0, F8_E8M0 scales (2^(b-127)),
         expert_dtype fp4 inside the quantization_config.
  f32    V4-style fields (expert_dtype fp4 at the top level) with weight_block_size [16, 32]
         (not square, so rows and columns cannot be confused) and F32 scales of 4 significant
         bits, amax / 448 rounded up.

Formats as DeepSeek's inference code and ROCm/ATOM's deepseek_v41/weights.py describe them (read,
not copied): FP8 scale grid [ceil(N / bn), ceil(K / bk)] with value = e4m3(w) * scale[n / bn,
k / bk]; FP4 value = e2m1(nibble) * 2^(scale - 127).

Run with /usr/bin/python3 (numpy; no torch needed) from the repository root.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests/fixtures/models/deepseek_v4")
OUT = os.path.join(ROOT, "tests/fixtures/models/deepseek_v4_fp8")

FP8_MODULES = (".attn.wq_a", ".attn.wq_b", ".attn.wkv", ".attn.wo_a", ".attn.wo_b",
               ".indexer.wq_b", ".shared_experts.w1", ".shared_experts.w2", ".shared_experts.w3")
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)


# ---- safetensors, by hand ------------------------------------------------------------------------
def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = data[a:b]
        if e["dtype"] == "BF16":
            v = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif e["dtype"] == "F32":
            v = np.frombuffer(raw, np.float32)
        elif e["dtype"] == "I64":
            v = np.frombuffer(raw, np.int64)
        else:
            sys.exit(f"{name}: unexpected dtype {e['dtype']}")
        out[name] = (e["dtype"], v.reshape(e["shape"]).copy())
    return out


def bf16_bytes(x):
    """F32 values that must be BF16 values exactly -> BF16 bytes."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    if np.any(u & 0xFFFF):
        sys.exit("a dequantised value is not a BF16 value")
    return (u >> 16).astype(np.uint16).tobytes()


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, shape, bytes)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def original_bytes(dtype, v):
    if dtype == "BF16":
        return bf16_bytes(v)
    return np.ascontiguousarray(v).tobytes()


# ---- E4M3 (fn) -----------------------------------------------------------------------------------
def e4m3_value(code):
    """The value of magnitude code 0..126 (sign clear; 127 is NaN)."""
    e, m = code >> 3, code & 7
    return (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)


E4M3 = np.array([e4m3_value(c) for c in range(127)], dtype=np.float64)  # ascending, max 448


def e4m3_encode(x):
    """Round to the nearest E4M3 value (ties to the even code); |x| <= 448 here."""
    mag = np.abs(x).astype(np.float64)
    if mag.max() > 448.0:
        sys.exit("FP8 value out of range")
    hi = np.clip(np.searchsorted(E4M3, mag), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dlo, dhi = mag - E4M3[lo], E4M3[hi] - mag
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    sign = (x < 0) & (code != 0)
    return (code | (sign.astype(np.int64) << 7)).astype(np.uint8)


def e4m3_decode(b):
    v = E4M3[(b & 0x7F).astype(np.int64)]
    return np.where(b & 0x80, -v, v)


# ---- scales --------------------------------------------------------------------------------------
def pow2_ceil(x):
    """2^ceil(log2 x), and its exponent."""
    k = np.ceil(np.log2(x)).astype(np.int64)
    return np.ldexp(1.0, k), k


def four_bit_ceil(x):
    """x rounded up to 4 significant bits (a float the product with an E4M3 value keeps exact)."""
    m, e = np.frexp(x)  # x = m 2^e, m in [0.5, 1)
    return np.ldexp(np.ceil(m * 16.0) / 16.0, e)


def quantize_fp8(w, bn, bk, ue8m0):
    """w [N, K] -> (codes [N, K] u8, scale grid, dequantised [N, K])."""
    N, K = w.shape
    gn, gk = -(-N // bn), -(-K // bk)
    scale = np.zeros((gn, gk), np.float64)
    exps = np.zeros((gn, gk), np.int64)
    codes = np.zeros((N, K), np.uint8)
    deq = np.zeros((N, K), np.float64)
    for i in range(gn):
        for j in range(gk):
            blk = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].astype(np.float64)
            amax = max(np.abs(blk).max(), 1e-30)
            if ue8m0:
                s, k = pow2_ceil(amax / 448.0)
                exps[i, j] = k
            else:
                s = four_bit_ceil(amax / 448.0)
            scale[i, j] = s
            c = e4m3_encode(blk / s)
            codes[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = c
            deq[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = e4m3_decode(c) * s
    if ue8m0:
        return codes, ("F8_E8M0", (exps + 127).astype(np.uint8)), deq
    return codes, ("F32", scale.astype(np.float32)), deq


def quantize_fp4(w):
    """w [N, K] -> (packed [N, K/2] u8, E8M0 scales [N, K/32] u8, dequantised [N, K])."""
    N, K = w.shape
    assert K % 32 == 0
    g = w.astype(np.float64).reshape(N, K // 32, 32)
    amax = np.maximum(np.abs(g).max(axis=2), 1e-30)
    s, k = pow2_ceil(amax / 6.0)
    q = np.clip(g / s[..., None], -6.0, 6.0)
    mag = np.abs(q)
    hi = np.clip(np.searchsorted(E2M1, mag), 0, 7)
    lo = np.clip(hi - 1, 0, 7)
    dlo, dhi = mag - E2M1[lo], E2M1[hi] - mag
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = code | (((q < 0) & (code != 0)).astype(np.int64) << 3)
    val = np.where(code & 8, -E2M1[code & 7], E2M1[code & 7])
    deq = (val * s[..., None]).reshape(N, K)
    code = code.reshape(N, K).astype(np.uint8)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8)  # the low nibble first
    return packed, (k + 127).astype(np.uint8), deq


# ---- the checkpoints -----------------------------------------------------------------------------
def release_name(n):
    if n == "model.embed_tokens.weight":
        return "embed.weight"
    if n.startswith("model.hc_head.hc_"):
        return "hc_head_" + n[len("model.hc_head.hc_"):]
    if n.startswith("model."):
        return n[len("model."):]
    return n


def make(variant, block, ue8m0, expert_dtype_in_quant):
    src = read_safetensors(os.path.join(SRC, "model.safetensors"))
    config = json.load(open(os.path.join(SRC, "config.json")))
    quant, deq = {}, {}
    stats = {"fp8": 0, "fp4": 0}
    for name, (dtype, v) in src.items():
        mod = name[:-len(".weight")] if name.endswith(".weight") else None
        rn = release_name(name)
        if mod and mod.endswith(FP8_MODULES):
            codes, (sdtype, sc), d = quantize_fp8(v, block[0], block[1], ue8m0)
            quant[rn] = ("F8_E4M3", v.shape, codes.tobytes())
            quant[rn[:-len(".weight")] + ".scale"] = (sdtype, sc.shape, sc.tobytes())
            deq[name] = ("BF16", v.shape, bf16_bytes(d.astype(np.float32)))
            stats["fp8"] += 1
        elif mod and ".ffn.experts." in mod:
            packed, sc, d = quantize_fp4(v)
            quant[rn] = ("I8", packed.shape, packed.view(np.int8).tobytes())
            quant[rn[:-len(".weight")] + ".scale"] = ("F8_E8M0", sc.shape, sc.tobytes())
            deq[name] = ("BF16", v.shape, bf16_bytes(d.astype(np.float32)))
            stats["fp4"] += 1
        else:
            raw = original_bytes(dtype, v)
            quant[rn] = (dtype, v.shape, raw)
            deq[name] = (dtype, v.shape, raw)
    base = os.path.join(OUT, variant)
    for sub, tensors in (("quantized", quant), ("dequantized", deq)):
        d = os.path.join(base, sub)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        shutil.copy(os.path.join(SRC, "generation_config.json"), d)
    json.dump(config, open(os.path.join(base, "dequantized", "config.json"), "w"), indent=2)
    q = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
         "weight_block_size": list(block)}
    if ue8m0:
        q["scale_fmt"] = "ue8m0"
    if expert_dtype_in_quant:
        q["expert_dtype"] = "fp4"
    else:
        config["expert_dtype"] = "fp4"
    config["quantization_config"] = q
    json.dump(config, open(os.path.join(base, "quantized", "config.json"), "w"), indent=2)
    sizes = [os.path.getsize(os.path.join(base, s, "model.safetensors"))
             for s in ("quantized", "dequantized")]
    print(f"{variant}: {stats['fp8']} FP8 linears, {stats['fp4']} FP4 expert projections; "
          f"quantized {sizes[0]} bytes, dequantized {sizes[1]} bytes")


def self_check():
    # E4M3 and E2M1 round trips on their own grids, and the nibble order.
    assert np.all(e4m3_decode(e4m3_encode(E4M3)) == E4M3)
    assert e4m3_decode(e4m3_encode(np.array([-448.0])))[0] == -448.0
    p, s, d = quantize_fp4(np.array([[0.5, 6.0] + [0.0] * 30]))
    assert p[0, 0] == 0x71 and s[0, 0] == 127 and d[0, 1] == 6.0


if __name__ == "__main__":
    self_check()
    make("ue8m0", (32, 32), ue8m0=True, expert_dtype_in_quant=True)
    make("f32", (16, 32), ue8m0=False, expert_dtype_in_quant=False)
