#!/usr/bin/env python3
"""The peer baseline for cuda_e2e_bench: Hugging Face transformers, eager generate, on the same
model shape with random BF16 weights (AutoModelForCausalLM.from_config), on the GPU machine.

  python3 bench/hf_baseline.py bench/models/llama-3.1-8b [--batch 1,32,128] [--prompt 128]
          [--new 64] [--prefill 2048,8192]

Decode: tokens/s = batch * new / time of generate() (prompt prefill included, as transformers
users see it). Prefill: one forward over the prompt, last-position logits only (logits_to_keep=1,
as atom computes them), tokens/s = prompt / time.
"""
import argparse
import json
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", default="1,32,128")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prefill", default="2048,8192")
    # Mixtures of experts: transformers' expert kernels ("eager" loops over experts, "grouped_mm"
    # calls torch's grouped GEMM); empty keeps transformers' default.
    ap.add_argument("--experts-implementation", default="")
    args = ap.parse_args()
    cfg = AutoConfig.from_pretrained(args.model)
    torch.manual_seed(0)
    t0 = time.time()
    kw = {}
    if args.experts_implementation:
        kw["experts_implementation"] = args.experts_implementation
    with torch.device("cuda"):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, **kw)
        except ValueError:  # a vision-language wrapper (GLM-5.3): its own auto class
            from transformers import AutoModelForImageTextToText
            model = AutoModelForImageTextToText.from_config(cfg, dtype=torch.bfloat16, **kw)
    model.eval()
    torch.cuda.synchronize()
    experts = getattr(model.config, "_experts_implementation", None)
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}; model built in {time.time() - t0:.1f} s; "
          f"experts implementation {experts}", flush=True)
    vocab = cfg.get_text_config().vocab_size
    results = {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for n in [int(x) for x in args.prefill.split(",") if x]:
            ids = torch.randint(0, vocab, (1, n), device="cuda", generator=gen)
            times = []
            for _ in range(4):
                torch.cuda.synchronize()
                a = time.time()
                model(ids, use_cache=False, logits_to_keep=1)
                torch.cuda.synchronize()
                times.append(time.time() - a)
            t = sorted(times[1:])[1]
            results[f"prefill_{n}"] = n / t
            print(f"hf prefill {n:6d} tokens: {t * 1e3:8.2f} ms  {n / t:10.0f} tok/s", flush=True)
        for b in [int(x) for x in args.batch.split(",") if x]:
            ids = torch.randint(0, vocab, (b, args.prompt), device="cuda", generator=gen)
            kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
            model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
            torch.cuda.synchronize()
            a = time.time()
            out = model.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new, **kw)
            torch.cuda.synchronize()
            t = time.time() - a
            new = out.shape[1] - args.prompt
            results[f"decode_b{b}"] = b * new / t
            print(f"hf generate batch {b:4d}: {args.prompt} prompt + {new} new: {t:7.2f} s  "
                  f"{b * new / t:10.1f} tok/s", flush=True)
    print("HF_RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main()
