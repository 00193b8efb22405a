"""Retrieval from a datastore: REST (He, Zhong, Cai, Lee & He, NAACL 2024, arXiv:2311.08252)
with SuffixDecoding's counts (Oliaro et al. 2024, arXiv:2411.04975), beside prompt lookup.

Prompt lookup (`lookup.py`) copies what followed the text's last tokens earlier in the text; it
costs a dictionary lookup, but it cannot guess what the text has not written yet. Code is full
of continuations that a corpus has written thousands of times (`self.`, `return `, `raise
ValueError(`): REST looks the text's last tokens up in a datastore built from a corpus, and
proposes the continuations that followed them there, merged into one tree, most frequent first.

The datastore (`Datastore`) is the corpus's token ids and a suffix array of the corpus read
backwards: the text's last m tokens, read backwards, are a prefix of the reversed corpus's
suffixes exactly where the corpus holds them, and those suffixes sit in one range of the sorted
array. Each token further back only narrows the range, so the longest match is found by
narrowing (a binary search per token; the last three tokens at once, `key`), and the forward
corpus right after each place in the range is a continuation. One step (`Rest.propose`):

1. the longest suffix of the text (up to `MAX_MATCH` tokens) that the corpus holds at least
   twice; up to `SAMPLE` of its occurrences, evenly spread over the range;
2. their next `DEPTH` tokens, up to a document's end, counted by prefix (`corpus_tree`): a prefix's count over
   the occurrences is the share of the corpus that continued that way (SuffixDecoding's
   empirical probability). The B prefixes of highest count that at least `MIN_SHARE` of the
   occurrences share make the corpus's part of the tree (a prefix never counts less than its
   extensions, so they form a tree); how many there are follows how predictable the match is;
3. the text's own earlier continuation (prompt lookup) joins the tree as one more branch,
   shared prefixes merged (`ngrams.trie`): K tokens when the text's last `max_ngram` tokens
   occurred before, fewer for a shorter match (K n / max_ngram for a match of n), since a
   continuation found by one token alone is seldom the right one (SuffixDecoding likewise sizes
   each speculation by its match).

The proposal is a function of the text and the corpus, never sampled: greedy at temperature 0,
and the point-mass rule above it make the output the target's own (`verify.py`).
"""

from __future__ import annotations

import heapq
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from ..decoding import Proposal, Row
from ..files import atomic_save_tensors, read_tensors
from ..model import GPT
from ..sampling import Sampling
from ..tree import tree_on
from .base import Weights
from .lookup import PromptLookup
from .ngrams import trie

MAX_MATCH = 16  # the longest suffix of the text looked up (the suffix array is sorted this deep)
SAMPLE = 64  # occurrences of the match whose continuations are counted
DEPTH = 8  # tokens of each continuation
MIN_SHARE = 0.125  # a corpus node is proposed only if at least this share of the occurrences continue that way


def suffix_array(tokens: np.ndarray, depth: int = MAX_MATCH) -> np.ndarray:
    """The start of every suffix of `tokens`, sorted by its first `depth` tokens (ties in any
    order): prefix doubling (Manber & Myers 1993). Each round sorts by the rank of a suffix's
    first k tokens and of the k after them, which ranks the first 2k; log2(depth) rounds of one
    `np.lexsort` each. A suffix that runs out of tokens sorts before every longer one."""
    n = len(tokens)
    rank = tokens.astype(np.int64)
    order, k = np.argsort(rank, kind="stable"), 1
    while k < depth:
        after = np.full(n, -1, np.int64)
        after[:max(0, n - k)] = rank[k:]
        order = np.lexsort((after, rank))  # by rank, then by the rank k tokens on
        first, then = rank[order], after[order]
        new = np.empty(n, bool)
        new[0], new[1:] = True, (first[1:] != first[:-1]) | (then[1:] != then[:-1])
        rank = np.empty(n, np.int64)
        rank[order] = np.cumsum(new) - 1
        k *= 2
    return order.astype(np.int32)


class Datastore:
    """A corpus's token ids (`tokens`, documents ending in `eot`) and the suffix array of their
    reversal (`order`), with `key`: each sorted suffix's first three tokens as one number, so the
    range of the text's last three tokens is a binary search in NumPy."""

    def __init__(self, tokens: np.ndarray, eot: int, order: np.ndarray | None = None, card: dict | None = None):
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.backwards = self.tokens[::-1].copy()
        self.eot, self.card = eot, card or {}
        self.order = suffix_array(self.backwards) if order is None else np.asarray(order, dtype=np.int64)
        base, n = eot + 2, len(self.tokens)  # token t is digit t + 1; 0 pads a suffix that runs out
        digit = lambda j: np.where(self.order + j < n, self.backwards[np.minimum(self.order + j, n - 1)] + 1, 0)
        self.key = (digit(0) * base + digit(1)) * base + digit(2)  # sorted, as the suffixes are
        self.base = base

    def __len__(self) -> int:
        return len(self.tokens)

    def match(self, text: list[int]) -> tuple[int, int, int]:
        """(m, lo, hi): the longest suffix of `text`, m tokens (up to MAX_MATCH), that the corpus
        holds at least twice, and the range of the suffix array where it does; m = 0 if none."""
        back, n = text[::-1][:MAX_MATCH], len(self.tokens)
        best = (0, 0, 0)
        for m in range(1, min(3, len(back)) + 1):  # the last one, two, three tokens: by key, in NumPy
            low = 0
            for j in range(3):
                low = low * self.base + (back[j] + 1 if j < m else 0)
            high = low + (self.base ** (3 - m) if m < 3 else 1)
            lo, hi = np.searchsorted(self.key, [low, high])
            if hi - lo < 2:
                return best
            best = (m, int(lo), int(hi))
        m, lo, hi = best
        while m < len(back):  # one token further back at a time: the range narrows
            t, column = back[m], lambda i: self.backwards[self.order[i] + m] if self.order[i] + m < n else -1
            lo2 = self.bisect(lo, hi, lambda i: column(i) < t)
            hi2 = self.bisect(lo2, hi, lambda i: column(i) <= t)
            if hi2 - lo2 < 2:
                break
            m, lo, hi = m + 1, lo2, hi2
        return m, lo, hi

    @staticmethod
    def bisect(lo: int, hi: int, before) -> int:
        """The first index in [lo, hi) where `before(index)` stops holding (it holds for a prefix)."""
        while lo < hi:
            mid = (lo + hi) // 2
            if before(mid):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def continuations(self, text: list[int]) -> np.ndarray:
        """(S, DEPTH): the next DEPTH tokens after up to SAMPLE occurrences of the text's longest
        match, -1 from its document's end on; no rows when the corpus holds not even the last
        token twice."""
        m, lo, hi = self.match(text)
        if m == 0:
            return np.zeros((0, DEPTH), np.int64)
        at = self.order[lo:hi] if hi - lo <= SAMPLE else self.order[np.linspace(lo, hi - 1, SAMPLE).astype(np.int64)]
        where = (len(self.tokens) - at)[:, None] + np.arange(DEPTH)  # the forward corpus after each occurrence
        rows = np.where(where < len(self.tokens), self.tokens[np.minimum(where, len(self.tokens) - 1)], self.eot)
        ended = np.cumsum(rows == self.eot, axis=1) > 0  # from the document's end on
        return np.where(ended, -1, rows)

    def save(self, path: str | Path, with_order: bool = True) -> None:
        """Safetensors: the tokens in 16 bits (a vocabulary under 32,768), and the suffix array
        unless `with_order` is False (then `load` sorts it again: about a second per million tokens)."""
        small = self.eot < 2 ** 15
        tensors = {"tokens": torch.from_numpy(self.tokens.astype(np.int16 if small else np.int32))}
        if with_order:
            tensors["order"] = torch.from_numpy(self.order.astype(np.int32))
        atomic_save_tensors(tensors, path, {"eot": str(self.eot), "card": json.dumps(self.card)})

    @classmethod
    def load(cls, path: str | Path, device=None, dtype=None) -> "Datastore":
        meta, tensors = read_tensors(path)
        try:
            order = tensors["order"].numpy() if "order" in tensors else None
            return cls(tensors["tokens"].numpy(), int(meta["eot"]), order, json.loads(meta.get("card", "{}")))
        except (KeyError, ValueError) as e:
            raise ValueError(f"{path} is not a datastore file ({e})") from None


def corpus_tree(continuations: np.ndarray, budget: int) -> list[tuple[int, ...]]:
    """The `budget` prefixes of the continuations (S, DEPTH) that most of them share (at least
    MIN_SHARE of them), as paths: every prefix of a kept path is kept (it is shared at least as
    often, and a tie goes to the shallower)."""
    counts: dict[tuple[int, ...], int] = {}
    for row, n in Counter(map(tuple, continuations.tolist())).items():  # each distinct continuation once
        for d in range(len(row)):
            if row[d] < 0:  # past its document's end
                break
            counts[row[:d + 1]] = counts.get(row[:d + 1], 0) + n
    least = MIN_SHARE * len(continuations)
    kept = heapq.nlargest(budget, ((n, -len(p), p) for p, n in counts.items() if n >= least))
    return sorted(p for _, _, p in kept)


class Rest(PromptLookup):
    """The corpus's continuations of the text's last tokens, and the text's own (step 1 above):
    prompt lookup, its index kept as lookup keeps it, with a datastore beside it."""
    name = "rest"
    chapter = 10.3  # of the walkthrough
    summary = "retrieval (REST): what followed the text's last tokens in a corpus, and earlier in the text, as a tree"
    proposes = "fixed tokens"
    weights = Weights("--datastore", "datastore.safetensors", Datastore, "a datastore",
                      "python -m tinyspec data datastore", "tokens")
    default_size = "16,4"
    sizes = ("8,2", "8,4", "16,4", "16,8")
    size_format = (("K", 0, 16, "tokens looked up in the text itself, prompt lookup's (fewer for a shorter match)"),
                   ("B", 0, 16, "nodes from the corpus"))

    def __init__(self, target: GPT, datastore: Datastore, max_ngram: int = 3):
        super().__init__(target, max_ngram)
        self.datastore = datastore

    def shape(self, size: str) -> tuple[int, int]:
        k, budget = self.parse_size(size)
        if k == budget == 0:
            raise ValueError(f"a rest size K,B proposes nothing at 0,0: make K or B at least 1, got {size!r}")
        return k, budget

    def room(self, shape) -> int:
        return shape[0] + shape[1]

    def identity(self) -> dict:
        what = {k: v for k, v in self.datastore.card.items() if k not in ("build_s", "lookup_us")}  # not its timings
        return {"datastore": what | {"tokens": len(self.datastore)}}

    def propose(self, rows: list[Row], shape, room: list[int], sampling: Sampling, sampled: bool) -> list:
        k, budget = shape
        out = []
        for r, left in zip(rows, room):
            paths = corpus_tree(self.datastore.continuations(r.text), budget) if budget else []
            own = r.state.propose(k * r.state.matched() // self.max_ngram) if k else []
            if own:
                paths.append(tuple(own))
            tokens, parents = trie([p[:left] for p in paths if left > 0])  # none deeper than the context allows
            out.append(Proposal(torch.tensor(tokens, device=self.device), tree_on(parents, self.device))
                       if tokens else None)
        return out


def build(tokens: np.ndarray, eot: int, sources: dict) -> Datastore:
    """A datastore of `tokens` (documents ending in eot), its card saying what it holds and how long
    its suffix array took."""
    t0 = time.perf_counter()
    store = Datastore(tokens, eot)
    store.card = dict(sources, tokens=len(tokens), build_s=round(time.perf_counter() - t0, 2))
    return store


METHOD = Rest
