"""Decoding loops: each method is a generator of what every target forward pass produced.

Plain autoregressive decoding yields one token per target pass; the speculative methods
(`speculative.py`, `medusa.py`, ...) yield several. One driver, `run`, consumes any of them the
same way: it stops at `<|endoftext|>`, at `max_new_tokens` or at the end of the context
window, streams tokens to a callback, and counts tokens, target passes and wall time.

A loop calls the target through a *forward*: `forward(tokens, L) -> (logits, hidden)` feeds the
n tokens (n,) after the L cached ones and advances the cache by n. By default it is the model's
own forward over a `KVCache`; `fastpath.py` makes fixed-shape ones that a CUDA graph can
replay. The loop does not care which it is given.

Every method that proposes a tree (Medusa, EAGLE, prompt lookup; `tree.py`) ends its step the
same way, `verify_tree`: one target forward over the root and the proposed tokens, an
acceptance rule from `verify.py`, and the cache compacted to the accepted path. Lookahead
decoding feeds more than the tree in its forward and calls the second half, `accept_tree`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from .kvcache import KVCache
from .model import GPT, prefix_mask
from .sampling import Sampling, sample


# Where each produced token came from (Step.sources):
TARGET = "target"  # chosen by the target itself (plain decoding)
ACCEPTED = "accepted"  # proposed (by a draft model, heads, a lookup) and accepted by the target
CORRECTION = "correction"  # sampled by the target after it rejected a proposal
BONUS = "bonus"  # sampled by the target after it accepted every proposal on its path


@dataclass
class Step:
    """What one target forward pass produced: tokens, where each came from, and how many
    tokens a proposal could add in that pass (0 for plain decoding, k for a draft, the depth of
    a tree: accepted / proposed is then the fraction of proposed positions filled)."""
    tokens: list[int]
    sources: list[str]
    proposed: int = 0


def plain_forward(model: GPT, cache: KVCache) -> Callable:
    """The ordinary forward over `cache`: the n tokens sit at the next n positions, causally."""
    return lambda tokens, length: model(tokens[None], cache=cache)


@torch.no_grad()
def autoregressive(model: GPT, prompt: list[int], sampling: Sampling, generator: torch.Generator | None,
                   max_len: int, cache: KVCache | None = None, forward: Callable | None = None) -> Iterator[Step]:
    """Plain decoding: one target forward per token; the baseline every speedup is against.
    cache: reused if given (emptied first); forward: a one-token forward over it (default: the
    model's own)."""
    device = model.lm_head.weight.device
    cache = cache if cache is not None else KVCache.for_model(model, max_len)
    cache.truncate(0)
    forward = forward or plain_forward(model, cache)
    h = model.hidden(torch.tensor([prompt], device=device), cache=cache)  # prefill: the prompt enters the cache
    logits = model.lm_head(h[:, -1])  # only the last position's logits are needed
    while True:
        token = sample(sampling.probs(logits), generator)  # (1,)
        yield Step([int(token)], [TARGET])
        if cache.length == max_len:
            return
        logits = forward(token.view(1), cache.length)[0][:, -1]


def verify_tree(target: GPT, cache: KVCache, root: torch.Tensor, tokens: torch.Tensor, tree, accept, sampling: Sampling,
                q: torch.Tensor | None, generator, forward: Callable | None = None):
    """One verification step over a proposal tree; returns (the Step, the next root, the hidden
    states (path length, C) of the accepted tokens, the root first).

    root (1,): the last accepted token, not yet in the cache; tokens (T,): the tree's nodes;
    accept: a rule from verify.RULES; q: its draft distributions, if it needs them.
    forward(x, L): a forward for this tree (e.g. a recorded one); default: the model's own, each
    node at position L + depth and seeing only its ancestors (`Tree.tree_mask`)."""
    L = cache.length
    x = torch.cat([root.view(1), tokens])  # (T+1,): root, then the tree
    if forward is None:
        logits, hidden = target(x[None], positions=L + tree.depth, cache=cache, attn_mask=prefix_mask(tree.tree_mask, L))
    else:
        logits, hidden = forward(x, L)
    step, nxt, path = accept_tree(cache, L, x, logits[0], tree, accept, sampling, q, generator)
    return step, nxt, hidden[0, path]


def accept_tree(cache: KVCache, L: int, x: torch.Tensor, logits: torch.Tensor, tree, accept, sampling: Sampling,
                q: torch.Tensor | None, generator, slots: torch.Tensor | None = None):
    """Steps 3-4 of a tree method, once the forward has run: the rule judges the tree, the cache
    keeps the root and the accepted path, and the Step says what came out. Returns (the Step,
    the next root, the accepted path as indices into x).

    x (T+1,): the root, then the tree's nodes; logits (T+1, V): the target's after each of them;
    L: the cache length before the forward. slots (T+1,): where the forward put each of x in the
    cache, counted from L (default 0..T: root and tree were all it fed; lookahead decoding feeds
    more between them)."""
    path, nxt = accept(x, sampling.probs(logits), tree, q, generator)
    where = path if slots is None else slots[path]
    cache.keep((L + where).tolist())  # the root (slot L) and the accepted nodes, compacted
    accepted = x[path[1:]].tolist()
    kind = CORRECTION if tree.children(int(path[-1])) else BONUS
    step = Step(accepted + [int(nxt)], [ACCEPTED] * len(accepted) + [kind], proposed=tree.max_depth)
    return step, nxt, path


@dataclass
class Result:
    token_ids: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    target_steps: int = 0  # target forward passes, the prefill included
    proposed: int = 0  # tokens proposed by a draft model, heads or a lookup
    accepted: int = 0  # ... of which the target accepted
    rejections: int = 0  # steps that ended in a rejection (the rest accepted everything)
    wall_s: float = 0.0
    stop_reason: str = "length"  # "length", "eot", "context" or "interrupted"

    def stats(self) -> dict:
        n = len(self.token_ids)
        out = {"new_tokens": n, "target_steps": self.target_steps, "wall_s": round(self.wall_s, 4),
               "tokens_per_s": round(n / self.wall_s, 2) if self.wall_s else 0.0, "stop_reason": self.stop_reason}
        if self.proposed:
            out.update(proposed_tokens=self.proposed, accepted_tokens=self.accepted, rejections=self.rejections,
                       acceptance_rate=round(self.accepted / self.proposed, 4),
                       # tau: tokens per target forward, the correction or bonus token included
                       tau=round(n / max(1, self.target_steps), 4))
        return out


def run(steps: Iterator[Step], max_new_tokens: int, stop_id: int | None = None,
        on_step: Callable[[Step], None] | None = None, device: torch.device | None = None) -> Result:
    """Drive a decoding method: collect its tokens until EOT, max_new_tokens or the context ends.
    Ctrl-C ends the run too (stop reason "interrupted"), so the caller can still show what came."""
    res, reason = Result(), None
    t0 = time.perf_counter()
    try:
        for step in steps:
            reason = take(res, step, max_new_tokens, stop_id, on_step)
            if reason:
                break
    except KeyboardInterrupt:
        reason = "interrupted"
    res.stop_reason = reason or "context"  # the method ran out of context window
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    res.wall_s = time.perf_counter() - t0
    return res


def take(res: Result, step: Step, max_new_tokens: int, stop_id: int | None, on_step) -> str | None:
    """Add one step's tokens to the result, up to the budget or end of text; returns the stop
    reason if the run ends here."""
    res.target_steps += 1
    res.proposed += step.proposed
    room = max_new_tokens - len(res.token_ids)
    keep, reason = len(step.tokens), None
    if stop_id in step.tokens[:room]:  # end of text within the budget (past it, the budget ends first)
        keep, reason = step.tokens.index(stop_id), "eot"
    elif keep >= room:
        keep, reason = room, "length"
    res.token_ids += step.tokens[:keep]
    res.sources += step.sources[:keep]
    res.accepted += step.sources[:keep].count(ACCEPTED)
    res.rejections += CORRECTION in step.sources[:keep]
    if on_step and keep:
        on_step(Step(step.tokens[:keep], step.sources[:keep]))
    return reason
