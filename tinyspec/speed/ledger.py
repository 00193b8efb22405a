"""Where a step's time goes: the target's forward, proposing, the acceptance rule, cache work, and
the rest (the loop's own Python).

A speculative step pays when the tokens it makes (tau) outweigh what it costs in plain steps, and
its cost is more than its forward: the draft's forwards or the heads, growing a tree, judging it,
compacting the cache. The one loop (`decoding.decode`) marks each of these parts of a step with
its clock (`clock.part("propose")`, ...); a `Ledger` is a clock that adds up the seconds of each
part. What no part claims is the rest: `split(wall_s)`. On CUDA every part is bracketed by
synchronisations, which a profile pays for; figures from `--profile` are for reading, and tokens/s
is measured without it.
"""

from __future__ import annotations

import contextlib
import time

import torch

from ..decoding import NO_CLOCK, Clock

PARTS = ("target", "propose", "rule", "cache")  # and "step": a recorded step, all four at once (recorded.py)


class Ledger(Clock):
    def __init__(self, device: torch.device):
        self.device, self.seconds = device, dict.fromkeys(PARTS, 0.0)

    @contextlib.contextmanager
    def part(self, name: str):
        """Adds the time inside to part `name` (a GPU's queued work included)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    @contextlib.contextmanager
    def watching(self, decoder):
        """While inside, the decoder's steps record into this ledger."""
        decoder.clock = self
        try:
            yield self
        finally:
            decoder.clock = NO_CLOCK

    def split(self, wall_s: float) -> dict:
        """Seconds per part, and the rest of `wall_s` that no part claimed."""
        out = {part: round(s, 6) for part, s in self.seconds.items()}
        out["rest"] = round(max(0.0, wall_s - sum(self.seconds.values())), 6)
        return out
