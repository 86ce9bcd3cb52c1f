#!/usr/bin/env python3
"""PyTorch baselines for examples/transformer_ops_bench.rs, on the same GPU and shapes (batch 8,
1,024 tokens, 12 heads of 64, width 768; f32 with TF32 off, and bf16): eager and torch.compile,
timed with CUDA events, bytes and FLOPs counted as the example counts them. Attention is
torch.nn.functional.scaled_dot_product_attention(is_causal=True), whatever backend it picks.
Prints `RESULT {json}` lines for transformer_ops_report.py.
"""
import json
import sys
import torch
from torch_bench import allow_recompiles, timed

allow_recompiles()

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
B, T, H, D, C, V = 8, 1024, 12, 64, 768, 50257


def attention_training(q, k, v, g):
    """The forward and the gradients of q, k and v, as a training step runs them."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return torch.autograd.grad(y, (q, k, v), g)


WORKLOADS = {
    "qk_t": ([(B, H, T, D), (B, H, T, D)], lambda q, k: q @ k.transpose(-2, -1), 2 * B * H * T * T * D),
    "pv": ([(B, H, T, T), (B, H, T, D)], lambda p, v: p @ v, 2 * B * H * T * T * D),
    "x_w": ([(B, T, C), (C, 4 * C)], lambda x, w: x @ w, 2 * B * T * C * 4 * C),
    "slice": ([(B, T, 3 * C)], lambda x: x[:, :, C:2 * C].contiguous(), 0),
    "concat": ([(B, T, C), (B, T, C)], lambda a, b: torch.cat([a, b], 2), 0),
    "permute": ([(B, T, H, D)], lambda x: x.permute(0, 2, 1, 3).contiguous(), 0),
    "attention": ([(B, H, T, D)] * 3,
                  lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                  2 * B * H * T * T * D),
    "attention_training": ([(B, H, T, D)] * 4, attention_training, 7 * B * H * T * T * D),
    "embedding": ([(V, C), ("ids", (B, T))], lambda w, i: torch.nn.functional.embedding(i, w), 0),
    "cross_entropy": ([(B * T, V), ("ids", (B * T,))], lambda x, t: torch.nn.functional.cross_entropy(x, t), 0),
}
# softmax, layer_norm and sum(x * x) over rows of 32 to 2^20 values, 2^24 in all, as the example names them.
for cols in [32, 128, 768, 1024, 1000, 4096, 16384, 65536, 1048576]:
    rows = max((1 << 24) // cols, 1)
    WORKLOADS[f"softmax_{cols}"] = ([(rows, cols)], lambda x: torch.softmax(x, -1), 0)
    WORKLOADS[f"sum_sq_{cols}"] = ([(rows, cols)], lambda x: (x * x).sum(-1), 0)
    WORKLOADS[f"layer_norm_{cols}"] = (
        [(rows, cols), (cols,), (cols,)],
        lambda x, w, b: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, 1e-5), 0)
ROW_OPS = {name for name in WORKLOADS if name.startswith(("softmax_", "layer_norm_", "sum_sq_"))}
# Attention at other lengths and head sizes, 12 heads, as the example names them.
for tokens, head, causal in [(256, 64, True), (512, 64, True), (2048, 64, True), (4096, 64, True), (1024, 16, True),
                             (1024, 32, True), (1024, 48, True), (1024, 64, False), (4096, 64, False)]:
    name = f"attention_{tokens}_{head}_{'causal' if causal else 'full'}"
    WORKLOADS[name] = ([(B, H, tokens, head)] * 3,
                       lambda q, k, v, causal=causal: torch.nn.functional.scaled_dot_product_attention(
                           q, k, v, is_causal=causal),
                       (2 if causal else 4) * B * H * tokens * tokens * head)
SWEPT = {name for name in WORKLOADS if name.startswith("attention_") and name != "attention_training"}


# An optional first argument names the workloads to run (comma-separated), as for the example;
# a second, `eager`, leaves torch.compile out (it compiles once per shape: minutes for a sweep).
ONLY = set(sys.argv[1].split(",")) if len(sys.argv) > 1 else None
IMPLS = ["torch_eager"] if sys.argv[2:3] == ["eager"] else ["torch_eager", "torch_compile"]
if ONLY is not None and "rows" in ONLY:
    ONLY |= ROW_OPS
if ONLY is not None and "attention_sweep" in ONLY:
    ONLY |= SWEPT

for dtype_name, dtype in [("f32", torch.float32), ("bf16", torch.bfloat16)]:
    for name, (shapes, fn, flops) in WORKLOADS.items():
        if ONLY is not None and name not in ONLY:
            continue
        args = [torch.randint(0, V, s[1], device="cuda") if s[0] == "ids" else
                torch.rand(*s, device="cuda", dtype=dtype) * 2 - 1 for s in shapes]
        out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        nbytes = sum(a.numel() * a.element_size() for a in list(args) + list(outs))
        for impl in IMPLS:
            f = fn if impl == "torch_eager" else torch.compile(fn, dynamic=False)
            ms = timed(f, args)
            print("RESULT " + json.dumps({"impl": impl, "op": name, "dtype": dtype_name, "ms": ms,
                                          "gbps": nbytes / (ms * 1e-3) / 1e9,
                                          "tflops": flops / (ms * 1e-3) / 1e12}), flush=True)
