"""The acceptance rules of verify.py: each lossless rule reproduces the target's distribution
(statistically, on a model small enough to enumerate), typical acceptance is shown to drift, and
planted bugs (the rule's own source with one line changed) are caught."""
import inspect
import textwrap

import pytest
import torch

from tinyspec import verify
from tinyspec.decoding import run
from tinyspec.medusa import medusa
from tinyspec.sampling import Sampling, sample
from tinyspec.speculative import accept_or_resample
from tinyspec.tree import Tree
from tinyspec.verify import chain_rule

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
        res = run(medusa(target, heads, [PROMPT], SAMPLING, [torch.Generator().manual_seed(seed)], 16, BRANCHING, rule), 3)
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




@pytest.mark.slow
def test_pointmass_rule_makes_the_top_k_tree_lossless(tiny_vocab):
    """Medusa's default, deterministic tree (each node its head's ranks[i]-th guess) sampled exactly."""
    target, exact, heads = tiny_vocab
    stat, dof = chi_square(three_token_counts(target, heads, "pointmass", 6000), exact)
    assert stat < critical_value(dof), f"chi-square {stat:.1f} with {dof} dof"


@pytest.mark.slow
def test_pointmass_without_removing_rejected_siblings_is_caught(tiny_vocab, monkeypatch):
    """A planted bug: after a rejection the next sibling is judged against p itself, not p
    without the rejected candidate. The test above must see the difference."""
    target, exact, heads = tiny_vocab
    monkeypatch.setattr(verify, "_walk", mutant(verify, "_walk", "p_node = residual(p_node, q)", "pass"))
    stat, dof = chi_square(three_token_counts(target, heads, "pointmass", 3000), exact)
    assert stat > 3 * critical_value(dof), f"chi-square {stat:.1f} with {dof} dof: the bug went unnoticed"


# ---- rules on a chain: the draft model's proposals -------------------------------------------

def chain_outputs(accept, p1, p2, p3, q1, q2, n, seed=0):
    """Counts of the first two tokens emitted when a 2-token chain x1 ~ q1, x2 ~ q2[x1] is judged by
    `accept` against the target p1, p2[x1], p3[x1, x2]; after a rejection at x1 the second token
    comes from the target itself, as the next step would draw it. Also the mean accepted count."""
    g = torch.Generator().manual_seed(seed)
    W = len(p1)
    counts, accepted = torch.zeros(W * W), 0
    for _ in range(n):
        x1 = sample(q1, g)
        x2 = sample(q2[x1], g)
        drafts = torch.stack([x1, x2])
        k, token = accept(torch.stack([p1, p2[x1], p3[x1, x2]]), torch.stack([q1, q2[x1]]), drafts, g)
        out = (drafts[:k].tolist() + [int(token)] + [int(sample(p2[token], g))])[:2]
        counts[out[0] * W + out[1]] += 1
        accepted += k
    return counts, accepted / n


def context_dependent_tables(W=3, temperature=1.5, seed=46):
    """p1, p2[a], p3[a, b] for the target and q1, q2[a] for the draft: random, and far apart.
    The defaults were chosen (by enumerating the rule's outcomes exactly) so that plausible
    mistakes in block verification move the two-token distribution by 0.1 to 0.25 in total
    variation: a test on them can see such a mistake, not only a gross one."""
    g = torch.Generator().manual_seed(seed)
    soft = lambda *shape: torch.softmax(temperature * torch.randn(*shape, W, generator=g), -1)
    return soft(), soft(W), soft(W, W), soft(), soft(W)


def mutant(module, name: str, old: str, new: str):
    """`module.name` rebuilt from its source with `old` replaced by `new`: a planted bug."""
    src = textwrap.dedent(inspect.getsource(getattr(module, name)))
    assert old in src, f"{name} no longer contains {old!r}: update the planted bug"
    namespace = dict(vars(module))
    exec(compile(src.replace(old, new), f"<mutant of {name}>", "exec"), namespace)
    return namespace[name]


@pytest.mark.parametrize("rule", ["block", "pointmass", "lossless"])
def test_chain_rules_reproduce_the_target_two_token_distribution(rule):
    p1, p2, p3, q1, q2 = context_dependent_tables()
    counts, _ = chain_outputs(chain_rule(rule), p1, p2, p3, q1, q2, 6000)
    stat, dof = chi_square(counts, (p1[:, None] * p2).flatten())
    assert stat < critical_value(dof), f"{rule}: chi-square {stat:.1f} with {dof} dof"


@pytest.mark.slow
@pytest.mark.parametrize("old, new", [
    ("hits[-1]", "hits[0]"),  # tau from the first success, not the last
    ("S / denominator.clamp(min=1e-30)", "S.clamp(max=1.0)"),  # h_i without its denominator
    ("residual(p_tau * p[tau], q[tau + 1])", "p[tau]"),  # the correction drawn from p, not the residual
    ("w = min(1.0, w * r)", "w = min(1.0, r)"),  # p_i without the running product
], ids=["first-success", "no-denominator", "correction-from-p", "no-product"])
def test_planted_bugs_in_block_verification_are_caught(old, new, monkeypatch):
    monkeypatch.setitem(verify.RULES, "block", mutant(verify, "block", old, new))
    p1, p2, p3, q1, q2 = context_dependent_tables()
    counts, _ = chain_outputs(chain_rule("block"), p1, p2, p3, q1, q2, 6000)
    stat, dof = chi_square(counts, (p1[:, None] * p2).flatten())
    assert stat > 3 * critical_value(dof), f"chi-square {stat:.1f} with {dof} dof: the bug went unnoticed"


@pytest.mark.slow
def test_block_verification_accepts_more_on_the_papers_example():
    """Sun et al. 2025, section 1: two tokens {a, b}, target (1/3, 2/3), draft (2/3, 1/3), blocks
    of 2, no dependence on context. Token by token accepts 2/3 + (2/3)^2 = 10/9 tokens per step
    on average; block verification 11/9 (the paper's figures, not ours)."""
    p, q = torch.tensor([1 / 3, 2 / 3]), torch.tensor([2 / 3, 1 / 3])
    tables = (p, p.expand(2, 2), p.expand(2, 2, 2), q, q.expand(2, 2))
    _, token_level = chain_outputs(accept_or_resample, *tables, 8000)
    _, block = chain_outputs(chain_rule("block"), *tables, 8000)
    assert token_level == pytest.approx(10 / 9, abs=0.03) and block == pytest.approx(11 / 9, abs=0.03)


def test_block_refuses_a_branching_tree():
    p = torch.full((4, 3), 1 / 3)
    with pytest.raises(ValueError, match="chain"):
        verify.block(torch.tensor([0, 1, 2, 0]), p, Tree((-1, -1, 0)), p, None)
