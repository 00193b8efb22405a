"""From logits to the distribution we sample from.

Speculative sampling compares two distributions token by token (accept x with probability
min(1, p(x) / q(x))), so every decoding rule here returns the *processed distribution*, not a
sample: `probs(logits, ...)` applies, in this order (the order of Hugging Face's generate),

1. temperature: softmax(logits / T); T = 0 means greedy and gives a one-hot at the argmax,
2. top-k: keep the k most likely tokens (ties with the k-th are kept too),
3. top-p (nucleus, Holtzman et al. 2019): keep the smallest set of most likely tokens whose
   mass reaches top_p,

then renormalises. Greedy as a one-hot distribution means the speculative algorithms need no
special case: with one-hot p and q, min(1, p(x) / q(x)) is 1 exactly when the draft's token is
the target's argmax.

`residual(p, q)` = norm(max(0, p - q)) is where a rejected proposal sends the target: every
acceptance rule (`methods/draft.py`, `verify.py`) resamples from it, and it is written only here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MIN_TEMPERATURE = 1e-3  # below this, logits / T overflows float32 to inf for ordinary logits; use 0 (greedy)


def check_params(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> None:
    """Raise ValueError (naming the fix) for out-of-range sampling settings."""
    if not (temperature == 0 or MIN_TEMPERATURE <= temperature < math.inf):
        raise ValueError(f"temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top-k must be at least 1 (or unset), got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top-p must be in (0, 1] (or unset), got {top_p}")


def probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
          top_p: float | None = None) -> torch.Tensor:
    """Processed next-token distribution over the last dim of `logits` (..., V), in float32:
    temperature (0 = one-hot at the argmax), then top-k, then top-p, renormalised."""
    if temperature == 0:  # (a scatter, not F.one_hot, which reads its input back to check it)
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    p = torch.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1:
        sorted_p, order = torch.sort(p, dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p  # mass of the more likely tokens
        sorted_p = sorted_p.masked_fill(mass_before >= top_p, 0.0)  # the first token always stays
        p = torch.zeros_like(p).scatter(-1, order, sorted_p)
        p = p / p.sum(-1, keepdim=True)
    return p


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what p has that q over-proposed (Leviathan et al. 2022, Algorithm 1).

    After a proposal drawn from q is rejected, the target's token comes from here, and the two
    together are distributed exactly as p. The mass is 0 where p <= q everywhere: for two
    distributions only where p == q, where a rejection has probability 0 and only rounding gets
    here. Block and traversal verification pass a scaled first argument (a weight times p), which
    can lie under q everywhere; they never draw from such a residual (its weight in their rule is
    then 0). Either way the token then comes from p itself, normalised."""
    r = (p - q).clamp(min=0)
    mass = r.sum(-1, keepdim=True)  # chosen on the device, not by reading the mass back (recorded.py)
    return torch.where(mass > 0, r / mass.clamp(min=torch.finfo(r.dtype).tiny), p / p.sum(-1, keepdim=True))


def sample(p: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row of a distribution (..., V); returns (...) long.

    Inverse-CDF sampling: with u uniform in (0, 1], the token is the first whose cumulative
    mass reaches u * total. A token of probability 0 adds nothing to the CDF, so it is never
    drawn, and a one-hot (greedy) distribution always gives its token. For one row of a large
    vocabulary this is several times faster than torch.multinomial on a CPU, which matters in a
    loop that samples once per decoded token. float64 keeps tiny probabilities' share."""
    total = p.sum(-1)
    ok = total.item() > 0 if total.numel() == 1 else bool((total > 0).all())  # (one row: the cheap check)
    if not ok:  # NaN (which compares False) or no mass: there is nothing to sample
        raise ValueError("cannot sample from a distribution that is NaN or all zero (did the logits overflow?)")
    return draw(p, torch.rand(p.shape[:-1], device=p.device, generator=generator, dtype=torch.float64))


def draw(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """`sample` with its uniform numbers u (...) in [0, 1) given, and nothing read back to the host:
    the token is the first whose cumulative mass reaches (1 - u) * total (1 - u is in (0, 1], so a
    token of mass 0 before the first that has any is never drawn)."""
    cdf = p.double().cumsum(-1)  # (..., V)
    return torch.searchsorted(cdf, ((1 - u.double()) * cdf[..., -1]).unsqueeze(-1)).squeeze(-1).clamp(max=p.shape[-1] - 1)


@dataclass
class Sampling:
    """How a token is chosen from logits (see sampling.py); temperature 0 is greedy."""
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return probs(logits, self.temperature, self.top_k, self.top_p)

    def check(self) -> None:
        check_params(self.temperature, self.top_k, self.top_p)
