"""Test vectors for atom's Engram n-gram hashing (src/layers/engram_hash.h), from numpy alone.

Engram (DeepSeek-V4.1; deepseek-ai/Engram's engram_demo_v1.py, ROCm/ATOM's
atom/model_ops/engram.py) hashes the last n compressed token ids of every position into rows of
large embedding tables. Its per-layer multipliers come from numpy's Generator:
    default_rng(seed + 10007 * layer_id).integers(0, half_bound, size=max_ngram_size,
                                                  dtype=np.int64) * 2 + 1
    half_bound = max(1, (INT64_MAX // compressed_vocab_size) // 2)
so numpy's own SeedSequence, PCG64 and bounded-integer draw are the oracle here: this script calls
them and records what they return. The rest of the algorithm (one distinct prime per layer, n-gram
order and head, in that order, with a search shared across layers; left-padded shifted ids; the
int64 XOR mix of wrapping products; numpy's floor modulo per head; head offsets) is re-expressed
below with numpy int64 arithmetic, as the reference computes it.

Writes tests/fixtures/references/engram_hash.json (python3 tools/engram_reference.py [OUT]).
"""
import json
import sys
from pathlib import Path

import numpy as np

INT64_MAX = int(np.iinfo(np.int64).max)
LAYER_SEED_STRIDE = 10007


def is_prime(n):
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def half_bound(compressed_vocab_size):
    return max(1, (INT64_MAX // compressed_vocab_size) // 2)


def multipliers(seed, layer_id, max_ngram_size, compressed_vocab_size):
    rng = np.random.default_rng(seed + LAYER_SEED_STRIDE * layer_id)
    r = rng.integers(0, half_bound(compressed_vocab_size), size=(max_ngram_size,), dtype=np.int64)
    return r * 2 + 1


def head_sizes(layer_ids, max_ngram_size, vocab_sizes, n_heads):
    """One distinct prime per (layer, n-gram order, head), searched in that order."""
    seen = set()
    out = {}
    for layer_id in layer_ids:
        heads = []
        for order in range(2, max_ngram_size + 1):
            start = vocab_sizes[order - 2] - 1
            for _ in range(n_heads):
                p = start + 1
                while p in seen or not is_prime(p):
                    p += 1
                seen.add(p)
                heads.append(p)
                start = p
        out[layer_id] = np.asarray(heads, dtype=np.int64)
    return out


def hash_rows(ids, mult, sizes, max_ngram_size, n_heads, pad_id):
    """Absolute table rows [T, (max_ngram_size - 1) * n_heads] of one layer."""
    x = np.asarray(ids, dtype=np.int64)[None, :]
    t = x.shape[1]
    shifted = [x] + [
        np.pad(x, ((0, 0), (k, 0)), mode="constant", constant_values=pad_id)[:, :t]
        for k in range(1, max_ngram_size)
    ]
    offsets = np.concatenate([[0], np.cumsum(sizes[:-1])]).astype(np.int64)
    cols = []
    with np.errstate(over="ignore"):
        for order in range(2, max_ngram_size + 1):
            mix = shifted[0] * mult[0]
            for k in range(1, order):
                mix = np.bitwise_xor(mix, shifted[k] * mult[k])
            base = (order - 2) * n_heads
            for j in range(n_heads):
                cols.append(mix % int(sizes[base + j]))
    rows = np.stack(cols, axis=2)[0] + offsets[None, :]
    return rows


def ints(a):
    return [int(v) for v in np.asarray(a).ravel()]


def main():
    out_path = Path(sys.argv[1] if len(sys.argv) > 1 else
                    Path(__file__).resolve().parent.parent /
                    "tests/fixtures/references/engram_hash.json")
    doc = {"numpy_version": np.__version__}

    # SeedSequence's pool and output, then PCG64's raw 64-bit outputs: each stage on its own.
    entropies = [0, 1, 7, 10007, 150105, 2**32 - 1, 2**32, 2**32 + 5, 2**62 + 12345, 2**64 - 1]
    doc["seed_sequence"] = [{
        "entropy": e,
        "state32": ints(np.random.SeedSequence(e).generate_state(8, np.uint32)),
    } for e in entropies]
    doc["pcg64_raw"] = [{
        "seed": e,
        "raw": ints(np.random.PCG64(e).random_raw(6)),
    } for e in entropies]

    # Generator.integers(low, high, size, dtype=int64): every path of the bounded draw. A range
    # of 2^32 - 1 or less takes the 32-bit path (PCG64's halves, the second kept for the next
    # draw); rng = high - low - 1 == 0 returns low; a range near 3 * 2^61 (or 3 * 2^30) rejects
    # about a quarter of its draws.
    bounds = [(0, 2**62), (0, INT64_MAX), (-2**62, 2**62), (0, 3 * 2**61), (0, 2**61 + 1),
              (0, half_bound(129280)), (0, half_bound(100000)), (0, 2**32 + 1), (0, 2**32),
              (0, 2**32 - 1), (0, 3 * 2**30), (0, 1000), (-5, 6), (0, 2), (0, 1), (41, 42)]
    draws = []
    for seed in [0, 10007, 2**40 + 3]:
        for low, high in bounds:
            for size in [1, 7]:
                v = np.random.default_rng(seed).integers(low, high, size=size, dtype=np.int64)
                draws.append({"seed": seed, "low": low, "high": high, "values": ints(v)})
    doc["integers"] = draws

    # Per-layer multipliers for several seeds, layers and compressed vocabulary sizes.
    mults = []
    for seed in [0, 1, 12345]:
        for layer_id in [0, 1, 2, 15, 61]:
            for vocab in [129280, 100000, 646400, 3, 2**31 + 11, 2**40, 2**62]:
                mults.append({"seed": seed, "layer_id": layer_id, "max_ngram_size": 4,
                              "compressed_vocab_size": vocab,
                              "multipliers": ints(multipliers(seed, layer_id, 4, vocab))})
    doc["multipliers"] = mults

    # Whole configurations: primes, offsets, totals and rows for token sequences.
    rs = np.random.default_rng(2024)
    configs = []
    for cfg in [
        {"engram_layer_ids": [1, 15], "engram_max_ngram_size": 3, "engram_vocab_size": 1000,
         "engram_n_heads": 4, "engram_head_dim": 32, "engram_pad_token_id": 2,
         "engram_compressed_vocab_size": 700, "engram_seed": 0},
        {"engram_layer_ids": [2, 5, 9], "engram_max_ngram_size": 4,
         "engram_vocab_size": [1200, 800, 1500], "engram_n_heads": 3, "engram_head_dim": 16,
         "engram_pad_token_id": 0, "engram_compressed_vocab_size": 50000, "engram_seed": 7},
        # engram_demo_v1.py's own sizes: [129280 * 5] * 2, 8 heads, layers 1 and 15.
        {"engram_layer_ids": [1, 15], "engram_max_ngram_size": 3,
         "engram_vocab_size": [646400, 646400], "engram_n_heads": 8, "engram_head_dim": 64,
         "engram_pad_token_id": 2, "engram_compressed_vocab_size": 128000, "engram_seed": 0},
    ]:
        n = cfg["engram_max_ngram_size"]
        vs = cfg["engram_vocab_size"]
        vs = vs if isinstance(vs, list) else [vs] * (n - 1)
        layers = cfg["engram_layer_ids"]
        h = cfg["engram_n_heads"]
        cv = cfg["engram_compressed_vocab_size"]
        sizes = head_sizes(layers, n, vs, h)
        cfg["engram_num_embeddings"] = [int(sizes[l].sum()) for l in layers]
        entry = {"config": cfg, "layers": []}
        pad_id = 1  # a compressed id: the tokenizer's mapping of the pad token is not hashed here
        seqs = [
            ints(rs.integers(0, cv, size=23)),
            ints(rs.integers(0, cv, size=2)),
            [5],
            # ids far outside the vocabulary and negative ids: the products wrap in int64 and the
            # mix goes negative, where numpy's modulo takes the divisor's sign.
            [INT64_MAX, -1, 2**40 + 17, -(2**62), 3, 2**63 - 2, -INT64_MAX - 1, 0, 12, 2**33, -7,
             cv - 1],
        ]
        for layer_id in layers:
            mult = multipliers(cfg["engram_seed"], layer_id, n, cv)
            offsets = np.concatenate([[0], np.cumsum(sizes[layer_id][:-1])]).astype(np.int64)
            entry["layers"].append({
                "layer_id": layer_id,
                "multipliers": ints(mult),
                "head_sizes": ints(sizes[layer_id]),
                "head_offsets": ints(offsets),
                "pad_id": pad_id,
                "cases": [{"ids": s, "rows": ints(hash_rows(s, mult, sizes[layer_id], n, h,
                                                            pad_id))} for s in seqs],
            })
        configs.append(entry)
    doc["configs"] = configs

    text = json.dumps(doc, separators=(",", ":"))
    out_path.write_text(text + "\n")
    print(f"wrote {out_path} ({len(text)} bytes)")


if __name__ == "__main__":
    main()
