"""A parallel feature drafter: EAGLE's head (eagle.py) for the first token and Medusa's heads
(medusa.py) on EAGLE's predicted feature for the rest, so that ONE head forward drafts a whole
block of k tokens. It answers what PARD (An et al. 2025, arXiv:2504.18583), Falcon (Gao et al.
2024, arXiv:2412.12639) and DFlash (arXiv:2602.06036) ask: draft a block at once, not a token per
forward, reading the target's features.

EAGLE's head is accurate, but it drafts one depth per head forward: a tree d deep costs d small
forwards, each through the LM head, and on a CPU that proposing is most of what EAGLE loses
(chapter 13's ledger). Medusa drafts in one forward, but its heads read the feature *before* the
root, f_{M-1}, so head 1 must guess s_{M+1} without knowing the root s_M. Here:

    f^_M      = EagleHead(pending pairs ... (f_{M-1}, s_M))     ONE head forward, as EAGLE's catch-up
    q_{M+1}   = softmax(LMHead(f^_M))                           depth 1: EAGLE's own guess
    q_{M+1+i} = softmax(LMHead(f^_M + SiLU(W_i f^_M + b_i)))    depth i + 1: Medusa's head i on f^_M

so head i reads the head's prediction of the feature AT the root, which already knows s_M, and
guesses the token i places after s_{M+1} without knowing the tokens between: its q is a guess
*marginalised* over them (less sure than EAGLE's depth i + 1, which reads the token drafted above
it). What that buys is the step's cost: one head forward whatever k, k small residual blocks on
one vector, and one LM-head product over k rows.

The tree is EAGLE-2's (`growth.grow_tree`, or `grow_sampled_tree` for the lossless rule), grown
from these k distributions: every node at depth d has the same distribution of children, q at
depth d + 1, so `expand` looks its rows up instead of running the head again. The rules judge a
node against the q it was drawn from, whatever made that q, so every exact rule stays exact.

Training (`training/distill.py: unrolled_loss`) starts from the shipped EAGLE head and Medusa
heads and teaches the heads on f^, the head's own *predicted* feature they read when decoding,
not the target's true f they were trained on: training that matches decoding (HASS, Zhang et al.
2024, arXiv:2408.15766). (Tried first, PARD-style: k - 1 learned *blank* inputs fed after the
pending pairs in the same forward. In the minutes a CPU gives, the blanks learned a bag of the
whole context: held-out top-1 accuracy 0.20 at every depth, against 0.40 at depth 2 for Medusa's
head on f^ before any training.)
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..decoding import Row
from ..kvcache import KVCache
from ..model import GPTConfig
from ..sampling import Sampling
from ..tree import MAX_NODES, Tree
from .base import STATIC_TREE, Weights
from .eagle import Eagle, EagleHead, EaglePart
from .growth import as_tree, fill_static_tree, grow_sampled_tree, grow_tree
from .medusa import MedusaHeads

BLOCK = 5  # k, the deepest block a head is made with: EAGLE's depth and Medusa's 4 heads


class ParallelHead(EagleHead):
    """EAGLE's head (fc and one block, the target's frozen embedding and LM head) and k - 1
    Medusa heads (`ahead`, one ResBlock each) on its predicted feature: depth i + 1's guess."""

    def __init__(self, config: GPTConfig, block: int = BLOCK):
        super().__init__(config)
        self.ahead = MedusaHeads(config.n_embd, block - 1)

    @property
    def block_size(self) -> int:
        return self.ahead.n_heads + 1

    @classmethod
    def shaped_for(cls, config: GPTConfig, tensors: dict) -> "ParallelHead":
        heads = {name.split(".")[2] for name in tensors if name.startswith("ahead.blocks.")}
        if not heads:
            raise KeyError("ahead (an EAGLE head has none: give it to --eagle)")
        return cls(config, len(heads) + 1)

    @classmethod
    def from_heads(cls, eagle: EagleHead, medusa: MedusaHeads | None = None, block: int = BLOCK) -> "ParallelHead":
        """A head that starts as `eagle` (fc and block copied) and, if given, Medusa's heads (their
        first block - 1), else new ones (the identity: Medusa's ResBlocks start at zero)."""
        head = cls(eagle.config, block).to(eagle.fc.weight.device)
        head.load_state_dict(eagle.state_dict(), strict=False)  # everything but the heads
        if medusa is not None:
            head.ahead.blocks.load_state_dict(medusa.blocks[:block - 1].state_dict())
        head.target_fingerprint = eagle.target_fingerprint
        return head

    def features_ahead(self, f_hat: torch.Tensor, depth: int) -> torch.Tensor:
        """The features whose LM head gives depths 1..depth: f^ (..., C) and head i's f^ + SiLU(W_i f^
        + b_i), stacked (depth, ..., C)."""
        return torch.stack([f_hat] + [block(f_hat) for block in self.ahead.blocks[:depth - 1]])

    def draft(self, features: torch.Tensor, tokens: torch.Tensor, wte: nn.Embedding, cache: KVCache,
              depth: int) -> torch.Tensor:
        """ONE head forward over the pending pairs (features (n, C), tokens (n,)), which stay in
        `cache`: the features of depths 1..depth, (depth, C)."""
        return self.features_ahead(self(features[None], tokens[None], wte, cache)[0, -1], depth)


class Parallel(Eagle):
    """EAGLE's step with the head's depths drafted in one forward (steps 0-1 of eagle.py become one
    head forward; step 5, what the head keeps between steps, is EAGLE's). A size is
    (top_k, depth, total_tokens), depth at most the head's block."""
    name = "parallel"
    chapter = 9  # EAGLE's chapter, its last section
    summary = "one forward of EAGLE's head and Medusa's heads on its predicted feature drafts a whole block; " \
              "EAGLE-2's tree from it"
    weights = Weights("--parallel", "parallel.safetensors", ParallelHead, "a parallel feature head",
                      "python -m tinyspec train parallel", "ahead.")
    settings = {"tree": STATIC_TREE}
    default_size = "2,4,8"
    sizes = ("1,2,2", "1,3,3", "1,4,4", "1,5,5", "2,3,4", "2,4,8", "2,5,10")
    size_format = (("TOPK", 1, 16, "children per expanded node, and nodes expanded per depth"),
                   ("DEPTH", 1, 5, "the tree's depth, at most the head's block"), ("NODES", 1, MAX_NODES, "the most likely "
                                                                                    "nodes kept"))

    def __init__(self, target, head: ParallelHead, draft_vocab: torch.Tensor | None = None, tree=None):
        super().__init__(target, head, draft_vocab, tree)
        self.sizes = tuple(s for s in type(self).sizes if int(s.split(",")[1]) <= head.block_size)  # what it can draft

    def shape(self, size: str):
        shape = super().shape(size)
        deepest = shape.max_depth if isinstance(shape, Tree) else shape[1]
        if deepest > self.head.block_size:
            raise ValueError(f"this parallel head drafts {self.head.block_size} deep at most, got a depth of {deepest} "
                             f"in {size!r}")
        return shape

    def draft_row(self, r: Row, static: Tree | None, shape, sampled: bool, sampling: Sampling):
        """ONE head forward gives the block's k distributions; the tree grows from them. (tokens, tree, q)."""
        deepest = static.max_depth if static is not None else shape[1]
        drafter = r.state.drafter
        features, tokens = r.state.joined()
        logits = drafter.lm_head(self.head.draft(features, tokens, drafter.wte, drafter.cache, deepest))  # (depth, V)

        def expand(chosen, parents, tokens, depth):  # a node d deep: its children are drafted at depth d + 1
            return logits[depth].expand(len(chosen), -1)
        if static is not None:
            tokens, q = fill_static_tree(static, logits[0], expand, sampled, sampling, r.generator)
            return tokens, static, q
        if sampled:
            parents, tokens, q = grow_sampled_tree(logits[0], expand, *shape, sampling, r.generator)
        else:
            (parents, tokens), q = grow_tree(logits[0], expand, *shape), None
        return tokens, as_tree(parents), q


class ParallelPart(EaglePart):
    """The parallel drafter: one head forward gives every depth's distribution, and the tree grows
    from them (a node at depth d has depth d + 1's children)."""

    def propose(self, root, L, u):
        logits = self.method.lm_head(self.head.features_ahead(self.catch_up(), self.D))[:, 0]  # (D, V)
        parents, tokens = grow_tree(logits[0], lambda chosen, parents, tokens, d: logits[d].expand(len(chosen), -1),
                                    *self.shape)
        return tokens, parents, None, None


Parallel.Part = ParallelPart  # its recorded step, found through the method as METHOD is


METHOD = Parallel
