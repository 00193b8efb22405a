"""Decoding: plain decoding, and the ONE step loop that every speculative method runs, for one
sequence or for several at once (rows of a batch).

Every method is the same loop. A step of it:

1. choose the step's size (a draft's k, a tree's nodes, ...): the fixed one, or a policy's
   choice (`speed/policy.py`); no size is a plain step. This is the only place a size is chosen;
2. propose: the method's `Proposer` gives each row a tree of tokens below its root (the last
   token chosen, not yet in the cache), or nothing (a plain step for that row);
3. verify: ONE target forward over every row's root and tree, each node at position L + depth,
   seeing only its ancestors (`Tree.tree_mask`);
4. accept: each row's rule (`verify.py`) keeps a path of the tree and gives the target's own next
   token; the row's cache keeps the root and that path, compacted (`KVCache.keep`);
5. the proposer updates what it keeps between steps (a draft's cache, EAGLE's features, a
   lookup's index); what each row got is yielded, and rows that are done leave: their tokens
   reached `max_new_tokens`, the end of text, or the end of the context.

Plain decoding is the loop with a proposer that proposes nothing: every step is step 3 over the
root alone. A speculative method's plain steps are exactly those steps, so a method never pays
for machinery it did not use in a step.

The batch is a dimension, as in gpt-fast: several rows share each forward, and each row is judged
alone, by the very rule it would meet alone, on its own slice of the logits, its own row of the
cache and its own random generator, so a row's output does not depend on the rows beside it
(greedy: token for token; sampled: exactly the target's distribution).

The loop yields {row id: Step} for the rows that took part in a forward; whoever runs it prints or
counts them (`results.py` counts each row's steps into its Result).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, NamedTuple

import torch

from .kvcache import KVCache, feed
from .model import GPT
from .sampling import Sampling, sample
from .tree import Tree
from .verify import RULES, SAMPLED

# Where each produced token came from (Step.sources):
TARGET = "target"  # chosen by the target itself (plain decoding)
ACCEPTED = "accepted"  # proposed (by a draft model, heads, a lookup) and accepted by the target
CORRECTION = "correction"  # sampled by the target after it rejected a proposal
BONUS = "bonus"  # sampled by the target after it accepted every proposal on its path
PLAIN = "0"  # the size of a plain step


@dataclass
class Step:
    """What one target forward produced for a row: tokens, where each came from, how many tokens
    the proposal could add (0 for a plain step, k for a chain, a tree's depth: accepted / proposed
    is the fraction of proposed positions filled) and how many it accepted, the size the step
    verified, how many tokens the row fed the forward (1 for a plain step: the root; a step's cost
    grows with it), and why the row stops here, if it does ("length", "eot" or "context": the
    tokens end at the budget, before the end-of-text token, or with the context full)."""
    tokens: list[int]
    sources: list[str]
    proposed: int = 0
    size: str = PLAIN
    fed: int = 1
    accepted: int = 0
    stop: str | None = None


Produced = dict[int, Step]  # what one forward gave each row that took part, by row id
Steps = Iterator[Produced]


@dataclass
class Row:
    """One sequence of a batch: which prompt it is, its text, its own random generator (so it draws
    the numbers it would draw alone), and whatever its method carries from step to step."""
    id: int
    text: list[int]  # the prompt and every token chosen since; the last, the root, is not in the cache yet
    generator: torch.Generator | None
    root: torch.Tensor | None = None  # text[-1], on the device
    state: object = None  # the proposer's (EAGLE's pending features, a lookup's index, ...)
    made: int = 0  # new tokens so far


class Fed(NamedTuple):
    """What a row feeds the verifying forward: x (n,), the mask among them (n, n) (None: the
    root alone, or causal), their position offsets after the cache (n,), and `at` (T+1,), where
    the root and the nodes are in x (None: x is the root, then the nodes)."""
    x: torch.Tensor
    mask: torch.Tensor | None = None
    offsets: torch.Tensor | None = None
    at: torch.Tensor | None = None


@dataclass
class Proposal:
    """What a proposer offers one row for one step: the T tokens of a tree below the row's root,
    and q (T+1, V), the distribution each node was drawn from (row a: node a's; row 0 unused), for
    the rules that need it; None for tokens that were chosen, not drawn. fed: what the row feeds
    when it is more than the root and the tree (lookahead's window beside them). tree None (no
    tokens to judge): the row's next token is taken as plain decoding takes it."""
    tokens: torch.Tensor
    tree: Tree | None
    q: torch.Tensor | None = None
    fed: Fed | None = None


@dataclass
class Verified:
    """A row's step once verified: the Step, the target's hidden states of every token fed
    (n, C), and `kept`, the indices (into what was fed) of the root and of the accepted tokens."""
    step: Step
    hidden: torch.Tensor
    kept: torch.Tensor


class Proposer:
    """What the loop asks of a method (`methods/base.py: Method` adds what the commands ask).
    This base proposes nothing: it is plain decoding. room(shape): the most tokens a step of that
    shape feeds beyond the root; rule(name): the acceptance rule for its proposals; start (a
    batch's rows begin, with the target's hidden states of each prompt), propose (a `Proposal`
    or None per row), update (what it keeps, once the target has judged). n_ctx: a context limit
    of its own (a draft model's); caches: KVCaches with a row per live row, narrowed as rows leave."""
    name = "ar"
    n_ctx: int | None = None
    caches: tuple[KVCache, ...] = ()

    def room(self, shape) -> int:
        return 0

    def rule(self, name: str):
        return RULES[name]

    def start(self, rows: list[Row], hidden: list[torch.Tensor], slots: int) -> None:
        """hidden[b] (P_b, C): the target's hidden states of row b's prompt; slots: the cache slots
        a row may use (its context plus one step's room)."""

    def propose(self, rows: list[Row], shape, room: list[int], sampling: Sampling, sampled: bool) -> list:
        """Each row's Proposal for a step of `shape`, or None; room[b]: the deepest position
        offset row b may feed (the context's end). sampled: the rule needs nodes drawn from q."""
        return [None] * len(rows)

    def update(self, rows: list[Row], proposals: list, verified: list[Verified]) -> None:
        """After the target judged: row b's text already holds what it accepted (verified[b].step)."""


class Clock:
    """Where the loop's time goes, by part (`speed/ledger.py` keeps one); this one keeps nothing."""

    def part(self, name: str):
        return NOTHING


NOTHING = contextlib.nullcontext()  # one, reused: a plain step should not pay for a clock nobody reads
NO_CLOCK = Clock()


class Observer:
    """What the loop shows whoever watches it (`trace.py` draws every step of a run); this one
    watches nothing, so the loop does no work for it. rule(accept): the rule the rows are judged
    by (a watcher wraps it to hear its coins); verified(...): a row's step, once judged."""

    def rule(self, accept):
        return accept

    def verified(self, row: Row, proposal, fed: Fed, p: torch.Tensor, path: torch.Tensor, before: int,
                 step: Step) -> None:
        """p (n, V): the target's distribution after the root and each node; path: the indices kept;
        before: the row's cache length when the step began (the root goes to that slot)."""


NO_OBSERVER = Observer()


# ---- the parts of a step ----------------------------------------------------------------------

def last(h: list[torch.Tensor]) -> torch.Tensor:
    """(B, C): each row's hidden state at its last fed token."""
    return torch.stack([x[-1] for x in h])


def sample_rows(p: torch.Tensor, rows: list[Row], sampling: Sampling) -> list[torch.Tensor]:
    """One token per row from p (B, V), each drawn with the row's own generator. Greedy (p one-hot):
    every row's argmax at once, which is what `sample` would return."""
    if sampling.temperature == 0:
        return list(p.argmax(-1))
    return [sample(p[b], r.generator) for b, r in enumerate(rows)]


def ended(step: Step, row: Row, max_new_tokens: int, stop_id: int | None, full: bool) -> Step:
    """The step as its row keeps it: cut before the end-of-text token, or at the budget, and the
    reason the row stops here (`Step.stop`), if it does: "eot", "length", or "context" (`full`)."""
    room = max_new_tokens - row.made
    if stop_id in step.tokens[:room]:  # the end of text within the budget (past it, the budget ends first)
        keep, step.stop = step.tokens.index(stop_id), "eot"
    elif len(step.tokens) >= room:
        keep, step.stop = room, "length"
    else:
        keep, step.stop = len(step.tokens), "context" if full else None
    step.tokens, step.sources = step.tokens[:keep], step.sources[:keep]
    row.made += keep
    return step


def prefill(target: GPT, cache: KVCache, rows: list[Row], sampling: Sampling) -> list[torch.Tensor]:
    """The prompts enter the cache, and each row's first token (plain decoding) becomes its root.
    Returns each row's hidden states of its prompt [(P_b, C)]."""
    device = target.lm_head.weight.device
    h = feed(target, cache, [torch.tensor(r.text, device=device) for r in rows])
    for r, root in zip(rows, sample_rows(sampling.probs(target.lm_head(last(h))), rows, sampling)):
        r.root = root
        r.text.append(int(root))
    return h


def verify(target: GPT, cache: KVCache, rows: list[Row], proposals: list, rule, sampling: Sampling, size: str,
           clock: Clock = NO_CLOCK, observer: Observer = NO_OBSERVER) -> list[Verified]:
    """Steps 3-4 for every row at once: ONE target forward over each row's root and proposal, then
    each row's rule and its cache's compaction. A row without a proposal takes a plain step: its
    token comes from the target's distribution after its root, as plain decoding takes it (all
    such rows in one draw). Sets each row's next root."""
    before = list(cache.lengths)
    fed = [Fed(r.root.view(1)) if p is None else p.fed or Fed(torch.cat([r.root.view(1), p.tokens]), p.tree.tree_mask,
                                                                   p.tree.depth) for r, p in zip(rows, proposals)]
    with clock.part("target"):
        h = feed(target, cache, [f.x for f in fed], [f.mask for f in fed], [f.offsets for f in fed])
        wanted = [x if f.at is None else x[f.at] for x, f in zip(h, fed)]  # the root's and the nodes' only
        p = sampling.probs(target.lm_head(torch.cat(wanted))).split([len(x) for x in wanted])  # one LM-head product
    plain = [b for b, prop in enumerate(proposals) if prop is None or prop.tree is None]
    tokens = dict(zip(plain, sample_rows(torch.stack([p[b][0] for b in plain]), [rows[b] for b in plain], sampling)
                      if plain else ()))  # the plain steps' tokens all at once, as plain decoding takes them
    out = []
    for b, (r, prop, f) in enumerate(zip(rows, proposals, fed)):
        if b in tokens:  # a plain step (that fed lookahead's window too, maybe: the cache keeps the root)
            path, r.root = torch.zeros(1, dtype=torch.long, device=f.x.device), tokens[b]
            step = Step([int(r.root)], [TARGET], size=PLAIN if prop is None else size, fed=len(f.x))
        else:
            with clock.part("rule"):
                path, r.root = rule(f.x if f.at is None else f.x[f.at], p[b], prop.tree, prop.q, r.generator)
            accepted = f.x[path[1:] if f.at is None else f.at[path[1:]]].tolist()
            kind = CORRECTION if prop.tree.child_lists[int(path[-1])] else BONUS
            step = Step(accepted + [int(r.root)], [ACCEPTED] * len(accepted) + [kind], prop.tree.max_depth, size,
                        len(f.x), len(accepted))
        kept = path if f.at is None else f.at[path]
        if prop is not None:  # (a plain step fed its root alone, and the cache holds just that)
            with clock.part("cache"):
                cache.keep([before[b] + i for i in kept.tolist()], b)  # the root (slot L) and the accepted path, compacted
        observer.verified(r, prop, f, p[b], path, before[b], step)
        out.append(Verified(step, h[b], kept))
    return out


# ---- THE loop ---------------------------------------------------------------------------------

@torch.no_grad()
def decode(target: GPT, proposer: Proposer, prompts: list[list[int]], sampling: Sampling, generators: list,
           max_new_tokens: int, stop_id: int | None = None, shapes: dict | None = None, policy=None,
           rule: str = "greedy", cache: KVCache | None = None, clock: Clock = NO_CLOCK,
           observer: Observer = NO_OBSERVER) -> Steps:
    """Decode every row (prompt i is row i, sampling with generators[i]) with `proposer`, each up
    to max_new_tokens new tokens or its end of text (`stop_id`), or the end of its context;
    yields what each target forward gave each row (`Step`, which says when its row stops).

    shapes: {size: shape} the steps may take: without a policy, the one entry is every step's
    size (none: plain decoding); policy: chooses a size of `shapes` (or a plain step) every step
    and hears what was accepted (`speed/policy.py`). rule: the acceptance rule's name
    (`verify.RULES`, as the proposer reads it: `Proposer.rule`). cache: the target's, reused if
    given (emptied first), with room for the context and one step. clock: times the parts of each
    step (`speed/ledger.py`); observer: sees each row's rule and what it judged (`trace.py`).
    (The same step written for the device: `recorded.py`.)"""
    shapes = shapes or {}
    fixed = next(iter(shapes), None) if policy is None else None
    n_ctx = min(target.config.n_ctx, proposer.n_ctx or target.config.n_ctx)
    slots = n_ctx + max((proposer.room(s) for s in shapes.values()), default=0) + 1
    if cache is None:  # a prompt may be as long as the target's context, where the proposer's is shorter
        cache = KVCache.for_model(target, slots + target.config.n_ctx - n_ctx, len(prompts))
    cache.reset(len(prompts))
    rows = [Row(i, list(p), g) for i, (p, g) in enumerate(zip(prompts, generators))]
    hidden = prefill(target, cache, rows, sampling)
    if shapes:  # (a loop that never proposes never starts its proposer: plain decoding pays for nothing more)
        with clock.part("propose"):
            proposer.start(rows, hidden, slots)
    accept, sampled = observer.rule(proposer.rule(rule)), rule in SAMPLED  # sampled: the rule needs nodes drawn from q
    steps = {r.id: ended(Step([int(r.root)], [TARGET]), r, max_new_tokens, stop_id, L >= n_ctx)
             for r, L in zip(rows, cache.lengths)}
    while rows:
        yield steps
        go_on = [b for b, r in enumerate(rows) if steps[r.id].stop is None]  # the rows that are done leave
        if len(go_on) < len(rows):
            for c in (cache, *proposer.caches):
                c.select(go_on)
            rows = [rows[b] for b in go_on]
        if not rows:
            return
        size = policy.choose(len(rows)) if policy is not None else fixed  # 1. the only place a size is chosen
        proposals = [None] * len(rows)
        if size is not None:  # 2. propose, each row within its own room (positions up to the context's end)
            with clock.part("propose"):
                proposals = proposer.propose(rows, shapes[size], [n_ctx - 1 - L for L in cache.lengths], sampling,
                                             sampled)
        verified = verify(target, cache, rows, proposals, accept, sampling, size, clock, observer)  # 3-4
        for r, v in zip(rows, verified):
            r.text += v.step.tokens
        if shapes:  # 5. what the proposer keeps between steps (a plain step's tokens too: its index, its features)
            with clock.part("propose"):
                proposer.update(rows, proposals, verified)
        if policy is not None:  # what every row that proposed accepted; the policy keeps its own clock
            policy.update([v.step.accepted for v, prop in zip(verified, proposals) if prop is not None], size,
                          len(rows))
        steps = {r.id: ended(v.step, r, max_new_tokens, stop_id, L >= n_ctx)
                 for r, v, L in zip(rows, verified, cache.lengths)}


def autoregressive(target: GPT, prompts: list[list[int]], sampling: Sampling, generators: list,
                   max_new_tokens: int, stop_id: int | None = None, cache: KVCache | None = None) -> Steps:
    """Plain decoding: one target forward per token, for every row at once; the baseline every
    speedup is against. The loop with a proposer that proposes nothing."""
    return decode(target, Proposer(), prompts, sampling, generators, max_new_tokens, stop_id, cache=cache)
