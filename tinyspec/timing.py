"""Honest timing: warm up first, synchronise the GPU around each call, report the median."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def median_seconds(fn: Callable[[], object], device: torch.device, repeats: int = 20, warmup: int = 3,
                   setup: Callable[[], object] | None = None) -> float:
    """Median wall time of `fn()` over `repeats` calls after `warmup` untimed ones. `setup()`
    runs untimed before every call (e.g. to reset a cache); on CUDA the queue is drained
    before and after each timed call, so the time is the GPU's work, not the launch."""
    times = []
    for i in range(warmup + repeats):
        if setup is not None:
            setup()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second (read + write) of a large copy within `device`'s memory: the practical
    peak that a memory-bound step can be held against (a data sheet's figure is never reached)."""
    x = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    return 2 * x.numel() / median_seconds(lambda: y.copy_(x), device, repeats)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters (a tied matrix counted once): what one forward must read."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
