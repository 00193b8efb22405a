"""Batch > 1: several independent sequences (rows) share every forward, and each row accepts its
own proposals.

A forward of a small model on one sequence leaves most of the hardware idle: it reads every
weight to compute a handful of tokens. Speculative decoding fills that idle compute with guesses
(one forward scores k proposals as cheaply as one token). Batching fills it with other
sequences (one forward advances B of them). Both spend the same spare capacity, so at a large
enough batch a forward is no longer nearly free to widen, and speculation, which multiplies the
tokens of every forward by 1 + k or 1 + T, starts to cost more than it yields. The benchmark
(`python -m tinyspec.bench --batch-sizes 1,2,4,8,16`) measures where; `auto.BatchPolicy` follows it.

Every method here is its batch-1 loop with three changes, and nothing else:

- the cache is a `kvcache.BatchKVCache`: each row has its own length, so rows that accepted
  different numbers of tokens, or started from prompts of different lengths, sit side by side;
- `feed` runs ONE forward for all rows, each row its own tokens (right-padded to the longest),
  at its own positions, under its own mask (causal, a tree's, lookahead's window);
- afterwards each row is judged alone, by the very function its batch-1 loop calls
  (`accept_or_resample`, `decoding.accept_tree` with a rule of `verify.py`) on its own slice of
  the logits, its own row of the cache (`BatchKVCache.row`) and its own random generator.

So a row's output is its batch-1 output: greedy token for token, and sampled with exactly the
target's distribution (with the same generator, even the same tokens, up to float rounding).

A batched loop is a generator like the batch-1 ones, but each `yield` gives a dict {row id:
Step} for the rows that took part in that forward, and the driver, `run_batch`, sends back the
ids of the rows that are done (end of text, or their token budget); those rows leave the batch
(`BatchKVCache.select`), so the forwards that follow compute only for the rest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Generator, Protocol

import torch

from .decoding import ACCEPTED, BONUS, CORRECTION, TARGET, Result, Step, accept_tree, take
from .eagle import DEFAULT_DEPTH, DEFAULT_TOPK, EagleHead, HeadDrafter, draft_tree, expanded_at_most
from .kvcache import BatchKVCache
from .lookahead import NgramPool, filler, slide, step_inputs, step_outputs, trie
from .lookup import NgramIndex
from .medusa import MedusaHeads, propose
from .model import GPT, causal_mask
from .sampling import Sampling, sample
from .speculative import AdaptiveK, accept_or_resample
from .tree import Tree, chain, tree_on
from .verify import RULES, SAMPLED


class TreeChooser(Protocol):
    """What chooses a batch's tree step by step (`auto.BatchPolicy`, which builds on this file)."""
    largest: int  # nodes of the largest tree it may choose

    def choose(self, rows: int) -> Tree | None: ...  # the tree for this step, None for a plain step

    def update(self, accepted: list[int], tree: Tree | None, rows: int | None = None) -> None: ...  # what it accepted


Produced = dict[int, Step]  # what one batched forward gave each row that took part, by row id
BatchSteps = Generator[Produced, list[int], None]  # yields Produced; is sent the ids of the rows that are done


def run_batch(steps: BatchSteps, rows: int, max_new_tokens: int, stop_id: int | None = None) -> list[Result]:
    """Drive a batched method: `decoding.run` for each of its rows at once (the same `take`
    stops a row at end of text or after max_new_tokens). A row the method itself ends (its
    context is full) stops with "context". A row's wall_s is the time from the start until its
    last token: its latency, in a batch that started together."""
    results = [Result() for _ in range(rows)]
    ended = set()
    t0 = time.perf_counter()
    try:
        produced = next(steps)
        while True:
            done = []
            for row, step in produced.items():
                reason = take(results[row], step, max_new_tokens, stop_id, None)
                if reason:
                    results[row].stop_reason, results[row].wall_s = reason, time.perf_counter() - t0
                    done.append(row)
            ended.update(done)
            produced = steps.send(done)
    except StopIteration:
        reason = "context"
    except KeyboardInterrupt:  # Ctrl-C: every row keeps what it has
        reason = "interrupted"
    for row in set(range(rows)) - ended:
        results[row].stop_reason, results[row].wall_s = reason, time.perf_counter() - t0
    return results


@dataclass
class Row:
    """One sequence of a batch: which prompt it is, its text so far, its own random generator (so
    it draws the numbers it would draw alone), and what its method carries from step to step."""
    id: int
    seq: list[int]  # the prompt; the draft-model loop appends its output
    generator: torch.Generator | None
    root: torch.Tensor | None = None  # the last token chosen, not yet in the target's cache
    h: torch.Tensor | None = None  # Medusa: the hidden state the heads read
    index: NgramIndex | None = None  # prompt lookup: the text's n-grams
    drafter: HeadDrafter | None = None  # EAGLE: the head's side, with its own cache
    pending: tuple | None = None  # EAGLE: (features, tokens) the head has not read yet
    grid: list[list[int]] = field(default_factory=list)  # lookahead: the window of Jacobi guesses,
    pool: NgramPool | None = None  # ... the n-grams they wrote,
    fill: Callable[[], int] | None = None  # ... and where a new column's first guess comes from


def new_rows(prompts: list[list[int]], generators: list) -> list[Row]:
    return [Row(i, list(p), g) for i, (p, g) in enumerate(zip(prompts, generators))]


def ready(cache: BatchKVCache | None, model, rows: int, size: int) -> BatchKVCache:
    """`cache` emptied for `rows` rows, or a new one of `size` slots per row."""
    cache = cache if cache is not None else BatchKVCache.for_model(model, size, rows)
    cache.reset(rows)
    return cache


def leave(rows: list[Row], done, caches, max_len: int) -> list[Row]:
    """The rows that go on: not done, and with room left in the context (the target's cache,
    caches[0], below max_len, as every batch-1 loop requires); every cache keeps just theirs."""
    go_on = [b for b, r in enumerate(rows) if r.id not in done and caches[0].lengths[b] < max_len]
    for cache in caches:
        cache.select(go_on)
    return [rows[b] for b in go_on]


def feed(model: GPT, cache: BatchKVCache, inputs: list[torch.Tensor], masks: list | None = None,
         offsets: list | None = None) -> list[torch.Tensor]:
    """ONE forward of `model` for all live rows of `cache`: row b feeds inputs[b] (n_b,) after its
    cached tokens, causally at the next positions, or (masks[b] not None) among themselves as
    masks[b] (n_b, n_b) allows, at positions length + offsets[b] (a tree: its mask and depths).
    Rows are padded at the end to the longest; the padding enters the cache like a rejected
    proposal and is dropped again, so each row advances by its own n_b. Returns the final
    hidden states of each row's own tokens, [(n_b, C)]."""
    device = inputs[0].device
    n = torch.tensor([len(x) for x in inputs], device=device)  # (B,)
    T = int(n.max())
    x = torch.nn.utils.rnn.pad_sequence(inputs, batch_first=True)  # (B, T), padded with token 0
    t = torch.arange(T, device=device)
    pos = torch.where(t < n[:, None], t, 0)  # (B, T); padding at offset 0, the row's root: a position that exists
    new_mask = causal_mask(T, device).repeat(len(inputs), 1, 1)  # (B, T, T); nothing real sees the padding
    for b in range(len(inputs) if masks is not None else 0):
        if masks[b] is not None:
            new_mask[b, :len(inputs[b]), :len(inputs[b])] = masks[b]
            pos[b, :len(inputs[b])] = offsets[b]
    before = list(cache.lengths)
    h = model.hidden(x, positions=cache.positions(pos), cache=cache, attn_mask=cache.mask(new_mask))  # (B, T, C)
    for b, length in enumerate(before):
        cache.truncate(b, length + len(inputs[b]))  # drop the padding
    return [h[b, :len(inputs[b])] for b in range(len(inputs))]


def last(h: list[torch.Tensor]) -> torch.Tensor:
    """(B, C): each row's hidden state at its last fed token."""
    return torch.stack([x[-1] for x in h])


def sample_rows(p: torch.Tensor, rows: list[Row], sampling: Sampling) -> list[torch.Tensor]:
    """One token per row from p (B, V), each drawn with the row's own generator. Greedy (p one-hot):
    every row's argmax at once, which is what `sample` would return."""
    if sampling.temperature == 0:
        return list(p.argmax(-1))
    return [sample(p[b], r.generator) for b, r in enumerate(rows)]


# ---- plain decoding: the baseline of every batch size ----------------------------------------

@torch.no_grad()
def autoregressive_batch(model: GPT, prompts: list[list[int]], sampling: Sampling, generators: list, max_len: int,
                         cache: BatchKVCache | None = None) -> BatchSteps:
    """Plain decoding of every row at once: one forward per token, for the whole batch.
    max_len: the context (cache slots) a row may fill; cache: reused if given (emptied first)."""
    device = model.lm_head.weight.device
    cache = ready(cache, model, len(prompts), max_len)
    rows = new_rows(prompts, generators)
    h = feed(model, cache, [torch.tensor(p, device=device) for p in prompts])  # prefill: prompts of any lengths
    logits = model.lm_head(last(h))  # (B, V)
    while True:
        tokens = sample_rows(sampling.probs(logits), rows, sampling)
        for r, t in zip(rows, tokens):
            r.root = t
        done = yield {r.id: Step([int(r.root)], [TARGET]) for r in rows}
        rows = leave(rows, done, [cache], max_len)
        if not rows:
            return
        logits = model.lm_head(last(feed(model, cache, [r.root.view(1) for r in rows])))


# ---- draft model (speculative.py, batched) ---------------------------------------------------

@torch.no_grad()
def speculative_batch(target: GPT, draft: GPT, prompts: list[list[int]], sampling: Sampling, generators: list,
                      max_len: int, k: int | AdaptiveK = 4, caches: tuple[BatchKVCache, BatchKVCache] | None = None,
                      accept=accept_or_resample) -> BatchSteps:
    """`speculative.speculative` for every row at once: each draft forward proposes the next token
    of every row, one target forward scores every row's proposals, and each row accepts its own
    prefix with `accept`. k is the same for all rows (an int, or an `AdaptiveK` that learns from
    all of them), and no more than the row with the least room left allows."""
    device = target.lm_head.weight.device
    # a row whose prompt fills max_len already has no room for a step: as at batch 1, it ends at once
    rows = [r for r in new_rows(prompts, generators) if len(r.seq) <= max_len]
    if not rows:
        return
    caches = caches or (None, None)
    t_cache = ready(caches[0], target, len(rows), max_len + 1 + (k if isinstance(k, int) else k.k_max))
    d_cache = ready(caches[1], draft, len(rows), 2 * max_len)  # a draft that sat out steps catches up in one
    policy = k if isinstance(k, AdaptiveK) else None
    while rows:
        room = min(max_len - len(r.seq) for r in rows)
        k_step = min(policy.choose() if policy else k, room)
        # 1. the draft proposes k tokens per row, one forward for the whole batch each
        unseen = [torch.tensor(r.seq[d_cache.lengths[b]:], device=device) for b, r in enumerate(rows)]
        drafts, qs = [], []
        for _ in range(k_step):
            qs.append(sampling.probs(draft.logits(last(feed(draft, d_cache, unseen)))))  # (B, V)
            drafts.append(torch.stack(sample_rows(qs[-1], rows, sampling)))  # (B,)
            unseen = list(drafts[-1][:, None])
        drafts = torch.stack(drafts, 1) if drafts else torch.zeros(len(rows), 0, dtype=torch.long, device=device)  # (B, k)
        # 2. the target scores every row's unseen tokens and proposals in one forward
        new = [torch.cat([torch.tensor(r.seq[t_cache.lengths[b]:], device=device), drafts[b]]) for b, r in enumerate(rows)]
        h = feed(target, t_cache, new)
        p = sampling.probs(target.lm_head(torch.stack([x[-(k_step + 1):] for x in h])))  # (B, k + 1, V)
        q = torch.stack(qs, 1) if qs else p[:, :0]  # (B, k, V)
        # 3. each row accepts or rejects its own proposals, left to right; 4. both caches roll back
        produced = {}
        for b, r in enumerate(rows):
            n, token = accept(p[b], q[b], drafts[b], r.generator)
            kind = TARGET if k_step == 0 else BONUS if n == k_step else CORRECTION
            t_cache.truncate(b, len(r.seq) + n)
            d_cache.truncate(b, min(d_cache.lengths[b], len(r.seq) + n))
            if policy:
                policy.update(n, rejected=kind == CORRECTION)
            produced[r.id] = Step(drafts[b, :n].tolist() + [int(token)], [ACCEPTED] * n + [kind], proposed=k_step)
            r.seq += produced[r.id].tokens
        done = yield produced
        rows = leave(rows, done, [t_cache, d_cache], max_len)


# ---- tree methods: Medusa, prompt lookup, EAGLE ----------------------------------------------

def verify_rows(target: GPT, cache: BatchKVCache, rows: list[Row], proposals: list, accept, sampling: Sampling):
    """Steps 2-4 of a tree method (`decoding.verify_tree`) for every row at once: ONE target
    forward over each row's root and proposed tree, then each row's rule and cache compaction
    (`decoding.accept_tree` on the row). proposals[b]: (tokens (T,), tree, q or None), or None
    for a plain step (no proposal, or no room for one). Sets each row's next root; returns
    [(Step, hidden states of the row's accepted tokens, the root first)]."""
    before = list(cache.lengths)
    inputs = [r.root.view(1) if prop is None else torch.cat([r.root.view(1), prop[0]]) for r, prop in zip(rows, proposals)]
    h = feed(target, cache, inputs, [None if prop is None else prop[1].tree_mask for prop in proposals],
             [None if prop is None else prop[1].depth for prop in proposals])
    out, all_logits = [], target.lm_head(torch.cat(h)).split([len(x) for x in h])  # one LM-head product for all rows
    plain = [b for b, prop in enumerate(proposals) if prop is None]
    if plain:  # the plain steps' tokens all at once, as plain decoding takes them
        p = sampling.probs(torch.stack([all_logits[b][0] for b in plain]))
        for b, root in zip(plain, sample_rows(p, [rows[b] for b in plain], sampling)):
            rows[b].root = root
    for b, (r, prop) in enumerate(zip(rows, proposals)):
        logits = all_logits[b]  # (1 + T, V)
        if prop is None:
            out.append((Step([int(r.root)], [TARGET]), h[b]))
            continue
        tokens, tree, q = prop
        step, r.root, path = accept_tree(cache.row(b), before[b], inputs[b], logits, tree, accept, sampling, q, r.generator)
        out.append((step, h[b][path]))
    return out


def prefill(target: GPT, cache: BatchKVCache, rows: list[Row], sampling: Sampling) -> list[torch.Tensor]:
    """The prompts enter the cache, and each row's first token (plain decoding) becomes its root.
    Returns each row's hidden states of its prompt [(P_b, C)]."""
    device = target.lm_head.weight.device
    h = feed(target, cache, [torch.tensor(r.seq, device=device) for r in rows])
    for r, root in zip(rows, sample_rows(sampling.probs(target.lm_head(last(h))), rows, sampling)):
        r.root = root
    return h


def tree_rule(rule: str, draft_free: bool = False):
    """The rule of verify.RULES named `rule`, refused as the batch-1 loops refuse it."""
    if rule not in RULES or rule == "block" or (draft_free and rule in SAMPLED):
        raise ValueError(f"rule {rule!r} cannot judge these proposals: use greedy, pointmass"
                         f"{'' if draft_free else ', lossless'} or typical")
    return RULES[rule]


@torch.no_grad()
def medusa_batch(target: GPT, heads: MedusaHeads, prompts: list[list[int]], sampling: Sampling, generators: list,
                 max_len: int, tree: Tree | TreeChooser, rule: str = "greedy",
                 cache: BatchKVCache | None = None) -> BatchSteps:
    """`medusa.medusa` for every row at once: the heads read every row's hidden state in one call,
    each row's tree is filled from its own guesses, one target forward verifies all trees.
    tree: the same tree every step, or a `TreeChooser` (`auto.BatchPolicy`) that picks one (or none) per step."""
    accept, sampled, device = tree_rule(rule), rule in SAMPLED, target.lm_head.weight.device
    policy = None if isinstance(tree, Tree) else tree
    tree = None if policy else tree.to(device)
    cache = ready(cache, target, len(prompts), max_len + (policy.largest if policy else len(tree)) + 1)
    rows = new_rows(prompts, generators)
    for r, h in zip(rows, prefill(target, cache, rows, sampling)):
        r.h = h[-1]
    done = yield {r.id: Step([int(r.root)], [TARGET]) for r in rows}
    rows = leave(rows, done, [cache], max_len)
    while rows:
        step_tree = policy.choose(len(rows)) if policy else tree  # None: a plain step for every row
        proposals = [None] * len(rows)
        if step_tree is not None:
            head_logits = heads(torch.stack([r.h for r in rows]), target.lm_head)  # (K, B, V): 1. propose
            for b, r in enumerate(rows):
                L = cache.lengths[b]
                if L + 1 + len(step_tree) <= max_len and L + step_tree.max_depth < target.config.n_ctx:  # else no room
                    tokens, q = propose(head_logits[:, b], step_tree, sampling, sampled, r.generator)
                    proposals[b] = (tokens, step_tree, q)
        produced = {}
        for r, (step, hidden) in zip(rows, verify_rows(target, cache, rows, proposals, accept, sampling)):  # 2-4.
            r.h, produced[r.id] = hidden[-1], step
        if policy:  # it times the step itself, from its choice to now (the tokens are on the host: the step is done)
            policy.update([len(produced[r.id].tokens) - 1 for r, prop in zip(rows, proposals) if prop], step_tree,
                          len(rows))
        done = yield produced
        rows = leave(rows, done, [cache], max_len)


@torch.no_grad()
def lookup_batch(target: GPT, prompts: list[list[int]], sampling: Sampling, generators: list, max_len: int,
                 k: int = 8, max_ngram: int = 3, rule: str = "greedy", cache: BatchKVCache | None = None) -> BatchSteps:
    """`lookup.lookup` for every row at once: each row looks up its own text; rows with nothing
    to propose take a plain step in the same forward as the others' chains."""
    accept, device, n_ctx = tree_rule(rule, draft_free=True), target.lm_head.weight.device, target.config.n_ctx
    cache = ready(cache, target, len(prompts), max_len + k + 1)
    rows = new_rows(prompts, generators)
    prefill(target, cache, rows, sampling)
    for r in rows:
        r.index = NgramIndex(max_ngram, r.seq + [int(r.root)])
    done = yield {r.id: Step([int(r.root)], [TARGET]) for r in rows}
    rows = leave(rows, done, [cache], max_len)
    while rows:
        proposals = []
        for b, r in enumerate(rows):  # 1. propose
            room = min(k, max_len - cache.lengths[b] - 1, n_ctx - 1 - cache.lengths[b])
            guess = r.index.propose(room) if room > 0 else []
            proposals.append((torch.tensor(guess, device=device), tree_on(chain(len(guess)).parents, device), None)
                             if guess else None)
        produced = {}
        for r, (step, _) in zip(rows, verify_rows(target, cache, rows, proposals, accept, sampling)):  # 2-4.
            r.index.extend(step.tokens)
            produced[r.id] = step
        done = yield produced
        rows = leave(rows, done, [cache], max_len)


@torch.no_grad()
def eagle_batch(target: GPT, head: EagleHead, prompts: list[list[int]], sampling: Sampling, generators: list,
                max_len: int, rule: str = "greedy", k: int = DEFAULT_TOPK, depth: int = DEFAULT_DEPTH, nodes: int = 16,
                tree: Tree | None = None, cache: BatchKVCache | None = None) -> BatchSteps:
    """`eagle.eagle` for every row at once. Each row drafts its own tree (EAGLE-2's differ from
    row to row) with its own head cache, a `HeadDrafter` per row; ONE target forward verifies
    every row's tree."""
    accept, sampled, device = tree_rule(rule), rule in SAMPLED, target.lm_head.weight.device
    budget = len(tree) if tree is not None else nodes  # the most nodes a step verifies
    tree = tree.to(device) if tree is not None else None
    cache = ready(cache, target, len(prompts), max_len + budget + 1)
    rows = new_rows(prompts, generators)
    for r, f in zip(rows, prefill(target, cache, rows, sampling)):
        r.drafter = HeadDrafter(head, target, head.new_cache(max_len + expanded_at_most(k, depth, nodes, tree)))
        r.pending = (f, torch.tensor(r.seq[1:] + [int(r.root)], device=device))  # pairs (f_j, t_{j+1}) unread
    done = yield {r.id: Step([int(r.root)], [TARGET]) for r in rows}
    rows = leave(rows, done, [cache], max_len)
    while rows:
        proposals = []
        for b, r in enumerate(rows):
            L = cache.lengths[b]
            if L + 1 + budget > max_len or L + (tree.max_depth if tree else depth) >= target.config.n_ctx:
                proposals.append(None)  # no room: a plain step
            else:  # 0-1. the row's head catches up and drafts its tree
                proposals.append(draft_tree(r.drafter, r.pending, tree, k, depth, nodes, sampled, sampling, r.generator))
        produced = {}
        for r, prop, (step, hidden) in zip(rows, proposals, verify_rows(target, cache, rows, proposals, accept, sampling)):
            new = (hidden, torch.tensor(step.tokens, device=device))  # 5. true features of the root and what followed
            r.pending = new if prop is not None else tuple(torch.cat(pair) for pair in zip(r.pending, new))
            produced[r.id] = step
        done = yield produced
        rows = leave(rows, done, [cache], max_len)


@torch.no_grad()
def lookahead_batch(target: GPT, prompts: list[list[int]], sampling: Sampling, generators: list, max_len: int,
                    window: int = 3, ngram: int = 3, guesses: int = 2, rule: str = "greedy",
                    cache: BatchKVCache | None = None, pools: list[NgramPool] | None = None) -> BatchSteps:
    """`lookahead.lookahead` for every row at once: each row its own window, n-gram pool and
    trie, all fed in ONE target forward, each under its own mask (`lookahead.step_mask`).
    pools: each row's `NgramPool` to start from (default: empty ones); they are updated."""
    accept, device, n_ctx = tree_rule(rule, draft_free=True), target.lm_head.weight.device, target.config.n_ctx
    size = (window + guesses) * (ngram - 1)  # the most tokens one step feeds
    cache = ready(cache, target, len(prompts), max_len + size + 1)
    rows = new_rows(prompts, generators)
    prefill(target, cache, rows, sampling)
    for r in rows:
        r.pool, r.fill = pools[r.id] if pools else NgramPool(guesses), filler(r.seq)
        r.grid = [[int(r.root)] + [r.fill() for _ in range(window - 1)]]
    done = yield {r.id: Step([int(r.root)], [TARGET]) for r in rows}
    rows = leave(rows, done, [cache], max_len)
    while rows:
        before, inputs, tries = list(cache.lengths), [], []
        for b, r in enumerate(rows):
            grid, L = r.grid, cache.lengths[b]
            nodes, parents = trie(r.pool.guesses(int(r.root))[:guesses])
            deepest = max(len(grid) + window - 2, ngram - 1 if nodes else 0)
            if L + len(grid) * window + len(nodes) > max_len or L + deepest >= n_ctx:  # no room: a plain step
                inputs.append((r.root.view(1), None, None, None))
                tries.append(None)
            else:
                tries.append(tree_on(parents, device) if nodes else None)
                inputs.append(step_inputs(grid, nodes, tries[-1], device))
        h = feed(target, cache, [x[0] for x in inputs], [x[1] for x in inputs], [x[2] for x in inputs])
        produced = {}
        for b, r in enumerate(rows):
            x, new_mask, _, idx = inputs[b]
            if new_mask is None:  # the plain step; the window stays, but its root is the newest token
                r.root = sample(sampling.probs(target.lm_head(h[b][0])), r.generator)
                r.grid[0][0], produced[r.id] = int(r.root), Step([int(r.root)], [TARGET])
                continue
            produced[r.id], r.root, top = step_outputs(target, cache.row(b), before[b], r.grid, x, h[b], idx, tries[b],
                                                       accept, sampling, r.generator)
            if len(r.grid) == ngram - 1:  # a full window: each column, topped by its output, is an n-gram
                for c in range(window):
                    r.pool.add([row[c] for row in r.grid] + [top[c]])
            r.grid = slide(r.grid, top, int(r.root), ngram, r.fill)
        done = yield produced
        rows = leave(rows, done, [cache], max_len)
