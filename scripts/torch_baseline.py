#!/usr/bin/env python3
"""PyTorch baselines for examples/cuda_bench.rs, on the same GPU: eager and torch.compile, for
the same chains and sizes, timed with CUDA events, useful bytes counted the same way (every
input read once, the output written once). Prints `RESULT {json}` lines for gpu_report.py.
"""
import json
import torch

COLS = 1024


def swish(a, b):
    x = a * b + 1.0
    return x * torch.sigmoid(x)


def norm(x, mean, rstd, w, b):
    return (x - mean) * rstd * w + b


def inputs(chain, n):
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.rand(*s, device="cuda", generator=g) * 2 - 1
    if chain == "swish":
        return [r(n), r(n)]
    rows = n // COLS
    return [r(rows, COLS), r(rows, 1), r(rows, 1), r(COLS), r(COLS)]


def timed(fn, args, reps):
    fn(*args)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def main():
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    for n in (1 << 24, 1 << 28):
        for chain, fn in (("swish", swish), ("norm", norm)):
            args = inputs(chain, n)
            useful = sum(a.numel() * 4 for a in args) + n * 4
            reps = 20 if n > 1 << 24 else 100
            compiled = torch.compile(fn)
            for impl, f in (("torch_eager", fn), ("torch_compile", compiled)):
                ms = timed(f, args, reps)
                print("RESULT " + json.dumps({"impl": impl, "chain": chain, "n": n, "ms": ms, "gbps": useful / (ms * 1e-3) / 1e9}))
            del args
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
