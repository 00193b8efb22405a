"""Honest timing: warm up first, synchronise the GPU around each call, report the median.

Also the two costs the analytic speedup models need, both measured, never assumed: c, a draft
forward over a target forward (Leviathan et al.'s cost ratio), and the cost of one tree step
(heads + a target forward over the root and the tree) over one plain decoding step.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from .fastpath import fixed_forward
from .kvcache import KVCache
from .model import GPT, prefix_mask


def median_seconds(fn: Callable[[], object], device: torch.device, repeats: int = 20, warmup: int = 3,
                   setup: Callable[[], object] | None = None) -> float:
    """Median wall time of `fn()` over `repeats` calls after `warmup` untimed ones. `setup()`
    runs untimed before every call (e.g. to reset a cache); on CUDA the queue is drained
    before and after each timed call, so the time is the GPU's work, not the launch."""
    times = [timed(fn, setup, device) for _ in range(warmup + repeats)]
    return statistics.median(times[warmup:])


def timed(fn: Callable[[], object], setup: Callable[[], object] | None, device: torch.device) -> float:
    """Seconds of one call of `fn()`, after an untimed `setup()`; on CUDA between two drains of the queue."""
    if setup is not None:
        setup()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def interleaved_medians(calls: dict, device: torch.device, rounds: int = 7) -> dict:
    """Median seconds of each of several calls, timed in turn, one call each per round (round 0
    only warms up), so that a slow spell of a shared machine hits every call alike instead of
    all the repeats of one. calls: {key: (fn, setup or None)}; setup runs untimed before fn."""
    times = {key: [] for key in calls}
    for r in range(rounds + 1):
        for key, (fn, setup) in calls.items():
            seconds = timed(fn, setup, device)
            if r:
                times[key].append(seconds)
    return {key: statistics.median(t) for key, t in times.items()}


def copy_bandwidth(device: torch.device, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second (read + write) of a large copy within `device`'s memory: the practical
    peak that a memory-bound step can be held against (a data sheet's figure is never reached)."""
    x = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    return 2 * x.numel() / median_seconds(lambda: y.copy_(x), device, repeats)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters (a tied matrix counted once): what one forward must read."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


@torch.no_grad()
def cost_ratio(target: GPT, draft: GPT, context: int = 64, repeats: int = 20) -> float:
    """c: the median time of one single-token draft forward over one target forward, each with
    `context` tokens in its cache (fewer if the context window is shorter), after a warm-up."""
    def forward_time(model: GPT) -> float:
        device = model.lm_head.weight.device
        n = min(context, model.config.n_ctx - 1)
        cache = KVCache.for_model(model, n + 1)
        model(torch.zeros(1, n, dtype=torch.long, device=device), cache=cache)
        x = torch.zeros(1, 1, dtype=torch.long, device=device)
        # every timed forward sees the same n cached tokens
        return median_seconds(lambda: model(x, cache=cache), device, repeats, setup=lambda: cache.truncate(n))
    return forward_time(draft) / forward_time(target)


@torch.no_grad()
def step_cost(target: GPT, tree, propose: Callable[[], object], context: int = 128, repeats: int = 10,
              cuda_graph: bool = False) -> float:
    """Time of one tree step (`propose()`, then a target forward over the root and `tree`) over
    one plain decoding step, both after `context` cached tokens; medians after a warm-up.
    cuda_graph: both forwards as the recorded fixed-shape ones that decoding then uses."""
    device = target.lm_head.weight.device
    tree = tree.to(device)
    n_ctx = target.config.n_ctx
    cache = KVCache.for_model(target, n_ctx if cuda_graph else context + len(tree) + 1)
    if cuda_graph:  # recorded while the cache is empty, as decoding does
        plain, verify = fixed_forward(target, cache), fixed_forward(target, cache, tree)
    else:
        plain = lambda x, L: target(x[None], cache=cache)
        verify = lambda x, L: target(x[None], positions=L + tree.depth, cache=cache, attn_mask=prefix_mask(tree.tree_mask, L))
    target(torch.zeros(1, context, dtype=torch.long, device=device), cache=cache)
    x1 = torch.zeros(1, dtype=torch.long, device=device)
    xt = torch.zeros(len(tree) + 1, dtype=torch.long, device=device)
    reset = lambda: cache.truncate(context)
    plain_time = median_seconds(lambda: plain(x1, context), device, repeats, setup=reset)
    tree_time = median_seconds(lambda: (propose(), verify(xt, context)), device, repeats, setup=reset)
    return tree_time / plain_time
