"""The acceptance rules of verify.py: each lossless rule reproduces the target's distribution
(statistically, on a model small enough to enumerate), typical acceptance is shown to drift."""
import pytest
import torch

from tinyspec.decoding import run
from tinyspec.medusa import medusa
from tinyspec.sampling import Sampling
from tinyspec.tree import Tree

from conftest import random_gpt, random_heads
from test_speculative import chi_square, critical_value


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


