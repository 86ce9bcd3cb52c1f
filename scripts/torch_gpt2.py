#!/usr/bin/env python3
"""PyTorch baseline for `examples/gpt2.rs --bench`: Hugging Face's `GPT2LMHeadModel` (SDPA
attention, random initialisation) on the same batch, eager and `torch.compile`, f32 (TF32 off)
and bf16 autocast, fused AdamW, timed with CUDA events in the steady state. Prints, per mode,
ms per forward (the loss for `labels=ids`) and per training step (forward, backward, AdamW),
tokens per second, and the peak memory PyTorch allocates in a training step.

    python3 scripts/torch_gpt2.py [--batch 8] [--tokens 1024] [--dtype f32,bf16] [--modes eager,compile]
"""
import argparse
import contextlib

import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def bench(dtype, mode, batch, tokens, warmup=3, runs=10):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(attn_implementation="sdpa", resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0)).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens), device="cuda")
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if dtype == "bf16" else contextlib.nullcontext

    def loss_of(ids):
        with autocast():
            return model(ids, labels=ids).loss

    fn = torch.compile(loss_of) if mode == "compile" else loss_of

    def step():
        opt.zero_grad(set_to_none=True)
        loss = fn(ids)
        loss.backward()
        opt.step()

    def forward():
        with torch.no_grad():
            fn(ids)

    def timed(f):
        for _ in range(warmup):
            f()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(runs):
            f()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / runs

    step_ms = timed(step)
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**20
    forward_ms = timed(forward)
    n = batch * tokens
    print(f"torch {mode} {dtype}: forward {forward_ms:.3f} ms ({n / forward_ms * 1e3:.0f} tokens/s), training step "
          f"{step_ms:.3f} ms ({n / step_ms * 1e3:.0f} tokens/s), peak memory in a step {peak:.0f} MiB", flush=True)
    del model, opt
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--dtype", default="f32,bf16")
    p.add_argument("--modes", default="eager,compile")
    a = p.parse_args()
    for dtype in a.dtype.split(","):
        for mode in a.modes.split(","):
            bench(dtype, mode, a.batch, a.tokens)


if __name__ == "__main__":
    main()
