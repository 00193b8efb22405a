"""Every method x acceptance rule x temperature that the command line accepts keeps the contract:
at T = 0 the output is plain greedy decoding's, token for token; at T > 0 it has exactly the
target's distribution (chi-square on a tiny vocabulary), except `typical`, the one rule documented
as lossy. What breaks the contract is refused in one line (`methods.check_rule`), and a planted bug
(the greedy rule let through at T = 1) shows that the distribution test would notice."""
import pytest
import torch

from tinyspec import methods
from tinyspec.commands import generate
from tinyspec.decoding import decode
from tinyspec.results import run_batch
from tinyspec.methods import Decoder, check_rule
from tinyspec.methods.draft import DraftModel
from tinyspec.methods.eagle import Eagle
from tinyspec.methods.lookahead import Lookahead
from tinyspec.methods.lookup import PromptLookup
from tinyspec.methods.medusa import Medusa
from tinyspec.sampling import Sampling
from tinyspec.speed import auto
from tinyspec.tree import Tree
from tinyspec.verify import RULES

from conftest import plain_tokens, random_gpt, random_heads, sampled_rows, token_counts
from test_eagle import random_head
from test_lookup import exact_distribution
from test_speculative import chi_square, critical_value

METHODS = ["draft", "medusa", "eagle", "lookup", "lookahead", "auto"]  # auto: Medusa, its size chosen per step
V, N = 8, 2  # vocabulary, tokens compared
PROMPTS = [[0, 1, 2, 3, 4, 5, 6, 7, 0], [6, 2, 7, 1, 0, 5, 3, 4, 6, 2, 1, 0, 7, 5, 3, 4, 0]]  # every token
# occurs in both, so prompt lookup always proposes; rows alternate between the two prompts


def method_of(name):
    """The method a row of METHODS runs: auto is Medusa with a policy (`speed/auto.py`)."""
    return "medusa" if name == "auto" else name


def allowed(temperature):
    return [(m, r) for m in METHODS for r in RULES if check_rule(method_of(m), r, temperature) is None]


def test_the_greedy_rule_is_refused_at_every_temperature_above_zero_and_only_there():
    for method in map(method_of, METHODS):
        for t in (0.5, 1.0, 2.0):
            problem = check_rule(method, "greedy", t)
            assert problem and "--accept" in problem and "\n" not in problem
            assert all(r in problem for r in methods.exact_rules(method))
        assert check_rule(method, "greedy", 0.0) is None
    assert ("draft", "greedy") not in allowed(1.0) and ("draft", "lossless") in allowed(1.0)
    assert [r for m, r in allowed(1.0) if m == "lookup"] == ["typical", "pointmass"]


def test_generate_refuses_the_greedy_rule_when_sampling(capsys):
    with pytest.raises(SystemExit) as e:
        generate.main(["--prompt", "x", "--method", "medusa", "--accept", "greedy", "--temperature", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "lossless or pointmass" in err


@pytest.fixture(scope="module")
def tiny():
    target = random_gpt(vocab_size=V, n_ctx=32, n_layer=1, n_embd=16, scale=6.0, seed=1)
    return dict(target=target, draft=random_gpt(vocab_size=V, n_ctx=32, n_layer=1, n_embd=16, scale=6.0, seed=2),
                heads=with_accuracy(random_heads(16, 2, seed=2, scale=1.0)), eagle=random_head(target, 2, 2.0),
                exact=[exact_distribution(target, p, Sampling(1.0), N) for p in PROMPTS])


def with_accuracy(heads):
    """Held-out accuracies for `auto`'s trees (made up: they shape the trees, not the exactness)."""
    heads.accuracy = torch.tensor([[0.5, 0.2, 0.1]] * heads.n_heads)
    return heads


def decoder(m, method, rule, draft_vocab=None):
    """The Decoder of `method` judged by `rule`; Medusa's tree has distinct siblings (ranks), so it
    is a valid top-k tree for pointmass and a shape for sampled trees."""
    t = m["target"]
    if method == "auto":  # Medusa, its tree chosen per step: here always a tree of 4 nodes (costs mean nothing)
        medusa = Medusa(t, m["heads"], draft_vocab)
        policy = auto.BatchPolicy(t, medusa, sizes=("4",), costs=(lambda r, t: 1.0, lambda r: 0.0))
        policy.choose = lambda rows: "4"
        return Decoder(t, medusa, policy=policy, rule=rule)
    proposer, size = {
        "draft": lambda: (DraftModel(t, m["draft"], draft_vocab), "3"),
        "medusa": lambda: (Medusa(t, m["heads"], draft_vocab, tree=Tree((-1, -1, -1, 0, 0, 1), (0, 1, 2, 0, 1, 0))),
                           None),
        "eagle": lambda: (Eagle(t, m["eagle"], draft_vocab), "2,2,4"),
        "lookup": lambda: (PromptLookup(t), "3"),
        "lookahead": lambda: (Lookahead(t), "2,2,3"),
    }[method]()
    return Decoder(t, proposer, size, rule=rule)


def counts_of(d, sampling, n_samples):
    runs = sampled_rows(d, PROMPTS, sampling, n_samples, N)
    return [token_counts(r, V, N) for r in runs], sum(res.proposed for r in runs for res in r)


@pytest.mark.slow
@pytest.mark.parametrize("method, rule", [c for c in allowed(1.0) if c[1] != "typical"])
def test_every_exact_combination_has_the_target_distribution(tiny, method, rule):
    counts, proposed = counts_of(decoder(tiny, method, rule), Sampling(1.0), 1536)
    for prompt, c, exact in zip(PROMPTS, counts, tiny["exact"]):
        stat, dof = chi_square(c, exact, V)
        assert stat < critical_value(dof), f"{method}@{rule}, prompt {prompt}: chi-square {stat:.1f} with {dof} dof"
    assert method == "lookahead" or proposed > 0  # proposals were judged (lookahead's pool fills later)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["medusa", "eagle", "lookup"])
def test_the_greedy_rule_at_t1_let_through_is_caught(tiny, method, monkeypatch):
    """(The draft's loop judges a chain with the lossless rule when asked for greedy, which is
    exact at every temperature; the command line refuses the name at T > 0 all the same.)"""
    monkeypatch.setattr(methods, "rule_problem", lambda *a: None)  # the check every Decoder makes
    counts, _ = counts_of(decoder(tiny, method, "greedy"), Sampling(1.0), 768)
    stats = [chi_square(c, exact, V) for c, exact in zip(counts, tiny["exact"])]
    assert any(stat > 3 * critical_value(dof) for stat, dof in stats), f"{method}: {stats}"


@pytest.fixture(scope="module")
def counting(counting_gpt):
    """The trained counting model with a draft, Medusa heads and an EAGLE head (none is changed by a
    decoder), four prompts, and plain decoding's 24 tokens after each: what every combination writes."""
    from test_batch import mixed_prompts
    from test_speculative import perturbed
    prompts = mixed_prompts(4, seed=3)
    models = dict(target=counting_gpt, draft=perturbed(counting_gpt, 0.5, 1),
                  heads=with_accuracy(random_heads(32, 3, seed=1)), eagle=random_head(counting_gpt, 1, 3.0))
    return models, prompts, [plain_tokens(counting_gpt, p, 24) for p in prompts]


@pytest.mark.parametrize("method, rule", allowed(0.0))
def test_every_combination_at_t0_is_plain_greedy_decoding(counting, method, rule):
    """Each rule as named, through the loop itself: a Decoder judges every step at T = 0 with the
    greedy rule, whatever was asked (`decoding.default_rule`)."""
    m, prompts, plain = counting
    counting_gpt = m["target"]
    d = decoder(m, method, rule)
    loop = lambda ps: decode(counting_gpt, d.proposer, ps, Sampling(0.0), [None] * len(ps), 24, None, d.shapes, d.policy,
                             rule)
    rows = run_batch(loop(prompts), 4)
    assert [r.token_ids for r in rows] == plain
    assert [run_batch(loop([p]), 1)[0].token_ids for p in prompts] == plain
    assert [run_batch(d.steps(p, Sampling(0.0), None, 24), 1)[0].token_ids for p in prompts] == plain


# ---- a reduced draft vocabulary (model.DraftVocab) ---------------------------------------------

SUBSET = torch.tensor([0, 2, 3, 5, 6])  # the drafter proposes only these; the target judges all 8


@pytest.fixture
def fresh(tiny):
    """The tiny models with new drafters: a reduced vocabulary is set on the drafter itself."""
    return dict(tiny, draft=random_gpt(vocab_size=V, n_ctx=32, n_layer=1, n_embd=16, scale=6.0, seed=2),
                heads=with_accuracy(random_heads(16, 2, seed=2, scale=1.0)), eagle=random_head(tiny["target"], 2, 2.0))


@pytest.mark.slow
@pytest.mark.parametrize("method, rule", [("draft", "lossless"), ("draft", "block"), ("medusa", "lossless"),
                                          ("medusa", "pointmass"), ("eagle", "lossless")])
def test_a_reduced_draft_vocabulary_keeps_the_target_distribution(fresh, method, rule):
    counts, proposed = counts_of(decoder(fresh, method, rule, SUBSET), Sampling(1.0), 1536)
    for prompt, c, exact in zip(PROMPTS, counts, fresh["exact"]):
        stat, dof = chi_square(c, exact, V)
        assert stat < critical_value(dof), f"{method}@{rule}, prompt {prompt}: chi-square {stat:.1f} with {dof} dof"
        assert c.view(V, V)[:, [1, 4, 7]].sum() > 0  # tokens outside the draft's vocabulary still come (from the target)
    assert proposed > 0


def test_a_reduced_draft_vocabulary_proposes_only_its_tokens_and_keeps_greedy_output(counting):
    m, prompts, plain = counting
    counting_gpt, subset = m["target"], torch.arange(0, 32, 2)  # the even tokens only
    d = Decoder(counting_gpt, DraftModel(counting_gpt, m["draft"], subset), "3")
    for p, expected in zip(prompts, plain):
        res = run_batch(d.steps(p, Sampling(0.0), None, 24), 1)[0]
        assert res.token_ids == expected
        accepted = [t for t, s in zip(res.token_ids, res.sources) if s == "accepted"]
        assert accepted and all(t % 2 == 0 for t in accepted)  # only the draft's own vocabulary is ever proposed


@pytest.mark.slow
def test_proposals_from_the_reduced_vocabulary_judged_with_the_full_q_are_caught(fresh, monkeypatch):
    """A planted bug: q renormalised wrongly. The draft samples from its distribution restricted to
    SUBSET and renormalised, but the rule is handed the full-vocabulary q it came from. (The first
    token is the prefill's, the target's own: the bug shows in the second only, hence as many
    samples as the exactness tests take.)"""
    from test_verify import mutant
    from tinyspec.methods import draft as draft_module
    keep = torch.zeros(V, dtype=torch.bool)
    keep[SUBSET] = True
    monkeypatch.setattr(draft_module, "KEEP", keep, raising=False)
    monkeypatch.setattr(DraftModel, "propose", mutant(draft_module, "propose", "sample(qs[-1][b], r.generator)",
                                                      "sample(qs[-1][b] * KEEP, r.generator)", DraftModel))
    counts, _ = counts_of(decoder(fresh, "draft", "lossless"), Sampling(1.0), 1536)
    stats = [chi_square(c, exact, V) for c, exact in zip(counts, fresh["exact"])]
    assert any(stat > 3 * critical_value(dof) for stat, dof in stats), f"the planted bug went unnoticed: {stats}"
