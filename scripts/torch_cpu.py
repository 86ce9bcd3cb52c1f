#!/usr/bin/env python3
"""PyTorch eager on the CPU, every core, for examples/cpu_bench.rs: the same workloads and
shapes, timed the same way (wall clock over many runs after three warm-ups), and the elementwise
chain under torch.compile too (Inductor's C++ backend; it compiles once, before the timing).
Prints `RESULT {json}` lines for transformer_ops_report.py.
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

# Every core this process may run on (as the CPU executors count them: the affinity mask).
torch.set_num_threads(len(os.sched_getaffinity(0)))


def product(m, k, n):
    return 2.0 * m * k * n


def mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)


def block(x, w1, b1, w2, b2, g, b):
    y = mlp(x, w1, b1, w2, b2) + x
    return torch.softmax(F.layer_norm(y, (y.shape[-1],), g, b, 1e-5), -1)


WORKLOADS = [
    ("matmul_1024", [(1024, 1024), (1024, 1024)], torch.matmul, product(1024, 1024, 1024)),
    ("matmul_64x256x256", [(64, 256), (256, 256)], torch.matmul, product(64, 256, 256)),
    ("matmul_512x768x3072", [(512, 768), (768, 3072)], torch.matmul, product(512, 768, 3072)),
    ("quickstart_block", [(64, 256), (256, 256), (256,), (256, 256), (256,), (256,), (256,)], block,
     2 * product(64, 256, 256)),
    ("gpt2_mlp_512", [(512, 768), (3072, 768), (3072,), (768, 3072), (768,)], mlp, 2 * product(512, 768, 3072)),
]

def swish(a, b):
    x = a * b + 1.0
    return x * torch.sigmoid(x)


CHAIN = 1 << 24
# (name, shapes, function, useful bytes): judged by GB/s, eager and compiled.
CHAINS = [("swish_chain_2^24", [(CHAIN,), (CHAIN,)], swish, 3 * 4 * CHAIN)]

ROWS = 512
for cols in (768, 1024, 2048, 4096):
    WORKLOADS.append((f"softmax_{cols}", [(ROWS, cols)], lambda x: torch.softmax(x, -1), ROWS * cols))
    WORKLOADS.append((f"layer_norm_{cols}", [(ROWS, cols), (cols,), (cols,)],
                      lambda x, g, b: F.layer_norm(x, (x.shape[-1],), g, b, 1e-5), ROWS * cols))

def timed(fn, args, reps):
    for _ in range(3):
        fn(*args)
    start = time.perf_counter()
    for _ in range(reps):
        fn(*args)
    return (time.perf_counter() - start) * 1e3 / reps


def result(impl, name, ms, gbps=0.0, tflops=0.0):
    print("RESULT " + json.dumps({"impl": impl, "op": name, "dtype": "f32", "ms": ms, "gbps": gbps, "tflops": tflops}),
          flush=True)


with torch.inference_mode():
    for name, shapes, fn, flops in WORKLOADS:
        args = [torch.rand(*s) * 0.2 - 0.1 for s in shapes]
        ms = timed(fn, args, max(5, min(2000, int(2e9 / flops))))
        result("torch_eager", name, ms, tflops=flops / (ms * 1e-3) / 1e12)
    for name, shapes, fn, nbytes in CHAINS:
        args = [torch.rand(*s) * 2 - 1 for s in shapes]
        for impl, f in (("torch_eager", fn), ("torch_compile", torch.compile(fn))):
            try:
                ms = timed(f, args, 20)
            except Exception as e:  # torch.compile needs a C++ compiler; say so and go on
                print(f"{impl} {name}: not run ({type(e).__name__}: {str(e)[:200]})", file=sys.stderr)
                continue
            result(impl, name, ms, gbps=nbytes / (ms * 1e-3) / 1e9)
