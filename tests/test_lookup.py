"""Prompt lookup decoding against plain decoding: the n-gram index against a scan of the text,
greedy output token for token, the cache afterwards, the sampled distribution (statistically,
with a planted bug that must be caught), and the command lines."""
import json
import random

import pytest
import torch

from tinyspec import verify
from tinyspec.commands import generate
from tinyspec.bench import specs
from tinyspec.methods import Decoder
from tinyspec.methods.lookup import NgramIndex, PromptLookup
from tinyspec.sampling import Sampling

from conftest import (assert_cache_holds, counting_sequences, drive, generations, plain_tokens, random_gpt, sampled_rows,
                      token_counts)
from test_speculative import chi_square, critical_value


def scanned_proposal(text, max_ngram, k):
    """The reference: scan the text backwards for the latest earlier occurrence of its suffix."""
    for n in range(min(max_ngram, len(text)), 0, -1):
        suffix = text[-n:]
        for end in range(len(text) - 1, n - 1, -1):  # an occurrence ending at end - 1, with a token after it
            if text[end - n:end] == suffix:
                return [text[end + i % (len(text) - end)] for i in range(k)]
    return []


def test_index_example_and_incremental_updates_match_a_scan():
    index = NgramIndex(2, [0, 1, 2, 0, 1])  # the docstring's example: a b c a b
    assert index.last == {(0,): 4, (1,): 2, (2,): 3, (0, 1): 2, (1, 2): 3, (2, 0): 4}
    assert index.propose(2) == [2, 0] and index.propose(5) == [2, 0, 1, 2, 0]  # wraps around: period 3
    assert NgramIndex(3, [5, 6, 7]).propose(4) == []  # the last token never occurred before
    rng = random.Random(0)
    for _ in range(200):
        max_ngram, k = rng.randint(1, 4), rng.randint(1, 8)
        text = [rng.randrange(rng.choice([2, 4, 16])) for _ in range(rng.randint(1, 40))]
        index = NgramIndex(max_ngram)
        for i in range(len(text)):  # grown a token at a time, as decoding grows it
            index.extend(text[i:i + 1])
            assert index.propose(k) == scanned_proposal(text[:i + 1], max_ngram, k), (text[:i + 1], max_ngram, k)


@pytest.fixture(scope="module")
def target():
    return random_gpt(vocab_size=64, n_ctx=96, scale=3.0, seed=0)


def prompts(seed):
    """Random prompts (lookup rarely matches them until the output repeats itself) and
    repetitive ones (it matches from the first step)."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    out = [[rng.randrange(64) for _ in range(rng.randint(1, 12))] for _ in range(3)]
    out += [counting_sequences(1, rng.randint(8, 16), 8, g)[0].tolist() for _ in range(2)]  # x + s (mod 8): repeats
    return out


@pytest.mark.parametrize("k, max_ngram", [(1, 1), (2, 3), (4, 2), (8, 3), (16, 4)])
def test_greedy_lookup_equals_plain_decoding(target, k, max_ngram):
    accepted = rejected = proposed = 0
    for prompt in prompts(k):
        res = generations(target, PromptLookup(target, max_ngram), [prompt], n=50, size=str(k))[0]
        assert res.token_ids == plain_tokens(target, prompt, 50), f"k={k}, max_ngram={max_ngram}, prompt {prompt}"
        accepted, rejected, proposed = accepted + res.accepted, rejected + res.rejections, proposed + res.proposed
    assert accepted > 20 and rejected > 0 and proposed > accepted  # both outcomes of the rule happened


def test_greedy_lookup_runs_to_the_end_of_the_context(target):
    prompt = [i % 8 for i in range(80)]
    plain = generations(target, None, [prompt], n=100)[0]
    res = generations(target, PromptLookup(target), [prompt], n=100, size="8")[0]
    assert res.token_ids == plain.token_ids and res.stop_reason == plain.stop_reason == "context"


def check_cache_after(target, d, prompt, sampling, n_steps):
    """After n_steps target forwards of Decoder d on `prompt` (the prefill's among them), d's cache
    holds what plain decoding of the same tokens builds, and some step proposed something."""
    [seq], produced = drive(d.steps(prompt, sampling, torch.Generator().manual_seed(0), 1000), [prompt], n_steps)
    assert d.cache.length == len(seq) - 1  # the newest token is not fed yet
    assert sum(step.proposed for p in produced for step in p.values()) > 0
    assert_cache_holds(target, d.cache, seq)


@pytest.mark.parametrize("temperature, rule", [(0.0, "greedy"), (1.0, "pointmass")])
def test_cache_after_lookup_steps_equals_plain_decoding(target, temperature, rule):
    d = Decoder(target, PromptLookup(target, 3), "6", rule=rule)
    check_cache_after(target, d, [3, 4, 5, 3, 4, 5, 3, 4], Sampling(temperature), 8)


def test_lookup_refuses_rules_that_need_a_draft_distribution(target):
    with pytest.raises(ValueError, match="sampled from a draft"):
        Decoder(target, PromptLookup(target), rule="lossless").steps([1, 2], Sampling(1.0), None, 10)


# ---- sampling: exactness, statistically ------------------------------------------------------

V = 8
SAMPLING = Sampling(1.0, top_k=4)  # 4 tokens per step: 64 three-token continuations


@torch.no_grad()
def exact_distribution(target, prompt, sampling, n):
    """P(x_1..x_n | prompt), all V^n cells, enumerated with plain forwards of the target."""
    table = torch.zeros([V] * n)

    def visit(prefix, prob):
        if len(prefix) == n:
            table[tuple(prefix)] = prob
            return
        p = sampling.probs(target(torch.tensor([prompt + prefix]))[0][0, -1])
        for x in range(V):
            if p[x] > 0:
                visit(prefix + [x], prob * p[x])
    visit([], 1.0)
    return table.flatten()


def sample_counts(d, prompt, n_samples, n=3):
    """Counts of the first n tokens of Decoder d's runs on `prompt` over seeds 0..n_samples-1
    (sampling with SAMPLING), and how many runs proposed anything."""
    [runs] = sampled_rows(d, [prompt], SAMPLING, n_samples, n)
    return token_counts(runs, V, n), sum(res.proposed > 0 for res in runs)


@pytest.fixture(scope="module")
def tiny_vocab():
    """A tiny-vocabulary target and a prompt it makes repetitive: every token 0..7 once, then the
    target's own greedy continuation, so a looked-up proposal is often the likely token."""
    model = random_gpt(vocab_size=V, n_ctx=32, n_layer=1, n_embd=16, scale=6.0, seed=1)
    head = list(range(V))
    prompt = head + plain_tokens(model, head, 8)
    return model, prompt, exact_distribution(model, prompt, SAMPLING, 3)


def lookup_counts(tiny_vocab, n_samples):
    model, prompt, _ = tiny_vocab
    d = Decoder(model, PromptLookup(model, 2), "3", rule="pointmass")
    counts, proposing = sample_counts(d, prompt, n_samples)
    assert proposing == n_samples  # every token occurs in the prompt: every run verified a lookup
    return counts


def check_distribution(counts_of, exact, monkeypatch):
    """6,000 samples must fit the exact distribution; with a planted bug in the point-mass walk
    (verify.py), a rejected candidate left in p so that the correction can be the very token
    just rejected, 3,000 must miss it by far."""
    stat, dof = chi_square(counts_of(6000), exact, V)
    assert stat < critical_value(dof), f"chi-square {stat:.1f} with {dof} dof"
    monkeypatch.setattr(verify, "residual", lambda p, q: p / p.sum(-1, keepdim=True))
    stat, dof = chi_square(counts_of(3000), exact, V)
    assert stat > 3 * critical_value(dof), f"chi-square {stat:.1f} with {dof} dof: the planted bug went unnoticed"


@pytest.mark.slow
def test_sampled_lookup_has_the_target_distribution_and_a_planted_bug_is_caught(tiny_vocab, monkeypatch):
    check_distribution(lambda n: lookup_counts(tiny_vocab, n), tiny_vocab[2], monkeypatch)


# ---- command line ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("draftfree") / "target.safetensors"
    random_gpt(vocab_size=8192, n_ctx=64, scale=4.0).save(path)
    return path


def check_cli_equals_ar(model_file, capsys, prompt, method, flag_sets):
    """`generate --json` with --method `method` and each set of flags writes ar's tokens, and proposes
    (--size auto: sized for the machine, and it may not)."""
    base = ["--prompt", prompt, "--max-new-tokens", "24", "--model", str(model_file), "--json"]
    generate.main(base)
    ar = json.loads(capsys.readouterr().out)
    for flags in flag_sets:
        generate.main(base + ["--method", method] + flags)
        out = json.loads(capsys.readouterr().out)
        assert out["token_ids"] == ar["token_ids"]
        if flags[-1:] != ["auto"]:  # at its default size or a given one it proposes
            assert out["stats"]["proposed_tokens"] > 0 and "tau" in out["stats"]
        else:
            assert "sized" in out["stats"]


def test_cli_lookup_equals_ar(model_file, capsys):
    flag_sets = [[], ["--size", "3"], ["--size", "8", "--max-ngram", "1"], ["--size", "auto"]]
    check_cli_equals_ar(model_file, capsys, "a b a b a b a b", "lookup", flag_sets)


@pytest.mark.parametrize("argv, message", [
    (["--size", "0"], "K must be in 1..16, got 0"), (["--size", "17"], "K must be in 1..16, got 17"),
    (["--max-ngram", "0"], "--max-ngram must be in 1..8"),
    (["--accept", "lossless"], "pointmass"), (["--accept", "block"], "pointmass"), (["--cuda-graph"], "--cuda-graph")])
def test_cli_refuses_bad_lookup_settings(model_file, argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        generate.main(["--prompt", "x", "--model", str(model_file), "--method", "lookup"] + argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bench_method_specs():
    assert specs.parse_method("lookup:4") == ("lookup", "4", None)
    assert specs.parse_method("lookahead:7,4,7") == ("lookahead", "7,4,7", None)
    assert specs.parse_method("lookup") == ("lookup", "", None)  # its default size
    assert specs.parse_method("lookup:auto@pointmass") == ("lookup", "auto", "pointmass")  # sized for the device
    for bad in ("lookup:x", "ar:4", "lookup@nope", "lookup@lossless", "teleport"):
        with pytest.raises(SystemExit):
            specs.parse_method(bad)
