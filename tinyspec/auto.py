"""Speculation or batching, chosen per step: the policy of `--method auto`.

A forward of a small model on one sequence leaves most of the hardware idle: it reads every
weight to compute a handful of tokens. Speculative decoding fills that idle compute with guesses
(one forward scores k proposals as cheaply as one token). Batching fills it with other
sequences: every loop runs any number of rows (`decoding.py`), one forward advancing all of
them. Both spend the same spare capacity, so at a large enough batch a forward is no longer
nearly free to widen, and speculation, which multiplies the tokens of every forward by 1 + k or
1 + T, starts to cost more than it yields. The benchmark (`python -m tinyspec.bench
--batch-sizes 1,2,4,8,16`) measures where.

Whether to speculate thus depends on the batch's size, and on the device: at one row a forward
over 1 + s tokens costs little more than over one, and a Medusa tree pays; at sixteen rows it
does not. `BatchPolicy` measures the costs of forwards of every shape once, then decides every
step, from the measured costs and what the text at hand accepts, whether to verify a tree or
take a plain step. Medusa's loop is handed it as its tree chooser (`medusa.TreeChooser`).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Callable

import torch

from .medusa import MedusaHeads
from .model import GPT
from .timing import forward_call, interleaved_medians
from .tree import Tree, expected_accepted, from_accuracies


@torch.no_grad()
def measure_costs(target: GPT, heads: MedusaHeads, max_rows: int, widths: list[int],
                  context: int = 128) -> tuple[Callable, Callable]:
    """F(rows, t): the seconds of a target forward over rows x t new tokens (t in `widths`), each
    row after `context` cached tokens; H(rows): of the heads on rows hidden states. Measured at
    rows = 1, 2, 4, ..., max_rows, all shapes in turn (`timing.interleaved_medians`), and linear
    in between."""
    device, C = target.lm_head.weight.device, target.config.n_embd
    grid = sorted({2 ** i for i in range(max_rows.bit_length()) if 2 ** i <= max_rows} | {max_rows})
    calls = {(r, t): forward_call(target, r, t, context) for r in grid for t in widths}
    calls |= {(r, 0): (partial(heads, torch.zeros(r, C, device=device), target.lm_head), None) for r in grid}
    seconds = interleaved_medians(calls, device)  # keys (rows, 0): the heads

    def between(rows: int, t: int) -> float:
        hi = next((r for r in grid if r >= rows), grid[-1])
        lo = max([r for r in grid if r <= rows], default=hi)
        a, b = seconds[lo, t], seconds[hi, t]
        return a if hi == lo else a + (b - a) * (rows - lo) / (hi - lo)
    return (lambda rows, t: between(rows, t)), (lambda rows: between(rows, 0))


class BatchPolicy:
    """`--method auto`: every step, Medusa with a tree of one of `sizes` nodes, or no tree at all
    (a plain step), whichever gives the batch the most tokens per second at its current size:

        rate(0) = rows / (F(rows, 1) + e(0, rows))
        rate(s) = rows (1 + a A(s)) / (H(rows) + F(rows, 1 + s) + e(s, rows))

    F(rows, t): the measured seconds of a target forward over rows x t tokens; H(rows): of the
    heads on rows hidden states; A(s): the tokens per step that the heads' held-out accuracies
    promise a tree of s nodes accepts (`tree.expected_accepted`, the tree `from_accuracies`); a:
    the running ratio of tokens accepted to tokens promised (each step's counts weigh `decay`
    times the step after), which corrects A for the text at hand (prose is harder than code);
    e(s, rows): the running seconds that whole steps with a tree of s nodes (0: plain) at `rows`
    rows took beyond F and H (`update`); 0 for a shape not yet timed, so that every shape the
    forwards say pays is tried once.

    At batch 1 a forward over 1 + s tokens costs little more than over one, and trees pay. As the
    batch grows, F(rows, 1 + s) climbs towards (1 + s) F(rows, 1), and the policy stops
    speculating where the measurement says it stops paying. While it does not speculate, a cannot
    learn; so after `probe_every` plain steps it tries once the tree it would choose if the text
    were as predictable as held-out text (a = 1), and only where that tree would pay; each probe
    that does not bring speculation back doubles the wait for the next: probes take a vanishing
    share of the steps where speculation does not pay (the wait grows to 8 `probe_every` at most).
    prior: tokens promised, and as many accepted, before any step (a = 1 until the text says
    otherwise). costs: (F, H) as functions, instead of measuring them (`measure_costs`)."""

    def __init__(self, target: GPT, heads: MedusaHeads, sizes=(2, 4, 8, 16), max_rows: int = 16,
                 decay: float = 0.9, probe_every: int = 8, prior: float = 4.0,
                 costs: tuple[Callable, Callable] | None = None):
        device = target.lm_head.weight.device
        self.trees = {s: from_accuracies(heads.accuracy, s).to(device) for s in sizes}
        self.promise = {s: expected_accepted(from_accuracies(heads.accuracy, s), heads.accuracy.cpu()) for s in sizes}
        self.largest, self.decay, self.probe_every = max(sizes), decay, probe_every
        self.F, self.H = costs or measure_costs(target, heads, max_rows, [1 + s for s in (0, *sizes)])  # F(rows, t), H(rows)
        self.accepted = self.promised = prior  # a = 1: the held-out accuracies hold
        self.plain_steps, self.wait = 0, probe_every  # plain steps since the last probe, and before the next
        self.extra: dict[tuple[int, int], float] = {}  # (tree size, rows) -> running seconds beyond F and H
        self.started: float | None = None  # when the step now running was chosen

    def seconds(self, size: int, rows: int) -> float:
        """What a step costs: the measured forward (and heads), plus the running extra that whole
        steps of this tree size at this many rows took beyond it (`update`)."""
        return self.forward(size, rows) + self.extra.get((size, rows), 0.0)

    def forward(self, size: int, rows: int) -> float:
        return self.F(rows, 1) if size == 0 else self.H(rows) + self.F(rows, 1 + size)

    def rate(self, size: int, rows: int, tokens: float) -> float:
        """Tokens per second of the batch, a step with a tree of `size` nodes making `tokens` per row."""
        return rows * tokens / self.seconds(size, rows)

    def best(self, rows: int, a: float) -> int:
        """The tree size (0: a plain step) with the highest rate if a is the acceptance correction."""
        return max([0, *self.trees], key=lambda s: self.rate(s, rows, 1 + a * self.promise[s] if s else 1))

    def choose(self, rows: int) -> Tree | None:
        self.started = time.perf_counter()  # the step starts with its choice; `update` ends it
        best = self.best(rows, self.accepted / self.promised)
        if best:
            self.plain_steps, self.wait = 0, self.probe_every
            return self.trees[best]
        self.plain_steps += 1
        if self.plain_steps < self.wait:
            return None
        probe = self.best(rows, 1.0)  # would a tree pay if the text were as predictable as held-out text?
        if not probe:
            return None
        self.plain_steps, self.wait = 0, min(2 * self.wait, 8 * self.probe_every)
        return self.trees[probe]

    def update(self, accepted: list[int], tree: Tree | None, rows: int | None = None,
               seconds: float | None = None) -> None:
        """accepted: tokens each row that verified `tree` accepted in this step; seconds: the whole
        step's wall time at `rows` rows (given rows and no seconds, the time since `choose`: the
        loop only reports what happened, the policy keeps its own clock). A step is more than its forward: proposing,
        judging each row, compacting its cache. Those costs grow with the tree and the rows, not
        with the forward, so they weigh most where the forward is cheap (a small model on a CPU);
        F alone would make trees look cheaper than they are. The running extra of each shape
        (tree size, 0 for a plain step, and rows) corrects `seconds` as a corrects A. It is kept
        per shape, not per row: part of it is per step, and spread over rows, a plain step's extra
        at one row would make plain steps of sixteen look dear, and plain steps no longer chosen
        are never timed again to correct it."""
        if seconds is None and rows is not None and self.started is not None:
            seconds = time.perf_counter() - self.started
        if seconds is not None:
            size = 0 if tree is None else len(tree)
            shape, extra = (size, rows), seconds - self.forward(size, rows)
            old = self.extra.get(shape)  # the first step of a shape sets its extra; later ones move it
            self.extra[shape] = extra if old is None else self.decay * old + (1 - self.decay) * extra
        if tree is not None and accepted:
            size = len(tree)
            self.accepted = self.decay * self.accepted + sum(accepted)
            self.promised = self.decay * self.promised + len(accepted) * self.promise[size]
