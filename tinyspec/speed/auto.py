"""Speculation or batching, chosen per step: the policy of `--size auto` for a batch.

A forward of a small model on one sequence leaves most of the hardware idle: it reads every
weight to compute a handful of tokens. Speculative decoding fills that idle compute with guesses
(one forward scores k proposals as cheaply as one token). Batching fills it with other
sequences: the loop runs any number of rows (`decoding.decode`), one forward advancing all of
them. Both spend the same spare capacity, so at a large enough batch a forward is no longer
nearly free to widen, and speculation, which multiplies the tokens of every forward by 1 + k or
1 + T, starts to cost more than it yields. The benchmark (`python -m tinyspec bench
--batch-sizes 1,2,4,8,16`) measures where.

Whether to speculate thus depends on the batch's size, and on the device: at one row a forward
over 1 + s tokens costs little more than over one, and a Medusa tree pays; at sixteen rows it
does not. `BatchPolicy` measures the costs of forwards of every shape once, then decides every
step, from the measured costs and what the text at hand accepts, whether to speculate or take a
plain step: `policy.Policy`, the policy every method's loop can be handed, with costs measured for
every batch size. A method takes part by predicting what each of its sizes accepts
(`Method.batch_sizes`, Medusa from its heads' accuracies) and offering a call that proposes for
any number of rows (`Method.proposing`).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..methods.base import Method
from ..model import GPT
from .policy import Policy
from .sizing import size
from .timing import forward_call, interleaved_medians


@torch.no_grad()
def measure_costs(target: GPT, proposing: Callable[[int], Callable], max_rows: int, widths: list[int],
                  context: int = 128) -> tuple[Callable, Callable]:
    """F(rows, t): the seconds of a target forward over rows x t new tokens (t in `widths`), each
    row after `context` cached tokens; H(rows): of the method's proposing for rows rows
    (`proposing(rows)` makes that call). Measured at rows = 1, 2, 4, ..., max_rows, all shapes in
    turn (`timing.interleaved_medians`), and linear in between."""
    device = target.lm_head.weight.device
    grid = sorted({2 ** i for i in range(max_rows.bit_length()) if 2 ** i <= max_rows} | {max_rows})
    calls = {(r, t): forward_call(target, r, t, context) for r in grid for t in widths}
    calls |= {(r, 0): (proposing(r), None) for r in grid}
    seconds = interleaved_medians(calls, device)  # keys (rows, 0): the proposing

    def between(rows: int, t: int) -> float:
        hi = next((r for r in grid if r >= rows), grid[-1])
        lo = max([r for r in grid if r <= rows], default=hi)
        a, b = seconds[lo, t], seconds[hi, t]
        return a if hi == lo else a + (b - a) * (rows - lo) / (hi - lo)
    return (lambda rows, t: between(rows, t)), (lambda rows: between(rows, 0))


class BatchPolicy(Policy):
    """A method at `--size auto` in a batch: every step, a step of one of its sizes, or a plain
    step, whichever gives the batch the most tokens per second at its current size
    (`policy.Policy`), with

        C(plain, rows) = F(rows, 1),     C(s, rows) = H(rows) + F(rows, 1 + room(s))

    F(rows, t): the measured seconds of a target forward over rows x t tokens; H(rows): of the
    method's proposing for rows rows; A(s): the tokens a step of size s accepts, as the method
    predicts from held-out data (`Method.batch_sizes`: Medusa's from its heads' accuracies).

    At batch 1 a forward over 1 + s tokens costs little more than over one, and speculating pays.
    As the batch grows, F(rows, 1 + s) climbs towards (1 + s) F(rows, 1), and the policy stops
    speculating where the measurement says it stops paying. sizes: of the method's, the ones to
    choose from (default: all); costs: (F, H) as functions, instead of measuring them."""

    def __init__(self, target: GPT, method: Method, sizes=None, max_rows: int = 16, decay: float = 0.9,
                 probe_every: int = 8, prior: float = 4.0, costs: tuple[Callable, Callable] | None = None):
        promise = {s: a for s, a in method.batch_sizes().items() if sizes is None or s in sizes}
        self.width = {s: 1 + method.room(method.shape(s)) for s in promise}  # tokens a step of the size feeds
        self.F, self.H = costs or measure_costs(target, method.proposing, max_rows, sorted({1, *self.width.values()}))
        super().__init__(promise, self.step_cost, decay, probe_every, prior, learn_costs=True)  # F leaves work out

    def step_cost(self, size: str | None, rows: int) -> float:
        return self.F(rows, 1) if size is None else self.H(rows) + self.F(rows, self.width[size])


def policy_for(target: GPT, proposer: Method, rule: str | None, sampling, prompts: list[list[int]], rows: int = 1,
               remeasure: bool = False, progress: Callable[[str], None] | None = None):
    """The policy of `--size auto` for batches of up to `rows` rows: for a method that predicts what
    its sizes accept (Medusa), `BatchPolicy` in a batch (forward costs measured at every batch size,
    which decide where batching has spent the idle compute speculation would use); every other, and
    every method at batch 1, is sized by whole steps measured on this device (`sizing.py`). Returns
    (the policy, the Sizing or None, one line saying what was chosen and why)."""
    if rows > 1 and proposer.batch_sizes() is not None:
        policy = BatchPolicy(target, proposer, max_rows=rows)
        return policy, None, (f"{proposer.name} --size auto: a step of size {', '.join(policy.promise)} or a plain "
                              f"step, each step, from forward costs measured now for batches of up to {rows} rows")
    sizing = size(target, proposer, rule, prompts, sampling, remeasure=remeasure, progress=progress)
    return sizing.policy(), sizing, sizing.describe()
