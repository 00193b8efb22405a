"""EAGLE (Li, Wei, Zhang & Zhang 2024, arXiv:2401.15077): a draft head that predicts the
target's next *feature*, and EAGLE-2's dynamic draft tree (Li et al. 2024, arXiv:2406.16858).

The target's feature f_i is its final hidden state at position i (`GPT.hidden`), the vector its
LM head turns into the distribution of token t_{i+1}. A token is a sample, so the next token is
uncertain; the next feature is a deterministic function of the text so far, and once the token
t_{i+1} that was actually sampled is known, predicting f_{i+1} from f_i is a much smoother
regression than guessing t_{i+2} from f_i alone, which is Medusa's task (chapter 8). EAGLE's
draft head does exactly that, autoregressively at the feature level (Li et al. eq. 1-3):

    x_i      = W [f_i ; e(t_{i+1})] + b          one linear layer, 2C -> C (e: the target's frozen wte)
    f^_{i+1} = Block(x_1 .. x_i)[i]              one transformer block of the target's shape, causal
    q_{i+2}  = softmax(LMHead(f^_{i+1}))         the target's own frozen LM head

and f^_{i+1}, paired with the token drawn from q_{i+2}, is its next input: the head drafts
several tokens ahead on its own predicted features. It keeps its own one-layer `KVCache`, rolled
back with the target's.

One decoding step (`Eagle` below). The target cache holds s_0 .. s_{M-1}; the root s_M (the last
token the target chose) is not fed yet, and the pairs (f_j, s_{j+1}) whose features the target has
computed but the head has not read are *pending*:

0. catch up: the head reads the pending pairs in one forward; the last, (f_{M-1}, s_M), gives
   f^_M, and LMHead(f^_M) drafts the root's children;
1. grow the tree (EAGLE-2, `growth.grow_tree`): at each depth the most promising nodes are
   expanded, one head forward over all of them (tree-masked, as verification is), each proposing
   its top-k children; then the N nodes of highest value make the tree. Or sampled
   (`grow_sampled_tree`), or the shape of a static tree (`fill_static_tree`);
2-4. the loop's (`decoding.decode`): one target forward over root and tree, a rule from
   `verify.py`, the target cache compacted to the accepted path;
5. the head's cache is truncated back to what it held after step 0 (the tree's entries came from
   predicted features), and the target's true features of the root and the accepted tokens,
   paired with the tokens that follow them, become the pending pairs of the next step.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn as nn

from ..decoding import Proposal, Row, Verified
from ..files import atomic_save_tensors, read_tensors
from ..kvcache import KVCache, SlotWriter, slot_mask
from ..model import GPT, SDPA, Block, DraftVocab, GPTConfig, causal_mask, prefix_mask
from ..sampling import Sampling
from ..tree import MAX_NODES, Tree, load_tree
from .base import STATIC_TREE, Method, Part, Weights
from .growth import as_tree, expanded_at_most, fill_static_tree, grow_sampled_tree, grow_tree


class EagleHead(nn.Module):
    """The draft head: fc [f ; e(t)] -> one `Block` -> predicted next feature (Li et al. 2024)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.n_embd, config.n_embd)
        self.block = Block(config)  # the target's block shape; no position embedding: f_i carries the position
        self.attention = SDPA()
        self.apply(GPT._init_weights)
        self.target_fingerprint = ""
        self.accuracy: list[float] | None = None  # held-out top-1 accuracy per draft depth, if measured

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, wte: nn.Embedding, cache: KVCache | None = None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """features (B, T, C), the target's (or the head's own predicted) f_i; tokens (B, T), t_{i+1}.
        Returns f^_{i+1} (B, T, C). cache: the head's one-layer KVCache (advanced by T); attn_mask
        (T, keys) as in `GPT.hidden`, default causal after the whole cached prefix."""
        return self.run(self.embed(features, tokens, wte), cache, attn_mask)

    def embed(self, features: torch.Tensor, tokens: torch.Tensor, wte: nn.Embedding) -> torch.Tensor:
        """x_i = W [f_i ; e(t_{i+1})] + b (B, T, C): eq. 1, the block's input for pair i."""
        return self.fc(torch.cat([features, wte(tokens)], dim=-1))

    def run(self, x: torch.Tensor, cache: KVCache | None = None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The block over inputs x (B, T, C), after what `cache` holds: f^ (B, T, C)."""
        T = x.shape[1]
        if attn_mask is None and cache is not None and cache.length > 0 and T > 1:
            attn_mask = prefix_mask(causal_mask(T, x.device), cache.length)
        x = self.block(x, 0, cache, self.attention, attn_mask)  # the reference attention: the head's masks are dense
        if cache is not None:
            cache.advance(T)
        return x

    def new_cache(self, max_len: int) -> KVCache:
        c, w = self.config, self.fc.weight
        return KVCache(1, c.n_head, c.n_embd // c.n_head, max_len, 1, w.device, w.dtype)

    def save(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        meta = {"config": json.dumps(asdict(self.config)), "target_fingerprint": self.target_fingerprint}
        if self.accuracy is not None:
            meta["accuracy"] = json.dumps([round(a, 5) for a in self.accuracy])
        tensors = {k: (v.to(dtype) if dtype else v).contiguous() for k, v in self.state_dict().items()}
        atomic_save_tensors(tensors, path, meta)

    @classmethod
    def load(cls, path: str | Path, device="cpu", dtype=None) -> "EagleHead":
        meta, sd = read_tensors(path)
        try:
            head = cls.shaped_for(GPTConfig(**json.loads(meta["config"])), sd)
            head.load_state_dict(sd)
        except (KeyError, ValueError, TypeError, RuntimeError) as e:  # not our metadata, names or shapes
            raise ValueError(f"{path} is not an EAGLE head file ({e})") from None
        head.target_fingerprint = meta.get("target_fingerprint", "")
        head.accuracy = json.loads(meta["accuracy"]) if "accuracy" in meta else None
        return head.to(device=device, dtype=dtype or torch.float32).eval()

    @classmethod
    def shaped_for(cls, config: GPTConfig, tensors: dict) -> "EagleHead":
        """A new head of the shape the saved `tensors` have."""
        return cls(config)

    @classmethod
    def for_target(cls, target: GPT) -> "EagleHead":
        head = cls(target.config)
        head.target_fingerprint = target.fingerprint()
        return head.to(target.lm_head.weight.device)


# ---- decoding ----------------------------------------------------------------------------------

class HeadDrafter:
    """The head's side of one step: `catch_up` feeds the pending true pairs (committed), then
    `expand` feeds tree nodes after them, each on its parent's predicted feature, seeing only its
    own ancestors (a tree mask over the head's cache, like verification's); `rollback` drops the
    tree's entries again."""

    def __init__(self, head: EagleHead, wte: nn.Embedding, lm_head, cache: KVCache):
        self.head, self.wte, self.lm_head, self.cache = head, wte, lm_head, cache

    def catch_up(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """features (n, C), tokens (n,): pairs (f_j, t_{j+1}). Returns the root's children logits (V,)."""
        f_hat = self.head(features[None], tokens[None], self.wte, self.cache)[0, -1]  # (C,): f^_M
        self.committed = self.cache.length
        self.feature, self.slot = {-1: f_hat}, {}  # node -> predicted feature f^ / its slot in the cache
        return self.lm_head(f_hat)

    def expand(self, chosen: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int) -> torch.Tensor:
        node_ids, parents = chosen.tolist(), parents.tolist()
        L, n = self.cache.length, len(node_ids)
        mask = torch.zeros(n, L + n, dtype=torch.bool, device=tokens.device)  # (n, keys)
        mask[:, :self.committed] = True  # the text so far
        for row, node in enumerate(node_ids):
            a = parents[node]
            while a >= 0:  # its ancestors (all expanded earlier, so all in the cache)
                mask[row, self.slot[a]] = True
                a = parents[a]
            mask[row, L + row] = True
            self.slot[node] = L + row
        features = torch.stack([self.feature[parents[node]] for node in node_ids])  # (n, C): the parents' f^
        f_hat = self.head(features[None], tokens[None], self.wte, self.cache, mask)[0]  # (n, C)
        self.feature.update(zip(node_ids, f_hat))
        return self.lm_head(f_hat)

    def rollback(self) -> None:
        self.cache.truncate(self.committed)


def draft_tree(drafter: HeadDrafter, pending, tree: Tree | None, top_k: int, depth: int, total_tokens: int,
               sampled: bool, sampling: Sampling, generator):
    """Steps 0-1 of an EAGLE step: the head reads the pending pairs and drafts a tree, static
    (`tree`), sampled, or EAGLE-2's dynamic one; its cache then drops the tree again. Returns
    (tokens (T,), the tree, q (T+1, V) or None)."""
    root_logits = drafter.catch_up(*pending)  # 0. the head reads the target's true features
    q = None  # 1. the draft tree
    if tree is not None:
        tokens, q = fill_static_tree(tree, root_logits, drafter.expand, sampled, sampling, generator)
    else:
        if sampled:
            parents, tokens, q = grow_sampled_tree(root_logits, drafter.expand, top_k, depth, total_tokens, sampling,
                                                   generator)
        else:
            parents, tokens = grow_tree(root_logits, drafter.expand, top_k, depth, total_tokens)
        tree = as_tree(parents)
    drafter.rollback()
    return tokens, tree, q


class Pending:
    """A row's head and what it has not read: the true pairs (f_j, t_{j+1}) as pieces
    [(features, tokens)], joined when it reads them (a plain step appends its piece instead of
    copying all the pieces before it)."""

    def __init__(self, drafter: HeadDrafter, features: torch.Tensor, tokens: torch.Tensor):
        self.drafter, self.pieces = drafter, [(features, tokens)]

    def joined(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([f for f, _ in self.pieces]), torch.cat([t for _, t in self.pieces])


class Eagle(Method):
    """The head drafts features and grows EAGLE-2's tree (steps 0-1 and 5 above). A size is
    (top_k, depth, total_tokens); with --tree, a static shape instead."""
    name = "eagle"
    chapter = 9  # of the walkthrough
    summary = "an EAGLE head drafts the target's features and grows a tree (EAGLE-2), verified in one target pass"
    proposes = "a tree"
    weights = Weights("--eagle", "eagle.safetensors", EagleHead, "an EAGLE head", "python -m tinyspec train eagle",
                      "block.")
    settings = {"tree": STATIC_TREE}
    reduced_vocab = True
    default_size = "2,4,8"
    # top_k = 1 is a chain: two head forwards for depth 2, where a small model's fixed cost per
    # forward makes every forward count
    sizes = ("1,2,2", "1,3,3", "2,3,4", "2,4,8", "2,6,16")
    size_format = (("TOPK", 1, 16, "children per expanded node, and nodes expanded per depth"),
                   ("DEPTH", 1, 16, "the tree's depth"), ("NODES", 1, MAX_NODES, "the most likely nodes kept"))

    def __init__(self, target: GPT, head: EagleHead, draft_vocab: torch.Tensor | None = None,
                 tree: str | Tree | None = None):
        """tree: a static shape (a Tree, or the path of a choice list) for every step, whatever the size."""
        self.target, self.head, self.device, self.tree = target, head, target.lm_head.weight.device, tree
        self.lm_head = target.lm_head if draft_vocab is None else DraftVocab(target.lm_head, draft_vocab)
        static = tree if isinstance(tree, Tree) or tree is None else load_tree(tree)
        self.static = static.to(self.device) if static is not None else None
        self.spare: KVCache | None = None  # batch 1's head cache, reused prompt after prompt

    def shape(self, size: str):
        """(top_k, depth, total_tokens), or the static tree from --tree whatever the size."""
        return self.static if self.static is not None else self.parse_size(size)

    def room(self, shape) -> int:
        return len(shape) if isinstance(shape, Tree) else shape[2]

    def start(self, rows: list[Row], hidden, slots: int) -> None:
        head_room = slots + expanded_at_most(16, 16, MAX_NODES)  # the text, and the most nodes a step of any size expands
        for r, f in zip(rows, hidden):  # f: (P, C), f_0 .. f_{P-1}
            own = self.spare if len(rows) == 1 and self.spare is not None and self.spare.max_len >= head_room else None
            own = own or self.head.new_cache(head_room)
            if len(rows) == 1:
                self.spare = own
            own.reset()
            r.state = Pending(HeadDrafter(self.head, self.target.transformer.wte, self.lm_head, own), f,
                              torch.tensor(r.text[1:], device=self.device))  # pairs (f_j, t_{j+1}), all unread

    def propose(self, rows: list[Row], shape, room: list[int], sampling: Sampling, sampled: bool) -> list:
        static = shape if isinstance(shape, Tree) else None
        deepest = static.max_depth if static is not None else shape[1]
        out = []
        for b, r in enumerate(rows):
            if deepest > room[b]:  # the tree would pass the end of the context: a plain step
                out.append(None)
                continue
            out.append(Proposal(*self.draft_row(r, static, shape, sampled, sampling)))
        return out

    def draft_row(self, r: Row, static: Tree | None, shape, sampled: bool, sampling: Sampling):
        """Steps 0-1 for one row: its head catches up and drafts its tree. (tokens, tree, q)."""
        grown = (None, None, None) if static is not None else shape
        return draft_tree(r.state.drafter, r.state.joined(), static, *grown, sampled, sampling, r.generator)

    def update(self, rows: list[Row], proposals: list, verified: list[Verified]) -> None:
        for r, prop, v in zip(rows, proposals, verified):
            new = (v.hidden[v.kept], torch.tensor(v.step.tokens, device=self.device))  # 5. true features, what followed
            if prop is not None:
                r.state.pieces = [new]  # the head read everything before this step
            else:
                r.state.pieces.append(new)


class EaglePart(Part):
    """EAGLE's head (and the parallel drafter's): its cache holds the pairs (f_j, t_{j+1}) it has
    read below `committed`; `features`, `tokens` hold the D + 1 newest pairs, the first `n_pending`
    of them not read yet. A step reads them all at once (the rest are written past what it keeps),
    then grows EAGLE-2's tree of T nodes, top_k expanded per depth (with `grow_tree`, as `Eagle`)."""

    @classmethod
    def problem(cls, method) -> str | None:
        return f"a recorded step of {method.name} grows EAGLE-2's tree: drop --tree" if method.static is not None else None

    def __init__(self, method, shape, sampling: Sampling, rule: str, slots: int):
        self.method, self.head, self.shape = method, method.head, shape
        self.top_k, self.D, total = shape
        levels = [min(self.top_k, total)]  # nodes made at each depth
        for _ in range(self.D - 1):
            levels.append(min(self.top_k, levels[-1]) * self.top_k)
        self.T, self.made, self.expanded = min(total, sum(levels)), sum(levels), [min(self.top_k, n) for n in levels[:-1]]
        self.cache = self.head.new_cache(slots + self.D + 1 + sum(self.expanded))
        device, C = self.cache.k.device, method.target.config.n_embd
        self.committed = torch.zeros(1, dtype=torch.long, device=device)
        self.features = torch.zeros(self.D + 1, C, device=device, dtype=self.cache.k.dtype)
        self.tokens = torch.zeros(self.D + 1, dtype=torch.long, device=device)
        self.n_pending = torch.ones(1, dtype=torch.long, device=device)
        self.wte = method.target.transformer.wte

    def begin(self, text, hidden):  # the prompt's pairs but the last are read and kept at once
        self.cache.reset()
        if len(text) > 2:
            self.head(hidden[None, :-1], torch.tensor(text[1:-1], device=hidden.device)[None], self.wte, self.cache)
        self.committed.fill_(self.cache.length)
        self.features[:1], self.tokens[:1] = hidden[-1:], text[-1]
        self.n_pending.fill_(1)

    def read(self, x: torch.Tensor, at: torch.Tensor, sees: torch.Tensor) -> torch.Tensor:
        """The head's block over inputs x (n, C), written at slots `at`: each sees the committed
        slots and, of the len(sees[0]) slots after them, where sees (n, m) says."""
        return self.head.run(x[None], SlotWriter(self.cache, at), slot_mask(sees, self.committed, self.cache.max_len))[0]

    def catch_up(self) -> torch.Tensor:
        """f^_M (1, C), the head's feature at the root, from the pending pairs, which it then keeps."""
        n = self.D + 1
        x = self.head.embed(self.features[None], self.tokens[None], self.wte)[0]
        f = self.read(x, self.committed + torch.arange(n, device=x.device), causal_mask(n, x.device))
        self.committed.add_(self.n_pending)
        return f[self.n_pending - 1]

    def propose(self, root, L, u):
        f_root = self.catch_up()
        E = sum(self.expanded)
        feature = torch.cat([f_root, f_root.new_zeros(self.made, f_root.shape[-1])])  # row i + 1: node i's f^
        sees = torch.zeros(self.made, E, dtype=torch.bool, device=f_root.device)  # which expanded nodes a node sees

        def expand(chosen, parents, tokens, d):  # the e chosen nodes of depth d, side by side after the text
            e, first = len(chosen), sum(self.expanded[:d - 1])
            view = sees[chosen]
            view[:, first:first + e] |= torch.eye(e, dtype=torch.bool, device=view.device)  # and itself
            made = len(parents)  # their children: nodes made .. made + e top_k - 1
            sees[made:made + e * self.top_k] = view.repeat_interleave(self.top_k, 0)
            x = self.head.embed(feature[parents[chosen] + 1][None], tokens[None], self.wte)[0]
            f = self.read(x, self.committed + first + torch.arange(e, device=x.device), view)
            feature[chosen + 1] = f
            return self.method.lm_head(f)
        parents, tokens = grow_tree(self.method.lm_head(f_root)[0], expand, *self.shape)
        return tokens, parents, None, None

    def update(self, hidden, path, n, seq):
        self.features.copy_(hidden[path])  # the true features of the root and the path,
        self.tokens.copy_(seq[1:])  # each with the token that followed it
        self.n_pending.copy_(n)


Eagle.Part = EaglePart  # its recorded step, found through the method as METHOD is


METHOD = Eagle
