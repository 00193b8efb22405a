"""How much to speculate, step by step: the one policy every method's loop can be handed.

A speculative step pays when the tokens it makes outweigh what it costs: a step that proposes s
tokens and accepts A of them on average makes 1 + A tokens (the correction or bonus included)
in C(s) seconds, where a plain step makes 1 in C(0). Both sides move. C depends on the device (a
forward over 17 tokens costs about one on a GPU, about two on a CPU core), on the batch (rows
that share a forward fill the same idle compute speculation would) and on the method's own work
(proposing, judging, compacting the cache: `ledger.py`). A depends on the text: code repeats
itself, prose less.

`Policy` holds a menu of *sizes*, each a shape the method's loop knows how to propose: a draft's
k, a Medusa tree of s nodes, an EAGLE-2 tree of s nodes (with its own top_k and depth), a lookup
of k tokens, a lookahead step feeding s tokens. Size 0 is a plain step, which every method can
take. Every step it chooses the size with the highest rate,

    rate(0) = rows / C(0, rows),     rate(s) = rows (1 + a A(s)) / C(s, rows),

from C measured on the device (`sizing.py` at batch 1, `auto.measure_costs` for batches) and A
measured on held-out text, and speculates only where the best rate beats the plain step's by a
`margin` (5%): the costs are measured to a few percent, and a size that merely ties with a plain
step wins nothing when it is right and loses when it is wrong. a is the running ratio of tokens
accepted to tokens promised (each step's counts weigh `decay` times the next's), so it follows
the text at hand: where a falls,
smaller sizes win, and below some point the plain step does. This is dynamic speculation length
in the sense of SpecDec++ (Huang et al. 2024) and DISCO (Mamou et al. 2024), with the threshold
not learned but read off measured costs, as SmartSpec (Liu et al. 2024) does for batches.

Costs from `sizing.py` are whole steps, the mean of many, measured on this device: the policy
trusts them. Costs that count only the forward (`auto.BatchPolicy`) are corrected by the clock
(`learn_costs`): each step is timed whole and its shape's cost moves towards what it took. Not for
whole-step costs: the first steps of a process run cold (allocations, the first forward of each
shape), and a cold step that set a size's cost would shut that size out for good, since a size
no longer chosen is never timed again.

While the policy takes plain steps, a cannot learn. So after `probe_every` plain steps it tries
once the size it would choose if the text were as predictable as held-out text (a = 1), and only
where that size would pay; each probe that does not bring speculation back doubles the wait, to
8 `probe_every` at most, so probes cost a vanishing share of the steps where speculation does not
pay. A plain step is a valid step of every method, so whatever the policy chooses the output is
the target's own (the tests hand loops a policy that chooses at random).
"""

from __future__ import annotations

import time
from typing import Callable, Hashable


MARGIN = 1.05  # how much more than a plain step's tokens/s a size must promise to be taken


class Policy:
    """promise: {size: A(size)}, the tokens a step of that size accepts on held-out text, the
    correction or bonus not counted; cost(size, rows): the measured seconds of a whole step (size
    0: a plain step); shapes: {size: what the loop proposes at that size} (a Tree, a tuple; by
    default the size itself). prior: tokens promised, and as many accepted, before any step.
    learn_costs: correct `cost` by each step's wall time (for costs that leave part of a step out)."""

    def __init__(self, promise: dict[int, float], cost: Callable[[int, int], float],
                 shapes: dict[int, Hashable] | None = None, decay: float = 0.9, probe_every: int = 8,
                 prior: float = 4.0, margin: float = MARGIN, learn_costs: bool = False):
        self.promise, self.cost = dict(promise), cost
        self.shapes = shapes if shapes is not None else {s: s for s in promise}
        self.size_of = {shape: s for s, shape in self.shapes.items()}
        self.largest = max(self.promise)
        self.decay, self.probe_every, self.prior, self.margin = decay, probe_every, prior, margin
        self.learn_costs = learn_costs
        self.accepted = self.promised = prior  # a = 1: held-out acceptance holds until the text says otherwise
        self.plain_steps, self.wait = 0, probe_every  # plain steps since the last probe, and before the next
        self.extra: dict[tuple[int, int], float] = {}  # (size, rows) -> running seconds beyond cost(size, rows)
        self.started: float | None = None  # when the step now running was chosen

    def reset(self) -> None:
        """A new text: acceptance back to the held-out promise (the measured costs stay)."""
        self.accepted = self.promised = self.prior
        self.plain_steps, self.wait = 0, self.probe_every

    @property
    def a(self) -> float:
        """The running ratio of tokens accepted to tokens promised."""
        return self.accepted / self.promised

    def seconds(self, size: int, rows: int) -> float:
        """What a step costs: the measured cost, plus (learning costs) the running extra that
        whole steps of this size at this many rows took beyond it (`update`)."""
        return self.cost(size, rows) + self.extra.get((size, rows), 0.0)

    def rate(self, size: int, rows: int, tokens: float) -> float:
        """Tokens per second of the batch, a step of `size` making `tokens` per row."""
        return rows * tokens / self.seconds(size, rows)

    def best(self, rows: int, a: float) -> int:
        """The size with the highest rate if a is the acceptance correction, or 0 (a plain step)
        unless that rate beats the plain step's by the margin."""
        size = max(self.promise, key=lambda s: self.rate(s, rows, 1 + a * self.promise[s]))
        return size if self.rate(size, rows, 1 + a * self.promise[size]) > self.margin * self.rate(0, rows, 1) else 0

    def may_speculate(self, rows: int) -> bool:
        """Whether any step of a new text, at up to `rows` rows, could speculate. With costs that do
        not learn, a starts at 1 and moves only on speculative steps, and a probe assumes a = 1: if
        no size pays at a = 1, every step is a plain step."""
        return self.learn_costs or any(self.best(r, 1.0) for r in range(1, rows + 1))

    def choose(self, rows: int = 1):
        """The shape of this step (None: a plain step)."""
        if self.learn_costs:
            self.started = time.perf_counter()  # the step starts with its choice; `update` ends it
        size = self.best(rows, self.a)
        if size:
            self.plain_steps, self.wait = 0, self.probe_every
        else:
            self.plain_steps += 1
            if self.plain_steps >= self.wait:
                size = self.best(rows, 1.0)  # would speculation pay if the text were as predictable as held-out text?
                if size:
                    self.plain_steps, self.wait = 0, min(2 * self.wait, 8 * self.probe_every)
        return self.shapes[size] if size else None

    def update(self, accepted: list[int], shape, rows: int | None = None, seconds: float | None = None) -> None:
        """accepted: tokens each row that proposed accepted in this step (the correction or bonus
        not counted); shape: what `choose` returned; seconds: the whole step's wall time at `rows`
        rows (given rows and no seconds, the time since `choose`: the loop only reports what
        happened, the policy keeps its own clock). Learning costs, the running extra of each
        (size, rows) corrects the measured cost as a corrects A: kept per shape, not per row, since
        part of a step's work is per step, and plain steps that are no longer chosen are never
        timed again."""
        size = 0 if shape is None else self.size_of[shape]
        if self.learn_costs:
            if seconds is None and rows is not None and self.started is not None:
                seconds = time.perf_counter() - self.started
            if seconds is not None:
                key, extra = (size, rows), seconds - self.cost(size, rows)
                old = self.extra.get(key)  # the first step of a shape sets its extra; later ones move it
                self.extra[key] = extra if old is None else self.decay * old + (1 - self.decay) * extra
        if size and accepted:
            self.accepted = self.decay * self.accepted + sum(accepted)
            self.promised = self.decay * self.promised + len(accepted) * self.promise[size]
