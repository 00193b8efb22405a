"""Driving a decoding loop: the steps `decoding.decode` yields, collected into each row's
`Result` (its tokens, where each came from, the counts tau and the acceptance figures come from).

`decode` yields what each target forward gave each row, cut where the row stops; what a caller
wants of a run (the text, tokens per forward, tokens/s, which sizes the steps took) is counted
here, once (`add`), for `generate`, the benchmark, sizing and the tests alike.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch

from .decoding import ACCEPTED, CORRECTION, Step, Steps


@dataclass
class Result:
    token_ids: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    target_steps: int = 0  # target forward passes, the prefill included
    proposed: int = 0  # tokens proposed by a draft model, heads or a lookup
    accepted: int = 0  # ... of which the target accepted
    rejections: int = 0  # steps that ended in a rejection (the rest accepted everything)
    sizes: Counter = field(default_factory=Counter)  # steps by the size they verified (Step.size; "0": plain)
    fed: Counter = field(default_factory=Counter)  # steps by (size, tokens fed): what the cost model adds up
    accepted_at: Counter = field(default_factory=Counter)  # steps that accepted the proposal's token at depth d
    speculated: int = 0  # steps that proposed (the rest were plain steps)
    empty: int = 0  # ... of which accepted nothing
    wall_s: float = 0.0
    prefill_s: float = 0.0  # ... of which the prompt's forward and the first token
    stop_reason: str = "length"  # "length", "eot", "context" or "interrupted"

    def stats(self) -> dict:
        """The run's figures: tau is tokens per target forward, the correction or bonus token
        included (1.0 where no step speculated)."""
        n = len(self.token_ids)
        out = {"new_tokens": n, "target_steps": self.target_steps, "wall_s": round(self.wall_s, 4),
               "tokens_per_s": round(n / self.wall_s, 2) if self.wall_s else 0.0, "stop_reason": self.stop_reason,
               "tau": round(n / max(1, self.target_steps), 4),
               "acceptance_rate": round(self.accepted / self.proposed, 4) if self.proposed else 0.0,
               "steps_by_size": {size: count for size, count in sorted(self.sizes.items(), key=size_order)}}
        if self.speculated:
            out.update(proposed_tokens=self.proposed, accepted_tokens=self.accepted, rejections=self.rejections,
                       # of the steps that proposed: the share that accepted the token at depth d, and none
                       acceptance_by_depth=[round(self.accepted_at[d] / self.speculated, 4)
                                            for d in range(1, max(self.accepted_at, default=0) + 1)],
                       empty_steps=round(self.empty / self.speculated, 4))
        return out


def size_order(item) -> tuple:
    """Sizes in a readable order: plain first, then by the numbers they are spelled with."""
    return tuple(int(x) if x.isdigit() else 0 for x in item[0].split(","))


def run_batch(steps: Steps, rows: int, on_step: Callable[[Step], None] | None = None,
              device: torch.device | None = None) -> list[Result]:
    """Drive a decoding loop to its end, counting each row's steps into its Result; Ctrl-C ends the
    run too ("interrupted"), so the caller can still show what came. A row's wall_s is the time
    from the start until its last token: its latency, in a batch that started together.
    on_step(step): called with what each step added (to stream one row's text)."""
    results = [Result() for _ in range(rows)]
    t0 = time.perf_counter()

    def now() -> float:  # a GPU runs ahead of the host: wait for it before reading the clock
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0
    try:
        for i, produced in enumerate(steps):
            for row, step in produced.items():
                add(results[row], step)
                if on_step and step.tokens:
                    on_step(step)
                if i == 0:  # the prompt's forward and the first token
                    results[row].prefill_s = now()
                if step.stop:
                    results[row].stop_reason, results[row].wall_s = step.stop, now()
    except KeyboardInterrupt:  # Ctrl-C: every row keeps what it has
        for res in results:
            if not res.wall_s:
                res.stop_reason, res.wall_s = "interrupted", now()
    return results


def run(steps: Steps, on_step: Callable[[Step], None] | None = None, device: torch.device | None = None) -> Result:
    """`run_batch` for a loop of one row (one prompt)."""
    return run_batch(steps, 1, on_step, device)[0]


def add(res: Result, step: Step) -> None:
    """Count one step (as the loop kept it: cut at the budget or the end of text) into the result."""
    res.target_steps += 1
    res.proposed += step.proposed
    res.sizes[step.size] += 1
    res.fed[step.size, step.fed] += 1
    res.token_ids += step.tokens
    res.sources += step.sources
    res.accepted += step.sources.count(ACCEPTED)
    res.rejections += CORRECTION in step.sources
    if step.proposed:
        res.speculated += 1
        res.empty += step.accepted == 0
        for d in range(1, step.accepted + 1):
            res.accepted_at[d] += 1
