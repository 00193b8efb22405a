"""Self-distillation: the target writes text, and heads learn to predict what it will say.

Medusa's heads (and EAGLE's draft head) are trained on the frozen target's *own* text, not on
the corpus: the target continues random corpus windows (`self_distill`), and a head learns the
target's next-token distributions on that text, so what it learns is what verification will
ask of it. This is Cai et al.'s "Medusa-1" recipe: the target stays frozen, only the heads learn.
EAGLE's head (`methods/eagle.py`) learns the target's next *feature* on the same text
(`train_eagle`).

Medusa's loss for head i is the cross-entropy against the target's own distribution at
position t + i (soft labels; the target is at hand anyway), weighted by 0.8^i so that nearer
heads, whose guesses are verified more often, count more (Cai et al. use the same decay).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..kvcache import KVCache
from ..methods.medusa import MedusaHeads
from ..methods.parallel import ParallelHead
from ..progress import progress_bar
from ..model import GPT, causal_mask
from ..sampling import probs, sample
from .corpus import TokenFile
from .optim import check_finite, lr_at, make_optimizer


def medusa_loss(head_logits: torch.Tensor, target_logits: torch.Tensor,
                decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
    """Sum over heads i of decay^i * CE(p_target at t + i, head i at t).

    head_logits (K, B, T, V); target_logits (B, T, V): the frozen target's logits, whose row
    t + i is its distribution of x_{t+1+i}, the token head i guesses at t. Head i is trained
    at t = 0 .. T-1-i, where that label exists. Returns the loss and each head's own loss."""
    K, B, T, V = head_logits.shape
    total, per_head = 0.0, []
    for i in range(1, K + 1):
        guess = head_logits[i - 1, :, : T - i].float()  # (B, T - i, V): head i at t = 0 .. T-1-i
        label = torch.softmax(target_logits[:, i:].float(), -1)  # target at t + i
        per_head.append(-(label * F.log_softmax(guess, -1)).sum(-1).mean())
        total = total + decay ** i * per_head[-1]
    return total, [float(x.detach()) for x in per_head]


@torch.no_grad()
def self_distill(model: GPT, tokens: TokenFile, n_sequences: int, prompt_len: int, gen_len: int, batch: int,
                 temperature: float, seed: int = 0, progress: bool = True) -> np.ndarray:
    """The target continues random corpus windows: (n_sequences, prompt_len + gen_len) uint16.
    Batched plain decoding with the KV cache, greedy (temperature 0) or sampled."""
    device = model.lm_head.weight.device
    g = torch.Generator().manual_seed(seed)
    g_dev = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for start in progress_bar(range(0, n_sequences, batch), desc=f"self-distilling (T={temperature})",
                              disable=not progress):
        b = min(batch, n_sequences - start)
        x = tokens.batch(b, prompt_len, g)[0].to(device)  # (b, P)
        cache = KVCache.for_model(model, prompt_len + gen_len, batch=b)
        logits = model.lm_head(model.hidden(x, cache=cache)[:, -1])
        out = [x]
        for t in range(gen_len):
            nxt = sample(probs(logits, temperature), g_dev).view(b, 1)
            out.append(nxt)
            if t + 1 < gen_len:
                logits = model(nxt, cache=cache)[0][:, -1]
        rows.append(torch.cat(out, 1).cpu().numpy().astype(np.uint16))
    return np.concatenate(rows)


@torch.no_grad()
def head_accuracy(model: GPT, heads: MedusaHeads, sequences: np.ndarray, prompt_len: int, top: int = 10,
                  batch: int = 16) -> torch.Tensor:
    """accuracy[i - 1, r]: how often head i's r-th best guess is the target's greedy choice for
    x_{t+1+i}, over the generated part of held-out self-distilled sequences."""
    device = model.lm_head.weight.device
    hits, count = torch.zeros(heads.n_heads, top), 0
    for start in range(0, len(sequences), batch):
        x = torch.from_numpy(sequences[start:start + batch].astype(np.int64)).to(device)
        h = model.hidden(x)
        greedy = model.lm_head(h).argmax(-1)  # (B, T): the target's choice for x_{t+1}
        guesses = heads(h, model.lm_head).topk(top, dim=-1).indices  # (K, B, T, top)
        T = x.shape[1]
        span = slice(prompt_len - 1, T - heads.n_heads)  # t whose every head has a label in range
        for i in range(1, heads.n_heads + 1):
            label = greedy[:, span.start + i: span.stop + i]  # target's choice at t + i
            hits[i - 1] += (guesses[i - 1, :, span] == label[..., None]).float().sum((0, 1)).cpu()
        count += x.shape[0] * (span.stop - span.start)
    return hits / count


def train_heads(model: GPT, heads: MedusaHeads, sequences: np.ndarray, prompt_len: int, steps: int, batch: int,
                lr: float, seed: int = 0, progress: bool = True, window: int | None = None) -> list[float]:
    """Medusa-1 training: the target is frozen, only the heads' residual blocks learn. Returns
    each head's loss averaged over the last 10% of steps.

    The target reads whole sequences, but with `window` the heads are trained on a random
    stretch of that many positions per batch (in the generated part): the K shared-LM-head
    projections dominate the cost, and more sequences per step beat more positions of each."""
    device = model.lm_head.weight.device
    model.requires_grad_(False)
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    T, K = sequences.shape[1], heads.n_heads
    first = prompt_len - 1  # train where the context is the target's own text
    span = T - first if window is None else min(window + K, T - first)
    tail = []
    bar = progress_bar(range(steps), desc="training heads", disable=not progress)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, max(1, steps // 20))
        rows = torch.randint(len(sequences), (batch,), generator=g)
        x = torch.from_numpy(sequences[rows.numpy()].astype(np.int64)).to(device)
        with torch.no_grad():
            target_logits, hidden = model(x)
        start = first + int(torch.randint(T - first - span + 1, (1,), generator=g))
        part = slice(start, start + span)
        loss, per_head = medusa_loss(heads(hidden[:, part], model.lm_head), target_logits[:, part])
        check_finite(loss.item(), step + 1)  # before the step: nan spreads into every weight it reaches
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", head1=f"{per_head[0]:.2f}")
        if step >= steps - max(1, steps // 10):  # the last tenth of the steps, and at least the last step
            tail.append(per_head)
    return [sum(col) / len(col) for col in zip(*tail)] if tail else []


# ---- EAGLE's draft head (methods/eagle.py) ---------------------------------------------------
#
# The head reads pairs (f_i, t_{i+1}) and predicts f_{i+1}. All its labels are features of the
# frozen target, so the target reads the training sequences once (`target_features`) and the
# head trains on the stored features for as many steps as it likes.

def eagle_loss(f_hat: torch.Tensor, f_next: torch.Tensor, lm_head, w: float = 0.1) -> tuple[torch.Tensor, float, float]:
    """Li et al. 2024, Section 4.2: L = SmoothL1(f^_{i+1}, f_{i+1}) + w * CE(p_{i+2}, q_{i+2}), with
    p = softmax(LMHead(f_{i+1})) the target's distribution and q = softmax(LMHead(f^_{i+1})) the
    head's (w = 0.1 in the paper). Returns the loss and its two parts."""
    regression = F.smooth_l1_loss(f_hat, f_next)
    p = torch.softmax(lm_head(f_next).float(), -1)
    ce = -(p * F.log_softmax(lm_head(f_hat).float(), -1)).sum(-1).mean()
    return regression + w * ce, float(regression.detach()), float(ce.detach())


@torch.no_grad()
def target_features(model: GPT, sequences: np.ndarray, batch: int = 16) -> torch.Tensor:
    """The target's features f (n, T, C) of each sequence, float32 on the model's device."""
    device = model.lm_head.weight.device
    return torch.cat([model.hidden(torch.from_numpy(sequences[i:i + batch].astype(np.int64)).to(device)).float()
                      for i in range(0, len(sequences), batch)])


def unrolled_loss(model: GPT, head, f: torch.Tensor, x: torch.Tensor, depth: int, anchors: int, noise: float, w: float,
                  g: torch.Generator) -> tuple[torch.Tensor, list[tuple[float, float]]]:
    """The head's loss at draft depths 1..`depth`, each on the inputs it reads when decoding.

    Depth 1 is EAGLE's: every pair (f_i + u, t_{i+1}) -> f_{i+1}, u ~ U(-noise, noise).
    - EAGLE's head, depth d > 1: a pass over `anchors` random positions j whose input is the pair
      (f^_{j+d-1}, t_{j+d}) of its OWN prediction one depth up (training-time test, HASS: Zhang et
      al. 2024, arXiv:2408.15766; EAGLE-3), seeing the true pairs 0..j and its own rows of passes
      2..d (`own_chains`); it learns f_{j+d}.
    - The parallel head: its Medusa heads read depth 1's f^_{j+1} at the anchors, as when
      decoding, with Medusa's loss (soft labels, the target's own distributions; weights 0.8^i).
    f (B, T, C) the target's features, x (B, T) the tokens. Returns the summed loss and
    (SmoothL1, CE) per depth (SmoothL1 0 where there is none)."""
    B, T, C = f.shape
    n, device = T - 1, f.device
    u = (torch.rand(f[:, :-1].shape, generator=g) * 2 - 1).to(device) * noise
    inputs = [head.embed(f[:, :-1] + u, x[:, 1:], model.transformer.wte)]  # pass 1: pair i = (f_i + u, t_{i+1})
    out = head.run(inputs[0])  # (B, n, C): f^_{i+1}
    loss, regression, ce = eagle_loss(out, f[:, 1:], model.lm_head, w)
    parts = [(regression, ce)]
    if depth == 1:
        return loss, parts
    j = torch.randperm(T - depth, generator=g)[:anchors].sort().values.to(device)  # j + depth <= T - 1
    if isinstance(head, ParallelHead):  # Medusa's heads on f^_{j+1}, head i guessing t_{j+2+i} (target at j+1+i)
        for i, block in enumerate(head.ahead.blocks[:depth - 1], start=1):
            p = torch.softmax(model.lm_head(f[:, j + 1 + i]).float(), -1)
            ce = -(p * F.log_softmax(model.lm_head(block(out[:, j])).float(), -1)).sum(-1).mean()
            loss, parts = loss + 0.8 ** i * ce, parts + [(0.0, float(ce.detach()))]
    else:
        for d, f_hat in enumerate(own_chains(head, inputs[0], out, x, j, depth, model.transformer.wte), start=2):
            more, regression, ce = eagle_loss(f_hat, f[:, j + d], model.lm_head, w)
            loss, parts = loss + more, parts + [(regression, ce)]
    return loss, parts


def own_chains(head, pairs: torch.Tensor, out: torch.Tensor, x: torch.Tensor, j: torch.Tensor, depth: int, wte):
    """EAGLE's head drafting on its own predictions, as a chain below each anchor j, for training:
    [f^ at depth d (B, A, C) for d = 2..depth]. Depth d's row reads (f^_{j+d-1}, t_{j+d}) and sees
    the true pairs 0..j and its own rows of depths 2..d, as a node d deep in a draft does.
    pairs (B, n, C): the embedded true pairs; out (B, n, C): the head's f^ on them."""
    n, A, device = pairs.shape[1], j.numel(), pairs.device
    inputs, mask = [pairs], causal_mask(n, device)
    seen = torch.arange(n, device=device)[None, :] <= j[:, None]  # (A, n): the true pairs 0..j
    for d in range(2, depth + 1):
        above = out[:, n + (d - 3) * A:] if d > 2 else out[:, j]  # (B, A, C): f^_{j+d-1}
        inputs.append(head.embed(above, x[:, j + d], wte))
        own = torch.zeros(A, mask.shape[1] + A, dtype=torch.bool, device=device)
        own[:, :n] = seen
        for e in range(d - 1):  # its own rows of depths 2..d
            own[:, n + e * A: n + (e + 1) * A] = torch.eye(A, dtype=torch.bool, device=device)
        mask = torch.cat([torch.cat([mask, mask.new_zeros(mask.shape[0], A)], 1), own])
        out = head.run(torch.cat(inputs, 1), None, mask)
    return [out[:, n + (d - 2) * A: n + (d - 1) * A] for d in range(2, depth + 1)]


def train_eagle(model: GPT, head, sequences: np.ndarray, features: torch.Tensor, steps: int, batch: int, lr: float,
                noise: float = 0.1, w: float = 0.1, seed: int = 0, progress: bool = True, resume=None,
                checkpoint=None, every: int = 100, depth: int = 1, anchors: int = 64) -> list[dict]:
    """EAGLE's training on self-distilled text (the target frozen): each step, `batch` random
    sequences, every pair (f_i + u, t_{i+1}) -> f_{i+1} with u ~ U(-noise, noise) per element: at
    decoding time the head reads its own, imperfect, predictions, and noisy inputs teach it to
    tolerate them (Li et al. 2024). depth > 1: it reads them in training too, at `anchors`
    positions per sequence (`unrolled_loss`); the parallel head trains its Medusa heads on its own f^.
    Returns the curve: mean losses every `every` steps (SmoothL1 and CE of depth 1, and CE per depth).

    resume(opt, generator) -> (step, curve): restores a checkpoint; checkpoint(step, opt,
    generator, curve) saves one, every `every` steps and at the end."""
    device = model.lm_head.weight.device
    model.requires_grad_(False)
    opt = make_optimizer(head, lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)  # rows and noise: its state is the data sampler's
    step, curve = resume(opt, g) if resume else (0, [])
    tokens = torch.from_numpy(sequences.astype(np.int64))
    bar = progress_bar(range(step, steps), desc=f"training the {type(head).__name__}", disable=not progress,
                       initial=step, total=steps)
    sums = []
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, max(1, steps // 20))
        rows = torch.randint(len(sequences), (batch,), generator=g)
        loss, parts = unrolled_loss(model, head, features[rows], tokens[rows].to(device), depth, anchors, noise, w, g)
        check_finite(loss.item(), step + 1)  # before the step: nan spreads into every weight it reaches
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sums.append(parts)
        bar.set_postfix(smooth_l1=f"{parts[0][0]:.3f}", ce=f"{parts[0][1]:.2f}")
        if (step + 1) % every == 0 or step + 1 == steps:
            point = {"step": step + 1, "smooth_l1": round(float(np.mean([s[0][0] for s in sums])), 4),
                     "ce": round(float(np.mean([s[0][1] for s in sums])), 4)}
            if depth > 1:
                point["ce_per_depth"] = [round(float(np.mean([s[d][1] for s in sums])), 4) for d in range(depth)]
            curve.append(point)
            sums = []
            if checkpoint:
                checkpoint(step + 1, opt, g, curve)
    return curve


@torch.no_grad()
def eagle_accuracy(model: GPT, head, sequences: np.ndarray, prompt_len: int, depth: int = 5,
                   batch: int = 16) -> list[float]:
    """accuracy[d - 1]: how often the head's top-1 guess at draft depth d is the target's greedy
    token, on held-out self-distilled text, given that the tokens before it were right (Li et al.'s
    "n-alpha": depth d reads d - 1 of the head's own predicted features).

    Row j of pass 1 reads the true pairs 0..j and predicts f^_{j+1}; row j of pass d reads the
    same true pairs, its own rows of passes 2..d-1, and (f^_{j+d-1}, t_{j+d}): exactly what a
    node d deep in a draft tree sees when the root is t_{j+1}. The parallel head's depth d is its
    Medusa head d - 1 on pass 1's f^_{j+1}."""
    device = model.lm_head.weight.device
    hits, count = torch.zeros(depth), torch.zeros(depth)
    for start in range(0, len(sequences), batch):
        x = torch.from_numpy(sequences[start:start + batch].astype(np.int64)).to(device)
        f = model.hidden(x)  # (B, T, C)
        greedy = model.lm_head(f).argmax(-1)  # (B, T): the target's token after each position
        B, T = x.shape
        n = T - 1  # pairs
        cache = KVCache(1, head.config.n_head, head.config.n_embd // head.config.n_head, n * depth, B, device, f.dtype)
        eye = torch.eye(n, dtype=torch.bool, device=device)
        f_hat = head(f[:, :-1], x[:, 1:], model.transformer.wte, cache)  # pass 1: f^_{j+1}
        ahead = head.features_ahead(f_hat, depth) if isinstance(head, ParallelHead) else None
        mask = causal_mask(n, device)  # the true pairs 0..j
        for d in range(1, depth + 1):
            rows = torch.arange(max(0, prompt_len - 1), T - d, device=device)  # j with a label t_{j+d+1}
            guess = model.lm_head((f_hat if ahead is None else ahead[d - 1])[:, rows]).argmax(-1)
            hits[d - 1] += (guess == greedy[:, rows + d]).sum().cpu()
            count[d - 1] += guess.numel()
            if d < depth and ahead is None:  # pass d + 1: (f^_{j+d}, t_{j+d+1}), seeing the true pairs, its own chain and itself
                mask = torch.cat([mask, eye], 1)
                nxt = torch.cat([x[:, d + 1:], x.new_zeros(B, d)], 1)  # t_{j+d+1}, padded past the end
                f_hat = head(f_hat, nxt, model.transformer.wte, cache, mask)
    return (hits / count.clamp(min=1)).tolist()
