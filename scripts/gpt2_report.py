#!/usr/bin/env python3
"""Side by side: `examples/gpt2.rs --bench` and `scripts/torch_gpt2.py` on the same batch, one
table with the ratios (ours over theirs as speed: > 1 means boundscope is faster; memory as
theirs over ours: > 1 means boundscope holds less).

    (gpt2 --config 124m --batch 8 --tokens 1024 --device cuda --dtype bf16 --bench; \\
     python3 scripts/torch_gpt2.py --dtype bf16) | python3 scripts/gpt2_report.py
"""
import re
import sys

ours = {}
theirs = {}
dtype = None
for line in sys.stdin:
    m = re.match(r"GPT-2: .* (F32|BF16) on", line)
    if m:
        dtype = m.group(1).lower()
    m = re.match(r"bench: forward ([\d.]+) ms .* training step ([\d.]+) ms .* training step ([\d.]+) MiB", line)
    if m and dtype:
        ours[dtype] = {"forward": float(m.group(1)), "step": float(m.group(2)), "memory": float(m.group(3))}
    m = re.match(r"bench: training step with a range on every op and module: ([\d.]+) ms \(([+-][\d.]+)%", line)
    if m and dtype in ours:
        ours[dtype]["profiled"] = m.group(2)
    m = re.match(r"torch (eager|compile) (f32|bf16): forward ([\d.]+) ms .* training step ([\d.]+) ms .* "
                 r"peak memory in a step ([\d.]+) MiB", line)
    if m:
        theirs[(m.group(2), m.group(1))] = {"forward": float(m.group(3)), "step": float(m.group(4)),
                                            "memory": float(m.group(5))}

if not ours:
    sys.exit("no `bench:` lines from examples/gpt2.rs --bench on stdin")
print("| dtype | figure | boundscope | torch eager | torch.compile | vs eager | vs compile |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for dt, o in ours.items():
    e, c = theirs.get((dt, "eager")), theirs.get((dt, "compile"))
    for key, unit, faster in [("forward", "ms", True), ("step", "ms", True), ("memory", "MiB", False)]:
        cells = []
        for t in (e, c):
            if t is None:
                cells.append("-")
            elif faster:
                cells.append(f"{t[key] / o[key]:.2f}x")
            else:
                cells.append(f"{t[key] / o[key]:.2f}x less" if t[key] >= o[key] else f"{o[key] / t[key]:.2f}x more")
        fmt = lambda t: "-" if t is None else f"{t[key]:.1f} {unit}"
        name = {"forward": "forward", "step": "training step", "memory": "device memory of a step"}[key]
        print(f"| {dt} | {name} | {o[key]:.1f} {unit} | {fmt(e)} | {fmt(c)} | {cells[0]} | {cells[1]} |")
    if "profiled" in o:
        print(f"| {dt} | a range on every op and module | {o['profiled']}% over profiling off | | | | |")
