#!/usr/bin/env python3
"""Reads the RESULT lines of examples/cuda_bf16_bench.rs and scripts/torch_baseline_bf16.py
(stdin) and prints the bf16 comparison: chains in GB/s with the ratio to torch.compile and the
share of the copy, the 8192^3 matmul in TFLOP/s against torch.matmul, and the transformer MLP
block in ms against eager and torch.compile.

  (./cuda_bf16_bench; python3 scripts/torch_baseline_bf16.py) | python3 scripts/gpu_report_bf16.py
"""
import json
import sys

results = []
for line in sys.stdin:
    if line.startswith("RESULT "):
        results.append(json.loads(line[len("RESULT "):]))
    else:
        sys.stdout.write(line)


def find(impl, **keys):
    return next((r for r in results if r["impl"] == impl and all(r.get(k) == v for k, v in keys.items())), None)


print("\n| bf16 chain | n | boundscope fused GB/s (x compile) | torch eager GB/s | torch.compile GB/s | copy GB/s | fused % of copy |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for chain in ("swish", "norm"):
    for n in (1 << 24, 1 << 28):
        ours = find("boundscope_fused_bf16", chain=chain, n=n)
        eager = find("torch_eager_bf16", chain=chain, n=n)
        compiled = find("torch_compile_bf16", chain=chain, n=n)
        if not ours:
            continue
        ratio = f" ({ours['gbps'] / compiled['gbps']:.2f}x)" if compiled else ""
        print(f"| {chain} | 2^{n.bit_length() - 1} | {ours['gbps']:.0f}{ratio} | {eager['gbps'] if eager else float('nan'):.0f} | "
              f"{compiled['gbps'] if compiled else float('nan'):.0f} | {ours['copy_gbps']:.0f} | {100 * ours['gbps'] / ours['copy_gbps']:.0f}% |")
ours, torch_mm = find("boundscope_matmul_bf16"), find("torch_matmul_bf16")
if ours and torch_mm:
    print(f"\nbf16 matmul 8192^3: boundscope {ours['tflops']:.0f} TFLOP/s, torch.matmul {torch_mm['tflops']:.0f} TFLOP/s "
          f"({100 * ours['tflops'] / torch_mm['tflops']:.0f}%)")
ours, eager, compiled = find("boundscope_transformer_bf16"), find("torch_transformer_eager_bf16"), find("torch_transformer_compile_bf16")
if ours and compiled:
    print(f"bf16 transformer MLP block: boundscope {ours['ms']:.3f} ms, torch eager {eager['ms']:.3f} ms, "
          f"torch.compile {compiled['ms']:.3f} ms ({compiled['ms'] / ours['ms']:.2f}x torch.compile)")
