"""Lookahead decoding against plain decoding: the mask and positions of the lookahead branch
against plain forwards over the text each guess sees, greedy output token for token over many
window shapes, the cache afterwards, the sampled distribution (statistically, with a planted
bug that must be caught), and the command lines."""
import json
import random

import pytest
import torch

from tinyspec.commands import generate
from tinyspec.bench import command as bench
from tinyspec.decoding import Fed, Proposal, Row, verify
from tinyspec.kvcache import KVCache
from tinyspec.methods import Decoder
from tinyspec.methods.lookahead import Lookahead, NgramPool, slide, step_inputs, step_mask, trie, window_mask
from tinyspec.sampling import Sampling
from tinyspec.tree import Tree
from tinyspec.verify import RULES

from conftest import assert_cache_holds, counting_sequences, generations, plain_tokens, random_gpt
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
    target's distribution at every trie node, equal those of plain forwards over the text each one
    sees, when the loop verifies what `step_inputs` lays out (`decoding.verify`)."""
    target = random_gpt(vocab_size=64, n_ctx=64, scale=3.0, seed=3)
    prefix, root = [5, 9, 2, 7], 11
    grid = [[root, 3, 8, 1], [4, 6, 2, 9], [10, 12, 13, 14]]  # 3 levels, W = 4
    nodes, parents = trie([(20, 21, 22), (20, 23, 24), (25, 26, 27)])
    cache = KVCache.for_model(target, 64)
    target(torch.tensor([prefix]), cache=cache)
    calls = []
    rule = lambda tokens, p, tree, q, generator: calls.append(p) or RULES["greedy"](tokens, p, tree)
    tree = Tree(parents)
    x, mask, offsets, at = step_inputs(grid, nodes, tree, torch.device("cpu"))
    row = Row(0, prefix + [root], None, torch.tensor(root))
    proposal = Proposal(x[len(x) - len(nodes):], tree, None, Fed(x, mask, offsets, at))
    [v] = verify(target, cache, [row], [proposal], rule, Sampling(1.0), "4,4,3")  # ONE forward: root, window, trie
    top = target.lm_head(v.hidden[2 * 4:3 * 4])  # the top level's outputs
    logits_after = lambda text: target(torch.tensor([text]))[0][0, -1]
    for c in range(4):  # guess (2, c) sees level 0 up to column c, then its own column
        expected = logits_after(prefix + grid[0][:c + 1] + [grid[1][c], grid[2][c]])
        torch.testing.assert_close(top[c], expected, atol=1e-4, rtol=1e-4, msg=f"column {c}")
    p = calls[0]  # (T+1, V): the target's distribution after the root and after each node
    paths = {0: [root]}
    for i, (token, parent) in enumerate(zip(nodes, parents)):
        paths[i + 1] = paths[parent + 1] + [token]
    for i, text in paths.items():
        expected = Sampling(1.0).probs(target(torch.tensor([prefix + text]))[0][0, -1])
        torch.testing.assert_close(p[i], expected, atol=1e-5, rtol=1e-4)
    assert cache.length == len(prefix) + len(v.step.tokens)  # the root and the accepted nodes only
    assert_cache_holds(target, cache, prefix + [root] + v.step.tokens)


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
    with counting and random prompts; up to 60 tokens in the counting model's context of 64, so its
    last steps may have no room for the window and are plain."""
    rng = random.Random(window * 10 + ngram)
    g = torch.Generator().manual_seed(window * 10 + ngram)
    runs = [(counting_gpt, counting_sequences(1, rng.randint(3, 10), 32, g)[0].tolist()) for _ in range(3)]
    runs += [(counting_gpt, [rng.randrange(32) for _ in range(rng.randint(1, 10))])]
    runs += [(target, [rng.randrange(64) for _ in range(rng.randint(1, 12))]) for _ in range(2)]
    accepted = rejected = 0
    for model, prompt in runs:
        res = generations(model, Lookahead(model), [prompt], n=50, size=f"{window},{ngram},{guesses}")[0]
        assert res.token_ids == plain_tokens(model, prompt, 50), f"W={window}, N={ngram}, G={guesses}, prompt {prompt}"
        accepted, rejected = accepted + res.accepted, rejected + res.rejections
    assert accepted > 10 and rejected > 10  # n-grams from the window were verified, and both ways


def test_greedy_lookahead_runs_to_the_end_of_the_context(target):
    prompt = [i % 64 for i in range(100)]
    plain = generations(target, None, [prompt], n=40)[0]
    res = generations(target, Lookahead(target), [prompt], n=40, size="4,3,4")[0]
    assert res.token_ids == plain.token_ids and res.stop_reason == plain.stop_reason == "context"


@pytest.mark.parametrize("temperature, rule", [(0.0, "greedy"), (1.0, "pointmass")])
def test_cache_after_lookahead_steps_equals_plain_decoding(target, temperature, rule):
    check_cache_after(target, Decoder(target, Lookahead(target), "4,3,4", rule=rule), [3, 5, 7, 9],
                      Sampling(temperature), 12)


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


class Seeded(Lookahead):
    """Lookahead whose rows start with a copy of a pool (row i: pools[i % len(pools)]) instead of an
    empty one, so that the first steps verify a trie (a fresh pool fills only once the window is full)."""

    def __init__(self, target, pools):
        super().__init__(target)
        self.pools = pools

    def start(self, rows, hidden, slots):
        super().start(rows, hidden, slots)
        for r in rows:
            pool = self.pools[r.id % len(self.pools)]
            r.state.pool.size, r.state.pool.table = pool.size, {a: dict(d) for a, d in pool.table.items()}


def lookahead_counts(tiny_vocab, n_samples):
    model, pool, _ = tiny_vocab
    d = Decoder(model, Seeded(model, [pool]), "3,3,3", rule="pointmass")  # each run starts from the same pool
    counts, proposing = sample_counts(d, PROMPT, n_samples)
    assert proposing == n_samples  # every run verified a trie
    return counts


@pytest.mark.slow
def test_sampled_lookahead_has_the_target_distribution_and_a_planted_bug_is_caught(tiny_vocab, monkeypatch):
    check_distribution(lambda n: lookahead_counts(tiny_vocab, n), tiny_vocab[2], monkeypatch)


# ---- command line ---------------------------------------------------------------------------

def test_cli_lookahead_equals_ar(model_file, capsys):
    check_cli_equals_ar(model_file, capsys, "a b a b a b a b", "lookahead",
                        [[], ["--size", "2,4,2"], ["--size", "auto"]])


@pytest.mark.parametrize("argv, message", [
    (["--size", "0,3,2"], "W must be in 1..32"), (["--size", "3,1,2"], "N must be in 2..8"),
    (["--size", "3,3,33"], "G must be in 1..32"), (["--size", "32,3,32"], "does not fit"),
    (["--accept", "lossless", "--temperature", "1"], "pointmass")])
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
