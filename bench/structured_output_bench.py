#!/usr/bin/env python3
"""The throughput cost of structured output (the Python twin of structured_output_bench.mjs, for
machines without node): `atom serve` on a model folder decodes requests with a grammar (a JSON
schema with free strings, and json_object) at concurrency 1 and 64, twice with different seeds:
the first pass meets a grammar the server has not seen (its mask caches cold), the second one it
has (the steady state of a server whose clients send the same schema). After each pass, the same
requests without a grammar, each decoding exactly as many tokens as its constrained twin
(ignore_eos, max_tokens = that count), so both sides decode the same lengths at the same batch
sizes. Prints output tokens per second and the fraction of the unconstrained speed kept
(1.0 is free).
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


def run(port, seeds, max_tokens, extra):
    """Requests for `seeds` at once (max_tokens: one count, or one per seed); their token counts,
    the seconds they took and tokens per second."""
    lengths = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(seeds)
    with concurrent.futures.ThreadPoolExecutor(len(seeds)) as ex:
        t0 = time.perf_counter()
        counts = list(ex.map(lambda a: one(port, a[0], a[1], extra), zip(seeds, lengths)))
        s = time.perf_counter() - t0
    return counts, s, sum(counts) / s


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
        run(port, [9999], 16, {"ignore_eos": True})  # warm-up: graphs, allocator
        for conc in (1, 64):
            for gi, (name, extra) in enumerate((
                    ("json_schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": SCHEMA}}}),
                    ("json_object", {"response_format": {"type": "json_object"}}))):
                base = 100000 * (gi + 1) + 1000 * conc
                line = f"concurrency {conc}, {name}:"
                for label, first in (("first pass", base), ("second pass", base + conc)):
                    seeds = list(range(first, first + conc))
                    counts, _, constrained = run(port, seeds, args.tokens, extra)
                    _, _, free = run(port, seeds, counts, {"ignore_eos": True})
                    line += (f" {label}: {sum(counts)} tokens (mean {sum(counts) / conc:.1f} a request), constrained "
                             f"{constrained:.1f} tok/s, unconstrained {free:.1f} tok/s, ratio {constrained / free:.3f};")
                print(line, flush=True)
    finally:
        p.kill()


if __name__ == "__main__":
    main()
