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
2-4. the loop's, as for any tree (`decoding.decode`): one target forward over root + chain, a
   rule from `verify.py`, the cache kept to the accepted prefix.

The proposal is a function of the text alone, never sampled: at temperature > 0 each proposed
token is a draft whose q is a point mass, and the `pointmass` rule makes that exact (a token x
is accepted with probability p(x); after a rejection the correction comes from p without x,
renormalised). At temperature 0 the `greedy` rule is plain greedy decoding, token for token.
"""

from __future__ import annotations

import torch

from ..decoding import Proposal, Row, Verified
from ..model import GPT
from ..sampling import Sampling
from ..tree import chain, tree_on
from .base import HostPart, Method, Setting
from .ngrams import NgramIndex


class PromptLookup(Method):
    """Each row proposes what followed its own text's last tokens earlier on (step 1 above)."""
    name = "lookup"
    chapter = 10.1  # of the walkthrough
    summary = "prompt lookup: the text's own earlier continuation of its last tokens is the proposal"
    proposes = "fixed tokens"
    settings = {"max_ngram": Setting(3, int, "the longest suffix of the text looked up; shorter ones are tried "
                                     "when it has not occurred before", 1, 8)}
    default_size = "8"
    sizes = ("4", "8", "16")
    size_format = (("K", 1, 16, "tokens looked up per step"),)

    def __init__(self, target: GPT, max_ngram: int = 3):
        self.device, self.max_ngram = target.lm_head.weight.device, max_ngram

    def room(self, k: int) -> int:
        return k

    def start(self, rows: list[Row], hidden, slots: int) -> None:
        for r in rows:
            r.state = NgramIndex(self.max_ngram, r.text)

    def propose(self, rows: list[Row], k: int, room: list[int], sampling: Sampling, sampled: bool) -> list:
        out = []
        for r, left in zip(rows, room):
            guess = r.state.propose(min(k, left)) if left > 0 else []  # nothing found: a plain step
            out.append(Proposal(torch.tensor(guess, device=self.device), tree_on(chain(len(guess)).parents, self.device))
                       if guess else None)
        return out

    def update(self, rows: list[Row], proposals: list, verified: list[Verified]) -> None:
        for r, v in zip(rows, verified):
            r.state.extend(v.step.tokens)


PromptLookup.Part = HostPart  # (and retrieval's): it proposes on the host, between recorded steps
METHOD = PromptLookup
