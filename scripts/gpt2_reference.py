#!/usr/bin/env python3
"""Writes the reference that `proptests/gpt2_matches_pytorch.rs` compares boundscope's GPT-2 with,
as llm.c's `test_gpt2` does: a small Hugging Face `GPT2LMHeadModel` (seeded), its weights under
the names `save_pretrained` writes (`transformer.`-prefixed, the tied `lm_head.weight` left out),
a batch of ids, the logits and loss for `labels=ids`, the gradient of that loss for every
parameter (`grad.<name>`), and the losses of 10 AdamW steps (`train_losses`).

    python3 scripts/gpt2_reference.py proptests/fixtures/gpt2_reference.safetensors

Runs on the CPU in f32 (any PyTorch 2.x with `transformers` and `safetensors`).
"""
import sys

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

# Kept in step with the test.
LAYERS, WIDTH, HEADS, VOCAB, POSITIONS = 2, 32, 4, 128, 32
BATCH, TOKENS = 2, 16
STEPS, LR, WEIGHT_DECAY = 10, 1e-3, 0.01


def main(path):
    torch.manual_seed(1234)
    config = GPT2Config(
        n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB, n_positions=POSITIONS,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new",
        layer_norm_epsilon=1e-5, bos_token_id=0, eos_token_id=0,
    )
    model = GPT2LMHeadModel(config).float()
    model.train()  # no dropout (every probability is 0); gradients on
    # GPT-2's initialisation leaves biases at zero and layer norms at one; perturb them so that
    # a gradient or a wiring mistake in any of them shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name or "ln_f" in name:
                p.add_(0.1 * torch.randn_like(p))
    ids = torch.randint(0, VOCAB, (BATCH, TOKENS), dtype=torch.int64)

    weights = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()
               if k != "lm_head.weight" and not k.endswith(".attn.bias") and not k.endswith("masked_bias")}
    out = model(ids, labels=ids)
    out.loss.backward()
    tensors = dict(weights)
    tensors["ids"] = ids
    tensors["logits"] = out.logits.detach().float().contiguous()
    tensors["loss"] = out.loss.detach().reshape(1).float()
    for name, p in model.named_parameters():
        if name == "lm_head.weight":
            continue  # tied: its gradient is part of `transformer.wte.weight`'s
        tensors["grad." + name] = p.grad.detach().clone().contiguous()

    model.zero_grad(set_to_none=True)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids).loss
        losses.append(loss.item())
        loss.backward()
        opt.step()
    tensors["train_losses"] = torch.tensor(losses, dtype=torch.float32)
    save_file(tensors, path, metadata={"format": "pt"})
    print(f"wrote {path}: loss {out.loss.item():.6f}, {len(weights)} weights, losses {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
