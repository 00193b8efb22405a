"""Acceptance rules: which proposed tokens the target keeps, judged from one forward pass.

A drafter (a draft model, Medusa's heads, EAGLE, a lookup) proposes a tree of tokens below the
last accepted one, the *root*; a draft model's k tokens are a chain, the simplest tree
(`tree.chain`). The target reads the root and the T nodes in one forward (each node at position
L + depth, seeing only its ancestors: `Tree.tree_mask`), and its distribution after token a is
how it judges a's children. Every rule here has one signature,

    rule(tokens, p, tree, q, generator) -> (path, next_token)

- tokens (T+1,): the root, then the T proposed nodes (tree order);
- p (T+1, V): the target's processed distribution after each of them (`Sampling.probs`);
- q (T+1, V) or None: q[a] is the distribution node a's token was drawn from (row 0 unused);
- path: indices of the accepted tokens, from the root (path[0] == 0) down one branch, a 1-D
  long tensor;
- next_token: the target's own token after the path (a correction, or a bonus at a leaf), a
  0-d tensor, as `sample` returns for one row;
- note (optional, None): called note(node, **facts) with what the rule saw at each node it
  judged (its coin u, min(1, p/q), ...), for a trace of the run (`trace.py`); never when None;

and they sit in one table, `RULES`, by name:

- `greedy`: the longest path on which every token is the target's argmax at its parent:
  exactly plain greedy decoding (Cai et al. 2024).
- `typical`: Medusa's typical acceptance: accept x where p(x) > min(epsilon, delta exp(-H(p))).
  Fast and fluent, but NOT lossless (tests/test_verify.py measures the drift).
- `lossless`: multi-candidate speculative sampling (SpecInfer, Miao et al. 2023): try a node's
  children in turn, accepting x with probability min(1, p(x) / q(x)), after a rejection
  replacing p by norm(max(0, p - q)); if all are rejected, sample from what is left of p. Exact
  when the siblings were drawn independently from q (a *sampled* tree).
- `pointmass`: the same walk for a *deterministic* tree (children chosen top-k, not sampled):
  a fixed candidate x is a draft whose q is a point mass at x, so x is accepted with
  probability p(x) and a rejection removes x from p and renormalises. Exact for any tree of fixed
  candidates, repeated siblings included (a repeat of a rejected token has p'(x) = 0 and is
  rejected in turn), so the top-k trees of Medusa and EAGLE are lossless at T > 0.
- `block`: block verification of a chain (Sun, Mendlovic, Leviathan et al., ICLR 2025,
  Algorithm 2): judges the whole block jointly; never fewer expected tokens per step than the
  token-by-token rule, same output distribution.
- `traversal`: traversal verification (Weng et al., NeurIPS 2025): block verification's
  sequence-level acceptance carried to a sampled tree, judged from the leaves up; a rejected
  subtree leaves its parent a residual instead of ending the walk. Exact when siblings were
  drawn independently from q, as for `lossless`; on a chain it is block verification.

`SAMPLED` names the rules whose exactness needs the nodes drawn from q; `CHAIN_ONLY` the rules
that judge a chain only. The draft model's chain has its own form of the lossless rule, the one of
Leviathan et al. (`methods/draft.py`, chapter 5); on a chain the two are the same rule.
"""

from __future__ import annotations

import torch

from .sampling import draw, residual, sample
from .tree import Tree, chain


def longest_accepted_path(ok: torch.Tensor, tree: Tree) -> torch.Tensor:
    """ok (T+1,) bool: token a is acceptable given its parent (the root is always). Returns the
    indices of the longest root-to-leaf prefix of acceptable tokens, e.g. [0, 1, 3]."""
    padded = torch.cat([ok, ok.new_zeros(1)])  # index -1 (padding) reads False
    run = padded[tree.paths].long().cumprod(dim=1)  # (leaves, depth+1): 1 while the path holds
    lengths = run.sum(1)
    n, best = torch.stack(lengths.max(0)).tolist()  # the host reads length and path: one sync
    return tree.paths[best, :n]


def greedy(tokens: torch.Tensor, p: torch.Tensor, tree: Tree, q=None, generator=None, note=None):
    """A node is acceptable when it is the target's argmax at its parent; the longest such
    path wins, and the argmax after it is the next token."""
    argmax = p.argmax(-1)  # (T+1,): the target's choice after each token
    for a, want in enumerate(argmax[tree.parent_index].tolist() if note else (), 1):
        note(a, want=want)
    ok = torch.cat([tokens.new_ones(1, dtype=torch.bool), tokens[1:] == argmax[tree.parent_index]])
    path = longest_accepted_path(ok, tree)
    return path, argmax[path[-1]]


def typical(tokens, p, tree: Tree, q=None, generator=None, note=None, epsilon: float = 0.09, delta: float = 0.3):
    """Medusa's typical acceptance (Cai et al. 2024; epsilon and delta as in their code)."""
    entropy = -(p * p.clamp(min=1e-10).log()).sum(-1)  # (T+1,)
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))
    parents = tree.parent_index
    ok = torch.cat([tokens.new_ones(1, dtype=torch.bool), p[parents, tokens[1:]] > threshold[parents]])
    for a, bar in enumerate(threshold[parents].tolist() if note else (), 1):
        note(a, threshold=bar)
    path = longest_accepted_path(ok, tree)
    return path, sample(p[path[-1]], generator)


def _walk(tokens, p, tree: Tree, q_of, generator, note=None):
    """Multi-candidate rejection down the tree. q_of(a): the distribution node a was drawn from."""
    node, path, p_node = 0, [0], p[0]
    while True:
        for child in tree.children(node):
            x, q = int(tokens[child]), q_of(child)
            r = float(torch.rand((), device=p.device, generator=generator))
            if note:
                note(child, u=r, ratio=min(1.0, float(p_node[x] / q[x])))
            if r * q[x] < p_node[x]:  # r < p(x) / q(x)
                break
            p_node = residual(p_node, q)  # rejected: the next sibling is judged against what is left
        else:  # no child accepted (or a leaf): the next token comes from what is left of p
            return torch.tensor(path, device=tokens.device), sample(p_node, generator)
        node, p_node = child, p[child]
        path.append(child)


def lossless(tokens, p, tree: Tree, q: torch.Tensor, generator=None, note=None):
    """SpecInfer's multi-candidate speculative sampling, for trees whose siblings were drawn
    independently from q[child] (the same q for all children of one node)."""
    return _walk(tokens, p, tree, lambda child: q[child], generator, note)


def pointmass(tokens, p, tree: Tree, q=None, generator=None, note=None):
    """The same walk with q a point mass at each (deterministic) candidate: accept x with
    probability p'(x), where p' is p without the siblings already rejected, renormalised."""
    V = p.shape[-1]
    return _walk(tokens, p, tree, lambda child: torch.nn.functional.one_hot(tokens[child], V).to(p.dtype), generator,
                 note)


def block(tokens, p, tree: Tree, q: torch.Tensor, generator=None, note=None):
    """Block verification of a chain x_1..x_k (Sun et al. 2025, Algorithm 2), in their notation
    with Mb = p (target), Ms = q (draft), X^i = x_1..x_i:

        p_0 = 1,   p_i = min(1, p_{i-1} Mb(x_i | X^{i-1}) / Ms(x_i | X^{i-1}))
        S_i = sum_x max(0, p_i Mb(x | X^i) - Ms(x | X^i))
        h_i = S_i / (S_i + 1 - p_i)  for i < k,   h_k = p_k

    with h_i = 1 where S_i + 1 - p_i = 0 (0 / 0: S_i = 0 and p_i = 1, so Mb(. | X^i) = Ms(. | X^i)
    and the block up to x_i loses nothing; a NaN there would never be hit).

    With eta_i uniform, tau is the LAST i with eta_i < h_i (0 if none): x_1..x_tau are
    accepted, then the next token comes from Mb(. | X^k) if tau = k, else from
    norm(max(0, p_tau Mb(. | X^tau) - Ms(. | X^tau))). Unlike the token-level rule, a
    rejection at i does not stop the walk: a later success can still accept the block up to it.
    A branching tree is refused with a ValueError whose message names a chain."""
    k = len(tree)
    if tree.parents != chain(k).parents:
        raise ValueError("block verification judges a chain (a draft model's proposals), not a branching tree")
    x = tokens[1:]  # x_1..x_k
    i = torch.arange(k, device=p.device)
    ratios = (p[i, x] / q[i + 1, x]).tolist()  # Mb(x_i | X^{i-1}) / Ms(x_i | X^{i-1}), i = 1..k
    weights, w = [], 1.0
    for r in ratios:
        w = min(1.0, w * r)
        weights.append(w)  # p_1 .. p_k
    wt = torch.tensor(weights, device=p.device, dtype=p.dtype)
    S = (wt[:-1, None] * p[1:k] - q[2:]).clamp(min=0).sum(-1)  # S_1 .. S_{k-1}
    denominator = S + 1 - wt[:-1]
    h = torch.cat([torch.where(denominator > 0, S / denominator.clamp(min=1e-30), torch.ones_like(S)), wt[-1:]])
    eta = torch.rand(k, device=p.device, generator=generator, dtype=p.dtype)
    hits = (eta < h).nonzero()
    for i, (u, h_i, w) in enumerate(zip(eta.tolist(), h.tolist(), weights) if note else (), 1):
        note(i, u=u, h=h_i, weight=w)
    tau = int(hits[-1]) + 1 if len(hits) else 0
    path = torch.arange(tau + 1, device=tokens.device)
    if tau == k:
        return path, sample(p[k], generator)
    p_tau = 1.0 if tau == 0 else weights[tau - 1]
    return path, sample(residual(p_tau * p[tau], q[tau + 1]), generator)


def traversal(tokens, p, tree: Tree, q: torch.Tensor, generator=None, note=None):
    """Traversal verification (Weng et al. 2025, arXiv:2505.12398), in block verification's
    notation: node a, drawn from q_a = q[a] below its parent b, has the sequence-level weight

        p_a = min(1, p_b p(x_a | b) / q_a(x_a)),   p_root = 1,

    the chance of accepting the whole path root..a at once. The walk visits the tree depth first,
    from the leaves up (post-order): a node whose children are all gone (a leaf, at first) is
    accepted with probability p_a, and with it its path; the next token then comes from the
    node's target distribution P_a, which is p(. | a) until a child is rejected. A rejected node
    is deleted, and its parent b keeps what the rejected subtree did not use:

        R = max(0, p_b P_b - q_a),   S = sum R,   P_b <- R / S,   p_b <- S / (S + 1 - p_b)

    (block verification's h_i and residual). Its next children are then judged against the new
    p_b and P_b. Where S = 0 the rejected subtree used all of it: P_b is kept as it was and the
    weight becomes 0 (or stays 1 if it was 1, a rejection of probability 0 that only rounding
    reaches); R / S there would be NaN, and min(1.0, nan) is 1.0. The root's weight stays 1: if every node is rejected, the root's residual gives
    the next token. On a chain this is block verification; at depth 1, SpecInfer's rule.
    Unlike the top-down walk, a deep path can be accepted although a token-level test on its
    first node would have failed: p_a weighs the whole path."""
    def visit(node: int, weight: float, P: torch.Tensor):
        """The subtree below `node` (its weight and target distribution): (path, next token) if
        a path through it is accepted, or None if the whole subtree, node included, is rejected."""
        for child in tree.children(node):
            x, q_child = int(tokens[child]), q[child]
            found = visit(child, min(1.0, weight * float(P[x]) / float(q_child[x])), p[child])
            if found is not None:
                return [node] + found[0], found[1]
            R = (weight * P - q_child).clamp(min=0)  # the subtree below child is gone: node keeps R
            S = float(R.sum())
            weight = S / (S + 1.0 - weight) if S + 1.0 - weight > 0 else 1.0  # (S = 0 and weight 1: p = q, kept)
            P = R / S if S > 0 else P
        r = float(torch.rand((), device=p.device, generator=generator))
        if note:
            note(node, u=r, weight=weight)
        if r < weight:
            return [node], sample(P, generator)
        return None
    path, nxt = visit(0, 1.0, p[0])  # the root's weight is 1: it is always accepted in the end
    return torch.tensor(path, device=tokens.device), nxt


RULES = {"greedy": greedy, "typical": typical, "lossless": lossless, "pointmass": pointmass, "block": block,
         "traversal": traversal}
SAMPLED = {"lossless", "block", "traversal"}  # exact only when each node was drawn from its q
CHAIN_ONLY = {"block"}


# ---- the same rules on the device: fixed shapes, no read-back (the recorded step, recorded.py) ----
# Each takes the step's tensors as they lie on the device and returns (path (D+1,): the accepted
# indices, padded with the last; n (1,): its length; next (1,): the target's token after it;
# last (1,): the path's last index), drawing from the uniform numbers u it is given.

def fixed_match(tokens, y, parent, mask, depth, valid, D: int):
    """The greedy and point-mass rules at once. y (T+1,): the target's token after each node, its
    argmax (greedy) or a draw from p (point-mass); node a is acceptable when tokens[a] == y[parent]
    and no earlier sibling carries the same token (the root always), and the deepest node whose
    ancestors are all acceptable ends the path. Following the FIRST child that equals the target's
    own draw, node by node, is sampling from the target, whatever the siblings repeat: a repeat
    never gets a second draw (`pointmass`, sibling by sibling, rejects a repeat of a rejected
    token). The device form of `greedy` and `pointmass`."""
    T1 = len(tokens)
    earlier = torch.ones(T1, T1, dtype=torch.bool, device=tokens.device).tril(-1) & (depth > 0) & valid
    repeat = (earlier & (parent[:, None] == parent) & (tokens[:, None] == tokens)).any(-1)  # (T+1,)
    ok = ((tokens == y[parent]) & ~repeat | (depth == 0)) & valid
    good = ~(mask & ~ok).any(-1)  # every ancestor acceptable: one node at most per depth
    best = (depth * good).argmax(-1, keepdim=True)  # (1,): the deepest
    return fixed_on_path(mask, depth, best, D), depth[best] + 1, y[best], best


def fixed_on_path(mask, depth, best, D: int) -> torch.Tensor:
    """(D+1,): the ancestor of `best` at each depth 0..D (the root where it has none)."""
    levels = mask[best] & (depth == torch.arange(D + 1, device=depth.device)[:, None])  # (D+1, T+1)
    return levels.byte().argmax(-1)


def fixed_walk(tokens, p, q, kids, u, D: int):
    """SpecInfer's multi-candidate rule (`verify.lossless`) on a static tree, with fixed shapes: at
    each depth the node's children (kids (T+1, S), -1 padded) are tried in turn, child x accepted
    when u q(x) < P(x), where P starts as the node's p and loses each rejected child's q
    (`residual`); the walk goes on below the accepted child and ends where none was. The tests
    that cannot happen are masked, not skipped. u (D * S + 1,): one number per test, then the
    next token's. Returns (path (D+1,), n (1,), next (1,), last (1,))."""
    node, alive = kids.new_zeros(1), torch.ones(1, dtype=torch.bool, device=p.device)
    P, path, n, S = p[:1], [node], kids.new_ones(1), kids.shape[1]
    for d in range(D):
        taken, found = node, torch.zeros_like(alive)
        for s in range(S):
            child = kids[node, s]  # (1,)
            live = alive & ~found & (child >= 0)
            child = child.clamp(min=0)
            x, q_child = tokens[child], q[child]  # (1,), (1, V)
            r = u[d * S + s]
            yes = live & (r * q_child.gather(1, x[:, None])[:, 0] < P.gather(1, x[:, None])[:, 0])
            taken, found = torch.where(yes, child, taken), found | yes
            P = torch.where((live & ~yes)[:, None], residual(P, q_child), P)
        alive = alive & found
        node, n = torch.where(alive, taken, node), n + alive
        P = torch.where(alive[:, None], p[node], P)
        path.append(node)
    return torch.cat(path), n, draw(P, u[-1:]), node


def fixed_block(tokens, p, q, kids, u, k: int):
    """Block verification of a chain (`block`, Sun et al. 2025) with no loop: the weights
    p_i = min(1, p_{i-1} r_i), r_i = Mb(x_i) / Ms(x_i), are exp(S_i - max(0, S_1, ..., S_i)) with S
    the running sum of log r (the min clips exactly where the sum last peaked), h_i as there, and
    tau the last i with u_i < h_i. kids: unused (a chain). u (k + 1,). Returns (path (k+1,), n (1,), next (1,), last (1,))."""
    x, i = tokens[1:], torch.arange(k, device=p.device)
    S = (p[i, x].log() - q[i + 1, x].log()).cumsum(0)
    w = (S - S.cummax(0).values.clamp(min=0)).exp()  # p_1 .. p_k
    R = (w[:-1, None] * p[1:k] - q[2:]).clamp(min=0).sum(-1)  # S_1 .. S_{k-1} of `block`
    h = torch.cat([torch.where(R + 1 - w[:-1] > 0, R / (R + 1 - w[:-1]).clamp(min=1e-30), 1.0), w[-1:]])
    tau = ((u[:k] < h) * (i + 1)).max().view(1)  # the last hit, 0 if none
    weight = torch.cat([w.new_ones(1), w])[tau]  # p_tau (p_0 = 1)
    q_after = torch.cat([q, torch.zeros_like(q[:1])])[tau + 1]  # a bonus (tau = k) resamples p_k itself
    nxt = draw(residual(weight[:, None] * p[tau], q_after), u[k:])
    return torch.minimum(torch.arange(k + 1, device=p.device), tau), tau + 1, nxt, tau
