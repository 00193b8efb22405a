"""The recorded step (walkthrough chapter 11): a method's whole speculative step as fixed-shape
tensor work on the device, recorded once as a CUDA graph and replayed.

The readable loop (`decoding.decode`) asks the host a dozen questions a step: how long is the
cache, which path did the rule accept, is this node's child the target's choice, how many
tokens to keep. Each answer is a read-back, and each read-back stops the host until the device
has caught up; on a GPU, where a small model's forward takes less time than Python takes to
launch it, those pauses and the launches between them are most of the step. A CUDA graph
replays recorded launches with one call, but it replays them on the same memory with the same
shapes and cannot ask anything. So here every answer stays on the device as a tensor:

- the cache length L and the root are tensors; the nodes are fed at slots L .. L + T
  (`kvcache.SlotWriter`) and see the slots below L and their ancestors (`kvcache.slot_mask`);
- a tree grown per step (EAGLE-2's) has a fixed number of nodes, and its mask and depths are
  derived from its parent indices on the device (`tree_tensors`), not built in Python;
- acceptance is index arithmetic: the greedy rule and the point-mass rule are one rule
  (`match`): node a is acceptable when its token is its parent's draw from p (the argmax at
  T = 0), and the path is the deepest node whose ancestors are all acceptable. SpecInfer's
  rule for sampled proposals (`walk`) becomes a fixed number of masked sibling tests, and block
  verification of a chain (`block`) a running sum and a running maximum;
- the cache keeps the root and the accepted path by a gather of depth + 1 slots (`keep`);
  whatever it copies past the path lies beyond the new length, where nothing looks;
- random numbers come from a device generator, registered with the graph so that each replay
  draws fresh ones.

A step writes `result` = (n, whether the last token is a correction, the deepest proposal,
the D + 1 tokens it produced, n of them valid), and the host reads that one small tensor back:
the only read-back of a step, and what the driver (`Recorded.steps`) yields, as the readable
loop yields its steps. The readable loop is the reference: at T = 0 a recorded step writes its
tokens, token for token, and at T > 0 it has the target's distribution (tests/test_step.py).

Each method's part proposes with fixed shapes: Medusa's heads fill their static tree; the draft
model feeds the text's last two tokens (the root and the one before, which it may have read
already: the same token at the same slot is written again) and drafts a chain of k; EAGLE's head
reads a fixed window of depth + 1 pending pairs and grows EAGLE-2's tree with the very function
the readable method uses (`eagle.grow_tree`); the parallel drafter grows it from one head
forward; prompt lookup and retrieval propose on the host from the text it has just read back,
padded to their largest tree.
"""

from __future__ import annotations

import torch

from ..decoding import ACCEPTED, BONUS, CORRECTION, NO_CLOCK, TARGET, Row, Step, Verified, ended, prefill
from ..kvcache import KVCache, SlotWriter, slot_mask
from ..methods.base import Method, default_rule, rule_problem
from ..methods.eagle import grow_tree  # the readable method's own growth, read back nowhere
from ..model import GPT, causal_mask
from ..sampling import Sampling, draw, residual
from ..tree import Tree, chain



# ---- trees, acceptance and the cache as index arithmetic ------------------------------------

def tree_tensors(parents: torch.Tensor, D: int):
    """(mask (T+1, T+1), depth (T+1,), parent (T+1,)) of a tree given as parent indices (T,) on the
    device (-1: a child of the root), at most D deep: D rounds of "a node sees itself and what its
    parent sees", the root its own parent (`tree.tree_mask` walks the nodes in Python instead)."""
    T = parents.shape[0]
    parent = torch.cat([parents.new_zeros(1), parents + 1])  # index among the T + 1 tokens
    eye = torch.eye(T + 1, dtype=torch.bool, device=parents.device)
    mask, depth = eye, torch.zeros(T + 1, dtype=torch.long, device=parents.device)
    not_root = torch.arange(T + 1, device=parents.device) > 0
    for _ in range(D):
        mask, depth = eye | mask[parent], torch.where(not_root, depth[parent] + 1, 0)
    return mask, depth, parent


def match(tokens, y, parent, mask, depth, valid, D: int):
    """The greedy and point-mass rules at once. y (T+1,): the target's token after each node, its
    argmax (greedy) or a draw from p (point-mass); node a is acceptable when tokens[a] == y[parent]
    and no earlier sibling carries the same token (the root always), and the deepest node whose
    ancestors are all acceptable ends the path. Following the FIRST child that equals the target's
    own draw, node by node, is sampling from the target, whatever the siblings repeat: a repeat
    never gets a second draw (`verify.pointmass`, sibling by sibling, rejects a repeat of a
    rejected token). Returns (path (D+1,), n (1,), next (1,), best (1,))."""
    T1 = len(tokens)
    earlier = torch.ones(T1, T1, dtype=torch.bool, device=tokens.device).tril(-1) & (depth > 0) & valid
    repeat = (earlier & (parent[:, None] == parent) & (tokens[:, None] == tokens)).any(-1)  # (T+1,)
    ok = ((tokens == y[parent]) & ~repeat | (depth == 0)) & valid
    good = ~(mask & ~ok).any(-1)  # every ancestor acceptable: one node at most per depth
    best = (depth * good).argmax(-1, keepdim=True)  # (1,): the deepest
    return on_path(mask, depth, best, D), depth[best] + 1, y[best], best


def on_path(mask, depth, best, D: int) -> torch.Tensor:
    """(D+1,): the ancestor of `best` at each depth 0..D (the root where it has none)."""
    levels = mask[best] & (depth == torch.arange(D + 1, device=depth.device)[:, None])  # (D+1, T+1)
    return levels.byte().argmax(-1)


def walk(tokens, p, q, kids, u, D: int):
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


def block(tokens, p, q, kids, u, k: int):
    """Block verification of a chain (`verify.block`, Sun et al. 2025) with no loop: the weights
    p_i = min(1, p_{i-1} r_i), r_i = Mb(x_i) / Ms(x_i), are exp(S_i - max(0, S_1, ..., S_i)) with S
    the running sum of log r (the min clips exactly where the sum last peaked), h_i as there, and
    tau the last i with u_i < h_i. kids: unused (a chain). u (k + 1,). Returns (path (k+1,), n (1,), next (1,), last (1,))."""
    x, i = tokens[1:], torch.arange(k, device=p.device)
    S = (p[i, x].log() - q[i + 1, x].log()).cumsum(0)
    w = (S - S.cummax(0).values.clamp(min=0)).exp()  # p_1 .. p_k
    R = (w[:-1, None] * p[1:k] - q[2:]).clamp(min=0).sum(-1)  # S_1 .. S_{k-1} of verify.block
    h = torch.cat([torch.where(R + 1 - w[:-1] > 0, R / (R + 1 - w[:-1]).clamp(min=1e-30), 1.0), w[-1:]])
    tau = ((u[:k] < h) * (i + 1)).max().view(1)  # the last hit, 0 if none
    weight = torch.cat([w.new_ones(1), w])[tau]  # p_tau (p_0 = 1)
    q_after = torch.cat([q, torch.zeros_like(q[:1])])[tau + 1]  # a bonus (tau = k) resamples p_k itself
    nxt = draw(residual(weight[:, None] * p[tau], q_after), u[k:])
    return torch.minimum(torch.arange(k + 1, device=p.device), tau), tau + 1, nxt, tau


def keep(cache: KVCache, L: torch.Tensor, path: torch.Tensor) -> None:
    """The cache keeps slot L (the root) and the accepted path: slots L + path move to L, L + 1, ...
    (`KVCache.keep` with the slots on the device; past the path the copies land beyond the length)."""
    to = L + torch.arange(len(path), device=L.device)
    for kv in (cache.k, cache.v):
        kv[:, 0].index_copy_(2, to, kv[:, 0].index_select(2, L + path))


# ---- each method's proposing, with fixed shapes ---------------------------------------------

class Part:
    """A method's side of a recorded step, made with (method, shape, sampling, rule, slots): T nodes
    at most D deep; `static` the tree when its shape never changes; `begin` (host, once per prompt:
    what the method reads of the prompt), `propose` (device: tokens (T,), parents (T,) or None for
    the static tree, q (T+1, V) or None, valid (T+1,) or None) and `update` (device: what it keeps
    for the next step). `rules`: the rules it runs at T > 0 (at T = 0 every rule is greedy)."""
    rules = ("pointmass",)
    static: Tree | None = None
    sampled = False  # proposals drawn from q (the lossless rule needs them)
    draws = 0  # uniform numbers a proposal uses

    def begin(self, text: list[int], hidden: torch.Tensor) -> None:
        pass

    def update(self, hidden, path, n, seq) -> None:
        """hidden (T+1, C) of every token fed; seq (D+2,): the root, then what the step produced."""


class MedusaPart(Part):
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


class DraftPart(Part):
    rules = ("lossless", "pointmass", "block")

    def __init__(self, method, k: int, sampling: Sampling, rule: str, slots: int):
        self.draft, self.lm_head, self.sampling = method.draft, method.lm_head, sampling
        self.static, self.T, self.D, self.draws, self.sampled = chain(k).to(method.draft.lm_head.weight.device), k, k, k, \
            sampling.temperature > 0
        self.cache = KVCache.for_model(method.draft, slots)
        self.prev = torch.zeros(1, dtype=torch.long, device=self.cache.k.device)  # the token before the root

    def begin(self, text, hidden):  # the draft reads all but the last two tokens; each step feeds those
        self.cache.reset()
        if len(text) > 2:
            self.draft.hidden(torch.tensor(text[:-2], device=self.prev.device)[None], cache=self.cache)
        self.prev.fill_(text[-2])

    def forward(self, x, at):
        """The draft's hidden state after x (n,) fed at slots `at` (n,), causally."""
        mask = slot_mask(causal_mask(len(x), x.device), at[:1], self.cache.max_len)
        return self.draft.hidden(x[None], positions=at, cache=SlotWriter(self.cache, at), attn_mask=mask)[0, -1:]

    def propose(self, root, L, u):
        h = self.forward(torch.cat([self.prev, root]), L - 1 + torch.arange(2, device=L.device))
        tokens, qs = [], []
        for i in range(self.T):
            logits = self.lm_head(h)  # (1, V)
            if self.sampled:
                qs.append(self.sampling.probs(logits))
                tokens.append(draw(qs[-1], u[i:i + 1]))
            else:
                tokens.append(logits.argmax(-1))
            if i + 1 < self.T:
                h = self.forward(tokens[-1], L + 1 + i)
        return torch.cat(tokens), None, torch.cat(qs[:1] + qs) if qs else None, None

    def update(self, hidden, path, n, seq):
        self.prev.copy_(seq[n - 1])


class EaglePart(Part):
    """EAGLE's head (and the parallel drafter's): its cache holds the pairs (f_j, t_{j+1}) it has
    read below `committed`; `features`, `tokens` hold the D + 1 newest pairs, the first `n_pending`
    of them not read yet. A step reads them all at once (the rest are written past what it keeps),
    then grows EAGLE-2's tree of T nodes, top_k expanded per depth."""

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


class ParallelPart(EaglePart):
    """The parallel drafter: one head forward gives every depth's distribution, and the tree grows
    from them (a node at depth d has depth d + 1's children)."""

    def propose(self, root, L, u):
        logits = self.method.lm_head(self.head.features_ahead(self.catch_up(), self.D))[:, 0]  # (D, V)
        parents, tokens = grow_tree(logits[0], lambda chosen, parents, tokens, d: logits[d].expand(len(chosen), -1),
                                    *self.shape)
        return tokens, parents, None, None


class HostPart(Part):
    """Prompt lookup and retrieval propose on the host, from the text the last step read back: the
    readable method proposes (`offer`), and its tree, padded to T nodes that are never accepted
    (`valid`), is copied into the step's inputs."""

    def __init__(self, method, shape, sampling: Sampling, rule: str, slots: int):
        self.method, self.shape, device = method, shape, method.device
        self.T = self.D = method.room(shape)
        self.x = torch.zeros(self.T, dtype=torch.long, device=device)
        self.parents = torch.full((self.T,), -1, dtype=torch.long, device=device)
        self.valid = torch.zeros(self.T + 1, dtype=torch.bool, device=device)

    def begin(self, text, hidden):
        self.row = Row(0, list(text), None)
        self.method.start([self.row], [hidden], 0)

    def offer(self, room: int) -> bool:
        """The method's proposal copied in; False if it has none (then the step is a plain one)."""
        proposal = self.method.propose([self.row], self.shape, [room], None, False)[0]
        if proposal is None:
            return False
        n = len(proposal.tokens)
        self.x[:n] = proposal.tokens
        self.parents.copy_(torch.tensor(proposal.tree.parents + (-1,) * (self.T - n)))
        self.valid.copy_(torch.arange(self.T + 1) <= n)
        return True

    def heard(self, tokens: list[int]) -> None:
        self.row.text += tokens
        self.method.update([self.row], [None], [Verified(Step(tokens, []), None, None)])

    def propose(self, root, L, u):
        return self.x, self.parents, None, self.valid


PARTS = {"ar": None, "draft": DraftPart, "medusa": MedusaPart, "eagle": EaglePart, "parallel": ParallelPart,
         "lookup": HostPart, "rest": HostPart}  # each method's part (plain decoding has none)


def refusal(method: Method, rule: str | None) -> str | None:
    """Why a recorded step cannot run `method` judged by `rule` (None: the default), or None."""
    if method.name not in PARTS:
        return f"{method.name} has no recorded step: run it without --cuda-graph"
    part = PARTS[method.name]
    rules = ("greedy",) + (part.rules if part is not None else ())
    if rule is not None and rule not in rules:
        return f"a recorded step of {method.name} judges with {', '.join(rules)}, not {rule}: pass --accept " + \
            ("pointmass" if "pointmass" in rules else "greedy")
    if part in (EaglePart, ParallelPart) and method.static is not None:
        return f"a recorded step of {method.name} grows EAGLE-2's tree: drop --tree"
    return None


# ---- one step, and the loop that replays it ---------------------------------------------------

class FixedStep:
    """One step of `part` (None: a plain step) over the target's cache at the device length L,
    with fixed shapes: propose, ONE target forward over the root and T nodes, the rule, the
    cache's compaction, the part's update; `result` then holds what the host reads back."""

    def __init__(self, target: GPT, cache: KVCache, part: Part | None, rule: str, sampling: Sampling, state):
        self.target, self.cache, self.part, self.sampling = target, cache, part, sampling
        self.L, self.root, self.generator = state  # shared by every step of a prompt
        device = cache.k.device
        self.T, self.D = (part.T, part.D) if part is not None else (0, 0)
        static = part.static if part is not None else None
        if static is not None:
            self.tree = static.tree_mask, static.depth, torch.cat([static.depth.new_zeros(1), static.parent_index])
            kids = [list(c) for c in static.child_lists]
            width = max(map(len, kids))
            self.kids = torch.tensor([c + [-1] * (width - len(c)) for c in kids], device=device)  # (T+1, S)
        elif part is None:
            self.tree = tree_tensors(torch.zeros(0, dtype=torch.long, device=device), 0)
        self.rule = "greedy" if sampling.temperature == 0 else rule if part is not None else "pointmass"  # (a plain draw)
        self.tests = {"lossless": self.D * self.kids.shape[1] + 1 if static is not None else 0, "block": self.D + 1,
                      "pointmass": self.T + 1}.get(self.rule, 0)
        self.draws = (part.draws if part is not None and part.sampled else 0) + self.tests  # the proposal's, the rule's
        self.offsets = torch.arange(self.T + 1, device=device)
        self.result = torch.zeros(self.D + 4, dtype=torch.long, device=device)

    def __call__(self) -> None:
        L, root, part, D = self.L, self.root, self.part, self.D
        u = torch.rand(self.draws, device=L.device, generator=self.generator) if self.draws else None
        tokens, parents, q, valid = part.propose(root, L, u) if part is not None else (root[:0], None, None, None)
        mask, depth, parent = self.tree if parents is None else tree_tensors(parents, D)
        valid = self.offsets >= 0 if valid is None else valid
        x = torch.cat([root, tokens])  # (T+1,): the root, then the nodes
        hidden = self.target.hidden(x[None], positions=L + depth, cache=SlotWriter(self.cache, L + self.offsets),
                                    attn_mask=slot_mask(mask, L, self.cache.max_len))[0]  # (T+1, C)
        logits = self.target.lm_head(hidden)
        if self.rule in ("lossless", "block"):
            rule = walk if self.rule == "lossless" else block
            path, n, nxt, last = rule(x, self.sampling.probs(logits), q, self.kids, u[self.draws - self.tests:], D)
        else:
            y = logits.argmax(-1) if self.rule == "greedy" else draw(self.sampling.probs(logits), u[self.draws - self.tests:])
            path, n, nxt, last = match(x, y, parent, mask, depth, valid, D)
        keep(self.cache, L, path)
        seq = torch.cat([x[path], nxt])  # (D+2,): the root, the path's tokens, and one more slot
        seq = torch.where(torch.arange(D + 2, device=L.device) == n, nxt, seq)  # the next token after the path
        correction = ((parent == last) & valid & (depth > 0)).any().view(1)  # the path stopped above a child
        self.result.copy_(torch.cat([n, correction.long(), (depth * valid).max().view(1), seq[1:]]))
        if part is not None:
            part.update(hidden, path, n, seq)
        L.add_(n)
        root.copy_(nxt)


def record(step: FixedStep):
    """`step` recorded once as a CUDA graph (its replay), or `step` itself off CUDA. Recording runs
    it four times on whatever the state holds (a prompt's start overwrites all of it)."""
    device = step.L.device
    if device.type != "cuda":
        return step
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):  # kernels chosen, workspaces allocated, before the capture
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    graph.register_generator_state(step.generator)  # each replay draws fresh numbers from it
    with torch.cuda.graph(graph), torch.no_grad():
        step()
    return graph.replay


class Recorded:
    """A method at one size as a recorded step, ready for prompt after prompt as a `Decoder` is:
    `steps(prompt, sampling, generator)` yields what each step gave (`results.run` drives it).
    Batch 1. Per sampling, on first use, the step and a plain one are recorded (the plain one
    for the end of the context, where the tree would not fit, and where a lookup finds nothing).
    clock: a `speed/ledger.py` Ledger times each step (part "step") and the host's proposing."""

    def __init__(self, target: GPT, proposer: Method | None = None, size: str | None = None, *, rule: str | None = None):
        self.target, self.proposer, self.rule = target, proposer or Method(), rule
        self.size = size or self.proposer.default_size
        self.shape = self.proposer.shape(self.size) if self.size else None
        self.n_ctx = min(target.config.n_ctx, self.proposer.n_ctx or target.config.n_ctx)
        self.slots = self.n_ctx + (self.proposer.room(self.shape) if self.size else 0) + 1
        self.cache = KVCache.for_model(target, self.slots)
        device = self.cache.k.device
        self.state = (torch.ones(1, dtype=torch.long, device=device), torch.zeros(1, dtype=torch.long, device=device),
                      torch.Generator(device=device))  # L (1 while recording: a draft feeds slot L - 1), root
        self.recorded, self.clock = {}, NO_CLOCK
        problem = refusal(self.proposer, rule)
        if problem:
            raise ValueError(problem)

    def recording(self, sampling: Sampling):
        """(part, step, its replay, plain step, its replay) for this sampling, recorded on first use."""
        key = (sampling.temperature, sampling.top_k, sampling.top_p)
        if key not in self.recorded:
            kind, rule = PARTS[self.proposer.name], self.rule_at(sampling.temperature)
            part = kind(self.proposer, self.shape, sampling, rule, self.slots) if kind is not None else None
            step, plain = (FixedStep(self.target, self.cache, p, rule, sampling, self.state) for p in (part, None))
            self.recorded[key] = part, step, record(step), plain, record(plain)
        return self.recorded[key]

    def rule_at(self, temperature: float) -> str:
        """The rule a step runs: the readable loop's (`base.default_rule`), or point-mass where the
        method's part cannot run that (EAGLE's default, lossless, judges a sampled tree; the part
        grows the top-k one): `instead` says so."""
        rule, kind = default_rule(self.proposer, self.rule, temperature), PARTS[self.proposer.name]
        return rule if kind is None or rule in ("greedy",) + kind.rules else "pointmass"

    def instead(self, temperature: float) -> str | None:
        """One line, where a step runs another rule than the readable loop would at `temperature`."""
        rule, readable = self.rule_at(temperature), default_rule(self.proposer, self.rule, temperature)
        return None if rule == readable else f"a recorded step of {self.proposer.name} judges with {rule} (exact for " \
            f"its top-k tree), not its default {readable}: pass --accept {rule} to say so"

    def batch_steps(self, prompts: list[list[int]], sampling: Sampling, generators: list, max_new_tokens: int,
                    stop_id: int | None = None):
        if len(prompts) != 1:
            raise ValueError("a recorded step decodes one prompt at a time (batch size 1)")
        return self.steps(prompts[0], sampling, generators[0], max_new_tokens, stop_id)

    @torch.no_grad()  # as `decoding.decode`: no autograd graph chained through the cache prompt after prompt
    def steps(self, prompt: list[int], sampling: Sampling, generator, max_new_tokens: int, stop_id: int | None = None):
        """The loop for one prompt, as `decoding.decode` yields it: the prefill (the readable one),
        then one replay and one read-back a step, until the row stops (`decoding.ended`). Without
        a generator the step's own is seeded from torch's global one, which the readable loop
        draws from, so each run draws fresh numbers."""
        problem = rule_problem(self.proposer, self.rule, sampling.temperature)  # the readable loop's refusals
        if problem:
            raise ValueError(problem)
        part, step, replay, plain, plain_replay = self.recording(sampling)
        L, root, device_generator = self.state
        row = Row(0, list(prompt), generator)
        self.cache.reset()
        hidden = prefill(self.target, self.cache, [row], sampling)[0]
        L.fill_(len(prompt))
        root.copy_(row.root.view(1))
        seed = torch.randint(2 ** 62, (1,), generator=generator, device=generator.device if generator else "cpu")
        device_generator.manual_seed(int(seed))  # the step's own generator, registered with its graphs
        if part is not None:
            part.begin(row.text, hidden)
        length, deepest = len(prompt), part.D if part is not None else 0
        produced = ended(Step([row.text[-1]], [TARGET]), row, max_new_tokens, stop_id, length >= self.n_ctx)
        while True:
            yield {0: produced}
            if produced.stop:
                return
            room = self.n_ctx - 1 - length
            with self.clock.part("propose"):
                speculate = part is not None and deepest <= room and (not isinstance(part, HostPart) or part.offer(room))
            with self.clock.part("step"):
                (replay if speculate else plain_replay)()
                n, correction, proposed, *out = (step if speculate else plain).result.tolist()  # the one read-back
            tokens, length = out[:n], length + n
            if isinstance(part, HostPart):
                with self.clock.part("propose"):
                    part.heard(tokens)
            produced = Step(tokens, [ACCEPTED] * (n - 1) + [CORRECTION if correction else BONUS], proposed, self.size,
                            step.T + 1, n - 1) if speculate else Step(tokens, [TARGET])
            produced = ended(produced, row, max_new_tokens, stop_id, length >= self.n_ctx)
