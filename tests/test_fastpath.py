"""Fixed-shape forwards (the recorded step's forward, and sizing's timing of one) against the
ordinary forward: the same logits, the same cache; on a GPU the recorded graph against the eager
one. The whole recorded step is tests/test_step.py's."""
import pytest
import torch

from tinyspec.commands import generate
from tinyspec.kernels.fastpath import CUDAGraphForward, FixedForward, fixed_forward
from tinyspec.kvcache import KVCache
from tinyspec.model import prefix_mask

from conftest import random_gpt, random_tree
from test_medusa import TREES


@torch.no_grad()
@pytest.mark.parametrize("tree", [None, TREES["star"], random_tree(9, 4, seed=2)], ids=["plain", "star", "random"])
def test_fixed_forward_equals_the_ordinary_forward(tree):
    model = random_gpt(scale=3.0)
    ref_cache, fixed_cache = KVCache.for_model(model, 40), KVCache.for_model(model, 40)
    tree_mask = tree.tree_mask if tree else torch.ones(1, 1, dtype=torch.bool)
    depth = tree.depth if tree else torch.zeros(1, dtype=torch.long)
    forward = fixed_forward(model, fixed_cache, tree)
    fixed_cache.k.normal_(), fixed_cache.v.normal_()  # garbage beyond the valid slots must stay invisible
    prefix = torch.randint(0, 64, (1, 13), generator=torch.Generator().manual_seed(0))
    model(prefix, cache=ref_cache), model(prefix, cache=fixed_cache)
    x = torch.randint(0, 64, (len(depth),), generator=torch.Generator().manual_seed(1))
    want_logits, want_hidden = model(x.view(1, -1), positions=13 + depth, cache=ref_cache,
                                     attn_mask=prefix_mask(tree_mask, 13))
    logits, hidden = forward(x, 13)  # advances the cache, as the ordinary forward does
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden, want_hidden, atol=1e-5, rtol=1e-5)
    n = ref_cache.length
    assert fixed_cache.length == n
    torch.testing.assert_close(fixed_cache.k[:, :, :, :n], ref_cache.k[:, :, :, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fixed_cache.v[:, :, :, :n], ref_cache.v[:, :, :, :n], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="cache is full"):
        forward(x, 40 - len(depth) + 1)


def test_cuda_graph_flag_is_refused_without_a_gpu(capsys, tmp_path):
    path = tmp_path / "m.safetensors"
    random_gpt(vocab_size=8192).save(path)
    argv = ["--prompt", "x", "--model", str(path), "--cuda-graph", "--device", "cpu"]
    with pytest.raises(SystemExit) as e:
        generate.main(argv)
    assert e.value.code == 2 and "--cuda-graph needs a CUDA device" in capsys.readouterr().err


@pytest.mark.triton
def test_a_fixed_forward_with_the_kernel_is_the_fixed_forward_with_sdpa():
    """The tree-attention kernel finds L and the tree on the device from the slot mask (the root's
    row sees the prefix and itself), so a fixed-shape forward can use it: same logits as SDPA's."""
    tree_attention = pytest.importorskip("tinyspec.kernels.tree_attention")
    tree = random_tree(9, 4, seed=2)
    logits = []
    for attention in (None, tree_attention.TreeAttention()):
        model = random_gpt(scale=3.0)
        model.set_attention(attention or model.attention)
        cache = KVCache.for_model(model, 40)
        forward = fixed_forward(model, cache, tree)
        cache.k.normal_(), cache.v.normal_()  # garbage beyond the valid slots must stay invisible
        model(torch.arange(13)[None] % 64, cache=cache)
        logits.append(forward(torch.arange(len(tree) + 1) * 7 % 64, 13)[0])
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=1e-4)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@torch.no_grad()
def test_recorded_graph_replays_the_eager_step():
    model = random_gpt(scale=3.0).cuda()
    tree = random_tree(9, 4, seed=3).to("cuda")
    graph_cache, eager_cache = KVCache.for_model(model, 48), KVCache.for_model(model, 48)
    graph = CUDAGraphForward(model, graph_cache, tree.tree_mask, tree.depth)  # recorded while empty
    eager = FixedForward(model, eager_cache, tree.tree_mask, tree.depth)
    prefix = torch.randint(0, 64, (1, 11), device="cuda")
    model(prefix, cache=graph_cache), model(prefix, cache=eager_cache)
    for length in (11, 21):  # two replays with new inputs, at two lengths
        x = torch.randint(0, 64, (len(tree) + 1,), device="cuda")
        want, _ = eager(x, length)
        got, _ = graph(x, length)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert graph_cache.length == eager_cache.length == length + len(tree) + 1
        graph_cache.truncate(21), eager_cache.truncate(21)
