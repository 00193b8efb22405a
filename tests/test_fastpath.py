"""Fixed-shape forwards (the CUDA-graph fast path) against the ordinary forward: the same logits,
the same cache, the same tokens; on a GPU the recorded graph against the eager one."""
import random

import pytest
import torch

from tinyspec.commands import generate
from tinyspec.results import run
from tinyspec.kernels.fastpath import CUDAGraphForward, FixedForward, fixed_forward
from tinyspec.kvcache import KVCache
from tinyspec.methods import Decoder
from tinyspec.methods.medusa import Medusa
from tinyspec.model import prefix_mask
from tinyspec.sampling import Sampling

from conftest import random_gpt, random_heads, random_tree
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


class Counted:
    """A recorded forward that counts the steps it ran."""
    def __init__(self, forward):
        self.forward, self.n, self.calls = forward, forward.n, 0

    def __call__(self, tokens, length):
        self.calls += 1
        return self.forward(tokens, length)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_fixed_decoding_writes_the_same_tokens(temperature):
    """Same seed, same tokens: plain decoding and Medusa with fixed-shape forwards against the
    ordinary loops, over prompts of different lengths that reuse one cache and its forward
    (longest first, so stale entries sit beyond the shorter prompts)."""
    model, heads, tree = random_gpt(scale=3.0), random_heads(32, 3, seed=1), TREES["default"]
    rng = random.Random(0)
    prompts = [[rng.randrange(64) for _ in range(n)] for n in (20, 3, 9)]
    sampling = Sampling(temperature)
    recorded = []
    record = lambda *a: recorded.append(Counted(fixed_forward(*a))) or recorded[-1]
    for proposer in (None, Medusa(model, heads, tree=tree)):
        fixed, ordinary = Decoder(model, proposer, record=record), Decoder(model, proposer)
        for prompt in prompts:
            tokens = [run(d.steps(prompt, sampling, torch.Generator().manual_seed(5)), 30).token_ids for d in (fixed, ordinary)]
            assert tokens[0] == tokens[1], f"{fixed.proposer.name}, prompt of {len(prompt)}"
        assert recorded[-1].calls > 30  # the recorded forward ran the steps


def test_cuda_graph_flag_is_refused_without_a_gpu(capsys, tmp_path):
    path = tmp_path / "m.safetensors"
    random_gpt(vocab_size=8192).save(path)
    argv = ["--prompt", "x", "--model", str(path), "--cuda-graph", "--device", "cpu"]
    with pytest.raises(SystemExit) as e:
        generate.main(argv)
    assert e.value.code == 2 and "--cuda-graph needs a CUDA device" in capsys.readouterr().err


@pytest.mark.triton
def test_fixed_forwards_refuse_the_triton_kernel():
    tree_attention = pytest.importorskip("tinyspec.kernels.tree_attention")
    model = random_gpt().set_attention(tree_attention.TreeAttention())
    with pytest.raises(ValueError, match="SDPA"):
        FixedForward(model, KVCache.for_model(model))


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


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("method", ["ar", "medusa"])
def test_decoding_with_recorded_graphs_writes_the_eager_tokens(method):
    """float32 on the GPU: a Decoder with cuda_graph against one without, prompt after prompt."""
    model, heads, tree = random_gpt(scale=3.0).cuda(), random_heads(32, 3, seed=1).cuda(), TREES["default"]
    proposer = Medusa(model, heads, tree=tree) if method == "medusa" else None
    graph, eager = Decoder(model, proposer, record=fixed_forward), Decoder(model, proposer)
    for prompt in ([5, 9, 2, 33, 7, 1], [4], list(range(20))):
        tokens = [run(d.steps(prompt, Sampling(0.0), None), 30).token_ids for d in (graph, eager)]
        assert tokens[0] == tokens[1], f"{method}, prompt of {len(prompt)}"
