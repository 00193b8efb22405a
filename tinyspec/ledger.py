"""Where a step's time goes: the target's forward, proposing, the acceptance rule, cache work, and
the rest (the loop's own Python).

A speculative step pays when the tokens it makes (tau) outweigh what it costs in plain steps, and
its cost is more than its forward: the draft's forwards or the heads, growing a tree, judging it,
compacting the cache. `Ledger.watching(decoder)` times each of these while the decoder runs, by
wrapping the functions that do them (the loops themselves stay as the book prints them): a call
counts towards its part only when no other timed call is running, so the LM head that Medusa's
heads call is proposing, not the target's forward, and the cache writes inside a forward are the
forward's. What no part claims is the rest: `split(wall_s)`. On CUDA every timed call is bracketed
by synchronisations, which a profile pays for; figures from `--profile` are for reading, and
tokens/s is measured without it.
"""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager

import torch

from . import eagle, lookahead, lookup, medusa, methods, speculative
from .kvcache import KVCache
from .verify import RULES

PARTS = ("target", "propose", "rule", "cache")


class Ledger:
    def __init__(self, device: torch.device):
        self.device, self.seconds, self.depth = device, dict.fromkeys(PARTS, 0.0), 0

    def timed(self, part: str, fn):
        """fn, its time added to `part` when no other timed call encloses it."""
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            try:
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                self.seconds[part] += time.perf_counter() - t0
                return out
            finally:
                self.depth -= 1
        return call

    @contextmanager
    def watching(self, decoder):
        """While inside, the decoder's loops record into this ledger (undone on the way out)."""
        d, patches = decoder, []
        if d.forward is None:  # recorded graphs (fastpath.py) are not wrapped: profile the eager path
            patches += [(d.target, "hidden", "target"), (d.target.lm_head, "forward", "target")]
        drafter = d.draft if d.method == "draft" else d.heads
        if drafter is not None:
            patches += [(drafter, "forward", "propose")] + ([(drafter, "hidden", "propose"), (drafter, "logits", "propose")]
                                                           if d.method == "draft" else [])
        patches += [(module, name, "propose") for module in (medusa, eagle, lookahead, speculative)
                    for name in ("propose", "draft_tree", "trie") if hasattr(module, name)]
        patches += [(lookup.NgramIndex, "propose", "propose"), (lookahead.NgramPool, "guesses", "propose"),
                    (methods, "accept_or_resample", "rule")]
        patches += [(KVCache, name, "cache") for name in ("truncate", "keep", "select")]
        saved = [(obj, name, vars(obj).get(name, _MISSING)) for obj, name, _ in patches]
        rules = dict(RULES)
        try:
            for obj, name, part in patches:
                setattr(obj, name, self.timed(part, getattr(obj, name)))
            RULES.update({name: self.timed("rule", rule) for name, rule in rules.items()})
            yield self
        finally:
            RULES.update(rules)
            for obj, name, original in reversed(saved):
                if original is _MISSING:
                    delattr(obj, name)
                else:
                    setattr(obj, name, original)

    def split(self, wall_s: float) -> dict:
        """Seconds per part, and the rest of `wall_s` that no part claimed."""
        out = {part: round(s, 6) for part, s in self.seconds.items()}
        out["rest"] = round(max(0.0, wall_s - sum(self.seconds.values())), 6)
        return out


_MISSING = object()
