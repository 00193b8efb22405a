"""Prompt lookup decoding (Saxena 2023, github.com/apoorvumang/prompt-lookup-decoding; the
method behind Hugging Face's `prompt_lookup_num_tokens`): speculation whose draft is the text
itself.

Code edits, summaries, answers that quote their question, tables: much of what a model writes
has already been written, in the prompt or earlier in the output. So instead of a draft model,
look up the last few tokens in the text so far and propose what followed them last time. The
proposal costs a dictionary lookup; only the target's forward over it costs anything, which is
what matters on a CPU, where a draft's forwards or Medusa's heads eat much of the gain.

One step, with root the last accepted token (not yet in the cache):

1. propose (`NgramIndex.propose`): for n = max_ngram down to 1, find the most recent earlier
   occurrence of the text's last n tokens; the k tokens that followed it are the proposal, a
   chain (`tree.chain`). No occurrence of even the last token: a plain step.
2-4. verify like any tree (`decoding.verify_tree`): one target forward over root + chain, a rule
   from `verify.py`, the cache kept to the accepted prefix.

The proposal is a function of the text alone, never sampled: at temperature > 0 each proposed
token is a draft whose q is a point mass, and the `pointmass` rule makes that exact (a token x
is accepted with probability p(x); after a rejection the correction comes from p without x,
renormalised). At temperature 0 the `greedy` rule is plain greedy decoding, token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .decoding import Chooser, Row, Steps, first_steps, leave, new_rows, prefill, ready, verify_trees
from .kvcache import KVCache
from .model import GPT
from .sampling import Sampling
from .tree import chain, tree_on
from .verify import tree_rule


class NgramIndex:
    """The text so far, and where each of its n-grams (n = 1..max_ngram) last occurred.

    `last[g]` is the index in `text` just after the most recent occurrence of n-gram g that has
    a token after it. Appending a token adds the n-grams that *end just before it*, so the index
    grows by max_ngram entries per token (a dict update, not a rescan of the text), and the
    text's own suffix is never found as its own earlier occurrence.

    Example, max_ngram = 2, text = a b c a b: last = {a: 4, b: 2, c: 3, ab: 2, bc: 3, ca: 4}
    (b at 4 has nothing after it yet). The suffix "a b" last occurred at 0..1, followed by
    text[2:] = "c a b": propose(2) = [c, a]."""

    def __init__(self, max_ngram: int, text=()):
        self.max_ngram = max_ngram
        self.text: list[int] = []
        self.last: dict[tuple[int, ...], int] = {}
        self.extend(text)

    def extend(self, tokens) -> None:
        for token in tokens:
            i = len(self.text)  # token i follows the n-grams that end at i - 1
            for n in range(1, min(self.max_ngram, i) + 1):
                self.last[tuple(self.text[i - n:i])] = i  # newer occurrences overwrite older ones
            self.text.append(int(token))

    def propose(self, k: int) -> list[int]:
        """The k tokens that followed the most recent earlier occurrence of the longest suffix
        (up to max_ngram tokens) seen before; [] if not even the last token was seen before.
        A continuation that runs into the end of the text wraps around: the suffix recurred
        len(text) - start tokens back, so the guess is that the text repeats with that period
        (a loop "x y z x y z" proposes "x y z x ..." rather than stopping after "x y z")."""
        text = self.text
        for n in range(min(self.max_ngram, len(text)), 0, -1):
            start = self.last.get(tuple(text[-n:]))
            if start is not None:
                period = len(text) - start
                return [text[start + i % period] for i in range(k)]
        return []


@dataclass
class LookupRow(Row):
    index: NgramIndex | None = None  # the row's text so far, by its n-grams


@torch.no_grad()
def lookup(target: GPT, prompts: list[list[int]], sampling: Sampling, generators: list, max_len: int,
           k: int | Chooser = 8, max_ngram: int = 3, rule: str = "greedy", cache: KVCache | None = None) -> Steps:
    """Prompt lookup decoding of every row (prompt) at once; yields what each target forward gave
    each row (`decoding.py`). Each row looks up its own text; rows with nothing to propose take a
    plain step in the same forward as the others' chains.

    k: tokens proposed per step, or a `decoding.Chooser` that chooses k (or a plain step) every
    step; max_ngram: the longest suffix looked up; rule: a name from
    `verify.RULES` that needs no draft distribution (greedy at temperature 0, pointmass for
    exact sampling; typical is not lossless). cache: reused if given (emptied first)."""
    accept, device, n_ctx = tree_rule(rule, draft_free=True), target.lm_head.weight.device, target.config.n_ctx
    policy = None if isinstance(k, int) else k
    cache = ready(cache, target, len(prompts), max_len + (policy.largest if policy else k) + 1)
    rows = new_rows(prompts, generators, LookupRow)
    prefill(target, cache, rows, sampling)
    for r in rows:
        r.index = NgramIndex(max_ngram, r.seq + [int(r.root)])
    done = yield first_steps(rows)
    while rows := leave(rows, done, [cache], max_len):
        chosen = policy.choose(len(rows)) if policy else k  # None: a plain step
        proposals = []
        for b, r in enumerate(rows):  # 1. propose
            room = min(chosen or 0, max_len - cache.lengths[b] - 1, n_ctx - 1 - cache.lengths[b])  # slots and positions
            guess = r.index.propose(room) if room > 0 else []  # nothing to look up: a plain step
            proposals.append((torch.tensor(guess, device=device), tree_on(chain(len(guess)).parents, device), None)
                             if guess else None)
        # 2-4. one target forward over roots and chains, each row's rule, its cache compacted to its accepted prefix
        produced = {}
        for r, (step, _) in zip(rows, verify_trees(target, cache, rows, proposals, accept, sampling)):
            r.index.extend(step.tokens)
            produced[r.id] = step
        if policy:  # what every row that proposed accepted; the policy times the step itself
            policy.update([len(produced[r.id].tokens) - 1 for r, prop in zip(rows, proposals) if prop], chosen, len(rows))
        done = yield produced
