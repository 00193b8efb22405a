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

One target forward per step carries two branches (the paper's Figure 2b; `Lookahead.propose`
lays them out, the loop feeds them, `Lookahead.update` reads the window's outputs):

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
(one mask, `step_mask`). The cache then keeps the root and the accepted path (`decoding.verify`);
the window's entries are dropped, and the window moves on by one iteration (`slide`).
"""

from __future__ import annotations

import functools
import random
from typing import Callable

import torch

from ..decoding import Fed, Proposal, Row, Verified
from ..model import GPT
from ..sampling import Sampling
from ..tree import Tree, tree_on
from .base import Method
from .ngrams import trie


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


class Window:
    """A row's lookahead branch: the window of Jacobi guesses (grid[0][0] the root), the n-grams
    they wrote, and where a new column's first guess comes from."""

    def __init__(self, prompt: list[int]):
        self.grid: list[list[int]] = []  # made at the first step, for the step's W and N
        self.ngram = 0  # N of the window's steps
        self.pool, self.fill = NgramPool(32), filler(prompt)  # 32: the most guesses a step verifies (G)


class Lookahead(Method):
    """The window's n-grams that start with the root, verified beside the next Jacobi iteration."""
    name = "lookahead"
    chapter = 10.2  # of the walkthrough
    summary = "n-grams from the target's own Jacobi iterations, made and verified in the same pass"
    proposes = "fixed tokens"
    default_size = "3,3,2"
    sizes = ("3,3,1", "3,3,2", "3,3,4")
    size_format = (("W", 1, 32, "positions guessed ahead in parallel"), ("N", 2, 8, "tokens an n-gram holds"),
                   ("G", 1, 32, "n-grams verified per step, at most"))

    def __init__(self, target: GPT):
        self.target, self.device = target, target.lm_head.weight.device

    def room(self, shape) -> int:
        window, ngram, guesses = shape
        return (window + guesses) * (ngram - 1)  # the window's levels and the trie's nodes

    def start(self, rows: list[Row], hidden, slots: int) -> None:
        for r in rows:
            r.state = Window(r.text[:-1])

    def propose(self, rows: list[Row], shape, room: list[int], sampling: Sampling, sampled: bool) -> list:
        window, ngram, guesses = shape
        out = []
        for r, left in zip(rows, room):
            w = r.state
            if not w.grid or len(w.grid[0]) != window or len(w.grid) > ngram - 1:  # a new window for this W, N
                w.grid, w.ngram = [[r.text[-1]] + [w.fill() for _ in range(window - 1)]], ngram
            w.grid[0][0] = r.text[-1]
            trie_tokens, parents = trie(w.pool.guesses(r.text[-1])[:guesses])
            deepest = max(len(w.grid) + window - 2, ngram - 1 if trie_tokens else 0)  # the largest position offset
            if deepest > left:
                out.append(None)  # the window would pass the end of the context: a plain step
                continue
            tree = tree_on(parents, self.device) if trie_tokens else None
            x, mask, offsets, at = step_inputs(w.grid, trie_tokens, tree, self.device)
            at = torch.zeros(1, dtype=torch.long, device=self.device) if at is None else at
            out.append(Proposal(x[len(x) - len(trie_tokens):], tree, None, Fed(x, mask, offsets, at)))
        return out

    def update(self, rows: list[Row], proposals: list, verified: list[Verified]) -> None:
        for r, prop, v in zip(rows, proposals, verified):
            w = r.state
            if not w.grid:
                continue
            if prop is None:  # a plain step: the window stays, but its root is always the newest token
                w.grid[0][0] = r.text[-1]
                continue
            levels, W = len(w.grid), len(w.grid[0])
            top = self.target.lm_head(v.hidden[levels * W - W:levels * W]).argmax(-1).tolist()  # each top guess's successor
            if levels == w.ngram - 1:  # a full window: each column, topped by its output, is an n-gram
                for c in range(W):
                    w.pool.add([row[c] for row in w.grid] + [top[c]])
            w.grid = slide(w.grid, top, r.text[-1], w.ngram, w.fill)


METHOD = Lookahead
