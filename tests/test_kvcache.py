"""The cache against recomputation: decoding with it must give what a full forward gives."""
import pytest
import torch

from tinyspec.kvcache import KVCache
from tinyspec.model import prefix_mask

from conftest import random_gpt

TOL = dict(atol=1e-5, rtol=1e-5)  # float32: only summation order differs


def test_token_by_token_equals_full_forward():
    model = random_gpt(scale=3.0)
    x = torch.randint(0, 64, (2, 40))
    with torch.no_grad():
        full, _ = model(x)
        cache = KVCache.for_model(model, 64, batch=2)
        steps = [model(x[:, t:t + 1], cache=cache)[0] for t in range(40)]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)
    assert cache.length == 40


def test_chunked_prefill_equals_full_forward():
    model = random_gpt(scale=3.0)
    x = torch.randint(0, 64, (1, 30))
    with torch.no_grad():
        full, _ = model(x)
        cache = KVCache.for_model(model, 64)
        parts = [model(x[:, s:e], cache=cache)[0] for s, e in [(0, 13), (13, 14), (14, 30)]]
    torch.testing.assert_close(torch.cat(parts, 1), full, **TOL)


def cache_of(model, tokens):
    cache = KVCache.for_model(model, 64)
    with torch.no_grad():
        model(torch.tensor([tokens]), cache=cache)
    return cache


def assert_same_cache(a, b):
    n = a.length
    assert n == b.length, f"cache lengths differ: {a.length} vs {b.length}"
    torch.testing.assert_close(a.k[:, :, :, :n], b.k[:, :, :, :n], **TOL)
    torch.testing.assert_close(a.v[:, :, :, :n], b.v[:, :, :, :n], **TOL)


def test_truncate_then_redecode_equals_fresh_cache():
    model = random_gpt(scale=3.0)
    cache = cache_of(model, list(range(20)))
    with torch.no_grad():
        model(torch.tensor([[40, 41, 42, 43]]), cache=cache)  # 4 speculative tokens...
        cache.truncate(21)  # ...of which only the first was accepted
        model(torch.tensor([[50, 51]]), cache=cache)
    assert_same_cache(cache, cache_of(model, list(range(20)) + [40, 50, 51]))


def test_keep_compacts_an_accepted_tree_path():
    model = random_gpt(scale=3.0)
    prefix = list(range(10))
    cache = cache_of(model, prefix)
    # tree below the prefix: node 0 = 30 (depth 1), node 1 = 31 (child of 0), node 2 = 32 (sibling of 0),
    # node 3 = 33 (child of 1); accepted path: nodes 0, 1, 3 -> slots 10, 11, 13
    parents_mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    with torch.no_grad():
        model(torch.tensor([[30, 31, 32, 33]]), positions=torch.tensor([10, 11, 10, 12]), cache=cache,
              attn_mask=prefix_mask(parents_mask, 10))
    cache.keep([10, 11, 13])
    assert_same_cache(cache, cache_of(model, prefix + [30, 31, 33]))


def test_keep_rejects_unsorted_or_stale_slots():
    cache = KVCache(1, 1, 2, 16)
    cache.advance(5)
    with pytest.raises(ValueError):
        cache.keep([3, 2])
    with pytest.raises(ValueError):
        cache.keep([5])
    with pytest.raises(ValueError):
        cache.truncate(6)


def test_full_cache_is_an_error_not_a_silent_overwrite():
    model = random_gpt()
    cache = KVCache.for_model(model, 8)
    with torch.no_grad(), pytest.raises(ValueError, match="full"):
        model(torch.zeros(1, 9, dtype=torch.long), cache=cache)
