#!/usr/bin/env python3
"""PyTorch baseline for examples/training_bench.rs: the same MLP classifier training step
(8,192 tokens of 768 -> 3,072 with tanh gelu -> 1,024 classes, cross_entropy, fused AdamW), f32
with TF32 off, eager and torch.compile (the loss function compiled; backward by autograd),
timed with CUDA events over 50 steps after 10 of warm-up. Prints ms per step and the peak
memory PyTorch allocates in one step (parameters, gradients, AdamW state, activations)."""
import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
N, D, H, C = 8192, 768, 3072, 1024


def make():
    torch.manual_seed(0)
    w1 = torch.nn.Parameter(torch.randn(H, D, device="cuda") * 0.02)
    b1 = torch.nn.Parameter(torch.zeros(H, device="cuda"))
    w2 = torch.nn.Parameter(torch.randn(C, H, device="cuda") * 0.02)
    b2 = torch.nn.Parameter(torch.zeros(C, device="cuda"))
    return [w1, b1, w2, b2]


def loss_fn(x, t, w1, b1, w2, b2):
    h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1), approximate="tanh")
    return torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w2, b2), t)


def bench(name, fn):
    params = make()
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    x = torch.randn(N, D, device="cuda") * 0.02
    t = torch.randint(0, C, (N,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = fn(x, t, *params)
        loss.backward()
        opt.step()
        return loss

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**20
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        step()
    end.record()
    torch.cuda.synchronize()
    print(f"torch {name} training step (f32): {start.elapsed_time(end) / 50:.3f} ms per step, "
          f"peak memory in a step {peak:.1f} MiB")


bench("eager", loss_fn)
bench("compile", torch.compile(loss_fn))
