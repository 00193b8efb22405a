"""Speculative decoding with a draft model: Leviathan, Kalman & Matias 2022 (arXiv:2211.17192)
and Chen et al. 2023 (arXiv:2302.01318), in Leviathan's notation.

p is the target's distribution, q the draft's (both after the same temperature / top-k / top-p
processing, `sampling.py`); gamma is called k here. One step:

1. the draft proposes k tokens x_1..x_k, each sampled from its own q_i = q(. | prefix, x_<i);
2. the target scores prefix + x_1..x_k in ONE forward pass, giving p_1..p_{k+1};
3. left to right, x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i));
4. at the first rejection, the target samples a correction from norm(max(0, p_i - q_i)) and
   the rest of the proposal is dropped; if all k were accepted, a bonus token comes from p_{k+1}.

Each step yields between 1 and k + 1 tokens for one target pass, and the tokens have exactly
the target's distribution p (proved in Leviathan et al.'s appendix; derived in walkthrough.md).
Greedy decoding needs no special case: with temperature 0, p and q are one-hot, so x_i is
accepted iff it is the target's argmax, and the residual is the target's argmax.

With acceptance rate alpha (the chance that a proposed token is accepted) and cost ratio c
(one draft forward / one target forward), a step yields (1 - alpha^(k+1)) / (1 - alpha) tokens
on average and costs k c + 1 target forwards: the expected speedup (Leviathan, Theorem 3.8)
is (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)). The k that maximises it is `best_k`; a step
costs more than k c + 1 forwards, though (the rule, the caches, the loop's own work), so the k
that `--k auto` uses is chosen from whole steps measured on the device, and step by step from
the running acceptance (`policy.py`, chapter 12).
"""

from __future__ import annotations

import torch

from .decoding import (ACCEPTED, BONUS, CORRECTION, TARGET, Chooser, Step, Steps, feed, last, leave, new_rows, ready,
                       sample_rows)
from .kvcache import KVCache
from .model import GPT
from .sampling import Sampling, residual, sample


def accept_or_resample(target_probs: torch.Tensor, draft_probs: torch.Tensor, drafts: torch.Tensor,
                       generator: torch.Generator | None) -> tuple[int, torch.Tensor]:
    """The acceptance rule (Leviathan et al. Algorithm 1, Chen et al. Algorithm 2): accept x_i
    while r_i < p_i(x_i) / q_i(x_i); at the first rejection sample from norm(max(0, p - q)), and
    if all k were accepted take a bonus token from p_(k+1).

    target_probs (k + 1, V): p at each proposed position and one beyond; draft_probs (k, V): the
    q each proposal was sampled from; drafts (k,). Returns (n accepted, next token)."""
    p, q, k = target_probs, draft_probs, drafts.numel()
    i = torch.arange(k, device=p.device)
    r = torch.rand(k, device=p.device, generator=generator)
    accepted = r * q[i, drafts] < p[i, drafts]  # r < p(x) / q(x), without dividing; q(x) > 0
    n = int(accepted.long().cumprod(0).sum())  # accepted before the first rejection (a host sync)
    if n == k:
        return n, sample(p[k], generator)
    return n, sample(residual(p[n], q[n]), generator)


def propose(draft: GPT, cache: KVCache, rows: list, k: int, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1 for every row: k draft forwards, each proposing the next token of every row from its
    own q. The first also feeds what the draft has not seen of each row (the prompt, the last
    correction or bonus, the tokens of plain steps). Returns drafts (B, k) and q (B, k, V)."""
    device = draft.lm_head.weight.device
    unseen = [torch.tensor(r.seq[cache.lengths[b]:], device=device) for b, r in enumerate(rows)]
    drafts, qs = [], []
    for _ in range(k):
        qs.append(sampling.probs(draft.logits(last(feed(draft, cache, unseen)))))  # (B, V)
        drafts.append(torch.stack(sample_rows(qs[-1], rows, sampling)))  # (B,)
        unseen = list(drafts[-1][:, None])
    return torch.stack(drafts, 1), torch.stack(qs, 1)


@torch.no_grad()
def speculative(target: GPT, draft: GPT, prompts: list[list[int]], sampling: Sampling, generators: list,
                max_len: int, k: int | Chooser = 4, caches: tuple[KVCache, KVCache] | None = None,
                accept=accept_or_resample) -> Steps:
    """Draft-model speculative decoding of every row (prompt) at once; yields what each target
    forward gave each row (`decoding.py`).

    Both models keep their own KV cache. Every token of a row's `seq` (prompt + output) is fed
    to each model exactly once: each forward starts with the tokens that model has not seen yet
    (the whole prompt the first time, then usually the last correction/bonus token; the draft
    also catches up on the last proposal after a fully accepted step, and on every token of plain
    steps, where the chooser chose not to draft). Rejected proposals are cut from both caches with
    `truncate`, so each cache always holds a prefix of `seq`, as plain decoding would build it.

    Each draft forward proposes the next token of every row; one target forward scores every
    row's proposals, and each row accepts its own prefix with `accept`: `accept_or_resample` or
    another chain rule with its signature (`verify.chain_rule` makes one from any rule of
    verify.py's table). k is the same for all rows (an int, or a `decoding.Chooser` that chooses
    it, or a plain step, every step and learns from all rows: `policy.Policy`), and no more than
    the row with the least room left allows. `caches` (target's,
    draft's; emptied first) lets a caller reuse them or look inside them afterwards."""
    device = target.lm_head.weight.device
    # a prompt that fills max_len leaves no room for a step: its row ends at once
    rows = [r for r in new_rows(prompts, generators) if len(r.seq) <= max_len]
    if not rows:
        return
    caches = caches or (None, None)
    policy = None if isinstance(k, int) else k
    t_cache = ready(caches[0], target, len(rows), max_len + 1 + (policy.largest if policy else k))
    d_cache = ready(caches[1], draft, len(rows), 2 * max_len)  # a draft that sat out steps catches up in one
    while rows:
        room = min(max_len - len(r.seq) for r in rows)
        chosen = policy.choose(len(rows)) if policy else k  # None: a plain step
        k_step = min(chosen or 0, room)
        # a step that also reads a prompt (the target's first, the draft's first proposal) is not
        # what a step of its size costs: the policy is told what was accepted but does not time it
        settled = all(t_cache.lengths[b] and (d_cache.lengths[b] or not k_step) for b in range(len(rows)))
        unseen = [torch.tensor(r.seq[t_cache.lengths[b]:], device=device) for b, r in enumerate(rows)]
        if k_step == 0:  # a plain step: the target alone, as plain decoding takes it (no rule, nothing to roll back)
            tokens = sample_rows(sampling.probs(target.lm_head(last(feed(target, t_cache, unseen)))), rows, sampling)
            produced = {r.id: Step([int(t)], [TARGET]) for r, t in zip(rows, tokens)}
        else:
            # 1. the draft proposes k tokens per row, one forward for all rows each
            drafts, q = propose(draft, d_cache, rows, k_step, sampling)  # (B, k), (B, k, V)
            # 2. the target scores every row's unseen tokens and proposals in one forward
            h = feed(target, t_cache, [torch.cat([x, d]) for x, d in zip(unseen, drafts)])
            p = sampling.probs(target.lm_head(torch.stack([x[-(k_step + 1):] for x in h])))  # (B, k + 1, V)
            # 3. each row accepts or rejects its own proposals, left to right; 4. both caches roll back
            produced = {}
            for b, r in enumerate(rows):
                n, token = accept(p[b], q[b], drafts[b], r.generator)
                t_cache.truncate(len(r.seq) + n, b)
                d_cache.truncate(min(d_cache.lengths[b], len(r.seq) + n), b)
                produced[r.id] = Step(drafts[b, :n].tolist() + [int(token)],
                                      [ACCEPTED] * n + [BONUS if n == k_step else CORRECTION], k_step, k_step)
        for r in rows:
            r.seq += produced[r.id].tokens
        if policy:  # what every row accepted; the policy times the step itself
            policy.update([len(s.tokens) - 1 for s in produced.values()] if k_step else [], chosen,
                          len(rows) if settled else None)
        done = yield produced
        rows = leave(rows, done, [t_cache, d_cache], max_len)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per step: 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, c: float, k: int) -> float:
    """Leviathan et al. Theorem 3.8: tokens per step over the step's cost in target forwards."""
    return expected_tokens(alpha, k) / (k * c + 1)


def best_k(alpha: float, c: float, k_max: int) -> int:
    """The k in 0..k_max with the largest expected speedup (k = 0 is plain decoding, speedup 1)."""
    return max(range(k_max + 1), key=lambda k: expected_speedup(alpha, c, k))
