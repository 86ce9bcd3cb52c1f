#!/usr/bin/env python3
"""Reads the RESULT lines of examples/transformer_ops_bench.rs (or examples/cpu_bench.rs) and
scripts/torch_transformer_ops.py (or scripts/torch_cpu.py) from runs on one machine on stdin and
prints a Markdown table: ms per run, the figure each workload is judged by (TFLOP/s for products
and attention, GB/s of useful bytes for copies), and boundscope's ratio to the better of PyTorch
eager and torch.compile.

Several rounds may be piped in one after the other (ours, PyTorch, ours, PyTorch, ...), as shared
machines are noisy: each column is then the median over the rounds, and the ratio is the median
of the rounds' ratios with their range.
"""
import json
import statistics
import sys

rows = {}
for line in sys.stdin:
    if line.startswith("RESULT "):
        r = json.loads(line[len("RESULT "):])
        rows.setdefault((r["op"], r["dtype"]), {}).setdefault(r["impl"], []).append(r)


def median(runs):
    """The run with the median time (the lower middle one for an even count)."""
    return sorted(runs, key=lambda r: r["ms"])[(len(runs) - 1) // 2]


rounds = max((len(runs) for impls in rows.values() for runs in impls.values()), default=0)
print("| op | dtype | boundscope ms | torch eager ms | torch.compile ms | boundscope | best torch | ratio |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for (op, dtype), impls in rows.items():
    if "boundscope" not in impls:
        continue
    ours_runs = impls["boundscope"]
    torch_names = [k for k in ("torch_eager", "torch_compile") if k in impls]
    ours = median(ours_runs)
    best = min((median(impls[k]) for k in torch_names), key=lambda r: r["ms"]) if torch_names else None
    unit = "tflops" if ours["tflops"] > 0 else "gbps"
    fmt = lambda r: f'{r[unit]:.1f} {"TFLOP/s" if unit == "tflops" else "GB/s"}' if r else "-"
    cell = lambda k: f'{median(impls[k])["ms"]:.3f}' if k in impls else "-"
    if not torch_names:
        ratio = "-"
    else:
        # Round i's ratio: the better PyTorch of round i against ours of round i.
        per_round = []
        for i, r in enumerate(ours_runs):
            theirs = [impls[k][i]["ms"] for k in torch_names if i < len(impls[k])]
            if theirs:
                per_round.append(min(theirs) / r["ms"])
        ratio = f"{statistics.median(per_round):.2f}x"
        if len(per_round) > 1:
            ratio += f" ({min(per_round):.2f}-{max(per_round):.2f})"
    print(f'| {op} | {dtype} | {ours["ms"]:.3f} | {cell("torch_eager")} | {cell("torch_compile")} | {fmt(ours)} | {fmt(best)} | {ratio} |')
if rounds > 1:
    print(f"\n{rounds} rounds: medians, and the ratio's median (range) over the rounds.")
