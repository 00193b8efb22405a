"""Tree verification: check a whole tree of guesses with one target forward pass.

Medusa's heads (medusa.py) guess the next K tokens; a tree (tree.py) combines several guesses
per position. The target reads the root (the last token it chose) and all T tree tokens as one
sequence: each token at position L + depth, attending to the whole cache and, inside the tree,
only to its ancestors (`Tree.ancestor_mask`). Its logits at token a are its distribution for
the token after a, so every node can be judged by its parent's logits. Three rules:

- `greedy_accept`: the longest root-to-leaf path on which every token is the target's argmax
  at its parent. Exactly plain greedy decoding (Cai et al. 2024, and their reference code).
- `typical_accept`: Medusa's typical acceptance: accept x at a parent with distribution p if
  p(x) > min(epsilon, delta * exp(-H(p))). Fast and fluent, but NOT lossless: its output does
  not follow the target's distribution (tests/test_verify.py measures the drift).
- `lossless_accept`: multi-candidate speculative sampling (SpecInfer, Miao et al. 2023): at a
  node, try its children in turn, accepting child x with probability min(1, p(x) / q(x)); after
  a rejection replace p by norm(max(0, p - q)) and try the next child; if all are rejected, sample
  from what is left of p. This is exact when every child was drawn independently from q, so in
  this mode the tree's tokens are sampled from the heads' distributions, not taken top-k.

After the pass the KV cache holds the prefix, the root and every tree token; `KVCache.keep`
compacts the accepted path into place, and the cache again holds exactly the accepted tokens.
"""

from __future__ import annotations

from typing import Iterator

import torch

from .decoding import BONUS, CORRECTION, HEAD, TARGET, Step
from .fastpath import fixed_step
from .kvcache import KVCache
from .medusa import MedusaHeads
from .model import GPT
from .sampling import Sampling, sample
from .tree import Tree

ACCEPT_RULES = ("greedy", "typical", "lossless")


def longest_accepted_path(ok: torch.Tensor, tree: Tree) -> torch.Tensor:
    """ok (T+1,) bool: token a is acceptable given its parent (the root is always). Returns the
    indices of the longest root-to-leaf prefix of acceptable tokens, e.g. [0, 1, 3]."""
    # BEGIN SOLUTION verify: over tree.paths, find the longest prefix of acceptable tokens and return its indices
    padded = torch.cat([ok, ok.new_zeros(1)])  # index -1 (padding) reads False
    run = padded[tree.paths].long().cumprod(dim=1)  # (leaves, depth+1): 1 while the path holds
    lengths = run.sum(1)
    n, best = torch.stack(lengths.max(0)).tolist()  # the host reads length and path: one sync
    return tree.paths[best, :n]
    # END SOLUTION


def greedy_accept(tokens: torch.Tensor, logits: torch.Tensor, tree: Tree) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens (T+1,) root + tree; logits (T+1, V). Returns (accepted path, next token)."""
    # BEGIN SOLUTION verify: a node is acceptable when it is the target's argmax at its parent; return the longest such path and the argmax after it
    argmax = logits.argmax(-1)  # (T+1,): the target's choice after each token
    ok = torch.cat([tokens.new_ones(1, dtype=torch.bool), tokens[1:] == argmax[tree.parent_index]])
    path = longest_accepted_path(ok, tree)
    return path, argmax[path[-1]]
    # END SOLUTION


def typical_accept(tokens, logits, tree: Tree, sampling: Sampling, generator, epsilon: float = 0.09,
                   delta: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """Medusa's typical acceptance (Cai et al. 2024; epsilon and delta as in their code)."""
    p = sampling.probs(logits)  # (T+1, V)
    entropy = -(p * p.clamp(min=1e-10).log()).sum(-1)  # (T+1,)
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))
    parents = tree.parent_index
    ok = torch.cat([tokens.new_ones(1, dtype=torch.bool), p[parents, tokens[1:]] > threshold[parents]])
    path = longest_accepted_path(ok, tree)
    return path, sample(p[path[-1]], generator)


def lossless_accept(tokens, logits, tree: Tree, draft_probs: torch.Tensor, sampling: Sampling,
                    generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-candidate rejection sampling (SpecInfer). draft_probs (K, V): q of each depth, the
    distribution every node at that depth was drawn from, independently."""
    target_probs = sampling.probs(logits)  # (T+1, V)
    node, path = 0, [0]
    p = target_probs[0]
    while True:
        for child in tree.children(node):
            x, q = tokens[child], draft_probs[int(tree.depth[child]) - 1]
            if float(torch.rand((), device=p.device, generator=generator)) * q[x] < p[x]:  # r < p(x)/q(x)
                break
            residual = (p - q).clamp(min=0)
            p = residual / residual.sum() if residual.sum() > 0 else p  # (p == q only by rounding)
        else:  # no child accepted (or a leaf): the next token comes from what is left of p
            return torch.tensor(path, device=tokens.device), sample(p, generator)
        node = child
        path.append(child)
        p = target_probs[child]


def propose(head_logits: torch.Tensor, tree: Tree, sampling: Sampling, rule: str, generator):
    """The tree's T tokens from the heads' logits (K, V); for lossless also q (K, V).
    greedy/typical: node i is the ranks[i]-th best guess of head depth(i). lossless: node i is
    drawn from q of its depth, independently of every other node."""
    depth = tree.depth[1:] - 1  # (T,) which head guesses each node
    if rule == "lossless":
        q = sampling.probs(head_logits)  # (K, V)
        return sample(q[depth], generator), q
    ranks = torch.tensor(tree.ranks, device=head_logits.device)
    top = head_logits.topk(int(ranks.max()) + 1, dim=-1).indices  # (K, max rank + 1)
    return top[depth, ranks], None


@torch.no_grad()
def medusa(target: GPT, heads: MedusaHeads, prompt: list[int], sampling: Sampling, generator: torch.Generator | None,
           max_len: int, tree: Tree, rule: str = "greedy", cache: KVCache | None = None,
           fixed: bool = False) -> Iterator[Step]:
    """Medusa decoding; yields one `Step` per target forward pass. fixed: verify with a
    fixed-shape step (fastpath.py), replayed as a CUDA graph on CUDA."""
    if rule not in ACCEPT_RULES:
        raise ValueError(f"unknown acceptance rule {rule!r}: use one of {', '.join(ACCEPT_RULES)}")
    device = target.lm_head.weight.device
    tree = tree.to(device)
    tree_step = None
    if fixed:  # a context-sized cache and the tree's step, made once and reused (fastpath.py)
        if cache is not None:
            raise ValueError("fixed steps bring their own cache: pass cache or fixed, not both")
        cache, tree_step = fixed_step(target, target.config.n_ctx, tree)
    cache = cache or KVCache.for_model(target, max_len)
    n_ctx = target.config.n_ctx
    h = target.hidden(torch.tensor([prompt], device=device), cache=cache)[0, -1]  # (C,) at the last prompt token
    root = sample(sampling.probs(target.lm_head(h)), generator)  # the first new token: plain decoding
    yield Step([int(root)], [TARGET])
    while cache.length < max_len:
        L = cache.length
        if L + 1 + len(tree) > max_len or L + tree.max_depth >= n_ctx:  # no room for a tree: plain step
            logits, hidden = target(root.view(1, 1), cache=cache)
            h, root = hidden[0, -1], sample(sampling.probs(logits[0, -1]), generator)
            yield Step([int(root)], [TARGET])
            continue
        tokens, q = propose(heads(h, target.lm_head), tree, sampling, rule, generator)
        x = torch.cat([root.view(1), tokens])  # (T+1,): root, then the tree
        if tree_step is not None:
            logits, hidden = tree_step(x, L)  # the graph's output buffers: used before the next replay
            cache.advance(len(x))
        else:
            logits, hidden = target(x.view(1, -1), positions=L + tree.depth, cache=cache, mask=tree.ancestor_mask)
        logits = logits[0]
        if rule == "greedy":
            path, root = greedy_accept(x, logits, tree)
        elif rule == "typical":
            path, root = typical_accept(x, logits, tree, sampling, generator)
        else:
            path, root = lossless_accept(x, logits, tree, q, sampling, generator)
        cache.keep((L + path).tolist())  # the root (slot L) and the accepted nodes, compacted
        h = hidden[0, path[-1]]
        accepted = x[path[1:]].tolist()
        kind = CORRECTION if tree.children(int(path[-1])) else BONUS
        yield Step(accepted + [int(root)], [HEAD] * len(accepted) + [kind], proposed=tree.max_depth)
