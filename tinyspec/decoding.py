"""Decoding loops: each method is a generator of what every target forward produced, for one
sequence or for several at once (rows of a batch).

Plain autoregressive decoding yields one token per target forward; the speculative methods
(`speculative.py`, `medusa.py`, ...) yield several. Every loop is written once, for any number
of rows: batch 1 is its simplest case (as in gpt-fast, the batch is a dimension). Several rows
share each forward, and each row is judged alone, by the very rule it would meet alone, on its
own slice of the logits, its own row of the cache and its own random generator, so a row's
output does not depend on the rows beside it: greedy token for token, and sampled with exactly
the target's distribution.

What every loop shares lives here:

- `feed`: ONE forward for all live rows, each its own tokens (right-padded to the longest), at
  its own positions, under its own mask (causal, a tree's, lookahead's window);
- `prefill`: the prompts enter the cache and each row's first token is plain decoding's;
- `verify_trees`: the end of a step of every tree method (Medusa, EAGLE, prompt lookup;
  `tree.py`): one target forward over each row's root and proposed tree, an acceptance rule
  from `verify.py` for each row, and each row's cache compacted to its accepted path
  (`accept_tree`, which lookahead decoding, feeding more than a tree, calls itself);
- `leave`: rows that are done (end of text, their token budget, a full context) leave the
  batch, so the forwards that follow compute only for the rest.

A loop yields a dict {row id: Step} for the rows that took part in a forward, and is sent the
ids of the rows that are done. `run_batch` drives it for every row; `run` for one.

A loop calls the target through `feed`. At batch 1 a `forward(tokens, L) -> (logits, hidden)`
may stand in for it: `fastpath.py` makes fixed-shape ones that a CUDA graph can replay.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Generator, Protocol

import torch

from .kvcache import KVCache
from .model import GPT, causal_mask, prefix_mask
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
    size: int = 0  # what the step verified: a chain's k, a tree's nodes, the tokens a lookahead step fed (0: plain)


Produced = dict[int, Step]  # what one forward gave each row that took part, by row id
Steps = Generator[Produced, list[int] | None, None]  # yields Produced; is sent the ids of the rows that are done


class Chooser(Protocol):
    """What a loop may be handed instead of a fixed size: each step it chooses what to propose
    (a draft's k, a tree, ...) or nothing (None: a plain step), and hears what was accepted
    (`policy.Policy`, chapter 12)."""
    largest: int  # the most tokens a step it chooses may propose
    shapes: dict  # {size: shape}: every shape it may choose

    def choose(self, rows: int) -> object | None: ...

    def update(self, accepted: list[int], shape, rows: int | None = None) -> None: ...

    def reset(self) -> None: ...  # a new text begins


@dataclass
class Row:
    """One sequence of a batch: which prompt it is, its text so far, its own random generator (so
    it draws the numbers it would draw alone), and the last token chosen, not yet in the cache.
    A method's own row (`medusa.MedusaRow`, ...) adds what it carries from step to step."""
    id: int
    seq: list[int]  # the prompt; the draft-model loop appends its output
    generator: torch.Generator | None
    root: torch.Tensor | None = None


def new_rows(prompts: list[list[int]], generators: list, kind=Row, **state) -> list:
    """Row i for prompt i, with generators[i]; kind: the method's Row, state: its first values."""
    return [kind(i, list(p), g, **state) for i, (p, g) in enumerate(zip(prompts, generators))]


def ready(cache: KVCache | None, model: GPT, rows: int, size: int) -> KVCache:
    """`cache` emptied for `rows` rows, or a new one of `size` slots per row."""
    cache = cache if cache is not None else KVCache.for_model(model, size, rows)
    cache.reset(rows)
    return cache


def leave(rows: list, done, caches: list[KVCache], max_len: int) -> list:
    """The rows that go on: not done, and with room left in the context (the target's cache,
    caches[0], below max_len); every cache keeps just theirs."""
    done = done or ()
    go_on = [b for b, r in enumerate(rows) if r.id not in done and caches[0].lengths[b] < max_len]
    if len(go_on) < len(rows):
        for cache in caches:
            cache.select(go_on)
    return [rows[b] for b in go_on]


def feed(model: GPT, cache: KVCache, inputs: list[torch.Tensor], masks: list | None = None,
         offsets: list | None = None) -> list[torch.Tensor]:
    """ONE forward of `model` for all live rows of `cache`: row b feeds inputs[b] (n_b,) after its
    cached tokens, causally at the next positions, or (masks[b] not None) among themselves as
    masks[b] (n_b, n_b) allows, at positions length + offsets[b] (a tree: its mask and depths).
    Rows are padded at the end to the longest; the padding enters the cache like a rejected
    proposal and is dropped again, so each row advances by its own n_b. Returns the final
    hidden states of each row's own tokens, [(n_b, C)]."""
    if len(inputs) == 1:  # one row: nothing to pad, and the mask is the prefix's (or none, causally)
        L, mask = cache.lengths[0], None if masks is None else masks[0]
        if mask is None:
            return [model.hidden(inputs[0][None], cache=cache)[0]]
        return [model.hidden(inputs[0][None], positions=L + offsets[0], cache=cache, attn_mask=prefix_mask(mask, L))[0]]
    device = inputs[0].device
    n = torch.tensor([len(x) for x in inputs], device=device)  # (B,)
    T = int(n.max())
    x = torch.nn.utils.rnn.pad_sequence(inputs, batch_first=True)  # (B, T), padded with token 0
    t = torch.arange(T, device=device)
    pos = torch.where(t < n[:, None], t, 0)  # (B, T); padding at offset 0, the row's root: a position that exists
    new_mask = causal_mask(T, device).repeat(len(inputs), 1, 1)  # (B, T, T); nothing real sees the padding
    for b in range(len(inputs) if masks is not None else 0):
        if masks[b] is not None:
            new_mask[b, :len(inputs[b]), :len(inputs[b])] = masks[b]
            pos[b, :len(inputs[b])] = offsets[b]
    before = list(cache.lengths)
    h = model.hidden(x, positions=cache.positions(pos), cache=cache, attn_mask=cache.mask(new_mask))  # (B, T, C)
    for b, length in enumerate(before):
        cache.truncate(length + len(inputs[b]), b)  # drop the padding
    return [h[b, :len(inputs[b])] for b in range(len(inputs))]


def last(h: list[torch.Tensor]) -> torch.Tensor:
    """(B, C): each row's hidden state at its last fed token."""
    return torch.stack([x[-1] for x in h])


def sample_rows(p: torch.Tensor, rows: list, sampling: Sampling) -> list[torch.Tensor]:
    """One token per row from p (B, V), each drawn with the row's own generator. Greedy (p one-hot):
    every row's argmax at once, which is what `sample` would return."""
    if sampling.temperature == 0:
        return list(p.argmax(-1))
    return [sample(p[b], r.generator) for b, r in enumerate(rows)]


def prefill(target: GPT, cache: KVCache, rows: list, sampling: Sampling) -> list[torch.Tensor]:
    """The prompts enter the cache, and each row's first token (plain decoding) becomes its root.
    Returns each row's hidden states of its prompt [(P_b, C)]."""
    device = target.lm_head.weight.device
    h = feed(target, cache, [torch.tensor(r.seq, device=device) for r in rows])
    for r, root in zip(rows, sample_rows(sampling.probs(target.lm_head(last(h))), rows, sampling)):
        r.root = root
    return h


def first_steps(rows: list) -> Produced:
    """What the prefill gave: each row's first token, chosen by the target."""
    return {r.id: Step([int(r.root)], [TARGET]) for r in rows}


@torch.no_grad()
def autoregressive(model: GPT, prompts: list[list[int]], sampling: Sampling, generators: list, max_len: int,
                   cache: KVCache | None = None, forward: Callable | None = None) -> Steps:
    """Plain decoding: one target forward per token, for every row at once; the baseline every
    speedup is against. max_len: the context (cache slots) a row may fill; cache: reused if given
    (emptied first); forward: a one-token forward over it (batch 1; default: `feed`)."""
    cache = ready(cache, model, len(prompts), max_len)
    rows = new_rows(prompts, generators)
    prefill(model, cache, rows, sampling)
    done = yield first_steps(rows)
    while rows := leave(rows, done, [cache], max_len):
        if forward is not None:
            logits = forward(rows[0].root.view(1), cache.lengths[0])[0][:, -1]  # (1, V)
        else:
            logits = model.lm_head(last(feed(model, cache, [r.root.view(1) for r in rows])))  # (B, V)
        for r, token in zip(rows, sample_rows(sampling.probs(logits), rows, sampling)):
            r.root = token
        done = yield {r.id: Step([int(r.root)], [TARGET]) for r in rows}


def verify_trees(target: GPT, cache: KVCache, rows: list, proposals: list, accept, sampling: Sampling,
                 forward: Callable | None = None) -> list[tuple[Step, torch.Tensor]]:
    """Steps 2-4 of a tree method for every row at once: ONE target forward over each row's root
    and proposed tree (each node at position L + depth, seeing only its ancestors,
    `Tree.tree_mask`), then each row's rule and cache compaction (`accept_tree`).
    proposals[b]: (tokens (T,), tree, q or None), or None for a plain step (no proposal, or no
    room for one). forward(x, L): batch 1, a forward for this tree (e.g. a recorded one).
    Sets each row's next root; returns [(Step, hidden states of the row's accepted tokens, the root first)]."""
    before = list(cache.lengths)
    inputs = [r.root.view(1) if prop is None else torch.cat([r.root.view(1), prop[0]]) for r, prop in zip(rows, proposals)]
    if forward is not None and proposals[0] is not None:  # batch 1, the recorded forward
        logits, hidden = forward(inputs[0], before[0])
        all_logits, h = [logits[0]], [hidden[0]]
    else:
        h = feed(target, cache, inputs, [None if prop is None else prop[1].tree_mask for prop in proposals],
                 [None if prop is None else prop[1].depth for prop in proposals])
        all_logits = target.lm_head(torch.cat(h)).split([len(x) for x in h])  # one LM-head product for all rows
    out, plain = [], [b for b, prop in enumerate(proposals) if prop is None]
    if plain:  # the plain steps' tokens all at once, as plain decoding takes them
        p = sampling.probs(torch.stack([all_logits[b][0] for b in plain]))
        for b, root in zip(plain, sample_rows(p, [rows[b] for b in plain], sampling)):
            rows[b].root = root
    for b, (r, prop) in enumerate(zip(rows, proposals)):
        if prop is None:
            out.append((Step([int(r.root)], [TARGET]), h[b]))
            continue
        tokens, tree, q = prop
        step, r.root, path = accept_tree(cache, b, before[b], inputs[b], all_logits[b], tree, accept, sampling, q,
                                         r.generator)
        out.append((step, h[b][path]))
    return out


def accept_tree(cache: KVCache, row: int, L: int, x: torch.Tensor, logits: torch.Tensor, tree, accept,
                sampling: Sampling, q: torch.Tensor | None, generator, slots: torch.Tensor | None = None):
    """Steps 3-4 of a tree method for one row, once the forward has run: the rule judges the
    tree, the row's cache keeps the root and the accepted path, and the Step says what came out.
    Returns (the Step, the next root, the accepted path as indices into x).

    x (T+1,): the root, then the tree's nodes; logits (T+1, V): the target's after each of them;
    L: the row's cache length before the forward. slots (T+1,): where the forward put each of x
    in the cache, counted from L (default 0..T: root and tree were all it fed; lookahead
    decoding feeds more between them)."""
    path, nxt = accept(x, sampling.probs(logits), tree, q, generator)
    where = path if slots is None else slots[path]
    cache.keep((L + where).tolist(), row)  # the root (slot L) and the accepted nodes, compacted
    accepted = x[path[1:]].tolist()
    kind = CORRECTION if tree.children(int(path[-1])) else BONUS
    step = Step(accepted + [int(nxt)], [ACCEPTED] * len(accepted) + [kind], proposed=tree.max_depth, size=len(tree))
    return step, nxt, path


@dataclass
class Result:
    token_ids: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    target_steps: int = 0  # target forward passes, the prefill included
    proposed: int = 0  # tokens proposed by a draft model, heads or a lookup
    accepted: int = 0  # ... of which the target accepted
    rejections: int = 0  # steps that ended in a rejection (the rest accepted everything)
    sizes: Counter = field(default_factory=Counter)  # steps by the size they verified (Step.size; 0: plain)
    wall_s: float = 0.0
    prefill_s: float = 0.0  # ... of which the prompt's forward and the first token
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
        if any(self.sizes):  # steps by the size they verified (0: plain), if any step speculated
            out["steps_by_size"] = {str(size): count for size, count in sorted(self.sizes.items())}
        return out


def run_batch(steps: Steps, rows: int, max_new_tokens: int, stop_id: int | None = None,
              on_step: Callable[[Step], None] | None = None, device: torch.device | None = None) -> list[Result]:
    """Drive a decoding loop: collect each row's tokens until end of text, max_new_tokens or the
    end of its context (stop reason "context"; the loop itself ends the row). Ctrl-C ends the run
    too ("interrupted"), so the caller can still show what came. A row's wall_s is the time from
    the start until its last token: its latency, in a batch that started together.
    on_step(step): called with what each step added (to stream one row's text)."""
    results = [Result() for _ in range(rows)]
    ended = set()
    t0 = time.perf_counter()

    def now() -> float:  # a GPU runs ahead of the host: wait for it before reading the clock
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0
    try:
        produced = next(steps)
        for res in results:
            res.prefill_s = now()
        while True:
            done = []
            for row, step in produced.items():
                reason = take(results[row], step, max_new_tokens, stop_id, on_step)
                if reason:
                    results[row].stop_reason, results[row].wall_s = reason, now()
                    done.append(row)
            ended.update(done)
            if len(ended) == rows:
                break
            produced = steps.send(done)
    except StopIteration:
        reason = "context"  # the method ran out of context window
    except KeyboardInterrupt:  # Ctrl-C: every row keeps what it has
        reason = "interrupted"
    for row in set(range(rows)) - ended:
        results[row].stop_reason, results[row].wall_s = reason, now()
    return results


def run(steps: Steps, max_new_tokens: int, stop_id: int | None = None,
        on_step: Callable[[Step], None] | None = None, device: torch.device | None = None) -> Result:
    """`run_batch` for a loop of one row (one prompt)."""
    return run_batch(steps, 1, max_new_tokens, stop_id, on_step, device)[0]


def one_row(steps: Steps):
    """The Steps of a loop of one row, one per target forward (to read a loop step by step)."""
    for produced in steps:
        yield produced[0]


def take(res: Result, step: Step, max_new_tokens: int, stop_id: int | None, on_step) -> str | None:
    """Add one step's tokens to the result, up to the budget or end of text; returns the stop
    reason if the run ends here."""
    res.target_steps += 1
    res.proposed += step.proposed
    res.sizes[step.size] += 1
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
