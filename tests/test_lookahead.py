"""Lookahead decoding against plain decoding: the mask and positions of the lookahead branch
against plain forwards over the text each guess sees, greedy output token for token over many
window shapes, the cache afterwards, the sampled distribution (statistically, with a planted
bug that must be caught), and the command lines."""
import json
import random

import pytest
import torch

from tinyspec import bench, generate
from tinyspec.decoding import autoregressive, feed, one_row, run
from tinyspec.kvcache import KVCache
from tinyspec.lookahead import NgramPool, lookahead, slide, step_inputs, step_mask, step_outputs, trie, window_mask
from tinyspec.sampling import Sampling
from tinyspec.tree import Tree
from tinyspec.verify import RULES

from conftest import counting_sequences, random_gpt
from test_lookup import (SAMPLING, V, check_cache_after, check_cli_equals_ar, check_distribution, exact_distribution,
                         model_file, sample_counts)  # noqa: F401 (model_file: a fixture)


def test_masks_are_the_drawn_ones():
    mask, offsets = window_mask(2, 3)
    drawn = ["1.....",
             "11....",
             "111...",
             "1..1..",
             "11..1.",
             "111..1"]
    assert mask.int().tolist() == [[int(c == "1") for c in row] for row in drawn]
    assert offsets.tolist() == [0, 1, 2, 1, 2, 3]
    nodes, parents = trie([(7, 8), (7, 9)])  # the walkthrough's figure: W = 3, N = 3, G = 2, two n-grams x 7 8, x 7 9
    mask, offsets, rows = step_mask(2, 3, Tree(parents))
    drawn = ["1........",
             "11.......",
             "111......",
             "1..1.....",
             "11..1....",
             "111..1...",
             "1.....1..",
             "1.....11.",
             "1.....1.1"]
    assert nodes == [7, 8, 9] and mask.int().tolist() == [[int(c == "1") for c in row] for row in drawn]
    assert offsets.tolist() == [0, 1, 2, 1, 2, 3, 1, 2, 2] and rows.tolist() == [0, 6, 7, 8]


def test_trie_merges_shared_prefixes_and_the_pool_keeps_the_most_recent():
    a, b, c, d, e, f, g = range(7)
    assert trie([(a, b, c), (a, b, d), (e, f, g)]) == ([a, b, c, d, e, f, g], (-1, 0, 1, 1, -1, 4, 5))
    pool = NgramPool(2)
    for ngram in [(1, 2, 3), (1, 4, 5), (1, 2, 3), (1, 6, 7), (2, 3, 4)]:
        pool.add(ngram)
    assert pool.guesses(1) == [(6, 7), (2, 3)]  # (4, 5) was the oldest when a third came
    assert pool.guesses(2) == [(3, 4)] and pool.guesses(9) == []


@torch.no_grad()
def test_each_guess_sees_exactly_its_own_text():
    """The lookahead branch against an independent reference: the outputs of the top level, and the
    logits of every trie node, equal those of plain forwards over the text each one sees."""
    target = random_gpt(vocab_size=64, n_ctx=64, scale=3.0, seed=3)
    prefix, root = [5, 9, 2, 7], 11
    grid = [[root, 3, 8, 1], [4, 6, 2, 9], [10, 12, 13, 14]]  # 3 levels, W = 4
    nodes, parents = trie([(20, 21, 22), (20, 23, 24), (25, 26, 27)])
    cache = KVCache.for_model(target, 64)
    target(torch.tensor([prefix]), cache=cache)
    calls, heads = [], []
    rule = lambda tokens, p, tree, q, generator: calls.append(p) or RULES["greedy"](tokens, p, tree)
    hook = target.lm_head.register_forward_hook(lambda module, inputs, output: heads.append(output))
    tree = Tree(parents)
    x, mask, offsets, at = step_inputs(grid, nodes, tree, torch.device("cpu"))
    [h] = feed(target, cache, [x], [mask], [offsets])  # ONE forward over the root, the window and the trie
    step, _, top = step_outputs(target, cache, 0, len(prefix), grid, x, h, at, tree, rule, Sampling(1.0), None)
    hook.remove()
    logits_after = lambda text: target(torch.tensor([text]))[0][0, -1]
    for c in range(4):  # guess (2, c) sees level 0 up to column c, then its own column
        expected = logits_after(prefix + grid[0][:c + 1] + [grid[1][c], grid[2][c]])
        torch.testing.assert_close(heads[0][c], expected, atol=1e-4, rtol=1e-4, msg=f"column {c}")
        assert top[c] == int(expected.argmax())
    p = calls[0]  # (T+1, V): the target's distribution after the root and after each node
    paths = {0: [root]}
    for i, (token, parent) in enumerate(zip(nodes, parents)):
        paths[i + 1] = paths[parent + 1] + [token]
    for i, text in paths.items():
        expected = Sampling(1.0).probs(target(torch.tensor([prefix + text]))[0][0, -1])
        torch.testing.assert_close(p[i], expected, atol=1e-5, rtol=1e-4)
    assert cache.length == len(prefix) + len(step.tokens)  # the root and the accepted nodes only


def test_slide_moves_each_level_down_and_fills_while_growing():
    fill = iter(range(100, 200)).__next__
    grid = slide([[1, 2, 3]], [4, 5, 6], 7, 4, fill)  # growing: one more level
    assert grid == [[7, 3, 100], [5, 6, 101]]
    grid = slide(grid, [8, 9, 10], 11, 3, fill)  # full (N - 1 = 2 levels): level 0 is forgotten
    assert grid == [[11, 6, 101], [8, 9, 10]]


@pytest.fixture(scope="module")
def target():
    return random_gpt(vocab_size=64, n_ctx=128, scale=3.0, seed=0)


@pytest.mark.parametrize("window, ngram, guesses", [(1, 2, 1), (3, 2, 4), (3, 3, 2), (4, 3, 4), (2, 5, 3), (6, 4, 6)])
def test_greedy_lookahead_equals_plain_decoding(target, counting_gpt, window, ngram, guesses):
    """On the trained counting model (whose window n-grams are often right) and on a random one,
    with counting and random prompts; 50 tokens in a context of 64, so the last steps have no
    room for the window and are plain."""
    rng = random.Random(window * 10 + ngram)
    g = torch.Generator().manual_seed(window * 10 + ngram)
    runs = [(counting_gpt, counting_sequences(1, rng.randint(3, 10), 32, g)[0].tolist()) for _ in range(3)]
    runs += [(counting_gpt, [rng.randrange(32) for _ in range(rng.randint(1, 10))])]
    runs += [(target, [rng.randrange(64) for _ in range(rng.randint(1, 12))]) for _ in range(2)]
    accepted = rejected = 0
    for model, prompt in runs:
        plain = run(autoregressive(model, [prompt], Sampling(0.0), [None], 64), 50).token_ids
        res = run(lookahead(model, [prompt], Sampling(0.0), [None], 64, window, ngram, guesses), 50)
        assert res.token_ids == plain, f"W={window}, N={ngram}, G={guesses}, prompt {prompt}"
        accepted, rejected = accepted + res.accepted, rejected + res.rejections
    assert accepted > 10 and rejected > 10  # n-grams from the window were verified, and both ways


def test_greedy_lookahead_runs_to_the_end_of_the_context(target):
    prompt = [i % 64 for i in range(100)]
    plain = run(autoregressive(target, [prompt], Sampling(0.0), [None], 128), 40)
    res = run(lookahead(target, [prompt], Sampling(0.0), [None], 128, 4, 3, 4), 40)
    assert res.token_ids == plain.token_ids and res.stop_reason == plain.stop_reason == "context"


@pytest.mark.parametrize("temperature, rule", [(0.0, "greedy"), (1.0, "pointmass")])
def test_cache_after_lookahead_steps_equals_plain_decoding(target, temperature, rule):
    cache, prompt = KVCache.for_model(target, 128), [3, 5, 7, 9]
    generator = torch.Generator().manual_seed(0)
    steps = one_row(lookahead(target, [prompt], Sampling(temperature), [generator], 128, 4, 3, 4, rule, cache))
    check_cache_after(target, cache, prompt, steps, 12)


# ---- sampling: exactness, statistically ------------------------------------------------------

PROMPT = [0, 1]


@pytest.fixture(scope="module")
def tiny_vocab():
    """A tiny-vocabulary target, and a pool that already holds, for every token, n-grams the
    target finds likely and unlikely: the first verification steps have a trie to walk (a fresh
    pool fills only once the window has N - 1 levels)."""
    model = random_gpt(vocab_size=V, n_ctx=16, n_layer=1, n_embd=16, scale=6.0, seed=1)
    order = lambda text: model(torch.tensor([text]))[0][0, -1].argsort(descending=True).tolist()
    pool = NgramPool(3)
    with torch.no_grad():
        for a in range(V):
            first, second = order(PROMPT + [a])[:2]
            pool.add((a, second, order(PROMPT + [a, second])[0]))
            pool.add((a, first, order(PROMPT + [a, first])[1]))
            pool.add((a, first, order(PROMPT + [a, first])[0]))  # most recent: tried first
    return model, pool, exact_distribution(model, PROMPT, SAMPLING, 3)


def lookahead_counts(tiny_vocab, n_samples):
    model, pool, _ = tiny_vocab
    def steps(seed):
        fresh = NgramPool(3)
        fresh.table = {a: dict(d) for a, d in pool.table.items()}  # each run starts from the same pool
        return lookahead(model, [PROMPT], SAMPLING, [torch.Generator().manual_seed(seed)], 16, 3, 3, 3, "pointmass",
                         pools=[fresh])
    counts, proposing = sample_counts(steps, n_samples)
    assert proposing == n_samples  # every run verified a trie
    return counts


@pytest.mark.slow
def test_sampled_lookahead_has_the_target_distribution_and_a_planted_bug_is_caught(tiny_vocab, monkeypatch):
    check_distribution(lambda n: lookahead_counts(tiny_vocab, n), tiny_vocab[2], monkeypatch)


# ---- command line ---------------------------------------------------------------------------

def test_cli_lookahead_equals_ar(model_file, capsys):
    check_cli_equals_ar(model_file, capsys, "a b a b a b a b", "lookahead",
                        [[], ["--window", "2", "--ngram", "4", "--guesses", "2"]])


@pytest.mark.parametrize("argv, message", [
    (["--window", "0"], "--window"), (["--ngram", "1"], "--ngram"), (["--guesses", "33"], "--guesses"),
    (["--window", "32", "--ngram", "3", "--guesses", "32"], "does not fit"), (["--accept", "lossless"], "pointmass")])
def test_cli_refuses_bad_lookahead_settings(model_file, argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        generate.main(["--prompt", "x", "--model", str(model_file), "--method", "lookahead"] + argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bench_runs_draft_free_methods(tmp_path, capsys):
    random_gpt(vocab_size=8192, n_ctx=320, scale=3.0).save(tmp_path / "target.safetensors")  # room for the prompts
    bench.main(["--methods", "lookahead:3,3,2,lookup:4", "--temperatures", "0,1", "--categories", "code",
                "--prompts-per-category", "1", "--max-new-tokens", "8", "--repeats", "1", "--no-hf", "--json",
                "--model", str(tmp_path / "target.safetensors")])
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["method"] for r in rows] == ["ar", "lookahead:3,3,2", "lookup:4"] * 2
    for r in rows:
        if r["temperature"] == 0:
            assert r["same_as_ar"] == 1
