#!/usr/bin/env python3
"""PyTorch baseline for examples/optimizer_bench.rs: `torch.optim.AdamW` (defaults: weight decay
0.01) over GPT-2 124M's 148 parameter shapes (f32), gradients set, fused (`fused=True`) and
multi-tensor (`foreach=True`), timed with CUDA events over 200 steps after 20 of warm-up, five
rounds (the median printed), and the kernels one step launches (`torch.profiler`)."""
import statistics

import torch
from torch.profiler import ProfilerActivity, profile


def gpt2_shapes():
    shapes = [(50257, 768), (1024, 768)]
    for _ in range(12):
        shapes += [(768,), (768,), (768, 2304), (2304,), (768, 768), (768,), (768,), (768,),
                   (768, 3072), (3072,), (3072, 768), (768,)]
    return shapes + [(768,), (768,)]


def bench(name, **kind):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, device="cuda") * 0.02) for s in gpt2_shapes()]
    for p in params:
        p.grad = torch.randn_like(p) * 0.02
    opt = torch.optim.AdamW(params, lr=1e-4, **kind)
    for _ in range(20):
        opt.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        opt.step()
        torch.cuda.synchronize()
    kernels = sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(200):
            opt.step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 200)
    print(f"torch AdamW over GPT-2's 148 parameters (f32), {name}: {kernels} kernel(s), "
          f"{statistics.median(times):.3f} ms per step (median of 5; {min(times):.3f}-{max(times):.3f})")


bench("fused", fused=True)
bench("foreach", foreach=True)
