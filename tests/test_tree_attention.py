"""The Triton tree-attention kernel against its PyTorch specification.

Without a GPU the kernels run in Triton's interpreter, which must be switched on before triton
is first imported (Triton reads TRITON_INTERPRET whenever `@triton.jit` runs, and its own
helpers are defined when triton is imported), hence the first lines. Shapes are kept tiny
because the interpreter runs every program in NumPy, and deliberately irregular: odd tree
sizes, no prefix, prefixes that are not a multiple of the block, views of a KV cache rather
than contiguous tensors.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.triton  # CI runs them after installing the triton extra: python -m pytest -m triton

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tinyspec.kernels import tree_attention as ta  # noqa: E402
from tinyspec.kvcache import KVCache  # noqa: E402

if not torch.cuda.is_available() and (not ta.INTERPRETED or ta._TRITON_IMPORTED_TOO_EARLY):
    pytest.skip("no GPU, and triton was imported before TRITON_INTERPRET=1 could be set (or it is set to 0): "
                "set it at the top of conftest.py or in the shell", allow_module_level=True)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4),  # only the summation order differs
       torch.float16: dict(atol=2e-3, rtol=2e-3),  # softmax weights are rounded to fp16 before p @ v
       torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """(T, T) bool: row i is True at i and at every ancestor of i. parents[i] < i, -1 = the root."""
    T = len(parents)
    mask = torch.eye(T, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]  # what the parent sees (it comes earlier), plus i itself
    return mask


def random_tree(T: int, gen: torch.Generator) -> torch.Tensor:
    parents = [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(T)]  # parents[i] in [-1, i - 1]
    return ancestor_mask(parents)


def tree_inputs(B, H, T, L, D, dtype, seed=0):
    """q (B, H, T, D) as the model makes it (a transposed view) and k, v as KVCache.update returns
    them: views of layer 1 of a cache with spare slots, so neither is contiguous."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype)

    cache = KVCache(n_layer=2, n_head=H, head_dim=D, max_len=L + T + 7, batch=B, device=DEVICE, dtype=dtype)
    if L:
        cache.update(1, randn(B, H, L, D), randn(B, H, L, D))
        cache.advance(L)
    k, v = cache.update(1, randn(B, H, T, D), randn(B, H, T, D))  # (B, H, L + T, D)
    q = randn(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    assert k.stride(1) == (L + T + 7) * D and q.stride(2) == H * D  # strided views, as in the model
    return q, k, v, random_tree(T, gen).to(DEVICE)


# --- the packed mask -------------------------------------------------------------------------

def test_pack_tree_mask_hand_drawn_tree():
    #   prefix ─┬─ 0 ─┬─ 1 ── 3
    #           │     └─ 2
    #           └─ 4
    mask = ancestor_mask([-1, 0, 0, 1, -1])
    expected = [[0b00001], [0b00011], [0b00101], [0b01011], [0b10000]]  # 1, 3, 5, 11, 16
    assert ta.pack_tree_mask(mask).tolist() == expected
    assert ta.pack_tree_mask(mask).dtype == torch.int32


def test_pack_tree_mask_second_word_and_sign_bit():
    mask = ancestor_mask([-1] + list(range(39)))  # a chain of 40: row i sees 0..i
    words = ta.pack_tree_mask(mask)
    assert words.shape == (40, 2)
    assert words[5].tolist() == [0b111111, 0]
    assert words[31].tolist() == [-1, 0], "bits 0..31 set is 0xFFFFFFFF, which as an int32 is -1"
    assert words[39].tolist() == [-1, 0xFF]


@pytest.mark.parametrize("bad", [torch.ones(3, 4, dtype=torch.bool), torch.ones(3, dtype=torch.bool),
                                 torch.ones(3, 3, dtype=torch.int32), torch.zeros(3, 3, dtype=torch.bool),
                                 torch.ones(0, 0, dtype=torch.bool)],
                         ids=["not-square", "1-D", "not-bool", "no-diagonal", "empty"])
def test_pack_tree_mask_rejects_bad_masks(bad):
    with pytest.raises(ValueError):
        ta.pack_tree_mask(bad)


# --- the kernel against the reference --------------------------------------------------------

CASES = [  # B, H, T, L, D, dtype, num_splits
    (1, 1, 1, 0, 16, torch.float32, None),  # one token, no prefix: only the tree tile
    (1, 2, 5, 1, 16, torch.float32, 1),  # a one-key prefix
    (2, 2, 13, 45, 64, torch.float32, 1),  # a prefix shorter than one block
    (1, 3, 13, 45, 64, torch.float32, 4),  # more splits asked than there are blocks
    (2, 1, 37, 130, 16, torch.float32, 1),  # one split walks 3 blocks, the last one partial
    (2, 1, 37, 130, 16, torch.float32, 2),  # 128 + 2 keys
    (1, 2, 37, 130, 64, torch.float32, 3),  # 64 + 64 + 2 keys
    (1, 1, 100, 70, 32, torch.float32, 2),  # 4 mask words; T pads to 128
    (1, 2, 5, 20, 128, torch.float32, None),
    (2, 2, 13, 0, 64, torch.float16, None),
    (1, 2, 37, 130, 64, torch.float16, 2),
    (2, 1, 5, 45, 16, torch.float16, 1),
]


@pytest.mark.parametrize("B, H, T, L, D, dtype, num_splits", CASES,
                         ids=[f"B{c[0]}H{c[1]}-T{c[2]}-L{c[3]}-D{c[4]}-{str(c[5])[6:]}-S{c[6]}" for c in CASES])
def test_matches_reference(B, H, T, L, D, dtype, num_splits):
    q, k, v, mask = tree_inputs(B, H, T, L, D, dtype, seed=T * 1000 + L)
    out = ta.tree_attention(q, k, v, ta.pack_tree_mask(mask), num_splits=num_splits)
    expected = ta.tree_attention_reference(q, k, v, mask)
    assert out.shape == (B, H, T, D) and out.dtype == dtype
    torch.testing.assert_close(out, expected, **TOL[dtype])


@pytest.mark.parametrize("layout", ["token-major", "every-other-dim"])
def test_any_strides(layout):
    """Cache views only skip whole heads; the kernel takes any strides, so try others too."""
    q, k, v, mask = tree_inputs(2, 2, 13, 45, 16, torch.float32)
    if layout == "token-major":  # (B, L + T, H, D) transposed: token stride H * D
        k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    else:  # the last dimension strided too
        k, v = (torch.stack([t, -t], dim=-1).flatten(-2)[..., ::2] for t in (k, v))
    assert k.stride(2) != k.shape[3] or k.stride(3) != 1
    out = ta.tree_attention(q, k, v, ta.pack_tree_mask(mask), num_splits=2)
    torch.testing.assert_close(out, ta.tree_attention_reference(q, k, v, mask), **TOL[torch.float32])


def test_custom_scale():
    q, k, v, mask = tree_inputs(1, 2, 13, 45, 16, torch.float32)
    out = ta.tree_attention(q, k, v, ta.pack_tree_mask(mask), scale=0.7, num_splits=2)
    torch.testing.assert_close(out, ta.tree_attention_reference(q, k, v, mask, scale=0.7), **TOL[torch.float32])


def test_output_ignores_tokens_outside_the_path():
    """Independent of the reference: changing the value of a tree token that is not an ancestor
    of i must leave i's output alone, and changing an ancestor's must not."""
    q, k, v, mask = tree_inputs(1, 1, 6, 10, 16, torch.float32)
    mask = ancestor_mask([-1, 0, 0, 1, -1, 4]).to(DEVICE)  # node 2 is on no path but its own
    packed = ta.pack_tree_mask(mask)
    before = ta.tree_attention(q, k, v, packed)
    v[:, :, 10 + 2] += 100.0  # the value of tree node 2
    after = ta.tree_attention(q, k, v, packed)
    changed = (after - before).abs().amax(dim=-1)[0, 0] > 1e-3  # (T,)
    assert changed.tolist() == [False, False, True, False, False, False]


def test_reference_agrees_with_sdpa():
    """The specification itself, against PyTorch's attention with the dense mask the model builds."""
    q, k, v, mask = tree_inputs(2, 2, 13, 45, 16, torch.float32)
    dense = torch.cat([torch.ones(13, 45, dtype=torch.bool, device=DEVICE), mask], dim=1)  # (T, L + T)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    torch.testing.assert_close(ta.tree_attention_reference(q, k, v, mask), sdpa, **TOL[torch.float32])


# --- bad inputs --------------------------------------------------------------------------------

def _bad_inputs():
    q, k, v, mask = tree_inputs(1, 2, 5, 3, 16, torch.float32)
    packed = ta.pack_tree_mask(mask)
    long_q = torch.zeros(1, 1, 129, 16, device=DEVICE)
    return {
        "q-3d": (q[0], k, v, packed, {}),
        "k-v-shapes-differ": (q, k, v[:, :, :-1], packed, {}),
        "wrong-heads": (q, k[:, :1], v[:, :1], packed, {}),
        "kv-shorter-than-tree": (q, k[:, :, :4], v[:, :, :4], packed, {}),
        "head-dim-24": (q[..., :8].repeat(1, 1, 1, 3), k[..., :8].repeat(1, 1, 1, 3),
                        v[..., :8].repeat(1, 1, 1, 3), packed, {}),
        "tree-too-big": (long_q, long_q, long_q, torch.zeros(129, 5, dtype=torch.int32, device=DEVICE), {}),
        "dtypes-differ": (q, k.half(), v, packed, {}),
        "float64": (q.double(), k.double(), v.double(), packed, {}),
        "mask-int64": (q, k, v, packed.long(), {}),
        "mask-wrong-shape": (q, k, v, torch.zeros(5, 2, dtype=torch.int32, device=DEVICE), {}),
        "dense-bool-mask": (q, k, v, mask, {}),
        "zero-splits": (q, k, v, packed, {"num_splits": 0}),
        "fractional-splits": (q, k, v, packed, {"num_splits": 1.5}),
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_bad_inputs_raise_value_error(case):
    q, k, v, packed, kwargs = _bad_inputs()[case]
    with pytest.raises(ValueError):
        ta.tree_attention(q, k, v, packed, **kwargs)


@pytest.mark.skipif(not ta.INTERPRETED, reason="only the interpreter lacks bfloat16")
def test_bfloat16_in_the_interpreter_is_refused():
    q, k, v, mask = tree_inputs(1, 1, 5, 3, 16, torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16"):
        ta.tree_attention(q, k, v, ta.pack_tree_mask(mask))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_interpreter_flag_set_too_late_gives_clear_errors():
    """In a fresh process, import triton and the kernels without the flag: they are GPU kernels,
    and CPU inputs get a ValueError. Setting the flag then is too late for triton's own helpers,
    and the launcher says so instead of failing deep inside the interpreter."""
    script = textwrap.dedent("""
        import importlib, os
        import torch
        import tinyspec.kernels.tree_attention as ta
        q = torch.randn(1, 1, 2, 16)
        packed = ta.pack_tree_mask(torch.eye(2, dtype=torch.bool))
        assert not ta.INTERPRETED
        try:
            ta.tree_attention(q, q, q, packed)
        except ValueError as e:
            assert "TRITON_INTERPRET" in str(e), e
        else:
            raise AssertionError("GPU kernels accepted CPU tensors")
        os.environ["TRITON_INTERPRET"] = "1"
        ta = importlib.reload(ta)
        assert ta.INTERPRETED
        try:
            ta.tree_attention(q, q, q, packed)
        except RuntimeError as e:
            assert "before the first import of triton" in str(e), e
        else:
            raise AssertionError("the interpreter ran with triton's helpers compiled for a GPU")
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[1], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]


# --- on a GPU only -----------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bfloat16 and long prefixes need a GPU")
@pytest.mark.parametrize("T, L, D, num_splits", [(5, 45, 64, None), (37, 1000, 64, 3), (64, 4096, 64, None),
                                                 (128, 2050, 128, None), (13, 300, 32, 1)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_on_gpu(T, L, D, num_splits, dtype):
    q, k, v, mask = tree_inputs(1, 4, T, L, D, dtype, seed=T + L)
    out = ta.tree_attention(q, k, v, ta.pack_tree_mask(mask), num_splits=num_splits)
    torch.testing.assert_close(out, ta.tree_attention_reference(q, k, v, mask), **TOL[dtype])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_model_with_the_kernel_writes_the_same_tokens_on_gpu():
    """End to end in float32: Medusa verifying with the Triton kernel against SDPA, on the GPU."""
    from conftest import random_gpt, random_heads
    from tinyspec.methods import Decoder
    from tinyspec.methods.medusa import Medusa
    from tinyspec.results import run
    from tinyspec.sampling import Sampling
    from tinyspec.tree import from_accuracies

    model, heads = random_gpt(scale=3.0).cuda(), random_heads(32, 3, seed=1).cuda()
    tree = from_accuracies(torch.tensor([[0.5, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.2, 0.1]]), 12)
    decoder = Decoder(model, Medusa(model, heads, tree=tree))
    tokens = lambda: run(decoder.steps([3, 1, 4, 1, 5], Sampling(0.0), None, 40)).token_ids
    reference = tokens()
    model.set_attention(ta.TreeAttention())
    assert tokens() == reference


def test_the_launchers_arithmetic_is_ceil_division_and_the_next_power_of_two():
    """Plain-Python stand-ins for Triton's helpers (which cost microseconds when called from Python)."""
    for n in range(1, 300):
        assert ta.next_power_of_2(n) == 2 ** math.ceil(math.log2(n))
        for d in (1, 2, 16, 32, 64, 256):
            assert ta.cdiv(n, d) == math.ceil(n / d)
