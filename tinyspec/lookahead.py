"""Lookahead decoding (Fu, Bailis, Stoica & Zhang, ICML 2024, arXiv:2402.02057): speculation
without a draft model, from the target's own Jacobi iterations.

Jacobi decoding guesses the next W tokens at once, feeds the guesses to the target, and takes
its output at each guess as the new guess for the token after it; repeated, this converges to
the greedy text, but slowly, because a guess is only right once everything before it is.
Lookahead decoding keeps what the iterations *write* instead: read along one column of the last
N - 1 iterations, each guess was made right after the one below it, so the column plus the
target's newest output is an n-gram the target itself wrote, even if its context was wrong.
Such n-grams go into a pool, and the pool's n-grams that start with the last accepted token (the
root) are verified like any draft.

One target forward per step carries two branches (the paper's Figure 2b; `lookahead_step`):

- the lookahead branch: a window of N - 1 levels (the last N - 1 iterations) by W columns.
  Level 0 holds the root and W - 1 guesses; the guess at level l, column c sits at position
  L + l + c and sees level 0 up to column c, then its own column up to level l (`window_mask`):
  a text of consecutive positions, whose last token it continues. The target's outputs at the
  top level are the next iteration's guesses.
- the verification branch: up to G n-grams from the pool that start with the root, merged into
  a trie below it (`trie`), each node at position L + depth seeing only its ancestors
  (`tree.py`). A rule from `verify.py` walks the trie: `greedy` at temperature 0, `pointmass`
  above it. The candidates are deterministic given the text so far, and the point-mass rule is
  exact for any such candidates, so the output is the target's, greedy or sampled.

Both branches see the cached prefix, neither sees the other, and the root is the ancestor of all
(one mask, `model.prefix_mask` around the two blocks). The cache then keeps the root and the
accepted path (`decoding.accept_tree`); the window's entries are dropped, and the window moves
on by one iteration (`slide`).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from typing import Callable

import torch

from .decoding import (TARGET, Chooser, Row, Step, Steps, accept_tree, feed, first_steps, leave, new_rows, prefill, ready,
                       sample_rows)
from .kvcache import KVCache
from .model import GPT
from .sampling import Sampling, sample
from .tree import Tree, tree_on
from .verify import tree_rule


class NgramPool:
    """n-grams the lookahead branch produced, by first token: for each token a, the last
    `size` distinct continuations (tuples of N - 1 tokens) of n-grams that start with a."""

    def __init__(self, size: int):
        self.size = size
        self.table: dict[int, dict[tuple[int, ...], None]] = {}  # a dict keeps insertion order: oldest first

    def add(self, ngram) -> None:
        recent = self.table.setdefault(int(ngram[0]), {})
        rest = tuple(ngram[1:])
        recent.pop(rest, None)  # seen again: now the most recent
        recent[rest] = None
        if len(recent) > self.size:
            del recent[next(iter(recent))]

    def guesses(self, token: int) -> list[tuple[int, ...]]:
        """The continuations of `token`, most recent first."""
        return list(reversed(self.table.get(token, {})))


def trie(continuations) -> tuple[list[int], tuple[int, ...]]:
    """Merge token sequences into one tree below the root: shared prefixes become one path, so
    siblings carry distinct tokens and no node is verified twice. Returns (the nodes' tokens,
    their parents), in topological order.

    Example: (a, b, c), (a, b, d), (e, f, g) -> tokens [a, b, c, d, e, f, g],
    parents (-1, 0, 1, 1, -1, 4, 5):   root ─ a ─ b ─ c
                                            │       └ d
                                            └ e ─ f ─ g"""
    tokens, parents, node = [], [], {}
    for sequence in continuations:
        parent = -1
        for t in sequence:
            if (parent, t) not in node:
                node[parent, t] = len(tokens)
                tokens.append(t)
                parents.append(parent)
            parent = node[parent, t]
    return tokens, tuple(parents)


@functools.lru_cache(maxsize=64)
def window_mask(levels: int, W: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The lookahead branch's (levels * W, levels * W) attention mask and (levels * W,) position
    offsets, for the window flattened level by level (index l * W + c; index 0 is the root).

    Guess (l, c) sits at offset l + c and sees (0, c') for c' <= c, and (l', c) for l' <= l.
    For levels = 2, W = 3 (rows attend to columns):

              (0,0) (0,1) (0,2) (1,0) (1,1) (1,2)    offset
        (0,0)   1     .     .     .     .     .        0      the root
        (0,1)   1     1     .     .     .     .        1
        (0,2)   1     1     1     .     .     .        2
        (1,0)   1     .     .     1     .     .        1
        (1,1)   1     1     .     .     1     .        2
        (1,2)   1     1     1     .     .     1        3"""
    level = torch.arange(levels, device=device).repeat_interleave(W)  # (levels * W,)
    column = torch.arange(W, device=device).repeat(levels)
    first_level_before = (level[None, :] == 0) & (column[None, :] <= column[:, None])
    own_column_below = (column[None, :] == column[:, None]) & (level[None, :] <= level[:, None])
    return first_level_before | own_column_below, level + column


def step_mask(levels: int, W: int, tree: Tree | None, device=None):
    """The attention among the n = levels * W + T tokens of one step: the window (index l * W + c),
    then the trie's T nodes. Returns the (n, n) mask, the (n,) position offsets (added to L),
    and the (T+1,) indices of the root and the trie's nodes (None when there is no trie).

    The two branches see nothing of each other; the root (index 0) is in both: a trie node sees
    the root and its own ancestors (`Tree.tree_mask`) at offsets 0 and its depth."""
    mask, offsets = window_mask(levels, W, device)
    if tree is None:
        return mask, offsets, None
    window, T = levels * W, len(tree)
    new_mask = torch.zeros(window + T, window + T, dtype=torch.bool, device=device)  # (n, n)
    new_mask[:window, :window] = mask
    rows = torch.tensor([0, *range(window, window + T)], device=device)  # (T+1,): the root, then the nodes
    new_mask[rows[:, None], rows] = tree.tree_mask
    return new_mask, torch.cat([offsets, tree.depth[1:]]), rows


def step_inputs(grid: list[list[int]], trie_tokens: list[int], tree: Tree | None, device):
    """What one step feeds: the tokens x (n,) of the window and the trie, and from `step_mask` the
    mask among them, their position offsets and the indices of the root and the trie's nodes."""
    x = torch.tensor([t for row in grid for t in row] + trie_tokens, device=device)  # (window + T,)
    return (x, *step_mask(len(grid), len(grid[0]), tree, device))


def step_outputs(target: GPT, cache: KVCache, row: int, L: int, grid: list[list[int]], x: torch.Tensor,
                 h: torch.Tensor, at, tree, accept, sampling: Sampling, generator) -> tuple[Step, torch.Tensor, list[int]]:
    """The rest of a lookahead step once ONE forward has given h (n, C), the hidden states of x,
    the window and the trie of `row`: the top level's outputs (the next iteration's guesses (W,)),
    then the trie judged by the rule and the row's cache (length L before the forward) compacted
    to the accepted path, or without a trie the root's own step. at (T+1,): the indices in x of
    the root and the trie's nodes (`step_mask`). Returns (the Step, the next root, the outputs)."""
    window, W = len(grid) * len(grid[0]), len(grid[0])
    top = target.lm_head(h[window - W:window]).argmax(-1).tolist()  # each top guess's successor
    if tree is None:  # nothing to verify: the root's own step
        root = sample(sampling.probs(target.lm_head(h[0])), generator)
        cache.truncate(L + 1, row)  # keep the root, drop the window
        return Step([int(root)], [TARGET]), root, top
    # verify the trie: logits only for the rows of the root and the nodes (the window's are never needed)
    logits = target.lm_head(h[at])  # (T+1, V)
    out, root, _ = accept_tree(cache, row, L, x[at], logits, tree, accept, sampling, None, generator, at)
    return out, root, top


def slide(grid: list[list[int]], top: list[int], root: int, ngram: int, fill: Callable[[], int]) -> list[list[int]]:
    """The window for the next step: one Jacobi iteration on, with `root` at (0, 0).

    While fewer than N - 1 levels exist, the top level's outputs become a new level; output
    (l, c) guesses the token after (l, c), so every level moves one column left and the right
    end gets a `fill()`. Once the window is full, level 0 (the oldest iteration) is forgotten,
    every level moves down one and the outputs become the top level. Either way, after a step
    that produced one token (the root moved one position on), every guess still sits at the
    position it was made for (L + level + column).

    When a step produces more (a accepted + 1), the window still moves one iteration, not
    a + 1 columns (as the authors' code does): the guesses then sit a positions behind the text,
    but the pool keeps n-grams by their tokens, not their positions, and the guesses keep
    maturing instead of restarting from filler (on the shipped model this gives a higher tau:
    walkthrough exercise)."""
    if len(grid) < ngram - 1:
        rows = [row[1:] + [fill()] for row in grid + [top]]
    else:
        rows = [list(row) for row in grid[1:] + [top]]
    rows[0][0] = root
    return rows


def filler(prompt: list[int]) -> Callable[[], int]:
    """A new column's first guess: any prompt token (the iterations fix it), from a fixed seed."""
    rng = random.Random(0)
    return lambda: rng.choice(prompt)


@dataclass
class LookaheadRow(Row):
    grid: list[list[int]] = field(default_factory=list)  # the window of Jacobi guesses, grid[0][0] the root,
    pool: NgramPool | None = None  # ... the n-grams they wrote,
    fill: Callable[[], int] | None = None  # ... and where a new column's first guess comes from


@torch.no_grad()
def lookahead(target: GPT, prompts: list[list[int]], sampling: Sampling, generators: list, max_len: int,
              window: int = 3, ngram: int = 3, guesses: int | Chooser = 2, rule: str = "greedy",
              cache: KVCache | None = None,
              pools: list[NgramPool] | None = None) -> Steps:
    """Lookahead decoding of every row (prompt) at once; yields what each target forward gave
    each row (`decoding.py`). Each row has its own window, n-gram pool and trie, all fed in ONE
    target forward, each under its own mask (`step_mask`).

    window W, ngram N, guesses G as in the paper: a step feeds W (N - 1) window tokens and a
    trie of at most G (N - 1) nodes. rule: a name from `verify.RULES` that needs no draft
    distribution (greedy at temperature 0, pointmass for exact sampling). guesses may be a
    `decoding.Chooser` instead, choosing G (or None: a plain step) every step. cache: reused if
    given (emptied first). pools: each row's `NgramPool` to start from (default: empty ones); they
    are updated."""
    accept, device, n_ctx = tree_rule(rule, draft_free=True), target.lm_head.weight.device, target.config.n_ctx
    policy = None if isinstance(guesses, int) else guesses
    most = max(policy.shapes.values()) if policy else guesses
    size = (window + most) * (ngram - 1)  # the most tokens one step feeds
    cache = ready(cache, target, len(prompts), max_len + size + 1)
    rows = new_rows(prompts, generators, LookaheadRow)
    prefill(target, cache, rows, sampling)
    for r in rows:
        r.pool, r.fill = pools[r.id] if pools else NgramPool(most), filler(r.seq)
        r.grid = [[int(r.root)] + [r.fill() for _ in range(window - 1)]]
    done = yield first_steps(rows)
    while rows := leave(rows, done, [cache], max_len):
        chosen = policy.choose(len(rows)) if policy else guesses  # None: a plain step
        before, inputs, tries = list(cache.lengths), [], []
        for b, r in enumerate(rows):
            grid, L = r.grid, cache.lengths[b]
            trie_tokens, parents = trie(r.pool.guesses(int(r.root))[:chosen]) if chosen else ([], ())
            deepest = max(len(grid) + window - 2, ngram - 1 if trie_tokens else 0)  # the largest position offset
            if chosen is None or L + len(grid) * window + len(trie_tokens) > max_len or L + deepest >= n_ctx:
                inputs.append((r.root.view(1), None, None, None))  # a plain step, chosen or for want of room
                tries.append(None)
            else:
                tries.append(tree_on(parents, device) if trie_tokens else None)
                inputs.append(step_inputs(grid, trie_tokens, tries[-1], device))
        h = feed(target, cache, [x[0] for x in inputs], [x[1] for x in inputs], [x[2] for x in inputs])  # ONE forward
        plain = [b for b, x in enumerate(inputs) if x[1] is None]
        if plain:  # the plain steps' tokens all at once, as plain decoding takes them
            p = sampling.probs(target.lm_head(torch.stack([h[b][0] for b in plain])))
            for b, root in zip(plain, sample_rows(p, [rows[b] for b in plain], sampling)):
                rows[b].root = root
        produced = {}
        for b, r in enumerate(rows):
            x, new_mask, _, at = inputs[b]
            if new_mask is None:  # the plain step; the window stays, but its root is always the newest token
                r.grid[0][0], produced[r.id] = int(r.root), Step([int(r.root)], [TARGET])
                continue
            produced[r.id], r.root, top = step_outputs(target, cache, b, before[b], r.grid, x, h[b], at, tries[b],
                                                       accept, sampling, r.generator)
            produced[r.id].size = (window + chosen) * (ngram - 1)  # what a step of this G feeds, at most
            if len(r.grid) == ngram - 1:  # a full window: each column, topped by its output, is an n-gram
                for c in range(window):
                    r.pool.add([row[c] for row in r.grid] + [top[c]])
            r.grid = slide(r.grid, top, int(r.root), ngram, r.fill)
        if policy:  # what every row that took a lookahead step accepted; the policy times the step itself
            policy.update([len(produced[r.id].tokens) - 1 for r, x in zip(rows, inputs) if x[1] is not None], chosen,
                          len(rows))
        done = yield produced
