#!/usr/bin/env python3
"""CPU benchmark on the embedded demo model: atom's CPU backend, and PyTorch eager as the peer
when torch is importable (it is on the GPU machine, not on the 2-core CI machine).

  python3 bench/cpu_demo_bench.py --atom build/atom [--model models/kjv-tiny] [--threads 2]
                                  [--out results.json]

Both run pinned to the first --threads CPUs this process may use, with that many threads, on
random prompts of --prompt-len tokens at batch 1 and 8:
  prompt tok/s = batch * prompt_len / (time to generate 1 token)
  decode tok/s = batch * (decode_len - 1) / (time for decode_len tokens - time for 1 token)
atom through `atom bench latency` (prefix caching off, so every iteration prefills); PyTorch
through `model.generate` (greedy, KV cache, min_new_tokens so EOS cannot end it early). The
hardware limit on a CPU is its fp32 FMA rate at its widest vector width, measured first on the
same threads (build/bench/cpu_fma_peak); each figure prints the fraction of it that it reaches
(FLOPs counted as 2 per weight per token, plus attention; a prefill's LM head for its last token).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def pin(threads):
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    os.sched_setaffinity(0, cpus)
    for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[v] = str(threads)
    return cpus


def model_flops(cfg, context, lm_head=True):
    """FLOPs of one token's forward: the layers' matmuls, attention over `context` earlier tokens,
    and the LM head (a prefill computes it for the last token only)."""
    H, I, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or H // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    per_layer = H * q + 2 * H * kv + q * H + 3 * H * I
    return 2 * (L * per_layer + (V * H if lm_head else 0)) + 4 * L * q * context


def fma_peak(binary, threads):
    """The measured fp32 FMA rate of `threads` threads (bench/cpu_fma_peak.cpp) and its ISA."""
    out = subprocess.run([binary, "--threads", str(threads)], check=True, capture_output=True,
                         text=True).stdout.split()
    return float(out[0]) * 1e9, out[1]


def atom_latency(args, batch, out_len, iters):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [args.atom, "bench", "latency", "--model", args.model, "--device", "cpu",
               "--input-len", str(args.prompt_len), "--output-len", str(out_len),
               "--batch-size", str(batch), "--num-iters", str(iters), "--num-iters-warmup", "1",
               "--no-enable-prefix-caching", "--output-json", f.name]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return statistics.median(json.load(open(f.name))["latencies"])


def torch_latency(torch, model, batch, prompt_len, out_len, iters, vocab):
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(3, vocab, (batch, prompt_len), generator=g)
    mask = torch.ones_like(ids)
    times = []
    with torch.inference_mode():
        for i in range(iters + 1):
            t = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=out_len,
                           min_new_tokens=out_len, do_sample=False, pad_token_id=0)
            if i:  # the first is a warm-up
                times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--atom", required=True)
    ap.add_argument("--model", default=os.path.join(os.path.dirname(__file__), "..", "models", "kjv-tiny"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-len", type=int, default=65)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--peak", help="bench/cpu_fma_peak (default: beside --atom in bench/)")
    ap.add_argument("--out")
    args = ap.parse_args()
    cpus = pin(args.threads)
    try:
        if args.no_torch:
            raise ImportError
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    cfg = json.load(open(os.path.join(args.model, "config.json")))
    peak_bin = args.peak or os.path.join(os.path.dirname(os.path.abspath(args.atom)), "bench", "cpu_fma_peak")
    peak, isa = fma_peak(peak_bin, args.threads)
    peak_what = f"fp32 FMA ({isa})"
    P, D = args.prompt_len, args.decode_len - 1
    print(f"CPUs {cpus} ({args.threads} threads); measured {peak_what}: {peak / 1e9:.1f} GFLOP/s")
    prefill_flops = sum(model_flops(cfg, c, lm_head=c == P - 1) for c in range(P))  # a sequence
    decode_flops = sum(model_flops(cfg, P + c) for c in range(D))

    runners = {"atom": lambda b, n: atom_latency(args, b, n, args.iters)}
    if torch is not None:
        import transformers
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
        runners[f"pytorch {torch.__version__} eager"] = lambda b, n: torch_latency(
            torch, model, b, P, n, args.iters, cfg["vocab_size"])
    rows = []
    for name, run in runners.items():
        for b in (1, 8):
            t1 = run(b, 1)
            tn = run(b, args.decode_len)
            row = dict(engine=name, batch=b, prompt_len=P, decode_tokens=D,
                       prompt_tok_s=b * P / t1, decode_tok_s=b * D / (tn - t1),
                       prompt_frac=b * prefill_flops / t1 / peak,
                       decode_frac=b * decode_flops / (tn - t1) / peak)
            rows.append(row)
            print(f"{name:28s} batch {b}: prompt {row['prompt_tok_s']:9.0f} tok/s "
                  f"({100 * row['prompt_frac']:5.1f}% of the FMA rate)   decode "
                  f"{row['decode_tok_s']:8.0f} tok/s ({100 * row['decode_frac']:5.1f}%)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(cpus=cpus, threads=args.threads, peak_flops=peak,
                           peak_what=peak_what, rows=rows), f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
