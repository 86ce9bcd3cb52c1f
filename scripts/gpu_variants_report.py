#!/usr/bin/env python3
"""Reads the RESULT lines of `examples/gpu_sweep.rs --variants` on stdin and prints, for each
variant of the generated kernels flipped from the defaults (`boundscope+<variant>` turned on,
`boundscope-<variant>` off, `boundscope-all` every variant off), what the variant is worth, case
by case: the time without it over the time with it (above 1.0: faster with the variant). For a
`+` column that is the defaults' time over the variant's; for a `-` column, the time of the
kernels without the variant over the defaults' (`-all`: the kernels without any variant over
the defaults). Then the minimum, median and maximum over the cases, and the cases where the
variant makes them faster or slower by more than the control's spread (below; 2% at least). Both were timed in the same run, interleaved,
the best of three rounds. The `=defaults` column is the defaults timed again as a plan of their
own (the same kernels, other memory): how far it strays from 1.00x is the noise under the other
columns, and the report says how far, last. Where a case was timed several times (`scripts/gpu-variants ab`: two
builds in turn, `boundscope-change` being the build before a change), each side's best counts;
the report then names its columns for the change: GB/s with it, and its worth (with / without).

    target/release/examples/gpu_sweep --variants | python3 scripts/gpu_variants_report.py
"""
import json
import statistics
import sys

cases = {}
for line in sys.stdin:
    if line.startswith("RESULT "):
        r = json.loads(line[len("RESULT "):])
        if r["impl"].startswith("boundscope"):
            impls = cases.setdefault((r["op"], r["rows"], r["cols"], r["dtype"]), {})
            if r["impl"] not in impls or r["ms"] < impls[r["impl"]]["ms"]:
                impls[r["impl"]] = r

variants = sorted({impl for impls in cases.values() for impl in impls if impl != "boundscope"})
if not variants:
    sys.exit("no variant results: run gpu_sweep with --variants")
names = [v[len("boundscope"):] for v in variants]
# `scripts/gpu-variants ab`: the base build's lines are the only other side. Its GB/s columns are
# then this build's (the change's), its ratio the change's worth.
ab = names == ["-change"]
if ab:
    names = ["change"]
print("| op | shape | dtype | "
      + ("GB/s with the change | % of copy | " if ab else "default GB/s | % of copy | ")
      + " | ".join(n + (" (a second plan)" if n.startswith("=") else " (with / without)") for n in names) + " |")
print("| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in names) + " |")
ratios = {v: [] for v in variants}
for (op, rows, cols, dtype), impls in cases.items():
    base = impls.get("boundscope")
    if base is None:
        continue
    row = []
    for v in variants:
        r = impls.get(v)
        if r is None:
            row.append("-")
            continue
        # With the variant over without it, whichever side the defaults are on (the control
        # `=defaults`: the first plan's time over the second's).
        ratio = r["ms"] / base["ms"] if v.startswith("boundscope-") else base["ms"] / r["ms"]
        ratios[v].append((ratio, f"{op} {rows}x{cols} {dtype}"))
        row.append(f"{ratio:.2f}x")
    share = 100 * base["gbps"] / base["copy_gbps"]
    print(f"| {op} | {rows}x{cols} | {dtype} | {base['gbps']:.0f} | {share:.0f}% | " + " | ".join(row) + " |")
print()
# The control's spread, where there is one, is the threshold of the lists below (2% at least).
control = next((v for v, n in zip(variants, names) if n == "=defaults"), None)
spread = max((abs(x - 1) for x, _ in ratios[control]), default=0.0) if control else 0.0
threshold = max(0.02, spread)
for v, name in zip(variants, names):
    values = ratios[v]
    if not values or name.startswith("="):
        continue
    only = [x for x, _ in values]
    what = "the change" if ab else "the variant"
    print(f"- {name}: minimum {min(only):.2f}x, median {statistics.median(only):.2f}x, "
          f"maximum {max(only):.2f}x with {what} over without it, over {len(only)} cases")
    faster = sorted((x for x in values if x[0] > 1 + threshold), reverse=True)
    slower = sorted(x for x in values if x[0] < 1 - threshold)
    by = f"by over {100 * threshold:.0f}%"
    if faster:
        print(f"  - {len(faster)} faster with it {by}: " + ", ".join(f"{c} {x:.2f}x" for x, c in faster))
    if slower:
        print(f"  - {len(slower)} slower with it {by}: " + ", ".join(f"{c} {x:.2f}x" for x, c in slower))
if control and ratios[control]:
    values = sorted(ratios[control])
    furthest = values[0] if 1 - values[0][0] > values[-1][0] - 1 else values[-1]
    print(f"- =defaults (the defaults as a second plan, the noise floor): minimum {values[0][0]:.2f}x, "
          f"median {statistics.median(x for x, _ in values):.2f}x, maximum {values[-1][0]:.2f}x over "
          f"{len(values)} cases; differences within {100 * spread:.0f}% are within the noise "
          f"(furthest: {furthest[1]}), and the lists above leave them out")
