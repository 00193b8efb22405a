"""Medusa decoding against plain decoding: greedy token for token over many tree shapes, the
lossless sampler statistically, typical acceptance shown to drift, and the cache afterwards."""
import itertools
import json
import random

import pytest
import torch

from tinyspec import generate
from tinyspec.decoding import autoregressive, run
from tinyspec.kvcache import KVCache
from tinyspec.medusa import MedusaHeads, fingerprint, self_distill, train_heads
from tinyspec.sampling import Sampling
from tinyspec.tree import Tree, from_accuracies, from_choices, save_tree
from tinyspec.verify import medusa

from conftest import counting_sequences, random_gpt
from test_speculative import chi_square, critical_value


class CountingCorpus:
    def batch(self, b, n, generator):
        x = counting_sequences(b, n, 32, generator)
        return x, x


@pytest.fixture(scope="module")
def trained_heads(counting_gpt):
    seqs = self_distill(counting_gpt, CountingCorpus(), 128, 8, 24, 64, temperature=0.0, progress=False)
    heads = MedusaHeads(32, 3)
    train_heads(counting_gpt, heads, seqs, 8, steps=300, batch=16, lr=2e-2, progress=False)
    return heads.eval()


def random_heads(n_embd, k, seed, scale=0.5):
    torch.manual_seed(seed)
    heads = MedusaHeads(n_embd, k)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, scale)
    return heads.eval()


def random_tree(n, depth, seed):
    rng = random.Random(seed)
    parents, depths = [], []
    for i in range(n):
        options = [-1] + [j for j in range(i) if depths[j] < depth]
        parents.append(rng.choice(options))
        depths.append(1 if parents[-1] == -1 else depths[parents[-1]] + 1)
    return Tree(tuple(parents), tuple(rng.randrange(4) for _ in range(n)))


TREES = {
    "chain": Tree((-1, 0, 1), (0, 0, 0)),
    "star": Tree((-1, -1, -1, -1), (0, 1, 2, 3)),
    "default": from_accuracies(torch.tensor([[0.5, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.2, 0.1]]), 10),
    "random": random_tree(12, 3, seed=0),
}


def test_greedy_medusa_equals_plain_decoding_on_every_tree_shape(counting_gpt, trained_heads):
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    prompts = [counting_sequences(1, rng.randint(3, 10), 32, g)[0].tolist() for _ in range(3)]
    prompts += [[rng.randrange(32) for _ in range(rng.randint(1, 10))] for _ in range(3)]  # not counting
    accepted = rejected = 0
    for heads in (trained_heads, random_heads(32, 3, seed=1)):
        for name, tree in TREES.items():
            for prompt in prompts:
                plain = run(autoregressive(counting_gpt, prompt, Sampling(0.0), None, 64), 40).token_ids
                res = run(medusa(counting_gpt, heads, prompt, Sampling(0.0), None, 64, tree), 40)
                assert res.token_ids == plain, f"tree {name}, prompt {prompt}"
                accepted, rejected = accepted + res.accepted, rejected + res.rejections
    assert accepted > 100 and rejected > 10  # long accepted paths and corrections both happened


def test_trained_heads_make_greedy_medusa_take_fewer_target_passes(counting_gpt, trained_heads):
    prompt = counting_sequences(1, 6, 32, torch.Generator().manual_seed(3))[0].tolist()
    res = run(medusa(counting_gpt, trained_heads, prompt, Sampling(0.0), None, 64, TREES["default"]), 40)
    assert res.token_ids == run(autoregressive(counting_gpt, prompt, Sampling(0.0), None, 64), 40).token_ids
    assert len(res.token_ids) / res.target_steps > 1.8  # tau, tokens per target forward


@pytest.mark.parametrize("rule, temperature", [("greedy", 0.0), ("lossless", 1.0), ("typical", 0.7)])
def test_cache_after_medusa_steps_equals_plain_decoding(counting_gpt, trained_heads, rule, temperature):
    cache = KVCache.for_model(counting_gpt, 64)
    prompt = [3, 5, 7, 9]
    steps = medusa(counting_gpt, trained_heads, prompt, Sampling(temperature), torch.Generator().manual_seed(0), 64,
                   TREES["random"], rule, cache)
    seq = prompt + [t for step in itertools.islice(steps, 8) for t in step.tokens]
    n = cache.length
    assert n == len(seq) - 1  # everything but the newest token, which has not been fed yet
    expected = KVCache.for_model(counting_gpt, 64)
    with torch.no_grad():
        for t in seq[:n]:
            counting_gpt(torch.tensor([[t]]), cache=expected)
    torch.testing.assert_close(cache.k[:, :, :, :n], expected.k[:, :, :, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.v[:, :, :, :n], expected.v[:, :, :, :n], atol=1e-5, rtol=1e-5)


# ---- sampling: lossless is exact, typical is not ---------------------------------------------

V, PROMPT = 8, [0, 1]
SAMPLING = Sampling(1.0, top_k=4)  # 4 tokens per step: 64 three-token continuations
BRANCHING = Tree((-1, -1, -1, 0, 0, 1), (0, 1, 2, 0, 1, 0))


@torch.no_grad()
def exact_three_token_distribution(target):
    p = lambda seq: SAMPLING.probs(target(torch.tensor([PROMPT + seq]))[0][0, -1])
    table = torch.zeros(V, V, V)
    p1 = p([])
    for a in range(V):
        if p1[a] > 0:
            p2 = p([a])
            for b in range(V):
                if p2[b] > 0:
                    table[a, b] = p1[a] * p2[b] * p([a, b])
    return table.flatten()


def three_token_counts(target, heads, rule, n):
    counts, from_tree = torch.zeros(V ** 3), 0
    for seed in range(n):
        res = run(medusa(target, heads, PROMPT, SAMPLING, torch.Generator().manual_seed(seed), 16, BRANCHING, rule), 3)
        out = res.token_ids
        counts[(out[0] * V + out[1]) * V + out[2]] += 1
        from_tree += res.proposed > 0
    assert from_tree == n  # tokens 2 and 3 always came from a tree step, never a plain fallback
    return counts


@pytest.fixture(scope="module")
def tiny_vocab():
    target = random_gpt(vocab_size=V, n_ctx=16, n_layer=1, n_embd=16, scale=6.0, seed=1)
    return target, exact_three_token_distribution(target), random_heads(16, 2, seed=2, scale=1.0)


@pytest.mark.slow
def test_lossless_tree_sampling_has_the_target_distribution(tiny_vocab):
    target, exact, heads = tiny_vocab
    stat, dof = chi_square(three_token_counts(target, heads, "lossless", 6000), exact)
    assert stat < critical_value(dof), f"chi-square {stat:.1f} with {dof} dof"


@pytest.mark.slow
def test_typical_acceptance_drifts_from_the_target_distribution(tiny_vocab):
    target, exact, heads = tiny_vocab
    stat, dof = chi_square(three_token_counts(target, heads, "typical", 3000), exact)
    assert stat > 3 * critical_value(dof), f"chi-square {stat:.1f} with {dof} dof: typical acceptance looked exact"


# ---- command line ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("medusa")
    target = random_gpt(vocab_size=8192, n_ctx=64, scale=4.0)
    target.save(d / "target.safetensors")
    heads = random_heads(32, 3, seed=0)
    heads.accuracy = torch.tensor([[0.5, 0.2, 0.1], [0.3, 0.2, 0.1], [0.2, 0.1, 0.1]])
    heads.target_fingerprint = fingerprint(target)
    heads.save(d / "heads.safetensors")
    heads.target_fingerprint = fingerprint(random_gpt(vocab_size=8192, n_ctx=64, seed=5))
    heads.save(d / "other_heads.safetensors")
    save_tree(from_choices([(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]), d / "deep.json")
    save_tree(from_choices([(0,), (1,), (0, 0)]), d / "small.json")
    return d


def test_cli_medusa_equals_ar(files, capsys):
    base = ["--prompt", "def f(x):", "--max-new-tokens", "24", "--model", str(files / "target.safetensors"), "--json"]
    generate.main(base)
    ar = json.loads(capsys.readouterr().out)
    for tree in ("default", str(files / "small.json")):
        generate.main(base + ["--method", "medusa", "--heads", str(files / "heads.safetensors"), "--tree", tree])
        out = json.loads(capsys.readouterr().out)
        assert out["token_ids"] == ar["token_ids"] and "mean_accepted" in out["stats"]


@pytest.mark.parametrize("argv, message", [
    (["--heads", "{d}/none.safetensors"], "not found"),
    (["--heads", "{d}/other_heads.safetensors"], "different target"),
    (["--tree", "{d}/deep.json"], "only 3 heads"),
    (["--tree", "{d}/none.json"], "cannot read tree"),
    (["--tree-nodes", "0"], "tree-nodes")])
def test_cli_refuses_bad_medusa_settings(files, argv, message, capsys):
    argv = [a.format(d=files) for a in argv]
    with pytest.raises(SystemExit) as e:
        generate.main(["--prompt", "x", "--model", str(files / "target.safetensors"), "--method", "medusa",
                       "--heads", str(files / "heads.safetensors")] + argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_cli_triton_attention_gives_the_same_tokens(files, capsys):
    """The Triton tree-attention kernel (interpreted on a CPU) against the PyTorch reference path."""
    pytest.importorskip("triton")
    base = ["--prompt", "def f(x):", "--max-new-tokens", "12", "--model", str(files / "target.safetensors"), "--json",
            "--method", "medusa", "--heads", str(files / "heads.safetensors")]
    generate.main(base + ["--attn", "torch"])
    reference = json.loads(capsys.readouterr().out)
    generate.main(base + ["--attn", "triton"])
    kernel = json.loads(capsys.readouterr().out)
    assert kernel["token_ids"] == reference["token_ids"] and reference["stats"]["draft_tokens"] > 0
