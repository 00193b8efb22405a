"""The acceptance rules of verify.py: each lossless rule reproduces the target's distribution
(statistically, on a model small enough to enumerate), typical acceptance is shown to drift, and
planted bugs (the rule's own source with one line changed) are caught."""
import __future__
import inspect
import itertools
import textwrap

import pytest
import torch

from tinyspec import verify
from tinyspec.methods import Decoder
from tinyspec.methods.draft import accept_or_resample
from tinyspec.methods.medusa import Medusa
from tinyspec.sampling import Sampling, sample
from tinyspec.tree import Tree, chain

from conftest import random_gpt, random_heads, sampled_rows, token_counts
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
    d = Decoder(target, Medusa(target, heads, tree=BRANCHING), rule=rule)
    [runs] = sampled_rows(d, [PROMPT], SAMPLING, n)
    assert all(res.proposed > 0 for res in runs)  # tokens 2 and 3 always came from a tree step, never a plain fallback
    return token_counts(runs, V)


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
def test_traversal_verification_of_a_sampled_tree_has_the_target_distribution(tiny_vocab):
    target, exact, heads = tiny_vocab
    stat, dof = chi_square(three_token_counts(target, heads, "traversal", 6000), exact)
    assert stat < critical_value(dof), f"chi-square {stat:.1f} with {dof} dof"


@pytest.mark.slow
@pytest.mark.parametrize("old, new", [
    ("weight * float(P[x])", "float(P[x])"),  # a node's weight from its own ratio, not its path's
    ("P = R / S if S > 0 else P", "P = P"),  # a rejected subtree leaves its parent's P as it was
    ("weight = S / (S + 1.0 - weight) if", "weight = weight if"),  # the parent's weight not lowered by the rejection
    ("return [node], sample(P, generator)", "return [node], sample(p[node], generator)"),  # next token from p
], ids=["no-product", "no-residual", "weight-kept", "next-from-p"])
def test_planted_bugs_in_traversal_verification_are_caught(tiny_vocab, old, new, monkeypatch):
    """Each bug is caught on the sampled tree (siblings at two depths); the chain of the draft
    model sees only the ones a chain can show."""
    target, exact, heads = tiny_vocab
    monkeypatch.setitem(verify.RULES, "traversal", mutant(verify, "traversal", old, new))
    stat, dof = chi_square(three_token_counts(target, heads, "traversal", 3000), exact)
    assert stat > 3 * critical_value(dof), f"chi-square {stat:.1f} with {dof} dof: the bug went unnoticed"


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
    comes from the target itself, as the next step would draw it. Also the mean accepted count.
    The n runs' chains, and a next step's token after each possible first one, are drawn at once
    up front; the rule then judges run after run, drawing its own coins."""
    g = torch.Generator().manual_seed(seed)
    W = len(p1)
    x1s = sample(q1.expand(n, W), g)  # (n,)
    x2s = sample(q2[x1s], g)  # (n,): each after its own x1
    nexts = sample(p2[:, None].expand(W, n, W), g)  # (W, n): run i's next token after a first token t is nexts[t, i]
    counts, accepted = torch.zeros(W * W), 0
    for i in range(n):
        x1, x2 = x1s[i], x2s[i]
        drafts = torch.stack([x1, x2])
        k, token = accept(torch.stack([p1, p2[x1], p3[x1, x2]]), torch.stack([q1, q2[x1]]), drafts, g)
        out = (drafts[:k].tolist() + [int(token)] + [int(nexts[token, i])])[:2]
        counts[out[0] * W + out[1]] += 1
        accepted += k
    return counts, accepted / n


def context_dependent_tables(W=3, temperature=1.5, seed=46):
    """p1, p2[a], p3[a, b] for the target and q1, q2[a] for the draft: random, and far apart.
    The defaults were chosen (by enumerating the rule's outcomes exactly) so that the planted
    mistakes in block verification below move the two-token distribution by 0.1 to 0.25 in total
    variation: a test on them can see such a mistake, not only a gross one. Slips inside block's
    correction move it far less here (0.002 without the weight p_tau): test_block_correction.py
    holds those on tables of its own."""
    g = torch.Generator().manual_seed(seed)
    soft = lambda *shape: torch.softmax(temperature * torch.randn(*shape, W, generator=g), -1)
    return soft(), soft(W), soft(W, W), soft(), soft(W)


def mutant(module, name: str, old: str, new: str, owner=None):
    """`module.name` (or the method `owner.name` of a class of `module`) rebuilt from its source
    with `old` replaced by `new`: a planted bug."""
    src = textwrap.dedent(inspect.getsource(getattr(owner or module, name)))
    assert old in src, f"{name} no longer contains {old!r}: update the planted bug"
    namespace = dict(vars(module))
    exec(compile(src.replace(old, new), f"<mutant of {name}>", "exec", __future__.annotations.compiler_flag), namespace)
    return namespace[name]


def chain_rule(name: str):
    """Rule `name` of `verify.RULES` (looked up when called, so a planted bug is seen) with the
    signature of `accept_or_resample`, for chains: (p (k+1, V), q (k, V), drafts (k,), generator)
    -> (n accepted, next token)."""
    def accept(p, q, drafts, generator):
        k = len(drafts)
        tokens = torch.cat([drafts.new_zeros(1), drafts])  # the root's token is never read
        path, token = verify.RULES[name](tokens, p, chain(k), torch.cat([q[:1], q]), generator)
        return len(path) - 1, token
    return accept


@pytest.mark.parametrize("rule", ["block", "pointmass", "lossless", "traversal"])
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
    on average; block verification 11/9 (the paper's figures, not ours). Statistical, but as safe
    as the chi-square tests (`MEAN_WITHIN`)."""
    p, q = torch.tensor([1 / 3, 2 / 3]), torch.tensor([2 / 3, 1 / 3])
    tables = (p, p.expand(2, 2), p.expand(2, 2, 2), q, q.expand(2, 2))
    _, token_level = chain_outputs(accept_or_resample, *tables, 8000)
    _, block = chain_outputs(chain_rule("block"), *tables, 8000)
    assert token_level == pytest.approx(10 / 9, abs=MEAN_WITHIN) and block == pytest.approx(11 / 9, abs=MEAN_WITHIN)


# A step accepts 0, 1 or 2 tokens here, so the variance of its count is at most m (2 - m) <= 1, and
# the mean of 8,000 steps has a standard deviation of at most 0.0112: within 0.05 of the truth but
# for 4.47 standard deviations, which a correct rule misses fewer than once in 100,000 runs per mean
# (as the chi-square tests, at p ~ 1e-5), whatever order it draws its coins in. 10/9 and 11/9 are
# 0.11 apart, so a rule that accepts like the other fails.
MEAN_WITHIN = 0.05


def traversal_visit(node, w, P, tree):
    """The traversal walk of `verify.traversal`'s docstring, every coin weighed by its probability:
    [(probability, accepted tokens below node, next-token distribution)], and P(all rejected)."""
    kids, tok, p, q = tree
    out, carry = [], 1.0
    for c in kids[node]:
        found, rejected = traversal_visit(c, min(1.0, w * P[tok[c]] / q[c][tok[c]]), p[c], tree)
        out += [(pr * carry, [tok[c]] + path, nd) for pr, path, nd in found]
        carry *= rejected
        R = (w * P - q[c]).clamp(min=0)
        S = float(R.sum())
        w, P = (S / (S + 1 - w) if S + 1 - w > 0 else 1.0), (R / S if S > 0 else P)
    return out + [(carry * w, [], P)], carry * (1 - w)


def top_down_visit(node, w, P, tree):
    """SpecInfer's walk (`verify.lossless`), likewise: a child is accepted with min(1, P(x) / q(x))."""
    kids, tok, p, q = tree
    out, carry = [], 1.0
    for c in kids[node]:
        accept = min(1.0, float(P[tok[c]] / q[c][tok[c]]))
        found, _ = top_down_visit(c, 1.0, p[c], tree)
        out += [(pr * carry * accept, [tok[c]] + path, nd) for pr, path, nd in found]
        carry *= 1 - accept
        R = (P - q[c]).clamp(min=0)
        P = R / R.sum() if R.sum() > 0 else P
    return out + [(carry, [], P)], 0.0


def walk_enumerated(visit, shape, seed, W=3):
    """A walk enumerated exactly on depth-2 trees: the root's two children a, b ~ q1 (i.i.d.), and
    two children y ~ q2[x] below each child x that shape(a, b, q1) expands. Every draw and every
    coin weighed by its probability, independently of the code under test. Returns (the total
    variation of the first two output tokens from the target's p1 x p2, expected accepted tokens)."""
    p1, p2, p3, q1, q2 = (t.double() / t.double().sum(-1, keepdim=True) for t in context_dependent_tables(W=W, seed=seed))
    dist, accepted = torch.zeros(W, W, dtype=torch.float64), 0.0
    for a, b in itertools.product(range(W), repeat=2):
        expanded = [e for e in shape(a, b, q1) for _ in range(2)]
        for ys in itertools.product(range(W), repeat=len(expanded)):
            kids, tok, p, q = {0: [1, 2], 1: [], 2: []}, {1: a, 2: b}, {0: p1, 1: p2[a], 2: p2[b]}, {1: q1, 2: q1}
            weight = float(q1[a] * q1[b])
            for n, (parent, y) in enumerate(zip(expanded, ys), start=3):
                kids[parent].append(n)
                kids[n], tok[n], p[n], q[n] = [], y, p3[tok[parent], y], q2[tok[parent]]
                weight *= float(q2[tok[parent]][y])
            found, rejected = visit(0, 1.0, p1, (kids, tok, p, q))
            assert rejected < 1e-12  # the root is always accepted in the end
            for pr, path, nd in found:
                accepted += weight * pr * len(path)
                if len(path) >= 2:
                    dist[path[0], path[1]] += weight * pr
                elif path:
                    dist[path[0]] += weight * pr * nd
                else:
                    dist += weight * pr * nd[:, None] * p2
    return float((dist - p1[:, None] * p2).abs().sum() / 2), accepted


@pytest.mark.parametrize("shape", [lambda a, b, q: [1, 2], lambda a, b, q: [1] if a == b else [1, 2],
                                   lambda a, b, q: [1] if q[a] >= q[b] else [2]],
                         ids=["static", "repeat-not-expanded", "likelier-expanded"])
@pytest.mark.parametrize("seed", [1, 2, 46])
def test_traversal_walk_is_exact_and_accepts_more_than_the_top_down_one(shape, seed):
    """Exactly, not statistically: the walk keeps the target's distribution also where the tree's
    shape depends on the drawn tokens (EAGLE-2's sampled tree expands the likelier node, and not a
    repeated one), and accepts more than SpecInfer's top-down walk on the same trees."""
    tv, traversal_accepted = walk_enumerated(traversal_visit, shape, seed)
    tv_top_down, top_down_accepted = walk_enumerated(top_down_visit, shape, seed)
    assert tv < 1e-9 and tv_top_down < 1e-9
    assert traversal_accepted > top_down_accepted


def test_traversal_is_block_verification_on_a_chain():
    """On a chain the traversal walk is block verification: the same expected accepted count
    (11/9 on Sun et al.'s example, against 10/9 token by token)."""
    p, q = torch.tensor([1 / 3, 2 / 3]), torch.tensor([2 / 3, 1 / 3])
    tables = (p, p.expand(2, 2), p.expand(2, 2, 2), q, q.expand(2, 2))
    _, accepted = chain_outputs(chain_rule("traversal"), *tables, 8000)
    assert accepted == pytest.approx(11 / 9, abs=MEAN_WITHIN)


def test_block_refuses_a_branching_tree():
    p = torch.full((4, 3), 1 / 3)
    with pytest.raises(ValueError, match="chain"):
        verify.block(torch.tensor([0, 1, 2, 0]), p, Tree((-1, -1, 0)), p, None)
