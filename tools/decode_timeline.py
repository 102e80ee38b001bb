#!/usr/bin/env python3
"""Per-kernel durations and the gaps before them in batch-1 decode steps, from an nsys export.

  nsys profile -t cuda --cuda-graph-trace=node -o P cuda_e2e_bench ... --prefill "" --batch 1
  nsys export --type sqlite -o P.sqlite P.nsys-rep
  python3 tools/decode_timeline.py P.sqlite

Groups the kernels of the last N steps (a step ends at the LM head's product, the largest
kernel) by name and prints count, mean duration and mean idle gap before each (GPU time between
the previous kernel's end and this one's start; negative when they overlap)."""
import sqlite3
import sys
from collections import defaultdict

db = sqlite3.connect(sys.argv[1])
steps_wanted = int(sys.argv[2]) if len(sys.argv) > 2 else 20
rows = db.execute(
    "SELECT k.start, k.end, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
    "JOIN StringIds s ON k.shortName = s.id ORDER BY k.start").fetchall()
if not rows:
    sys.exit("no kernels")
# Steps: split at kernels longer than 150 us (the LM head at batch 1).
ends = [i for i, (s, e, n) in enumerate(rows) if e - s > 150_000]
if len(ends) < steps_wanted + 2:
    steps_wanted = max(1, len(ends) - 2)
lo, hi = ends[-steps_wanted - 1] + 1, ends[-1] + 1
sel = rows[lo:hi]
stat = defaultdict(lambda: [0, 0.0, 0.0])
prev_end = rows[lo - 1][1]
busy = 0
for s, e, n in sel:
    st = stat[n[:60]]
    st[0] += 1
    st[1] += (e - s)
    st[2] += (s - prev_end)
    prev_end = max(prev_end, e)
    busy += e - s
span = sel[-1][1] - rows[lo - 1][1]
print(f"{steps_wanted} steps, {len(sel) / steps_wanted:.0f} kernels per step, "
      f"step {span / steps_wanted / 1e3:.1f} us, kernel time {busy / steps_wanted / 1e3:.1f} us")
print(f"{'kernel':60s} {'n/step':>7s} {'mean us':>8s} {'gap us':>7s} {'us/step':>8s} {'gap/step':>8s}")
for n, (c, d, g) in sorted(stat.items(), key=lambda kv: -kv[1][1]):
    print(f"{n:60s} {c / steps_wanted:7.1f} {d / c / 1e3:8.2f} {g / c / 1e3:7.2f} "
          f"{d / steps_wanted / 1e3:8.1f} {g / steps_wanted / 1e3:8.1f}")
