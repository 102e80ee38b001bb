#!/usr/bin/env python3
"""The throughput cost of structured output (the Python twin of structured_output_bench.mjs, for
machines without node): `atom serve` on a model folder decodes the same requests with and without
a grammar at concurrency 1 and 64 and prints output tokens per second and their ratio (the fraction
of unconstrained decode speed constrained decoding keeps; 1.0 is free). Unconstrained runs ignore
EOS so every request decodes max_tokens; the grammar runs are a JSON schema with free strings and
json_object.
  python3 bench/structured_output_bench.py --model DIR [--device cuda] [--tokens N] [--load-format dummy]
ATOM_BIN (default build/atom) names the binary."""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = {"type": "object", "properties": {"book": {"type": "string"}, "chapter": {"type": "integer"},
                                           "verse": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["book", "chapter", "verse"]}


def start_server(args):
    cmd = [os.environ.get("ATOM_BIN", os.path.join(ROOT, "build/atom")), "serve", args.model, "--device", args.device,
           "--host", "127.0.0.1", "--port", "0", "--served-model-name", "m", "--max-num-seqs", "64",
           "--max-model-len", str(args.max_model_len), "--load-format", args.load_format]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = []
    port = [None]
    ready = threading.Event()

    def reader():
        for line in p.stderr:
            log.append(line)
            m = re.search(r"serving .* at http://127\.0\.0\.1:(\d+)", line)
            if m:
                port[0] = int(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=reader, daemon=True).start()
    ready.wait(600)
    if port[0] is None:
        p.kill()
        sys.exit("server did not start:\n" + "".join(log))
    return p, port[0]


def one(port, seed, max_tokens, extra):
    body = {"model": "m", "prompt": "And God said, ", "max_tokens": max_tokens, "temperature": 1.0, "seed": seed, **extra}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        j = json.load(r)
    return j["usage"]["completion_tokens"]


def run(port, conc, max_tokens, extra):
    with concurrent.futures.ThreadPoolExecutor(conc) as ex:
        list(ex.map(lambda i: one(port, 1000 + i, max_tokens, extra), range(min(conc, 4))))  # warm-up
        t0 = time.perf_counter()
        counts = list(ex.map(lambda i: one(port, i, max_tokens, extra), range(conc)))
        s = time.perf_counter() - t0
    return sum(counts), s, sum(counts) / s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models/kjv-tiny"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--max-model-len", type=int, default=512)
    args = ap.parse_args()
    p, port = start_server(args)
    try:
        print(f"model {args.model}, device {args.device}, max_tokens {args.tokens}", flush=True)
        for conc in (1, 64):
            ft, fs, ftps = run(port, conc, args.tokens, {"ignore_eos": True})
            for name, extra in (("json_schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": SCHEMA}}}),
                                ("json_object", {"response_format": {"type": "json_object"}})):
                ct, cs, ctps = run(port, conc, args.tokens, extra)
                print(f"concurrency {conc}: unconstrained {ftps:.1f} tok/s ({ft} tokens); {name} {ctps:.1f} tok/s "
                      f"({ct} tokens): ratio {ctps / ftps:.3f}", flush=True)
    finally:
        p.kill()


if __name__ == "__main__":
    main()
