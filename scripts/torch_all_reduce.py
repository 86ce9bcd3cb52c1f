#!/usr/bin/env python3
"""PyTorch baseline for `examples/ranks.rs --nccl --bench`, measured the same way: on each rank
(`torchrun --nproc_per_node N scripts/torch_all_reduce.py`, one GPU per rank, NCCL), the
`torch.distributed.all_reduce` of 256 MiB of f32 (3 warm-up runs, a barrier, 20 timed runs,
then a synchronize), and a bf16 tensor-parallel MLP block (gelu(x w1) w2 summed over the ranks,
plus a bias: x [8192, 4096], hidden 16384 split over the ranks) against the whole block on one
GPU. Rank 0 prints `RESULT {json}` lines with the same keys as the example's ("impl": "torch").
With one process (no torchrun), it runs a world of one."""
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def ms_per_run(fn, runs):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(runs):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / runs


def main():
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()

    length = 64 << 20
    x = (torch.arange(length, device="cuda") % 7).float()
    ms = ms_per_run(lambda: dist.all_reduce(x), 20)
    nbytes = length * 4
    algbw = nbytes / (ms * 1e-3) / 1e9
    busbw = algbw * 2 * (world - 1) / world
    if rank == 0:
        print("RESULT " + json.dumps({"impl": "torch", "bench": "all_reduce", "world": world, "bytes": nbytes,
                                      "ms": round(ms, 4), "algbw_gbps": round(algbw, 1),
                                      "busbw_gbps": round(busbw, 1)}), flush=True)

    tokens, d, hidden = 8192, 4096, 16384
    part = hidden // world
    g = torch.Generator(device="cuda").manual_seed(0)
    scale = d ** -0.5
    xs = torch.randn(tokens, d, device="cuda", generator=g).bfloat16() * scale
    w1 = torch.randn(d, hidden, device="cuda", generator=g).bfloat16() * scale
    w2 = torch.randn(hidden, d, device="cuda", generator=g).bfloat16() * scale
    bias = torch.randn(d, device="cuda", generator=g).bfloat16() * scale
    w1s, w2s = w1[:, rank * part:(rank + 1) * part].contiguous(), w2[rank * part:(rank + 1) * part].contiguous()

    def whole():
        return F.gelu(xs @ w1, approximate="tanh") @ w2 + bias

    def sharded():
        y = F.gelu(xs @ w1s, approximate="tanh") @ w2s
        dist.all_reduce(y)
        return y + bias

    with torch.no_grad():
        whole_ms = ms_per_run(whole, 10)
        sharded_ms = ms_per_run(sharded, 10)
    if rank == 0:
        print("RESULT " + json.dumps({"impl": "torch", "bench": "tensor_parallel_mlp", "world": world,
                                      "shape": [tokens, d, hidden], "whole_ms": round(whole_ms, 3),
                                      "sharded_ms": round(sharded_ms, 3),
                                      "ratio": round(sharded_ms / whole_ms, 3)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
