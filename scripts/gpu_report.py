#!/usr/bin/env python3
"""Reads the RESULT lines of examples/cuda_bench.rs and scripts/torch_baseline.py (stdin) and
prints two tables: GB/s of useful bytes per implementation for the chains, each ratio to
torch.compile, the device-to-device copy bandwidth measured in the same run and the host time
to queue a run; and, for the quickstart block, time per run and host time per run."""
import json
import sys

rows = {}
blocks = {}
copy = {}
host = {}
for line in sys.stdin:
    if not line.startswith("RESULT "):
        print(line, end="")
        continue
    r = json.loads(line[len("RESULT "):])
    if "chain" not in r:
        blocks[r["impl"]] = r
        continue
    key = (r["chain"], r["n"])
    rows.setdefault(key, {})[r["impl"]] = r["gbps"]
    if "copy_gbps" in r:
        copy[key] = r["copy_gbps"]
        host[key] = r["host_us"]

impls = ["boundscope_fused", "boundscope_unfused", "torch_eager", "torch_compile"]
print("| chain | n | " + " | ".join(f"{i} GB/s (x compile)" for i in impls) + " | copy GB/s | fused % of copy | host us/launch |")
print("|" + " --- |" * (len(impls) + 5))
for (chain, n), r in sorted(rows.items()):
    base = r.get("torch_compile")
    cells = []
    for i in impls:
        g = r.get(i)
        cells.append("-" if g is None else f"{g:.0f} ({g / base:.2f}x)" if base else f"{g:.0f}")
    c = copy.get((chain, n))
    fused = r.get("boundscope_fused")
    share = f"{100 * fused / c:.0f}%" if c and fused else "-"
    print(f"| {chain} | 2^{n.bit_length() - 1} | " + " | ".join(cells) + f" | {c:.0f} | {share} | {host.get((chain, n), float('nan')):.2f} |")

if blocks:
    print()
    print("| the quickstart block ([64, 256], hidden 256) | us per run | host us to queue one |")
    print("| --- | --- | --- |")
    for impl, r in blocks.items():
        print(f"| {impl} | {r['us']:.1f} | {r['host_us']:.1f} |")
