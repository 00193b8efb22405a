"""EAGLE-2's dynamic tree: grow it from the drafter's scores (Li, Wei, Zhang & Zhang 2024, EAGLE-2,
arXiv:2406.16858), shared by EAGLE's head (eagle.py) and the parallel drafter (parallel.py).

A tree grows node by node: parents[i] (-1 = child of the root) and tokens[i], in the order nodes
are made, which is topological. The drafter is one function, `expand(chosen, parents, tokens,
depth)`: it runs once over the chosen nodes (chosen (e,): their indices, all `depth` deep; parents:
every node's so far; tokens (e,): theirs) and returns their logits (e, V), the draft's distribution
of each node's children. EAGLE's head reads each node on its parent's predicted feature and its own
token, seeing its ancestors; the parallel drafter looks up the row of depth + 1 it drafted already.
Here: `grow_tree` (EAGLE-2's, top-k), `grow_sampled_tree` (sampled children, for the lossless
rule), `fill_static_tree` (a fixed shape, `--tree`), `as_tree` (the grown parents as a `Tree`) and
`expanded_at_most` (how many nodes a step hands to `expand`, the room they take in EAGLE's head cache).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..sampling import Sampling, sample
from ..tree import Tree


def grow_tree(root_logits: torch.Tensor, expand: Callable, top_k: int, depth: int, total_tokens: int):
    """EAGLE-2's dynamic tree (Li et al. 2024, Section 4): the `total_tokens` draft tokens most likely to
    be accepted, from `depth - 1` head forwards. Returns (parents (T,), tokens (T,)), T <= total_tokens,
    as tensors on the device: nothing here is read back to the host, so the recorded step
    (`eagle.EaglePart`) grows its trees with this very function.

    root_logits (V,): the head's logits for the root's children. The *value* of a node is the
    product of the draft's probabilities along its path (a sum of log-probabilities here), the
    head's own estimate of the chance that the target accepts the whole path.

    - Expansion: the root's top_k most likely tokens are depth 1. At each depth d < `depth`, the top_k
      nodes of depth d with the highest value are expanded: ONE call `expand(those nodes)` gives
      their logits, and each proposes its top_k most likely tokens as children, of value
      value(parent) + log q(child). Every count is fixed by (top_k, depth), whatever the values.
    - Rerank: of all nodes made, keep the `total_tokens` of highest value (ties: the earlier node). A
      child's value never exceeds its parent's (log q <= 0), so every kept node's parent is kept:
      the result is a tree. Kept nodes stay in the order they were made, so parents come first.

    Example, top_k = 2, depth = 3, total_tokens = 4 (values shown as probabilities):
        depth 1: a .6   b .25                  expand a, b:  a -> c 0.5, d 0.3;  b -> e 0.9, f 0.1
        depth 2: c .3   d .18   e .225  f .025 expand c, e:  c -> g 0.8, h 0.1;  e -> i 0.5, j 0.4
        depth 3: g .24  h .03   i .1125 j .09
        keep the 4 best: a .6, c .3, b .25, g .24 -> parents [-1, -1, 0, 2], tokens [a, b, c, g]
    (g, three deep on a likely path, beats e, two deep on an unlikely one.)"""
    device = root_logits.device
    top = torch.log_softmax(root_logits.float(), -1).topk(min(top_k, total_tokens))
    parents, tokens, values = [torch.full_like(top.indices, -1)], [top.indices], [top.values]  # depth 1
    for d in range(1, depth):
        value, first = torch.cat(values), len(torch.cat(parents)) - len(values[-1])  # depth d: nodes first..
        chosen = first + value[first:].topk(min(top_k, len(values[-1]))).indices  # (e,): the best of depth d
        logq = torch.log_softmax(expand(chosen, torch.cat(parents), torch.cat(tokens)[chosen], d).float(), -1)
        top = logq.topk(top_k, dim=-1)  # (e, top_k) children each
        parents.append(chosen.repeat_interleave(top_k))
        tokens.append(top.indices.flatten())
        values.append((value[chosen, None] + top.values).flatten())  # (e * top_k,): path log-probabilities
    value, tokens, parents = torch.cat(values), torch.cat(tokens), torch.cat(parents)
    keep = torch.sort(value, descending=True, stable=True).indices[:total_tokens].sort().values  # in made order
    new = torch.full_like(parents, -1)
    new[keep] = torch.arange(len(keep), device=device)  # old node index -> index in the kept tree
    return torch.where(parents[keep] >= 0, new[parents[keep].clamp(min=0)], -1), tokens[keep]


def grow_sampled_tree(root_logits: torch.Tensor, expand: Callable, top_k: int, depth: int, total_tokens: int,
                      sampling: Sampling, generator):
    """A tree of *sampled* children for the lossless rule: (parents (T,), tokens (T,), q (T+1, V)).

    SpecInfer's rule (`verify.lossless`) is exact only if, given everything the walk has seen,
    the children of a node are i.i.d. draws from that node's q and HOW MANY there are does not
    depend on their values. Dropping a sampled child because of its own value (EAGLE-2's rerank)
    keeps the likely draws and loses the unlikely ones: the surviving children are no longer
    draws from q, and the output drifts from p. So here:
    - every expanded node gets a whole *group* of top_k children drawn i.i.d. from its q (duplicates
      included), and a group, once drawn, is never pruned;
    - which nodes to expand at depth d is decided from what is known at depths <= d (their
      values; a repeated sibling is not expanded again), i.e. before their children are drawn;
    - the budget is counted in groups, min(top_k, (total_tokens - size) // top_k) expansions per depth, so the
      tree's size never depends on sampled values.
    A node's children are thus a fixed-size i.i.d. sample whatever happened elsewhere in the tree.
    Row a of q is the distribution node a was drawn from (its parent's), row 0 unused."""
    q_rows = [sampling.probs(root_logits)]  # q_rows[g]: the distribution of group g
    n = min(top_k, total_tokens)
    tokens = [sample(q_rows[0].expand(n, -1), generator)]
    parents, group, values = [-1] * n, [0] * n, [q_rows[0][tokens[0]].log()]
    frontier = list(range(n))
    for d in range(1, depth):
        value, flat = torch.cat(values), torch.cat(tokens).tolist()
        seen, fresh = set(), []
        for i in frontier:  # a sibling repeating an earlier one's token would only repeat its subtree
            if (parents[i], flat[i]) not in seen:
                seen.add((parents[i], flat[i]))
                fresh.append(i)
        e = min(top_k, len(fresh), (total_tokens - len(parents)) // top_k)
        if e == 0:
            break
        chosen = [fresh[i] for i in value[fresh].topk(e).indices.tolist()]
        device = root_logits.device
        q = sampling.probs(expand(torch.tensor(chosen, device=device), torch.tensor(parents, device=device),
                                  torch.cat(tokens)[chosen], d))  # (e, V)
        q_each = q.repeat_interleave(top_k, dim=0)  # (e * top_k, V): each child's distribution
        children = sample(q_each, generator)  # (e * top_k,): top_k i.i.d. draws per expanded node
        frontier = list(range(len(parents), len(parents) + e * top_k))
        parents += [p for p in chosen for _ in range(top_k)]
        group += [len(q_rows) + j for j in range(e) for _ in range(top_k)]
        q_rows += list(q)
        tokens.append(children)
        values.append(value[chosen].repeat_interleave(top_k) + q_each.gather(1, children[:, None])[:, 0].log())
    q = torch.stack(q_rows)[torch.tensor([0] + group, device=root_logits.device)]  # (T+1, V)
    return torch.tensor(parents, device=root_logits.device), torch.cat(tokens), q


def fill_static_tree(tree: Tree, root_logits: torch.Tensor, expand: Callable, sampled: bool, sampling: Sampling,
                     generator):
    """The tokens of a fixed tree shape (a choice list, `--tree FILE.json`), one head forward per
    depth over the nodes that have children. Node i is the ranks[i]-th most likely child of its
    parent, or (sampled) a draw from the parent's q. Returns (tokens (T,), q (T+1, V) or None)."""
    device = root_logits.device
    depth = tree.depth[1:].tolist()
    logits = {-1: root_logits}  # parent node -> the head's logits for its children
    tokens = torch.zeros(len(tree), dtype=torch.long, device=device)
    q = torch.zeros(len(tree) + 1, root_logits.shape[-1], device=device) if sampled else None
    for d in range(1, tree.max_depth + 1):
        level = [i for i in range(len(tree)) if depth[i] == d]
        for i in level:
            parent_logits = logits[tree.parents[i]]
            if sampled:
                q[i + 1] = sampling.probs(parent_logits)
                tokens[i] = sample(q[i + 1], generator)
            else:
                tokens[i] = parent_logits.topk(tree.ranks[i] + 1).indices[-1]
        inner = [i for i in level if tree.children(i + 1)]
        if inner:
            logits.update(zip(inner, expand(torch.tensor(inner, device=device), torch.tensor(tree.parents, device=device),
                                            tokens[inner], d)))
    return tokens, q




def expanded_at_most(top_k: int, depth: int, total_tokens: int, tree: Tree | None = None) -> int:
    """The most nodes one step passes to `expand`, the entries it writes into EAGLE's head cache: every
    node of a static tree, or top_k expanded nodes at each depth but the last of a dynamic one (or the
    node budget)."""
    return len(tree) if tree is not None else max(total_tokens, top_k * (depth - 1))


def as_tree(parents: torch.Tensor) -> Tree:
    """The Tree of parent indices on the device (read back once: the readable loop's rules walk it
    in Python); built on the CPU, moved only where that is not the device."""
    tree = Tree(tuple(parents.tolist()))
    return tree if parents.device.type == "cpu" else tree.to(parents.device)
