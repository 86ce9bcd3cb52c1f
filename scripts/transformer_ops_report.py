#!/usr/bin/env python3
"""Reads the RESULT lines of examples/transformer_ops_bench.rs and scripts/torch_transformer_ops.py
(from one run on one machine) on stdin and prints a Markdown table: ms per run, the figure each
workload is judged by (TFLOP/s for products and attention, GB/s of useful bytes for copies), and
boundscope's ratio to the better of PyTorch eager and torch.compile.
"""
import json
import sys

rows = {}
for line in sys.stdin:
    if line.startswith("RESULT "):
        r = json.loads(line[len("RESULT "):])
        rows.setdefault((r["op"], r["dtype"]), {})[r["impl"]] = r

print("| op | dtype | boundscope ms | torch eager ms | torch.compile ms | boundscope | best torch | ratio |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for (op, dtype), impls in rows.items():
    ours = impls.get("boundscope")
    if not ours:
        continue
    torch = [impls[k] for k in ("torch_eager", "torch_compile") if k in impls]
    best = min(torch, key=lambda r: r["ms"]) if torch else None
    unit = "tflops" if ours["tflops"] > 0 else "gbps"
    fmt = lambda r: f'{r[unit]:.1f} {"TFLOP/s" if unit == "tflops" else "GB/s"}' if r else "-"
    cell = lambda k: f'{impls[k]["ms"]:.3f}' if k in impls else "-"
    ratio = f'{best["ms"] / ours["ms"]:.2f}x' if best else "-"
    print(f'| {op} | {dtype} | {ours["ms"]:.3f} | {cell("torch_eager")} | {cell("torch_compile")} | {fmt(ours)} | {fmt(best)} | {ratio} |')
