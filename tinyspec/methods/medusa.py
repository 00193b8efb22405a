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
text (`training/distill.py`).

One decoding step (`Medusa` below), with h the hidden state of the token *before* the root:
the root is the last token the target chose (from h's LM-head logits), and head i's guesses
from h are candidates for the token i places after the root:

1. propose: the heads turn h into a tree of candidates below the root (`propose`): node i is the
   ranks[i]-th best guess of the head for its depth, or a sample from that head's distribution;
2-4. the loop's (`decoding.decode`): the target reads the root and the T nodes in ONE forward,
   each node at position L + depth, seeing only its ancestors (`Tree.tree_mask`); a rule from
   `verify.py` walks the tree and returns the accepted path and the target's next token, which
   becomes the next root; the cache keeps the root and the accepted path (`KVCache.keep`);
5. h becomes the hidden state of the last accepted token (`Medusa.update`).

The tree is a static shape (`tree.py`), built from the heads' measured accuracies
(`from_accuracies`: the nodes most likely to be accepted), or read from a choice list.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..decoding import Proposal, Row, Verified
from ..files import atomic_save_tensors, read_tensors
from ..model import GPT, DraftVocab
from ..sampling import Sampling, draw, sample
from ..tree import MAX_NODES, Tree, expected_accepted, from_accuracies, load_tree
from .base import STATIC_TREE, Method, Part, Weights


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

    def forward(self, hidden: torch.Tensor, lm_head) -> torch.Tensor:
        """hidden (..., C) -> logits (K, ..., V): row i-1 is head i's guess of x_{t+1+i}. lm_head:
        the target's, or the rows of a reduced draft vocabulary (`model.DraftVocab`)."""
        # One LM-head matmul for all K heads, not K: the (vocab x C) matrix is the largest the
        # heads touch, and when decoding one position it is read from memory once instead of K times.
        return lm_head(torch.stack([block(hidden) for block in self.blocks]))

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


class Medusa(Method):
    """The heads propose a static tree from the hidden state before the root (step 1 above)."""
    name = "medusa"
    chapter = 8  # of the walkthrough
    summary = "Medusa heads propose a tree, verified in one target pass (Cai et al. 2024)"
    proposes = "a tree"
    weights = Weights("--heads", "medusa.safetensors", MedusaHeads, "Medusa heads", "python -m tinyspec train medusa",
                      "blocks.")
    settings = {"tree": STATIC_TREE}
    reduced_vocab = True
    default_size = "4"
    sizes = ("2", "4", "8", "16")
    size_format = (("NODES", 1, MAX_NODES, "the tree's nodes, the most likely to be accepted by the heads' measured "
                                     "accuracies"),)

    def __init__(self, target: GPT, heads: MedusaHeads, draft_vocab: torch.Tensor | None = None,
                 tree: str | Tree | None = None):
        """tree: a static tree (a Tree, or the path of a choice list) for every step, whatever the size."""
        if heads.accuracy is None and tree is None:
            raise ValueError("these heads record no accuracies to build a tree from: pass --tree FILE.json")
        self.target, self.heads, self.device, self.tree = target, heads, target.lm_head.weight.device, tree
        self.lm_head = target.lm_head if draft_vocab is None else DraftVocab(target.lm_head, draft_vocab)
        self.static = tree if isinstance(tree, Tree) or tree is None else load_tree(tree)

    def shape(self, size: str) -> Tree:
        """The tree of `size` nodes (or the static tree from --tree, whatever the size)."""
        tree = self.static if self.static is not None else from_accuracies(self.heads.accuracy, super().shape(size))
        if tree.max_depth > self.heads.n_heads:
            raise ValueError(f"the tree is {tree.max_depth} deep but there are only {self.heads.n_heads} heads: "
                             "use a smaller tree")
        return tree.to(self.device)

    def room(self, tree: Tree) -> int:
        return len(tree)

    def batch_sizes(self) -> dict[str, float] | None:
        """The tokens each size's tree accepts, if heads were right independently at their measured
        accuracies (`tree.expected_accepted`): what a batch's policy weighs its forward costs by."""
        if self.static is not None or self.heads.accuracy is None:
            return None
        accuracy = self.heads.accuracy.cpu()
        return {s: expected_accepted(from_accuracies(accuracy, int(s)), accuracy) for s in self.sizes}

    def proposing(self, rows: int):
        return partial(self.heads, torch.zeros(rows, self.heads.blocks[0].linear.in_features, device=self.device),
                       self.lm_head)

    def start(self, rows: list[Row], hidden, slots: int) -> None:
        for r, h in zip(rows, hidden):
            r.state = h[-1]  # (C,): the hidden state at the last prompt token, the root's parent's

    def propose(self, rows: list[Row], tree: Tree, room: list[int], sampling: Sampling, sampled: bool) -> list:
        head_logits = self.heads(torch.stack([r.state for r in rows]), self.lm_head)  # (K, B, V): one call, all rows
        out = []
        for b, r in enumerate(rows):
            if tree.max_depth > room[b]:  # the tree would pass the end of the context: a plain step
                out.append(None)
                continue
            tokens, q = propose(head_logits[:, b], tree, sampling, sampled, r.generator)
            out.append(Proposal(tokens, tree, q))
        return out

    def update(self, rows: list[Row], proposals: list, verified: list[Verified]) -> None:
        for r, v in zip(rows, verified):
            r.state = v.hidden[v.kept[-1]]  # the hidden state of the last accepted token: the heads' next input


class MedusaPart(Part):
    """`Medusa.propose` with fixed shapes, for a recorded step: the heads read the hidden state the
    last step kept, and fill the static tree (its ranks, or draws from q for the lossless rule)."""
    rules = ("pointmass", "lossless")

    def __init__(self, method, tree: Tree, sampling: Sampling, rule: str, slots: int):
        self.heads, self.lm_head, self.sampling, self.sampled = method.heads, method.lm_head, sampling, rule == "lossless"
        self.static, self.T, self.D, self.draws = tree, len(tree), tree.max_depth, len(tree)
        self.head_of, self.ranks = tree.depth[1:] - 1, torch.tensor(tree.ranks, device=tree.depth.device)
        self.top = max(tree.ranks) + 1  # the guesses a head ranks (a Python int: read once, here)
        self.h = torch.zeros(1, method.target.config.n_embd, device=tree.depth.device,
                             dtype=method.target.lm_head.weight.dtype)  # the hidden state before the root

    def begin(self, text, hidden):
        self.h.copy_(hidden[-1:])

    def propose(self, root, L, u):
        logits = self.heads(self.h, self.lm_head)[:, 0]  # (K, V)
        if not self.sampled:  # node i: the ranks[i]-th best guess of its depth's head
            return logits.topk(self.top).indices[self.head_of, self.ranks], None, None, None
        q = self.sampling.probs(logits)[self.static.depth.clamp(min=1) - 1]  # (T+1, V): node a drawn from q[a]
        return draw(q[1:], u[:self.T]), None, q, None

    def update(self, hidden, path, n, seq):
        self.h.copy_(hidden[path[n - 1]])


Medusa.Part = MedusaPart  # its recorded step, found through the method as METHOD is


METHOD = Medusa
