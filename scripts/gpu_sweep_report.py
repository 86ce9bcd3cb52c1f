#!/usr/bin/env python3
"""Reads the RESULT lines of examples/gpu_sweep.rs and scripts/torch_gpu_sweep.py on stdin and
prints one Markdown table: each case's GB/s of useful bytes, the ratio of our speed to PyTorch
eager's, to torch.compile's and to the faster of the two (goal >= 1.0), and to a copy of the same
bytes (goal >= 85% where the case is memory-bound); then the minimum and median of each ratio
over the cases, and the cases that miss a goal: below the faster PyTorch, and below 85% of the
copy (slowest first).
"""
import json
import statistics
import sys

cases = {}
for line in sys.stdin:
    if line.startswith("RESULT "):
        r = json.loads(line[len("RESULT "):])
        cases.setdefault((r["op"], r["rows"], r["cols"], r["dtype"]), {})[r["impl"]] = r

columns = {"eager": [], "compile": [], "best": [], "copy": []}
misses = []
# (share of the copy, case) for the cases under the 85% goal.
under_copy = []
print("| op | shape | dtype | boundscope GB/s | eager GB/s | compile GB/s | copy GB/s | / eager | / compile | / best | / copy |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for (op, rows, cols, dtype), impls in cases.items():
    ours = impls.get("boundscope")
    if ours is None:
        continue
    eager, compiled = impls.get("torch_eager"), impls.get("torch_compile")
    ratio = lambda r: r and r["ms"] / ours["ms"]
    best = min((r for r in (eager, compiled) if r), key=lambda r: r["ms"], default=None)
    row = {"eager": ratio(eager), "compile": ratio(compiled), "best": ratio(best),
           "copy": ours["gbps"] / ours["copy_gbps"]}
    for k, v in row.items():
        if v is not None:
            columns[k].append(v)
    if (row["best"] or 1.0) < 1.0:
        misses.append(f"{op} {rows}x{cols} {dtype}: {row['best']:.2f}x the faster PyTorch")
    if row["copy"] < 0.85:
        under_copy.append((row["copy"], f"{op} {rows}x{cols} {dtype}"))
    gb = lambda r: f'{r["gbps"]:.0f}' if r else "-"
    x = lambda v: f"{v:.2f}x" if v is not None else "-"
    print(f'| {op} | {rows}x{cols} | {dtype} | {gb(ours)} | {gb(eager)} | {gb(compiled)} | {ours["copy_gbps"]:.0f} '
          f'| {x(row["eager"])} | {x(row["compile"])} | {x(row["best"])} | {100 * row["copy"]:.0f}% |')
print()
for k, v in columns.items():
    if v:
        fmt = (lambda y: f"{100 * y:.0f}%") if k == "copy" else (lambda y: f"{y:.2f}x")
        print(f"- against {k}: minimum {fmt(min(v))}, median {fmt(statistics.median(v))} over {len(v)} cases")
if misses:
    print(f"\n{len(misses)} cases below the faster PyTorch:")
    for m in misses:
        print(f"- {m}")
if under_copy:
    print(f"\n{len(under_copy)} cases below 85% of the copy:")
    for share, case in sorted(under_copy):
        print(f"- {case}: {100 * share:.0f}%")
