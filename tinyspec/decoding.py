"""Decoding loops: each method is a generator of what every target forward pass produced.

Plain autoregressive decoding yields one token per target pass; the speculative methods
(`speculative.py`, `verify.py`) yield several. One driver, `run`, consumes any of them the
same way: it stops at `<|endoftext|>`, at `max_new_tokens` or at the end of the context
window, streams tokens to a callback, and counts tokens, target passes and wall time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from .fastpath import fixed_step
from .kvcache import KVCache
from .model import GPT
from .sampling import Sampling, sample


# Where each produced token came from (Step.sources):
TARGET = "target"  # chosen by the target itself (plain decoding)
DRAFT = "draft"  # proposed by the draft model and accepted by the target
HEAD = "head"  # proposed by a Medusa head and accepted by the target
CORRECTION = "correction"  # sampled by the target after it rejected a proposal
BONUS = "bonus"  # sampled by the target after it accepted every proposal
PROPOSED = (DRAFT, HEAD)


@dataclass
class Step:
    """What one target forward pass produced: tokens, where each came from, and how many
    tokens a proposal could add in that pass (0 for plain decoding, k for a draft, the depth of
    the tree for Medusa: accepted / proposed is then the fraction of proposed positions filled)."""
    tokens: list[int]
    sources: list[str]
    proposed: int = 0


@torch.no_grad()
def autoregressive(model: GPT, prompt: list[int], sampling: Sampling, generator: torch.Generator | None,
                   max_len: int, fixed: bool = False) -> Iterator[Step]:
    """Plain decoding: one target forward per token; the baseline every speedup is against.
    fixed: run each step with fixed shapes (fastpath.py), as a CUDA graph on CUDA."""
    device = model.lm_head.weight.device
    cache, step = fixed_step(model, model.config.n_ctx) if fixed else (KVCache.for_model(model, max_len), None)
    x = torch.tensor([prompt], device=device)
    h = model.hidden(x, cache=cache)  # prefill: the prompt's keys and values enter the cache
    logits = model.lm_head(h[:, -1])  # only the last position's logits are needed
    while True:
        token = sample(sampling.probs(logits), generator)  # (1,)
        yield Step([int(token)], [TARGET])
        if cache.length == max_len:
            return
        if step is not None:
            logits, _ = step(token.view(1), cache.length)
            cache.advance(1)
        else:
            logits, _ = model(token.view(1, 1), cache=cache)
        logits = logits[:, -1]


@dataclass
class Result:
    token_ids: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    target_steps: int = 0  # target forward passes, the prefill included
    proposed: int = 0  # tokens proposed by a draft model or heads
    accepted: int = 0  # ... of which the target accepted
    rejections: int = 0  # steps that ended in a rejection (the rest accepted everything)
    wall_s: float = 0.0
    stop_reason: str = "length"  # "length", "eot" or "context"

    def stats(self) -> dict:
        n = len(self.token_ids)
        out = {"new_tokens": n, "target_steps": self.target_steps, "wall_s": round(self.wall_s, 4),
               "tokens_per_s": round(n / self.wall_s, 2) if self.wall_s else 0.0, "stop_reason": self.stop_reason}
        if self.proposed:
            out.update(draft_tokens=self.proposed, accepted_tokens=self.accepted, rejections=self.rejections,
                       acceptance_rate=round(self.accepted / self.proposed, 4),
                       # tau: tokens per target forward, the correction or bonus token included
                       mean_accepted=round(n / max(1, self.target_steps), 4))
        return out


def run(steps: Iterator[Step], max_new_tokens: int, stop_id: int | None = None,
        on_step: Callable[[Step], None] | None = None, device: torch.device | None = None) -> Result:
    """Drive a decoding method: collect its tokens until EOT, max_new_tokens or the context ends."""
    res, reason = Result(), None
    t0 = time.perf_counter()
    for step in steps:
        res.target_steps += 1
        res.proposed += step.proposed
        room = max_new_tokens - len(res.token_ids)
        keep = len(step.tokens)
        if stop_id in step.tokens and step.tokens.index(stop_id) <= room:
            keep, reason = step.tokens.index(stop_id), "eot"
        elif keep >= room:
            keep, reason = room, "length"
        res.token_ids += step.tokens[:keep]
        res.sources += step.sources[:keep]
        res.accepted += sum(s in PROPOSED for s in step.sources[:keep])
        res.rejections += CORRECTION in step.sources[:keep]
        if on_step and keep:
            on_step(Step(step.tokens[:keep], step.sources[:keep]))
        if reason:
            break
    res.stop_reason = reason or "context"  # the method ran out of context window
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    res.wall_s = time.perf_counter() - t0
    return res
