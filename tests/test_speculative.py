"""Draft-model speculative decoding against plain decoding (greedy: token for token; sampled:
the same distribution, checked statistically on a model small enough to enumerate)."""
import json
import math
import random
from collections import Counter

import pytest
import torch

from tinyspec.commands import generate
from tinyspec.methods import Decoder
from tinyspec.methods.draft import DraftModel, accept_or_resample, best_k, expected_speedup, expected_tokens
from tinyspec.results import run
from tinyspec.sampling import Sampling
from tinyspec.speed.policy import Policy

from conftest import (Coin, assert_cache_holds, drive, generations, looped, plain_tokens, random_gpt, refused,
                      sampled_rows, token_counts)


def perturbed(model, noise, seed):
    """A draft that agrees with `model` often but not always: its weights plus noise."""
    torch.manual_seed(seed)
    copy = random_gpt(vocab_size=model.config.vocab_size, n_ctx=model.config.n_ctx)
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(noise * torch.randn_like(p) * p.std())
    return copy


@pytest.fixture(scope="module")
def models():
    target = random_gpt(vocab_size=64, n_ctx=96, scale=3.0, seed=0)
    drafts = {"same": target, "close": perturbed(target, 0.3, 1), "far": perturbed(target, 1.5, 2),
              "unrelated": random_gpt(vocab_size=64, n_ctx=96, n_layer=1, scale=3.0, seed=3)}
    return target, drafts


def test_greedy_equals_plain_decoding_for_every_k_and_draft(models):
    target, drafts = models
    rng = random.Random(0)
    cases = [(name, k, [rng.randrange(64) for _ in range(rng.randint(1, 12))])
             for name in drafts for k in range(1, 9) for _ in range(3)]
    plain = generations(target, None, [prompt for _, _, prompt in cases], n=40)  # rows of one batch: each its batch-1 tokens
    proposers = {name: DraftModel(target, draft) for name, draft in drafts.items()}
    accepted_somewhere, rejected_somewhere = False, False
    for (name, k, prompt), alone in zip(cases, plain):
        spec = generations(target, proposers[name], [prompt], n=40, size=str(k))[0]
        assert spec.token_ids == alone.token_ids, f"draft {name}, k={k}, prompt {prompt}"
        accepted_somewhere |= spec.accepted > 0
        rejected_somewhere |= spec.rejections > 0
    assert accepted_somewhere and rejected_somewhere  # both branches of the rule were exercised


@pytest.mark.parametrize("rule", ["block", "pointmass"])
def test_greedy_with_other_chain_rules_equals_plain_decoding(models, rule):
    target, drafts = models
    rng = random.Random(1)
    for name in ("close", "far"):
        for k in (1, 3, 6):
            prompt = [rng.randrange(64) for _ in range(rng.randint(1, 12))]
            spec = looped(target, DraftModel(target, drafts[name]), [prompt], str(k), rule, n=30)[0]
            assert spec.token_ids == plain_tokens(target, prompt, 30), f"{rule}, draft {name}, k={k}"


def test_greedy_runs_to_the_end_of_the_context(models):
    target, drafts = models
    prompt = [i % 64 for i in range(80)]
    plain = generations(target, None, [prompt], n=100)[0]
    spec = generations(target, DraftModel(target, drafts["close"]), [prompt], n=100, size="6")[0]
    assert spec.token_ids == plain.token_ids and spec.stop_reason == plain.stop_reason == "context"
    assert len(prompt) + len(spec.token_ids) == 97


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_caches_after_speculative_steps_equal_plain_decoding(models, temperature):
    """After 8 target forwards, the target's cache and the draft's each hold exactly what plain
    decoding of the same text builds."""
    target, drafts = models
    proposer = DraftModel(target, drafts["close"])
    d = Decoder(target, proposer, "4")
    prompt = [5, 17, 3]
    [seq], produced = drive(d.steps(prompt, Sampling(temperature), torch.Generator().manual_seed(0), 1000), [prompt], 8)
    assert d.cache.length == len(seq) - 1  # everything but the newest token, not fed yet
    assert sum(step.proposed for p in produced for step in p.values()) > 0
    assert_cache_holds(target, d.cache, seq)
    assert 0 < proposer.caches[0].length <= d.cache.length
    assert_cache_holds(drafts["close"], proposer.caches[0], seq)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_drafts_cache_is_made_once_and_reused_prompt_after_prompt(models, temperature):
    """At batch 1 both caches are made once and every prompt reuses them (longest prompt first, so
    stale entries sit beyond the shorter ones): the tokens are those of a decoder made afresh."""
    target, drafts = models
    proposer = DraftModel(target, drafts["close"])
    d = Decoder(target, proposer, "4")
    tokens = lambda d, p: run(d.steps(p, Sampling(temperature), torch.Generator().manual_seed(3), 30)).token_ids
    tokens(d, list(range(40)))
    cache = proposer.caches[0]
    for prompt in ([5, 17, 3], [9] * 12):
        assert tokens(d, prompt) == tokens(Decoder(target, DraftModel(target, drafts["close"]), "4"), prompt)
        assert proposer.caches[0] is cache


# ---- sampling: exactness, statistically ------------------------------------------------------

V = 8  # tiny vocabulary: all V^3 three-token continuations can be enumerated
PROMPT = [0, 1]


@torch.no_grad()
def exact_distribution(target, sampling, n=3):
    """P(x1 .. xn | prompt) = p(x1 | prompt) p(x2 | prompt, x1) ..., enumerated with the target."""
    table = torch.ones(1)  # (V^i,): P(x1 .. xi | prompt), x1 the most significant digit of the index
    for i in range(n):
        texts = [[j // V ** (i - 1 - a) % V for a in range(i)] for j in range(V ** i)]
        p = torch.stack([sampling.probs(target(torch.tensor([PROMPT + t]))[0][0, -1]) for t in texts])  # (V^i, V)
        table = (table[:, None] * p).flatten()
    return table


class Statistic(float):
    """A chi-square statistic that, printed (`f"{stat:.1f}"`), also says what made it infinite: the
    outcome seen that the target can never produce."""

    def __new__(cls, value: float, note: str = ""):
        stat = super().__new__(cls, value)
        stat.note = note
        return stat

    def __format__(self, spec: str) -> str:
        return super().__format__(spec) + (f" ({self.note})" if self.note else "")


def chi_square(counts, expected_probs, vocab: int | None = None):
    """(statistic, degrees of freedom) of `counts` against `expected_probs`, the rare cells pooled.
    An outcome of probability 0 that occurred makes it infinite, and names it: its index, and
    with `vocab`, its tokens (the index's digits in base vocab, the first the most significant)."""
    n = counts.sum()
    keep = expected_probs * n >= 5  # pool the rare cells so the chi-square approximation holds
    observed = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    expected = torch.cat([expected_probs[keep] * n, (expected_probs[~keep] * n).sum().view(1)])
    if expected[-1] == 0:  # nothing to pool: only impossible outcomes, which must not occur
        if observed[-1] > 0:
            seen = [i for i in range(len(counts)) if counts[i] > 0 and expected_probs[i] == 0]
            return Statistic(float("inf"), "; ".join(impossible(i, int(counts[i]), len(counts), vocab)
                                                      for i in seen[:3])), len(expected) - 2
        observed, expected = observed[:-1], expected[:-1]
    stat = ((observed - expected) ** 2 / expected).sum().item()
    return Statistic(stat), len(expected) - 1  # degrees of freedom


def impossible(index: int, times: int, outcomes: int, vocab: int | None) -> str:
    """What an impossible outcome was: "tokens (4, 5), which the target writes with probability 0,
    came 3 times"."""
    what = f"outcome {index} of {outcomes}"
    if vocab:
        n = round(math.log(outcomes, vocab))
        what = "tokens (" + ", ".join(str(index // vocab ** (n - 1 - i) % vocab) for i in range(n)) + ")"
    return f"{what}, which the target writes with probability 0, came {times} time{'s' * (times > 1)}"


def critical_value(dof, z=4.26):
    """Wilson-Hilferty approximation of the chi-square quantile at z (4.26: p ~ 1e-5)."""
    a = 2 / (9 * dof)
    return dof * (1 - a + z * a ** 0.5) ** 3


def speculative_samples(target, draft, sampling, k, n, rule=None):
    """Counts of the first three tokens over seeds 0..n-1: the prefill's (the target's own), then
    the first speculative step's two."""
    d = Decoder(target, DraftModel(target, draft), str(k), rule=rule)
    [runs] = sampled_rows(d, [PROMPT], sampling, n)
    return token_counts(runs, V)


@pytest.fixture(scope="module")
def tiny_vocab_models():
    target = random_gpt(vocab_size=V, n_ctx=8, n_layer=1, n_embd=16, scale=6.0, seed=1)
    draft = random_gpt(vocab_size=V, n_ctx=8, n_layer=1, n_embd=16, scale=6.0, seed=3)  # a poor draft: many rejections
    return target, draft


@torch.no_grad()
def assert_target_distribution(target, draft, sampling, k, rule=None):
    exact = exact_distribution(target, sampling)
    counts = speculative_samples(target, draft, sampling, k, 6000, rule)
    stat, dof = chi_square(counts, exact, V)
    assert stat < critical_value(dof), f"chi-square {stat:.1f} with {dof} dof: output is not the target's distribution"
    # the draft really is far from the target where it first drafts (after the prefill's token): the test has teeth
    p1 = exact.view(V, V * V).sum(1)
    far = 0.0
    for x1 in range(V):
        p2, q2 = (sampling.probs(m(torch.tensor([PROMPT + [x1]]))[0][0, -1]) for m in (target, draft))
        far += float(p1[x1]) * float((p2 - q2).abs().sum()) / 2
    assert far > 0.2, far


@pytest.mark.slow
@pytest.mark.parametrize("sampling, k", [(Sampling(1.0), 2), (Sampling(0.8, top_k=5), 1)])
def test_sampled_output_has_the_target_distribution(tiny_vocab_models, sampling, k):
    assert_target_distribution(*tiny_vocab_models, sampling, k)


@pytest.mark.slow
def test_block_verification_in_the_draft_loop_has_the_target_distribution(tiny_vocab_models):
    assert_target_distribution(*tiny_vocab_models, Sampling(1.0), 3, rule="block")


def test_acceptance_rule_reproduces_p_for_fixed_distributions():
    """accept_or_resample alone: the first token it emits is distributed as p, whatever q."""
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(2, 6) * 2, -1)  # p_1 and p_2 (bonus)
    q = torch.softmax(torch.randn(1, 6) * 2, -1)
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    n = 20000
    for draft in torch.multinomial(q[0], n, replacement=True, generator=g).view(n, 1):  # the n proposals, drawn at once
        accepted, token = accept_or_resample(p, q, draft, g)
        counts[int(draft) if accepted else int(token)] += 1
    stat, dof = chi_square(counts, p[0], V)
    assert stat < critical_value(dof), (counts / n, p[0])


# ---- adaptive k -----------------------------------------------------------------------------

def test_expected_tokens_matches_a_simulation():
    rng = random.Random(0)
    for alpha, k in [(0.3, 2), (0.7, 4), (0.9, 8)]:
        def one_step():
            n = 0
            while n < k and rng.random() < alpha:
                n += 1
            return n + 1  # accepted proposals + the correction or bonus token
        mean = sum(one_step() for _ in range(40000)) / 40000
        assert mean == pytest.approx(expected_tokens(alpha, k), rel=0.02)


def test_best_k_falls_back_to_plain_decoding_when_speculation_does_not_pay():
    assert best_k(alpha=0.05, c=0.5, k_max=8) == 0
    assert best_k(alpha=0.9, c=0.05, k_max=8) >= 6
    assert expected_speedup(0.8, 0.1, 4) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 1.4))


def test_a_k_chosen_anew_every_step_is_still_exact(models):
    target, drafts = models
    plain = plain_tokens(target, [3, 4], 60)
    sizes = Counter()
    for seed, name in enumerate(("same", "close", "unrelated")):
        res = generations(target, DraftModel(target, drafts[name]), n=60,
                          policy=Coin([str(k) for k in range(1, 7)], seed=seed))[0]
        assert res.token_ids == plain
        sizes += res.sizes
    assert sizes["0"] > 3 and len(sizes) == 7  # plain steps (beyond the three prefills) and every k


def test_the_policy_follows_the_drafts_acceptance(models):
    """Held-out acceptance promises tokens for each k; a draft identical to the target is always
    accepted, so the running ratio of accepted to promised tokens climbs well above 1 and the
    policy keeps speculating; text on which nothing is accepted turns it to plain steps."""
    target, drafts = models
    plain = plain_tokens(target, [3, 4], 60)
    promise = {str(k): expected_tokens(0.5, k) - 1 for k in (1, 2, 4, 6)}
    policy = Policy(promise, lambda size, rows: 1.0 + 0.2 * int(size or 0))  # a step of k costs 1 + 0.2 k plain steps
    assert generations(target, DraftModel(target, drafts["same"]), n=60, policy=policy)[0].token_ids == plain
    assert policy.a > 2 and policy.choose(1) is not None
    for _ in range(40):
        policy.update([0], "2", 1)
    assert policy.a < 0.1 and policy.choose(1) is None


# ---- command line ---------------------------------------------------------------------------

def save_target_and_draft(d, n_ctx: int = 64):
    """A random target over the shipped tokenizer's 8192 tokens and a draft close to it, saved in d."""
    target = random_gpt(vocab_size=8192, n_ctx=n_ctx, scale=4.0)
    target.save(d / "target.safetensors")
    perturbed(target, 0.3, 1).save(d / "draft.safetensors")
    return target


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec")
    save_target_and_draft(d)
    random_gpt(vocab_size=100).save(d / "v100.safetensors")
    return d


def test_cli_draft_method_json_stats_and_equality_with_ar(model_files, capsys):
    base = ["--prompt", "def f(x):", "--max-new-tokens", "20", "--model", str(model_files / "target.safetensors"), "--json"]
    generate.main(base)
    ar = json.loads(capsys.readouterr().out)
    for size in ([], ["--size", "3"], ["--size", "auto"]):
        generate.main(base + ["--method", "draft", "--draft", str(model_files / "draft.safetensors")] + size)
        spec = json.loads(capsys.readouterr().out)
        assert spec["token_ids"] == ar["token_ids"]
        stats = spec["stats"]
        assert stats["tau"] == pytest.approx(stats["new_tokens"] / stats["target_steps"], abs=1e-3)
        if size[1:] == ["auto"]:  # sized for this machine (sizing.py): it may find that no k pays, and take plain steps
            assert stats["sized"]["file"].endswith(".json") and stats["size"] == "auto"
            continue
        assert {"proposed_tokens", "accepted_tokens", "acceptance_rate", "acceptance_by_depth", "empty_steps"} <= set(stats)
        assert stats["size"] == (size[1] if size else "4") and stats["steps_by_size"][stats["size"]] > 0


def test_cli_show_colours_tokens(model_files, capsys):
    generate.main(["--prompt", "x = 1", "--max-new-tokens", "12", "--model", str(model_files / "target.safetensors"),
                   "--method", "draft", "--size", "4", "--draft", str(model_files / "draft.safetensors"), "--show", "--color",
                   "always"])
    out, err = capsys.readouterr()
    assert "\033[32m" in out and "tau" in err and "colours" in err


@pytest.mark.parametrize("argv, message", [
    (["--k", "0"], "--k"), (["--k", "many"], "--k"),
    (["--draft", "{d}/v100.safetensors"], "vocabulary"), (["--draft", "{d}/none.safetensors"], "not found")])
def test_cli_refuses_bad_draft_settings(model_files, argv, message, capsys):
    argv = [a.format(d=model_files) for a in argv]
    assert message in refused(generate.main, ["--prompt", "x", "--model", str(model_files / "target.safetensors"),
                                              "--method", "draft", "--draft", str(model_files / "draft.safetensors")] + argv,
                              capsys)
