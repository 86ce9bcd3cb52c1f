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


def block_baseline():
    """The quickstart's MLP block ([64, 256], hidden 256, f32): eager, torch.compile and a CUDA
    graph, per run (queued back to back) and host time to queue one, as cuda_bench measures."""
    import time
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(1)
    r = lambda *s: (torch.rand(*s, device="cuda", generator=g) * 2 - 1) * 0.1
    x, w1, b1, w2, b2, gamma, beta = r(64, 256), r(256, 256), r(256), r(256, 256), r(256), r(256), r(256)

    def block(x):
        h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
        o = F.linear(h, w2, b2) + x
        return torch.softmax(F.layer_norm(o, (256,), gamma, beta, 1e-5), dim=-1)

    def measure(run, runs=1000, queued=50):
        run()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(runs):
            run()
        torch.cuda.synchronize()
        per_run = (time.perf_counter() - start) * 1e6 / runs
        start = time.perf_counter()
        for _ in range(queued):
            run()
        host = (time.perf_counter() - start) * 1e6 / queued
        torch.cuda.synchronize()
        return per_run, host

    compiled = torch.compile(block)
    for _ in range(3):
        compiled(x)
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            block(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        block(static_x)
    for impl, run in (("torch_block_eager", lambda: block(x)), ("torch_block_compile", lambda: compiled(x)), ("torch_block_graph", graph.replay)):
        us, host = measure(run)
        print("RESULT " + json.dumps({"impl": impl, "us": us, "host_us": host}))


def transformer_baseline():
    """The transformer MLP block of cuda_bench ([8192, 4096], 16384 hidden, f32, TF32 off):
    eager and torch.compile, ms per run."""
    import time
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(2)
    r = lambda *s: (torch.rand(*s, device="cuda", generator=g) * 2 - 1) * 0.02
    x, w1, b1, w2, b2 = r(8192, 4096), r(16384, 4096), r(16384), r(4096, 16384), r(4096)
    gamma, beta = r(4096), r(4096)

    def block(x):
        h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
        return F.layer_norm(F.linear(h, w2, b2) + x, (4096,), gamma, beta, 1e-5)

    compiled = torch.compile(block)
    for impl, fn in (("torch_transformer_eager", block), ("torch_transformer_compile", compiled)):
        for _ in range(2):
            fn(x)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            fn(x)
        torch.cuda.synchronize()
        us = (time.perf_counter() - start) * 1e6 / 10
        print("RESULT " + json.dumps({"impl": impl, "us": us, "host_us": 0}))


def main():
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    block_baseline()
    transformer_baseline()
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
