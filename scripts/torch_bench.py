"""What the PyTorch GPU baselines (torch_transformer_ops.py, torch_gpu_sweep.py) share: timing with
CUDA events, and torch.compile allowed to recompile for every shape they time."""
import torch
import torch._dynamo


def allow_recompiles():
    """One compiled function may serve many shapes: without a high limit dynamo falls back to
    eager after 8 of them, silently."""
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 100000)


def timed(fn, args, reps=100):
    """Milliseconds per call of fn(*args) on the GPU: 3 calls to warm up, then the mean of reps,
    timed with CUDA events."""
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps
