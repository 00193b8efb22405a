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

Steps 2-4 are the loop's (`decoding.decode`), as for every method; this file is step 1, the
rule of step 3 (`accept_or_resample`), and the draft's own cache: both models keep one, every
token of the text is fed to each exactly once, and rejected proposals are cut from both.

With acceptance rate alpha (the chance that a proposed token is accepted) and cost ratio c
(one draft forward / one target forward), a step yields (1 - alpha^(k+1)) / (1 - alpha) tokens
on average and costs k c + 1 target forwards: the expected speedup (Leviathan, Theorem 3.8)
is (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)). The k that maximises it is `best_k`; a step
costs more than k c + 1 forwards, though (the rule, the caches, the loop's own work), so the k
that `--size auto` uses is chosen from whole steps measured on the device (chapter 13).
"""

from __future__ import annotations

import torch

from ..decoding import Proposal, Row, Verified, last
from ..kvcache import KVCache, SlotWriter, feed, slot_mask
from ..model import GPT, DraftVocab, causal_mask
from ..sampling import Sampling, draw, residual, sample
from ..tree import chain, tree_on
from ..verify import RULES
from .base import Method, Part, Weights


def accept_or_resample(target_probs: torch.Tensor, draft_probs: torch.Tensor, drafts: torch.Tensor,
                       generator: torch.Generator | None, note=None) -> tuple[int, torch.Tensor]:
    """The acceptance rule (Leviathan et al. Algorithm 1, Chen et al. Algorithm 2): accept x_i
    while r_i < p_i(x_i) / q_i(x_i); at the first rejection sample from norm(max(0, p - q)), and
    if all k were accepted take a bonus token from p_(k+1).

    target_probs (k + 1, V): p at each proposed position and one beyond; draft_probs (k, V): the
    q each proposal was sampled from; drafts (k,). Returns (n accepted, next token). note: as
    for the rules of `verify.py`, told each x_i's coin and min(1, p/q), for a trace."""
    p, q, k = target_probs, draft_probs, drafts.numel()
    i = torch.arange(k, device=p.device)
    r = torch.rand(k, device=p.device, generator=generator)
    accepted = r * q[i, drafts] < p[i, drafts]  # r < p(x) / q(x), without dividing; q(x) > 0
    n = int(accepted.long().cumprod(0).sum())  # accepted before the first rejection (a host sync)
    if note:  # a trace's view of each coin (`trace.py`)
        for i, (u, ratio) in enumerate(zip(r.tolist(), (p[i, drafts] / q[i, drafts]).clamp(max=1).tolist()), 1):
            note(i, u=u, ratio=ratio)
    if n == k:
        return n, sample(p[k], generator)
    return n, sample(residual(p[n], q[n]), generator)


def speculative_sampling(tokens: torch.Tensor, p: torch.Tensor, tree, q: torch.Tensor, generator=None, note=None):
    """`accept_or_resample` with the signature of every rule in `verify.py`: tokens (k+1,) are the
    root and the chain, q (k+1, V) row i the distribution x_i was drawn from (row 0 unused)."""
    n, token = accept_or_resample(p, q[1:], tokens[1:], generator, note)
    return torch.arange(n + 1, device=tokens.device), token


class DraftModel(Method):
    """A small GPT of the target's tokenizer proposes k tokens, one forward each (step 1 above)."""
    name = "draft"
    chapter = 5  # of the walkthrough
    summary = "speculative decoding with a draft model (Leviathan et al. 2022)"
    proposes = "a sampled chain"
    weights = Weights("--draft", "draft.safetensors", GPT, "a draft model",
                      "python -m tinyspec train gpt --preset draft --distill-from weights/target.safetensors",
                      "transformer.")
    reduced_vocab = True
    default_size = "4"
    sizes = ("1", "2", "4")
    size_format = (("K", 1, 16, "tokens the draft proposes per step"),)

    def __init__(self, target: GPT, draft: GPT, draft_vocab: torch.Tensor | None = None):
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"the draft's vocabulary ({draft.config.vocab_size}) differs from the target's "
                             f"({target.config.vocab_size}): a draft must share the target's tokenizer")
        self.draft, self.n_ctx = draft, draft.config.n_ctx
        # the draft's LM head, or the rows of its --draft-vocab tokens only (model.DraftVocab)
        self.lm_head = draft.lm_head if draft_vocab is None else DraftVocab(draft.lm_head, draft_vocab)
        self.cache = KVCache.for_model(draft, 2 * draft.config.n_ctx)  # batch 1's, reused prompt after prompt
        self.caches = ()

    def room(self, k: int) -> int:
        return k

    def rule(self, name: str):
        # a chain with one child per node: the lossless rule IS Leviathan's (the greedy rule is its T = 0)
        return speculative_sampling if name == "lossless" else RULES[name]

    def start(self, rows: list[Row], hidden, slots: int) -> None:
        # a draft that sat out plain steps catches up on all of them in its next forward: room for the text twice
        rows_here = len(rows)
        if rows_here == 1 and self.cache.max_len < 2 * slots:  # (slots pass the context by a step's room)
            self.cache = KVCache.for_model(self.draft, 2 * slots)
        self.caches = (self.cache if rows_here == 1 else KVCache.for_model(self.draft, 2 * slots, rows_here),)
        self.caches[0].reset(rows_here)

    def propose(self, rows: list[Row], k: int, room: list[int], sampling: Sampling, sampled: bool) -> list:
        """k draft forwards, each proposing the next token of every row from its own q (fewer for a
        row near the end of its context). The first also feeds what the draft has not read of each
        row's text (the prompt, the last correction or bonus, the tokens of plain steps)."""
        cache, device = self.caches[0], self.draft.lm_head.weight.device
        ks = [max(0, min(k, r)) for r in room]  # each row's own k: a row's text never depends on the rows beside it
        unseen = [torch.tensor(r.text[cache.lengths[b]:], device=device) for b, r in enumerate(rows)]
        drafts, qs = [], []
        for i in range(max(ks)):
            for b, kb in enumerate(ks):
                if i > kb:  # row b proposes no more: its stand-in takes the same slot again (past it, near the
                    cache.truncate(cache.lengths[b] - 1, b)  # context's end, is a position the draft does not have)
            logits = self.lm_head(last(feed(self.draft, cache, unseen)))  # (B, V)
            tokens = logits.argmax(-1)  # (B,): greedy; and the stand-in of a row that proposes fewer (it draws nothing)
            if sampled or sampling.temperature > 0:  # q: what each row draws from, and the rule judges draws by
                qs.append(sampling.probs(logits))
            if sampling.temperature > 0:
                tokens = torch.stack([sample(qs[-1][b], r.generator) if i < ks[b] else tokens[b]
                                      for b, r in enumerate(rows)])
            drafts.append(tokens)
            unseen = list(drafts[-1][:, None])
        if not drafts:
            return [None] * len(rows)
        drafts = torch.stack(drafts, 1)  # (B, k)
        q = torch.stack(qs, 1) if qs else None  # (B, k, V); greedy needs none
        return [Proposal(drafts[b, :kb], tree_on(chain(kb).parents, device),
                         None if q is None else torch.cat([q[b, :1], q[b, :kb]])) if kb else None
                for b, kb in enumerate(ks)]

    def update(self, rows: list[Row], proposals: list, verified: list[Verified]) -> None:
        """The draft's cache keeps what the target accepted: its text up to the new root."""
        cache = self.caches[0]
        for b, r in enumerate(rows):
            cache.truncate(min(cache.lengths[b], len(r.text) - 1), b)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per step: 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, c: float, k: int) -> float:
    """Leviathan et al. Theorem 3.8: tokens per step over the step's cost in target forwards."""
    return expected_tokens(alpha, k) / (k * c + 1)


def best_k(alpha: float, c: float, k_max: int) -> int:
    """The k in 0..k_max with the largest expected speedup (k = 0 is plain decoding, speedup 1)."""
    return max(range(k_max + 1), key=lambda k: expected_speedup(alpha, c, k))


class DraftPart(Part):
    """`DraftModel.propose` with fixed shapes, for a recorded step: the draft's own cache at slots
    on the device, a chain of k drafted one token at a time (argmax, or drawn from q)."""
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


DraftModel.Part = DraftPart  # its recorded step, found through the method as METHOD is


METHOD = DraftModel
