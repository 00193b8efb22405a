"""Honest timing: warm up first, synchronise the GPU around each call, time competing calls in
turn, report the median.

Every forward is timed one way, `forward_call`: `decoding.feed`, the very forward the decoding
loop calls, over rows x t new tokens after a fixed number of cached ones, with the cache set back
before each call. The benchmark, the batch policy (`auto.py`), the cost model and the figures all
time their forwards with it, in turn with whatever they compare them to (`interleaved_times`).

Also the two costs the analytic speedup models need, both measured, never assumed: c, a draft
forward over a target forward (Leviathan et al.'s cost ratio), and the cost of one tree step
(heads + a target forward over the root and the tree) over one plain decoding step.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from ..kernels.fastpath import fixed_forward
from ..kvcache import KVCache, feed
from ..model import GPT


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


def interleaved_times(calls: dict, device: torch.device, rounds: int = 7) -> dict:
    """Seconds of each of several calls in each round, timed in turn, one call each per round
    (round 0 only warms up), so that a slow spell of a shared machine hits every call alike
    instead of all the repeats of one; round r's times of two calls make a pair.
    calls: {key: (fn, setup or None)}; setup runs untimed before fn. Returns {key: [seconds]}."""
    times = {key: [] for key in calls}
    for r in range(rounds + 1):
        for key, (fn, setup) in calls.items():
            seconds = timed(fn, setup, device)
            if r:
                times[key].append(seconds)
    return times


def interleaved_medians(calls: dict, device: torch.device, rounds: int = 7) -> dict:
    """The median of each call's `interleaved_times`."""
    return {key: statistics.median(t) for key, t in interleaved_times(calls, device, rounds).items()}


def forward_call(model: GPT, rows: int, t: int, context: int, tree=None) -> tuple[Callable, Callable]:
    """(fn, setup) for timing one forward of `model` as a decoding loop makes it (`decoding.feed`):
    rows x t new tokens, each row after `context` cached tokens (fewer if the context window is
    shorter), causally or (tree) as the root and the tree's t - 1 nodes; setup truncates the
    cache back, so that every timed call sees the same cache."""
    device = model.lm_head.weight.device
    context = min(context, model.config.n_ctx - t)
    cache = KVCache.for_model(model, context + t, rows)
    zeros = lambda n: torch.zeros(n, dtype=torch.long, device=device)
    with torch.no_grad():
        feed(model, cache, [zeros(context)] * rows)
    masks = None if tree is None else [tree.tree_mask.to(device)] * rows
    offsets = None if tree is None else [tree.depth.to(device)] * rows

    def fn():
        with torch.no_grad():
            return feed(model, cache, [zeros(t)] * rows, masks, offsets)
    return fn, lambda: [cache.truncate(context, b) for b in range(rows)]


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
def cost_ratio(target: GPT, draft: GPT, context: int = 64, rounds: int = 20) -> float:
    """c: the median time of one single-token draft forward over one target forward, each with
    `context` tokens in its cache, timed in turn."""
    calls = {"target": forward_call(target, 1, 1, context), "draft": forward_call(draft, 1, 1, context)}
    t = interleaved_medians(calls, target.lm_head.weight.device, rounds)
    return t["draft"] / t["target"]


@torch.no_grad()
def step_cost(target: GPT, tree, propose: Callable[[], object], context: int = 128, rounds: int = 10,
              cuda_graph: bool = False) -> float:
    """Time of one tree step (`propose()`, then a target forward over the root and `tree`) over
    one plain decoding step, both after `context` cached tokens; medians, timed in turn.
    cuda_graph: both forwards as the recorded fixed-shape ones that decoding then uses."""
    device = target.lm_head.weight.device
    tree = tree.to(device)
    if cuda_graph:  # recorded while the cache is empty, as decoding does
        cache = KVCache.for_model(target, target.config.n_ctx)
        plain, verify = fixed_forward(target, cache), fixed_forward(target, cache, tree)
        target(torch.zeros(1, context, dtype=torch.long, device=device), cache=cache)
        x1 = torch.zeros(1, dtype=torch.long, device=device)
        xt = torch.zeros(len(tree) + 1, dtype=torch.long, device=device)
        reset = lambda: cache.truncate(context)
        calls = {"plain": (lambda: plain(x1, context), reset), "tree": (lambda: (propose(), verify(xt, context)), reset)}
    else:
        (plain, reset_plain), (verify, reset_tree) = forward_call(target, 1, 1, context), \
            forward_call(target, 1, len(tree) + 1, context, tree)
        calls = {"plain": (plain, reset_plain), "tree": (lambda: (propose(), verify()), reset_tree)}
    t = interleaved_medians(calls, device, rounds)
    return t["tree"] / t["plain"]
