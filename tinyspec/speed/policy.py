"""How much to speculate, step by step: the one policy every method's loop can be handed.

A speculative step pays when the tokens it makes outweigh what it costs: a step that proposes s
tokens and accepts A of them on average makes 1 + A tokens (the correction or bonus included)
in C(s) seconds, where a plain step makes 1 in C(0). Both sides move. C depends on the device (a
forward over 17 tokens costs about one on a GPU, about two on a CPU core), on the batch (rows
that share a forward fill the same idle compute speculation would) and on the method's own work
(proposing, judging, compacting the cache: `ledger.py`). A depends on the text: code repeats
itself, prose less.

`Policy` holds a menu of *sizes*, each a size of the method as the method spells it (a draft's
k "4", a Medusa tree of "8" nodes, an EAGLE-2 tree "2,4,8", a lookup of "8" tokens, a lookahead
step "3,3,2"); no size (None) is a plain step, which every method can take. Every step the loop
(`decoding.decode`, the one place a size is chosen) asks it for the size with the highest rate,

    rate(plain) = rows / C(plain, rows),     rate(s) = rows (1 + a A(s)) / C(s, rows),

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
the target's own (the tests hand the loop a policy that chooses at random).
"""

from __future__ import annotations

import time
from typing import Callable


MARGIN = 1.05  # how much more than a plain step's tokens/s a size must promise to be taken


class Policy:
    """promise: {size: A(size)}, the tokens a step of that size accepts on held-out text, the
    correction or bonus not counted; cost(size, rows): the measured seconds of a whole step (size
    None: a plain step). prior: tokens promised, and as many accepted, before any step.
    learn_costs: correct `cost` by each step's wall time (for costs that leave part of a step out)."""

    def __init__(self, promise: dict[str, float], cost: Callable[[str | None, int], float], decay: float = 0.9,
                 probe_every: int = 8, prior: float = 4.0, margin: float = MARGIN, learn_costs: bool = False):
        self.promise, self.cost = dict(promise), cost
        self.decay, self.probe_every, self.prior, self.margin = decay, probe_every, prior, margin
        self.learn_costs = learn_costs
        self.accepted = self.promised = prior  # a = 1: held-out acceptance holds until the text says otherwise
        self.plain_steps, self.wait = 0, probe_every  # plain steps since the last probe, and before the next
        self.extra: dict[tuple, float] = {}  # (size, rows) -> running seconds beyond cost(size, rows)
        self.started: float | None = None  # when the step now running was chosen

    def reset(self) -> None:
        """A new text: acceptance back to the held-out promise (the measured costs stay)."""
        self.accepted = self.promised = self.prior
        self.plain_steps, self.wait = 0, self.probe_every

    @property
    def a(self) -> float:
        """The running ratio of tokens accepted to tokens promised."""
        return self.accepted / self.promised

    def seconds(self, size: str | None, rows: int) -> float:
        """What a step costs: the measured cost, plus (learning costs) the running extra that
        whole steps of this size at this many rows took beyond it (`update`)."""
        return self.cost(size, rows) + self.extra.get((size, rows), 0.0)

    def rate(self, size: str | None, rows: int, tokens: float) -> float:
        """Tokens per second of the batch, a step of `size` making `tokens` per row."""
        return rows * tokens / self.seconds(size, rows)

    def best(self, rows: int, a: float) -> str | None:
        """The size with the highest rate if a is the acceptance correction, or None (a plain step)
        unless that rate beats the plain step's by the margin."""
        size = max(self.promise, key=lambda s: self.rate(s, rows, 1 + a * self.promise[s]))
        return size if self.rate(size, rows, 1 + a * self.promise[size]) > self.margin * self.rate(None, rows, 1) else None

    def may_speculate(self, rows: int) -> bool:
        """Whether any step of a new text, at up to `rows` rows, could speculate. With costs that do
        not learn, a starts at 1 and moves only on speculative steps, and a probe assumes a = 1: if
        no size pays at a = 1, every step is a plain step."""
        return self.learn_costs or any(self.best(r, 1.0) is not None for r in range(1, rows + 1))

    def choose(self, rows: int = 1) -> str | None:
        """The size of this step (None: a plain step)."""
        if self.learn_costs:
            self.started = time.perf_counter()  # the step starts with its choice; `update` ends it
        size = self.best(rows, self.a)
        if size is not None:
            self.plain_steps, self.wait = 0, self.probe_every
        else:
            self.plain_steps += 1
            if self.plain_steps >= self.wait:
                size = self.best(rows, 1.0)  # would speculation pay if the text were as predictable as held-out text?
                if size is not None:
                    self.plain_steps, self.wait = 0, min(2 * self.wait, 8 * self.probe_every)
        return size

    def update(self, accepted: list[int], size: str | None, rows: int) -> None:
        """accepted: tokens each row that proposed accepted in this step (the correction or bonus
        not counted); size: what `choose` returned; rows: the rows that took the step. Learning
        costs, the step's wall time (since `choose`: the loop only reports what happened, the
        policy keeps its own clock) moves the running extra of (size, rows), which corrects the
        measured cost as a corrects A: kept per size, not per row, since part of a step's work is
        per step, and plain steps that are no longer chosen are never timed again."""
        if self.learn_costs and self.started is not None:
            key, extra = (size, rows), time.perf_counter() - self.started - self.cost(size, rows)
            old = self.extra.get(key)  # the first step of a size sets its extra; later ones move it
            self.extra[key] = extra if old is None else self.decay * old + (1 - self.decay) * extra
        if size is not None and accepted:
            self.accepted = self.decay * self.accepted + sum(accepted)
            self.promised = self.decay * self.promised + len(accepted) * self.promise[size]
