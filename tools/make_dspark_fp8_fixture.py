#!/usr/bin/python3
"""DeepSeek-V4.1 with DSpark stages in DeepSeek's native FP8 / FP4 format (issue 39).

Reads tests/fixtures/models/deepseek_v41_dspark (the V4.1 target with two DSpark stages,
tools/dspark_reference.py) and writes tests/fixtures/models/deepseek_v41_dspark_fp8/:

  quantized/    the release's format, as tests/fixtures/models/deepseek_v41_fp8 (the same
                quantization_config): FP8 e4m3 linears in 32 x 32 blocks with F8_E8M0 scales
                "<module>.scale" -- the target's wq_a, wq_b, wkv, wo_a, wo_b, indexer.wq_b, shared
                expert and engram.wkv, and every DSpark stage's wq_a, wq_b, wkv, wo_a, wo_b, shared
                expert and main_proj; the Engram table F8_E4M3 with an F8_E8M0 scale per 32 values
                of a row; every routed expert (target and stages) FP4 e2m1, I8 [rows, K/2] (the low
                nibble the even column) with an F8_E8M0 scale per 32 values along K. The rest as the
                source has it: the routers, compressors, indexer.wk / weights_proj, norms,
                hyper-connections, embed, head, and the stages' Markov and confidence heads (BF16 /
                F32), as ROCm/ATOM's checkpoint schema (atom/models/deepseek_v41/weights.py, read,
                not copied) lists them: main_proj quantised like the layers' linears, the heads not.
  dequantized/  the same values in full precision (BF16: every decoded value, 4 significant bits
                times a power of two, is a BF16 value), decoded here from the bytes written into
                quantized/ by this file's own decoder, and the source's config without a
                quantization_config.

The format needs K a multiple of 32 for the FP4 groups and the Engram rows; the source has
moe_intermediate_size 16 and engram_head_dim 8. Both are padded with zeros to 32 (the experts'
w1 / w3 rows and w2 columns, the shared expert's too; each Engram head's table row and its columns
of engram.wkv): a zero intermediate unit adds silu(0) * 0 = 0, a zero embedding column meets a zero
weight column, so the padded model computes what the source does; only the quantisation changes
its values.

Encoders: tools/make_v4_quantized_fixture.py's (scales 2^ceil(log2(amax / 448)) for FP8 and
2^ceil(log2(amax / 6)) for FP4, nearest even codes). Run with /usr/bin/python3 (numpy) from the
repository root.
"""
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_v4_quantized_fixture as mq  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests/fixtures/models/deepseek_v41_dspark")
OUT = os.path.join(ROOT, "tests/fixtures/models/deepseek_v41_dspark_fp8")

FP8_MODULES = (".attn.wq_a", ".attn.wq_b", ".attn.wkv", ".attn.wo_a", ".attn.wo_b",
               ".indexer.wq_b", ".shared_experts.w1", ".shared_experts.w2", ".shared_experts.w3",
               ".engram.wkv", ".main_proj")
QUANT = dict(quant_method="fp8", fmt="e4m3", weight_block_size=[32, 32], scale_fmt="ue8m0",
             activation_scheme="dynamic", expert_dtype="fp4")
PAD = 32  # moe_intermediate_size and engram_head_dim after padding


# ---- padding (the model's function unchanged) ---------------------------------------------------
def pad(src, text):
    inter, hd = text["moe_intermediate_size"], text["engram_head_dim"]
    heads = (text["engram_max_ngram_size"] - 1) * text["engram_n_heads"]
    out = {}
    for name, (dtype, v) in src.items():
        if ".ffn.experts." in name or ".ffn.shared_experts." in name:
            if name.endswith((".w1.weight", ".w3.weight")):
                assert v.shape[0] == inter
                v = np.concatenate([v, np.zeros((PAD - inter, v.shape[1]), v.dtype)], 0)
            elif name.endswith(".w2.weight"):
                assert v.shape[1] == inter
                v = np.concatenate([v, np.zeros((v.shape[0], PAD - inter), v.dtype)], 1)
        elif name.endswith(".engram.embed.weight"):
            assert v.shape[1] == hd
            v = np.concatenate([v, np.zeros((v.shape[0], PAD - hd), v.dtype)], 1)
        elif name.endswith(".engram.wkv.weight"):
            assert v.shape[1] == heads * hd
            w = np.zeros((v.shape[0], heads, PAD), v.dtype)
            w[:, :, :hd] = v.reshape(v.shape[0], heads, hd)
            v = w.reshape(v.shape[0], heads * PAD)
        out[name] = (dtype, np.ascontiguousarray(v))
    return out


# ---- decoding, from the bytes (independent of the encoders) -------------------------------------
def e4m3_decode(b):
    e, m = (b >> 3) & 15, (b & 7).astype(np.float64)
    v = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e.astype(np.float64) - 7))
    if np.any((b & 0x7F) == 0x7F):
        sys.exit("an E4M3 NaN code")
    return np.where(b & 0x80, -v, v)


def e8m0_decode(b):
    return 2.0 ** (b.astype(np.float64) - 127)


def decode_fp8(codes, scales, bn, bk):
    rows, cols = codes.shape
    full = np.repeat(np.repeat(e8m0_decode(scales), bn, 0), bk, 1)[:rows, :cols]
    return e4m3_decode(codes) * full


def decode_fp4(packed, scales):
    e2m1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    rows = packed.shape[0]
    nib = np.stack([packed & 15, packed >> 4], -1).reshape(rows, packed.shape[1] * 2)
    val = np.where(nib & 8, -e2m1[nib & 7], e2m1[nib & 7])
    return val * np.repeat(e8m0_decode(scales), 32, 1)


# ---- the checkpoints ----------------------------------------------------------------------------
def main():
    config = json.load(open(os.path.join(SRC, "config.json")))
    text = config["text_config"]
    src = pad(mq.read_safetensors(os.path.join(SRC, "model.safetensors")), text)
    quant, deq = {}, {}
    stats = {"fp8": 0, "fp8_stage": 0, "fp4": 0, "fp4_stage": 0, "table": 0}
    for name, (dtype, v) in src.items():
        mod = name[:-len(".weight")] if name.endswith(".weight") else None
        stage = name.startswith("mtp.")
        if mod and (mod.endswith(FP8_MODULES) or mod.endswith(".engram.embed")):
            bn = 1 if mod.endswith(".engram.embed") else 32  # the table: a scale per 32 of a row
            codes, (sdtype, sc), d = mq.quantize_fp8(v, bn, 32, True)
            assert sdtype == "F8_E8M0"
            quant[name] = ("F8_E4M3", v.shape, codes.tobytes())
            quant[mod + ".scale"] = ("F8_E8M0", sc.shape, sc.tobytes())
            back = decode_fp8(codes, sc, bn, 32)
            stats["table" if bn == 1 else "fp8_stage" if stage else "fp8"] += 1
        elif mod and ".ffn.experts." in mod:
            packed, sc, d = mq.quantize_fp4(v)
            quant[name] = ("I8", packed.shape, packed.view(np.int8).tobytes())
            quant[mod + ".scale"] = ("F8_E8M0", sc.shape, sc.tobytes())
            back = decode_fp4(packed, sc)
            stats["fp4_stage" if stage else "fp4"] += 1
        else:
            raw = mq.original_bytes(dtype, v)
            quant[name] = (dtype, v.shape, raw)
            deq[name] = (dtype, v.shape, raw)
            continue
        # The decoder and the encoder's own dequantised values agree, and quantisation moved
        # the weight (so a loader ignoring the format would be seen).
        if not np.array_equal(back, d):
            sys.exit(f"{name}: the decoder disagrees with the encoder")
        deq[name] = ("BF16", v.shape, mq.bf16_bytes(back.astype(np.float32)))
    dq_text = dict(text, moe_intermediate_size=PAD, engram_head_dim=PAD)
    for sub, tensors in (("quantized", quant), ("dequantized", deq)):
        d = os.path.join(OUT, sub)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        mq.write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        for f in ("generation_config.json", "tokenizer.json"):
            shutil.copy(os.path.join(SRC, f), d)
        c = dict(config, text_config=dq_text)
        if sub == "quantized":
            c["quantization_config"] = QUANT
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
            f.write("\n")
    sizes = [os.path.getsize(os.path.join(OUT, s, "model.safetensors"))
             for s in ("quantized", "dequantized")]
    print(f"target: {stats['fp8']} FP8 linears, {stats['fp4']} FP4 expert projections, "
          f"{stats['table']} FP8 Engram table; stages: {stats['fp8_stage']} FP8 linears, "
          f"{stats['fp4_stage']} FP4 expert projections; quantized {sizes[0]} bytes, "
          f"dequantized {sizes[1]} bytes")


if __name__ == "__main__":
    mq.self_check()
    main()
