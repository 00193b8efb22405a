"""Medusa (Cai et al. 2024, arXiv:2401.10774): heads that guess several tokens ahead from one
hidden state, and the decoding loop that verifies their guesses as a tree.

The target's final hidden state h_t at position t already feeds its LM head, which predicts
x_{t+1}. Medusa adds K small heads on the same h_t; head i (i = 1..K) predicts x_{t+1+i}, the
token i places further on, without seeing the tokens in between. Each head is one residual block
followed by the target's own LM head (shared and frozen):

    head_i(h) = LMHead(h + SiLU(W_i h + b_i))

(Cai et al. give each head its own output matrix, initialised from the LM head; sharing the
frozen one keeps a head at n_embd^2 + n_embd parameters.)

W_i and b_i start at zero, so a new head is the base LM head exactly, and training only has to
learn the shift by i tokens. The heads are trained "Medusa-1" style on the frozen target's own
text (`distill.py`).

One decoding step (`medusa` below), with h the hidden state of the token *before* the root:
the root is the last token the target chose (from h's LM-head logits), and head i's guesses
from h are candidates for the token i places after the root:

1. propose: the heads turn h into a tree of candidates below the root (`propose`): node i is the
   ranks[i]-th best guess of the head for its depth, or a sample from that head's distribution;
2. verify: the target reads the root and the T nodes in ONE forward, each node at position
   L + depth, seeing only its ancestors (`Tree.tree_mask`);
3. accept: a rule from `verify.py` walks the tree and returns the accepted path and the
   target's next token, which becomes the next root;
4. the cache keeps the root and the accepted path (`KVCache.keep`), and h becomes the hidden
   state of the last accepted token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .decoding import Chooser, Row, Steps, first_steps, leave, new_rows, prefill, ready, verify_trees
from .files import atomic_save_tensors, read_tensors
from .kvcache import KVCache
from .model import GPT
from .sampling import Sampling, sample
from .tree import Tree
from .verify import SAMPLED, tree_rule


class ResBlock(nn.Module):
    """h + SiLU(W h + b), starting as the identity (W = 0, b = 0)."""

    def __init__(self, n_embd: int):
        super().__init__()
        self.linear = nn.Linear(n_embd, n_embd)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h):
        return h + F.silu(self.linear(h))


class MedusaHeads(nn.Module):
    def __init__(self, n_embd: int, n_heads: int = 4):
        super().__init__()
        # one block per head, built by a comprehension: `[ResBlock(n)] * k` would repeat ONE module
        self.blocks = nn.ModuleList([ResBlock(n_embd) for _ in range(n_heads)])
        self.accuracy: torch.Tensor | None = None  # (heads, ranks) measured on held-out data, if known
        self.target_fingerprint = ""

    @property
    def n_heads(self) -> int:
        return len(self.blocks)

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """hidden (..., C) -> logits (K, ..., V): row i-1 is head i's guess of x_{t+1+i}."""
        # One LM-head matmul for all K heads, not K: the (vocab x C) matrix is the largest the
        # heads touch, and when decoding one position it is read from memory once instead of K times.
        # With a reduced draft vocabulary (model.DraftVocab) only its V' rows are.
        vocab = getattr(self, "draft_vocab", None)
        return (lm_head if vocab is None else vocab)(torch.stack([block(hidden) for block in self.blocks]))

    def save(self, path: str | Path) -> None:
        meta = {"n_heads": str(self.n_heads), "n_embd": str(self.blocks[0].linear.in_features),
                "target_fingerprint": self.target_fingerprint}
        if self.accuracy is not None:
            meta["accuracy"] = json.dumps([[round(a, 5) for a in row] for row in self.accuracy.tolist()])
        atomic_save_tensors({k: v.contiguous() for k, v in self.state_dict().items()}, path, meta)

    @classmethod
    def load(cls, path: str | Path, device="cpu", dtype=None) -> "MedusaHeads":
        meta, sd = read_tensors(path)
        try:
            heads = cls(int(meta["n_embd"]), int(meta["n_heads"]))
            heads.load_state_dict(sd)
        except (KeyError, ValueError, RuntimeError) as e:  # missing metadata, wrong names or shapes
            raise ValueError(f"{path} is not a Medusa heads file ({e})") from None
        heads.target_fingerprint = meta.get("target_fingerprint", "")
        if "accuracy" in meta:
            heads.accuracy = torch.tensor(json.loads(meta["accuracy"]))
        return heads.to(device=device, dtype=dtype).eval()


def propose(head_logits: torch.Tensor, tree: Tree, sampling: Sampling, sampled: bool, generator):
    """Step 1: the tree's T tokens from the heads' logits (K, V), and q (T+1, V) when sampled.
    Top-k: node i is the ranks[i]-th best guess of the head for its depth. Sampled: node i is
    drawn from that head's distribution q, independently of every other node."""
    depth = tree.depth - 1  # (T+1,): which head guesses each node (the root's -1 is never read)
    if sampled:
        q = sampling.probs(head_logits)[depth.clamp(min=0)]  # (T+1, V): node a was drawn from q[a]
        return sample(q[1:], generator), q
    ranks = torch.tensor(tree.ranks, device=head_logits.device)
    top = head_logits.topk(int(ranks.max()) + 1, dim=-1).indices  # (K, max rank + 1)
    return top[depth[1:], ranks], None


@dataclass
class MedusaRow(Row):
    h: torch.Tensor | None = None  # the hidden state the heads read: the root's parent's


@torch.no_grad()
def medusa(target: GPT, heads: MedusaHeads, prompts: list[list[int]], sampling: Sampling, generators: list,
           max_len: int, tree: Tree | Chooser, rule: str = "greedy", cache: KVCache | None = None,
           forward: Callable | None = None) -> Steps:
    """Medusa decoding of every row (prompt) at once; yields what each target forward gave each
    row (`decoding.py`). The heads read every row's hidden state in one call, each row's tree is
    filled from its own guesses, one target forward verifies all trees.

    tree: the same tree every step, or a `decoding.Chooser` (`policy.Policy`) that picks one (or
    none) per step. rule: a name from `verify.RULES` (lossless rules at T > 0: pointmass, or
    lossless with sampled trees). cache: reused if given (emptied first). forward(tokens, L):
    batch 1, verifies the root and the tree over it (`fastpath.fixed_forward` makes a
    fixed-shape one; default: `decoding.feed`)."""
    accept, sampled, device = tree_rule(rule), rule in SAMPLED, target.lm_head.weight.device
    policy = None if isinstance(tree, Tree) else tree
    tree = None if policy else tree.to(device)
    cache = ready(cache, target, len(prompts), max_len + (policy.largest if policy else len(tree)) + 1)
    rows = new_rows(prompts, generators, MedusaRow)
    for r, h in zip(rows, prefill(target, cache, rows, sampling)):
        r.h = h[-1]  # (C,) at the last prompt token
    done = yield first_steps(rows)
    while rows := leave(rows, done, [cache], max_len):
        step_tree = policy.choose(len(rows)) if policy else tree  # None: a plain step for every row
        proposals = [None] * len(rows)
        if step_tree is not None:
            head_logits = heads(torch.stack([r.h for r in rows]), target.lm_head)  # (K, B, V): 1. propose
            for b, r in enumerate(rows):
                L = cache.lengths[b]
                if L + 1 + len(step_tree) <= max_len and L + step_tree.max_depth < target.config.n_ctx:  # else no room
                    tokens, q = propose(head_logits[:, b], step_tree, sampling, sampled, r.generator)
                    proposals[b] = (tokens, step_tree, q)
        # 2-4. one target forward over roots and trees, each row's rule, its cache compacted to its accepted path
        produced = {}
        for r, (step, hidden) in zip(rows, verify_trees(target, cache, rows, proposals, accept, sampling,
                                                        forward if policy is None else None)):
            r.h, produced[r.id] = hidden[-1], step  # the hidden state of the last accepted token: the heads' next input
        if policy:  # it times the step itself, from its choice to now (the tokens are on the host: the step is done)
            policy.update([len(produced[r.id].tokens) - 1 for r, prop in zip(rows, proposals) if prop], step_tree,
                          len(rows))
        done = yield produced
