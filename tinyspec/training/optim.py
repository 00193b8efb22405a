"""How every model and head in tinyspec is optimised: AdamW and a warm-up + cosine schedule.

As in nanoGPT and GPT-3: AdamW with beta2 = 0.95, weight decay on matrices and embeddings only
(not on biases or LayerNorm gains), a linear warm-up, then cosine decay to 10% of the peak
learning rate (Loshchilov & Hutter 2017).
"""

from __future__ import annotations

import math

import torch


class Diverged(ValueError):
    """The loss is no longer a number (nan or inf): the step would write weights that are no model.
    Training stops before it, and before anything more is saved; the command says it in one line
    and names the last good checkpoint."""


def check_finite(loss: float, step: int, what: str = "training loss") -> None:
    """Diverged if `loss` (of the step numbered `step`, from 1) is nan or inf."""
    if not math.isfinite(loss):
        raise Diverged(f"the {what} is {loss} at step {step}: the run diverged (a learning rate too high for this "
                       "model?), so training stopped there")


def check_weights(module: torch.nn.Module, step: int) -> None:
    """Diverged if a weight of `module` is nan or inf after `step` steps (checked before it is saved:
    a step of finite loss can still write them)."""
    if not all(torch.isfinite(p).all() for p in module.parameters()):
        raise Diverged(f"the weights are not finite numbers after step {step}: the run diverged (a learning rate too "
                       "high for this model?), so training stopped there")


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
