#!/usr/bin/env python3
"""PyTorch bf16 baselines for examples/cuda_bf16_bench.rs, on the same GPU: the swish and norm
chains (eager and torch.compile), torch.matmul 8192^3, and the transformer MLP block (eager and
torch.compile), all in bf16, timed as the benchmark times plans. Prints `RESULT {json}` lines
for scripts/gpu_report_bf16.py.
"""
import json
import time

import torch
import torch.nn.functional as F

# The same chains as the f32 baseline (this script's directory is on the module path).
from torch_baseline import COLS, norm, swish

BF16 = torch.bfloat16


def inputs(chain, n):
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: (torch.rand(*s, device="cuda", generator=g) * 2 - 1).to(BF16)
    if chain == "swish":
        return [r(n), r(n)]
    rows = n // COLS
    return [r(rows, COLS), r(rows, 1), r(rows, 1), r(COLS), r(COLS)]


def per_run_ms(fn, args, reps):
    fn(*args)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / reps


def main():
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    for n in (1 << 24, 1 << 28):
        reps = 20 if n > 1 << 24 else 100
        for chain, fn in (("swish", swish), ("norm", norm)):
            args = inputs(chain, n)
            useful = sum(a.numel() for a in args) * 2 + n * 2
            compiled = torch.compile(fn)
            for impl, f in (("torch_eager_bf16", fn), ("torch_compile_bf16", compiled)):
                ms = per_run_ms(f, args, reps)
                print("RESULT " + json.dumps({"impl": impl, "chain": chain, "n": n, "ms": ms, "gbps": useful / (ms * 1e-3) / 1e9}), flush=True)
    a = torch.randn(8192, 8192, device="cuda", dtype=BF16)
    b = torch.randn(8192, 8192, device="cuda", dtype=BF16)
    ms = per_run_ms(torch.matmul, [a, b], 20)
    print("RESULT " + json.dumps({"impl": "torch_matmul_bf16", "ms": ms, "tflops": 2 * 8192**3 / (ms * 1e-3) / 1e12}), flush=True)
    g = torch.Generator(device="cuda").manual_seed(2)
    r = lambda *s: ((torch.rand(*s, device="cuda", generator=g) * 2 - 1) * 0.02).to(BF16)
    x, w1, b1, w2, b2, gamma, beta = r(8192, 4096), r(16384, 4096), r(16384), r(4096, 16384), r(4096), r(4096), r(4096)

    def block(x):
        h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
        return F.layer_norm(F.linear(h, w2, b2) + x, (4096,), gamma, beta, 1e-5)

    compiled = torch.compile(block)
    for impl, f in (("torch_transformer_eager_bf16", block), ("torch_transformer_compile_bf16", compiled)):
        for _ in range(2):
            f(x)
        ms = per_run_ms(f, [x], 10)
        print("RESULT " + json.dumps({"impl": impl, "ms": ms}), flush=True)


if __name__ == "__main__":
    main()
