#!/usr/bin/env python3
"""PyTorch beside examples/gpu_sweep.rs: reads the example's output on stdin, passes it on, and
times PyTorch eager and torch.compile on the same GPU for every case the example ran (same op,
shape and dtype), printing `RESULT {json}` lines for gpu_sweep_report.py. Bytes are counted as
the example counts them (every input read once, the output written once), times with CUDA events.

    target/release/examples/gpu_sweep | python3 scripts/torch_gpu_sweep.py | python3 scripts/gpu_sweep_report.py

torch.compile specialises on every shape (dynamic=False) and may recompile as often as there are
cases, as a user compiling one model per shape would get.
"""
import json
import sys

import torch
from torch_bench import allow_recompiles, timed

allow_recompiles()
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def gelu(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


def group(rows):
    """The middle axis of `bcast_mid` over `rows` rows: the largest divisor up to 64 (as the example)."""
    return next(g for g in range(min(64, rows), 0, -1) if rows % g == 0)


OPS = {
    "softmax": (lambda x: torch.softmax(x, -1), lambda r, c: [(r, c)]),
    "layer_norm": (lambda x, w, b: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, 1e-5),
                   lambda r, c: [(r, c), (c,), (c,)]),
    "sum": (lambda x: x.sum(-1, keepdim=True), lambda r, c: [(r, c)]),
    "max": (lambda x: x.amax(-1, keepdim=True), lambda r, c: [(r, c)]),
    "bcast_last": (lambda x, s, b: gelu(x * s + b), lambda r, c: [(r, c), (c,), (c,)]),
    "bcast_first": (lambda x, s, b: gelu(x * s + b), lambda r, c: [(r, c), (r, 1), (r, 1)]),
    "bcast_mid": (lambda x, s, b: gelu(x * s + b),
                  lambda r, c: [(r // group(r), group(r), c), (r // group(r), 1, c), (r // group(r), 1, c)]),
}


ours = []
for line in sys.stdin:
    sys.stdout.write(line)
    if line.startswith("RESULT "):
        result = json.loads(line[len("RESULT "):])
        # Each case once (with --variants the example times its kernel variants too).
        if result["impl"] == "boundscope":
            ours.append(result)
sys.stdout.flush()

compiled = {op: torch.compile(fn, dynamic=False) for op, (fn, _) in OPS.items()}
for case in ours:
    op, rows, cols, dtype = case["op"], case["rows"], case["cols"], case["dtype"]
    fn, shapes = OPS[op]
    args = [torch.rand(*s, device="cuda", dtype=DTYPES[dtype]) * 2 - 1 for s in shapes(rows, cols)]
    out = fn(*args)
    nbytes = sum(a.numel() * a.element_size() for a in args + [out])
    reps = int(min(max(9e10 / nbytes, 20), 1000))
    for impl, f in [("torch_eager", fn), ("torch_compile", compiled[op])]:
        ms = timed(f, args, reps)
        print("RESULT " + json.dumps({"impl": impl, "op": op, "rows": rows, "cols": cols, "dtype": dtype, "ms": ms,
                                      "gbps": nbytes / (ms * 1e-3) / 1e9}), flush=True)
    del args, out
