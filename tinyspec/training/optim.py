"""How every model and head in tinyspec is optimised: AdamW and a warm-up + cosine schedule.

As in nanoGPT and GPT-3: AdamW with beta2 = 0.95, weight decay on matrices and embeddings only
(not on biases or LayerNorm gains), a linear warm-up, then cosine decay to 10% of the peak
learning rate (Loshchilov & Hutter 2017).
"""

from __future__ import annotations

import math

import torch


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay from `peak` to peak/10 at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(module: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    decay = [p for p in module.parameters() if p.requires_grad and p.dim() >= 2]  # matrices and embeddings
    rest = [p for p in module.parameters() if p.requires_grad and p.dim() < 2]  # biases and LayerNorm gains
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))
