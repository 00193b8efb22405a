"""Batch > 1 against batch 1: every row of a batch must be what it would be alone. Greedy rows
equal plain decoding token for token (B = 1..8, prompts of mixed lengths, every method); sampled
rows equal their batch-1 run with the same generator, and have the target's distribution
(statistically, per row, with planted bugs that must be caught); each row's cache equals the one
plain decoding builds."""
import importlib
import json
import random

import pytest
import torch

from tinyspec import auto, bench, decoding, generate
from tinyspec.decoding import autoregressive, feed, run, run_batch
from tinyspec.eagle import eagle
from tinyspec.kvcache import KVCache
from tinyspec.lookahead import NgramPool, lookahead
from tinyspec.lookup import lookup
from tinyspec.medusa import medusa
from tinyspec.model import causal_mask, prefix_mask
from tinyspec.sampling import Sampling
from tinyspec.speculative import speculative
from tinyspec.tree import Tree

from conftest import counting_sequences, random_gpt, random_heads, random_tree
from test_eagle import random_head
from test_speculative import chi_square, critical_value, perturbed, save_target_and_draft
from test_verify import mutant

TOL = dict(atol=1e-5, rtol=1e-5)
speculative_module = importlib.import_module("tinyspec.speculative")  # the module; `speculative` is its loop
medusa_module = importlib.import_module("tinyspec.medusa")


# ---- the cache and the forward ----------------------------------------------------------------

def test_mask_is_the_docstring_example():
    cache = KVCache(1, 1, 1, 8, 2)
    cache.lengths = [3, 5]
    mask = cache.mask(causal_mask(2))
    assert mask.shape == (2, 2, 7)
    assert mask[0].int().tolist() == [[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0]]
    assert mask[1].int().tolist() == [[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]]


def test_rows_of_different_lengths_equal_their_own_single_caches():
    """Three sequences fed in one batch, in chunks of different sizes per row (a tree in one row),
    then truncated and compacted per row: each row's hidden states and cache equal those of the
    same tokens fed alone into a KVCache."""
    model = random_gpt(scale=3.0)
    rng = random.Random(0)
    texts = [[rng.randrange(64) for _ in range(n)] for n in (5, 11, 2)]
    cache = KVCache.for_model(model, 64, 3)
    with torch.no_grad():
        h = feed(model, cache, [torch.tensor(t) for t in texts])
        for b, t in enumerate(texts):
            torch.testing.assert_close(h[b], model.hidden(torch.tensor([t]))[0], **TOL)
        # row 0: 3 more tokens, of which 1 is kept; row 1: a tree [a, b (child of a), c (child of root)], path a, b
        # kept; row 2: one token
        tree = Tree((-1, 0, -1))
        feeds = [torch.tensor([40, 41, 42]), torch.tensor([7, 50, 51, 52]), torch.tensor([60])]
        feed(model, cache, feeds, [None, tree.tree_mask, None], [None, tree.depth, None])
        cache.truncate(6, 0)
        cache.keep([11, 12, 13], 1)
    expected = [texts[0] + [40], texts[1] + [7, 50, 51], texts[2] + [60]]
    assert cache.lengths == [len(t) for t in expected]
    for b, t in enumerate(expected):
        alone = KVCache.for_model(model, 64)
        with torch.no_grad():
            model(torch.tensor([t]), cache=alone)
        n = len(t)
        torch.testing.assert_close(cache.k[:, b, :, :n], alone.k[:, 0, :, :n], **TOL)
        torch.testing.assert_close(cache.v[:, b, :, :n], alone.v[:, 0, :, :n], **TOL)
    cache.select([0, 2])  # row 1 leaves; row 2 moves down to row 1
    assert cache.lengths == [6, 3]
    with torch.no_grad():
        alone = KVCache.for_model(model, 64)
        model(torch.tensor([expected[2]]), cache=alone)
    torch.testing.assert_close(cache.k[:, 1, :, :3], alone.k[:, 0, :, :3], **TOL)


def test_a_per_row_mask_is_the_same_forward_as_a_shared_one():
    """GPT.hidden with a (B, T, keys) mask whose rows are all prefix_mask(...) equals the (T, keys) one."""
    model = random_gpt(scale=3.0)
    x = torch.randint(0, 64, (2, 4))
    with torch.no_grad():
        c1, c2 = KVCache.for_model(model, 16, batch=2), KVCache.for_model(model, 16, batch=2)
        model(torch.randint(0, 64, (2, 5)), cache=c1)
        c2.k.copy_(c1.k), c2.v.copy_(c1.v)
        c2.length = c1.length
        shared = model.hidden(x, cache=c1, attn_mask=prefix_mask(causal_mask(4), 5))
        per_row = model.hidden(x, cache=c2, attn_mask=prefix_mask(causal_mask(4), 5).expand(2, 4, 9))
    torch.testing.assert_close(shared, per_row)


def test_cache_refuses_bad_rows_and_slots():
    cache = KVCache(1, 1, 2, 16, 3)
    cache.advance(5)
    for bad in (lambda: cache.keep([3, 2], 0), lambda: cache.keep([5], 1), lambda: cache.truncate(6, 2),
                lambda: cache.select([2, 0]), lambda: cache.select([0, 3]), lambda: cache.reset(4)):
        with pytest.raises(ValueError):
            bad()
    with torch.no_grad(), pytest.raises(ValueError, match="full"):
        random_gpt()(torch.zeros(1, 17, dtype=torch.long), cache=KVCache.for_model(random_gpt(), 16, 1),
                     positions=torch.arange(17)[None], attn_mask=causal_mask(17)[None])


# ---- every method, every row: its batch-1 output ----------------------------------------------

@pytest.fixture(scope="module")
def models(counting_gpt):
    """The trained counting model (proposals often accepted) with a draft, Medusa heads and an EAGLE
    head that are right often enough to accept long paths and wrong often enough to reject."""
    draft = perturbed(counting_gpt, 0.5, 1)
    return dict(target=counting_gpt, draft=draft, heads=random_heads(32, 3, seed=1), eagle=random_head(counting_gpt, 1, 3.0),
                tree=random_tree(10, 3, seed=0))


def methods(m, temperature: float):
    """name -> (batch-1 loop, batched loop), functions of (prompt(s), sampling, generator(s)); the
    batched one also takes the target's KVCache (default: its own)."""
    tree_rule = "greedy" if temperature == 0 else "lossless"
    fixed_rule = "greedy" if temperature == 0 else "pointmass"
    t = m["target"]
    return {
        "ar": (lambda p, s, g: autoregressive(t, [p], s, [g], 64),
               lambda ps, s, gs, c=None: autoregressive(t, ps, s, gs, 64, c)),
        "draft": (lambda p, s, g: speculative(t, m["draft"], [p], s, [g], 64, 3),
                  lambda ps, s, gs, c=None: speculative(t, m["draft"], ps, s, gs, 64, 3, c and (c, None))),
        "medusa": (lambda p, s, g: medusa(t, m["heads"], [p], s, [g], 64, m["tree"], tree_rule),
                   lambda ps, s, gs, c=None: medusa(t, m["heads"], ps, s, gs, 64, m["tree"], tree_rule, c)),
        "lookup": (lambda p, s, g: lookup(t, [p], s, [g], 64, 4, 3, fixed_rule),
                   lambda ps, s, gs, c=None: lookup(t, ps, s, gs, 64, 4, 3, fixed_rule, c)),
        "eagle": (lambda p, s, g: eagle(t, m["eagle"], [p], s, [g], 64, tree_rule, 2, 3, 6),
                  lambda ps, s, gs, c=None: eagle(t, m["eagle"], ps, s, gs, 64, tree_rule, 2, 3, 6, cache=c)),
        "lookahead": (lambda p, s, g: lookahead(t, [p], s, [g], 64, 3, 3, 2, fixed_rule),
                      lambda ps, s, gs, c=None: lookahead(t, ps, s, gs, 64, 3, 3, 2, fixed_rule, c)),
    }


METHODS = ["ar", "draft", "medusa", "lookup", "eagle", "lookahead"]


def mixed_prompts(n, seed):
    """Counting prompts and random ones, of lengths 1 to 40: the longest reach the end of the
    context (64) within 40 new tokens, so those rows stop early and the others go on."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = rng.choice([1, 3, 7, 12, 40])
        out.append(counting_sequences(1, length, 32, g)[0].tolist() if i % 2 else [rng.randrange(32) for _ in range(length)])
    return out


@pytest.mark.parametrize("name", METHODS)
def test_greedy_rows_equal_plain_decoding_at_every_batch_size(models, name):
    batched = methods(models, 0.0)[name][1]
    uneven = False  # some batch's rows accepted different numbers of proposals: they advanced unevenly
    for B in range(1, 9):
        prompts = mixed_prompts(B, seed=B)
        plain = [run(autoregressive(models["target"], [p], Sampling(0.0), [None], 64), 40) for p in prompts]
        rows = run_batch(batched(prompts, Sampling(0.0), [None] * B), B, 40)
        for b, (row, alone) in enumerate(zip(rows, plain)):
            assert row.token_ids == alone.token_ids, f"{name}, B={B}, row {b}, prompt {prompts[b]}"
            assert row.stop_reason == alone.stop_reason
        uneven |= len({r.accepted for r in rows}) > 1
    # the premise that makes the test worth running, whatever tokens this CPU's floats lead to
    assert name == "ar" or uneven


@pytest.mark.parametrize("name", METHODS)
def test_sampled_rows_equal_their_batch_one_run_with_the_same_generator(models, name):
    """Each row draws from its own generator in the order it would alone, so a batch of 6 rows
    writes, row by row, what 6 batch-1 runs with the same seeds write (float32; only a rounding
    difference in a forward could move a sample across a boundary, and none does here). Away
    from the end of the context: there the draft's k is the least any row has room for."""
    one, batched = methods(models, 1.0)[name]
    prompts, s = [p[:12] for p in mixed_prompts(6, seed=10)], Sampling(1.0)
    alone = [run(one(p, s, torch.Generator().manual_seed(i)), 30).token_ids for i, p in enumerate(prompts)]
    rows = run_batch(batched(prompts, s, [torch.Generator().manual_seed(i) for i in range(6)]), 6, 30)
    assert [r.token_ids for r in rows] == alone


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_rows_cache_equals_plain_decodings(models, name, temperature):
    """After 8 steps, row b of the cache holds exactly what plain decoding of row b's text builds."""
    t = models["target"]
    prompts = mixed_prompts(5, seed=20)
    cache = KVCache.for_model(t, 64 + 32, 5)
    loop = methods(models, temperature)[name][1]
    steps = loop(prompts, Sampling(temperature), [torch.Generator().manual_seed(i) for i in range(5)], cache)
    texts = [list(p) for p in prompts]
    produced = next(steps)
    for i in range(9):
        for row, step in produced.items():
            texts[row] += step.tokens
        if i < 8:
            produced = steps.send([])
    assert len(produced) >= 3  # most rows are still in the batch, the cache holding only theirs
    for b, row in enumerate(sorted(produced)):
        n = cache.lengths[b]
        assert n == len(texts[row]) - 1  # everything but the newest token, not fed yet
        alone = KVCache.for_model(t, 64)
        with torch.no_grad():
            for token in texts[row][:n]:
                t(torch.tensor([[token]]), cache=alone)
        torch.testing.assert_close(cache.k[:, b, :, :n], alone.k[:, 0, :, :n], **TOL)
        torch.testing.assert_close(cache.v[:, b, :, :n], alone.v[:, 0, :, :n], **TOL)


def stop_token_for_some_rows(target, prompts, n):
    """A stop token that some rows' plain continuations (n tokens) hold and others do not, picked
    from what this machine's model writes: which tokens a random model writes depends on float
    details of the CPU, so no fixed token can be relied on to end some rows and not others."""
    texts = [set(run(autoregressive(target, [p], Sampling(0.0), [None], 64), n).token_ids) for p in prompts]
    candidates = sorted(set.union(*texts) - set.intersection(*texts), key=lambda x: -sum(x in t for t in texts))
    assert candidates, "every row wrote the same tokens: no stop token ends some rows only"
    return candidates[0]


@pytest.mark.parametrize("name", METHODS)
def test_rows_that_are_done_leave_the_batch_and_the_rest_go_on(models, name):
    """Stopping at an end-of-text token ends rows at different steps; each row's tokens are still
    its plain-decoding tokens up to its stop, and once the driver says a row is done, the next
    forward computes for the others alone (the cache has fewer rows)."""
    t, prompts = models["target"], [p[:12] for p in mixed_prompts(6, seed=30)]  # room for 30 tokens each
    stop = stop_token_for_some_rows(t, prompts, 30)
    plain = [run(autoregressive(t, [p], Sampling(0.0), [None], 64), 30, stop_id=stop) for p in prompts]
    rows = run_batch(methods(models, 0.0)[name][1](prompts, Sampling(0.0), [None] * 6), 6, 30, stop_id=stop)
    assert [r.token_ids for r in rows] == [r.token_ids for r in plain]
    assert [r.stop_reason for r in rows] == [r.stop_reason for r in plain]
    assert {r.stop_reason for r in rows} == {"eot", "length"}
    cache = KVCache.for_model(t, 64 + 32, 6)
    steps = methods(models, 0.0)[name][1](prompts, Sampling(0.0), [None] * 6, cache)
    assert sorted(next(steps)) == list(range(6))
    produced = steps.send([1, 4])
    assert sorted(produced) == [0, 2, 3, 5] and cache.rows == 4


# ---- sampling: every row has the target's distribution ---------------------------------------

V = 8
SAMPLING = Sampling(1.0, top_k=4)  # 4 tokens per step: 64 three-token continuations
PROMPTS = [[0, 1, 2, 3, 4, 5, 6, 7, 0], [6, 2, 7, 1, 0, 5, 3, 4, 6, 2, 1, 0, 7, 5, 3, 4, 0]]  # rows alternate;
ROWS = 32  # every token occurs in both, so prompt lookup always proposes


@pytest.fixture(scope="module")
def tiny_vocab():
    from test_lookup import exact_distribution
    target = random_gpt(vocab_size=V, n_ctx=32, n_layer=1, n_embd=16, scale=6.0, seed=1)
    return dict(target=target, exact=[exact_distribution(target, p, SAMPLING, 3) for p in PROMPTS],
                draft=random_gpt(vocab_size=V, n_ctx=32, n_layer=1, n_embd=16, scale=6.0, seed=2),  # a poor draft
                heads=random_heads(16, 2, seed=2, scale=1.0), eagle=random_head(target, 2, 2.0), pools=seeded_pools(target))


def row_counts(steps_for, n_samples: int, n: int = 3):
    """Counts of each prompt's first n tokens over n_samples rows of it, ROWS rows a batch (prompts
    alternating), each row with its own seed; and the rows whose run proposed anything."""
    counts, proposing = [torch.zeros(V ** n) for _ in PROMPTS], 0
    for first in range(0, len(PROMPTS) * n_samples, ROWS):  # (n_samples a multiple of ROWS / len(PROMPTS))
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(ROWS)]
        rows = run_batch(steps_for(prompts, [torch.Generator().manual_seed(first + i) for i in range(ROWS)]), ROWS, n)
        for i, r in enumerate(rows):
            counts[i % len(PROMPTS)][sum(t * V ** (n - 1 - j) for j, t in enumerate(r.token_ids))] += 1
            proposing += r.proposed > 0
    return counts, proposing


def assert_rows_have_the_target_distribution(tiny, steps_for, n_samples=6000):
    counts, proposing = row_counts(steps_for, n_samples)
    for prompt, c, exact in zip(PROMPTS, counts, tiny["exact"]):
        stat, dof = chi_square(c, exact)
        assert stat < critical_value(dof), f"prompt {prompt}: chi-square {stat:.1f} with {dof} dof"
    return proposing


def assert_caught(tiny, steps_for, n_samples=3000):
    counts, _ = row_counts(steps_for, n_samples)
    stats = [chi_square(c, exact) for c, exact in zip(counts, tiny["exact"])]
    assert any(stat > 3 * critical_value(dof) for stat, dof in stats), f"{stats}: the planted bug went unnoticed"


def tiny_loop(tiny, name):
    t, s = tiny["target"], SAMPLING
    return {
        "ar": lambda ps, gs: autoregressive(t, ps, s, gs, 32),
        "draft": lambda ps, gs: speculative(t, tiny["draft"], ps, s, gs, 32, 2),
        "medusa": lambda ps, gs: medusa(t, tiny["heads"], ps, s, gs, 32, Tree((-1, -1, 0, 1)), "lossless"),
        "medusa-pointmass": lambda ps, gs: medusa(t, tiny["heads"], ps, s, gs, 32,
                                                              Tree((-1, -1, -1, 0, 0, 1), (0, 1, 2, 0, 1, 0)), "pointmass"),
        "lookup": lambda ps, gs: lookup(t, ps, s, gs, 32, 3, 2, "pointmass"),
        "eagle": lambda ps, gs: eagle(t, tiny["eagle"], ps, s, gs, 32, "lossless", 2, 2, 4),
        "lookahead": lambda ps, gs: lookahead(t, ps, s, gs, 32, 3, 3, 3, "pointmass",
                                                          pools=copies(tiny["pools"])),
    }[name]


def seeded_pools(target):
    """For each prompt, a pool that holds, for every token, one likely and one unlikely n-gram after
    it (a fresh pool fills only once the window is full), so the first steps verify a trie."""
    pools = []
    with torch.no_grad():
        for prompt in PROMPTS:
            pool = NgramPool(3)
            order = lambda text: target(torch.tensor([text]))[0][0, -1].argsort(descending=True).tolist()
            for a in range(V):
                first, second = order(prompt + [a])[:2]
                pool.add((a, second, order(prompt + [a, second])[0]))
                pool.add((a, first, order(prompt + [a, first])[0]))
            pools.append(pool)
    return pools


def copies(pools):
    """A fresh copy of its prompt's pool for each of ROWS rows: every row starts from the same pool."""
    out = []
    for i in range(ROWS):
        pool = NgramPool(pools[i % len(PROMPTS)].size)
        pool.table = {a: dict(d) for a, d in pools[i % len(PROMPTS)].table.items()}
        out.append(pool)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name, n_samples", [("ar", 6000), ("draft", 6000), ("medusa", 6000), ("medusa-pointmass", 6000),
                                             ("lookup", 6000), ("eagle", 3008), ("lookahead", 6000)])
def test_every_row_has_the_target_distribution(tiny_vocab, name, n_samples):
    """n_samples rows of each prompt (EAGLE and lookahead draft row by row, in Python: fewer)."""
    proposing = assert_rows_have_the_target_distribution(tiny_vocab, tiny_loop(tiny_vocab, name), n_samples)
    assert name == "ar" or proposing == len(PROMPTS) * n_samples  # every row verified proposals, not only plain steps


class Echo:
    """A chooser whose choice depends on what was drawn: a plain step after a step that accepted
    nothing, else the next of its shapes in turn. A size chosen from past acceptance, as
    `policy.Policy` chooses, must leave every row with the target's distribution."""

    def __init__(self, shapes: dict):
        self.shapes, self.largest, self.turn, self.last = shapes, max(shapes), 0, 1

    def choose(self, rows):
        if not self.last:
            self.last = 1
            return None
        self.turn += 1
        return list(self.shapes.values())[self.turn % len(self.shapes)]

    def update(self, accepted, shape, rows=None):
        self.last = sum(accepted)

    def reset(self):
        pass


@pytest.mark.slow
@pytest.mark.parametrize("name", ["draft", "eagle"])
def test_sizes_chosen_from_what_was_accepted_keep_the_target_distribution(tiny_vocab, name):
    t, s = tiny_vocab["target"], SAMPLING
    loop = {"draft": lambda ps, gs: speculative(t, tiny_vocab["draft"], ps, s, gs, 32, Echo({1: 1, 3: 3})),
            "eagle": lambda ps, gs: eagle(t, tiny_vocab["eagle"], ps, s, gs, 32, "lossless",
                                          total_tokens=Echo({4: (2, 2, 4), 3: (1, 3, 3)}))}[name]
    assert assert_rows_have_the_target_distribution(tiny_vocab, loop, 3008) > 0


@pytest.mark.slow
def test_a_draft_judged_with_another_rows_q_is_caught(tiny_vocab):
    """A planted batching bug: row b's proposals judged against q of row b - 1 (an off-by-one
    in the per-row loop). Rows of different prompts have different q: the output drifts."""
    bad = mutant(speculative_module, "speculative", "accept(p[b], q[b],", "accept(p[b], q[b - 1],")
    assert_caught(tiny_vocab, lambda ps, gs: bad(tiny_vocab["target"], tiny_vocab["draft"], ps, SAMPLING, gs, 32, 2))


@pytest.mark.slow
def test_a_tree_judged_with_another_rows_logits_is_caught(tiny_vocab, monkeypatch):
    """A planted batching bug: row b's tree judged by the target's logits of row b - 1."""
    monkeypatch.setattr(medusa_module, "verify_trees", mutant(decoding, "verify_trees", "inputs[b], all_logits[b],",
                                                              "inputs[b], all_logits[b - 1],"))
    assert_caught(tiny_vocab, tiny_loop(tiny_vocab, "medusa"))


# ---- --method auto: speculate or not, per step ------------------------------------------------

def accuracy_heads(seed=1):
    heads = random_heads(32, 3, seed=seed)
    heads.accuracy = torch.tensor([[0.6, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.1]])
    return heads


def costs(free_up_to: int):
    """A made-up machine: a forward costs 1 until it holds `free_up_to` tokens, then grows with
    them (as a memory-bound forward turns compute-bound); the heads cost 0.1 per row."""
    return (lambda rows, t: max(1.0, rows * t / free_up_to)), (lambda rows: 0.1 * rows)


def test_policy_speculates_where_it_pays_and_stops_where_it_does_not(counting_gpt):
    policy = auto.BatchPolicy(counting_gpt, accuracy_heads(), costs=costs(free_up_to=16))
    assert policy.choose(1) is not None  # at batch 1 a forward of 17 tokens costs what one of 1 does
    assert policy.choose(16) is None  # at batch 16 a tree multiplies the forward's cost
    for _ in range(30):  # the text at hand is much harder than held-out text: nothing is ever accepted
        policy.update([0, 0], policy.trees[2])
    assert policy.choose(1) is None


def test_probes_back_off_where_speculation_does_not_pay(counting_gpt):
    policy = auto.BatchPolicy(counting_gpt, accuracy_heads(), costs=costs(free_up_to=16), probe_every=4)
    for _ in range(20):
        policy.update([0], policy.trees[2])
    probes = [t is not None for t in (policy.choose(2) for _ in range(200))]
    assert sum(probes) == 8  # after 4, 8 and 16 plain steps, then every 32 (8 probe_every), not every 4th
    policy = auto.BatchPolicy(counting_gpt, accuracy_heads(), costs=costs(free_up_to=1))
    assert not any(policy.choose(4) for _ in range(100))  # where no tree could ever pay, no probes at all


def test_timed_steps_correct_the_costs(counting_gpt):
    """Forwards alone say a tree pays at batch 4; whole tree steps that take three times their forward
    (work the forward does not count) say it does not, and the policy follows the clock. The
    correction is per shape: plain steps timed at their forward keep no extra, and what steps cost
    at one batch size says nothing about another."""
    policy = auto.BatchPolicy(counting_gpt, accuracy_heads(), costs=costs(free_up_to=64))
    assert policy.choose(4) is not None
    for size, tree in policy.trees.items():
        policy.update([], tree, rows=4, seconds=3 * policy.seconds(size, 4))  # acceptance as promised
    policy.update([], None, rows=4, seconds=policy.seconds(0, 4))
    assert policy.choose(4) is None
    assert policy.extra[0, 4] == 0 and all(policy.extra[s, 4] > 0 for s in policy.trees)
    assert policy.choose(2) is not None  # not yet timed at 2 rows: the forwards decide


def test_slow_plain_steps_at_one_row_do_not_make_trees_pay_at_sixteen(counting_gpt):
    """A plain step at one row that takes ten times its forward (the per-step work of a loop, not
    of a row) must not make plain steps of sixteen rows look dear: there trees cost 17 forwards
    and the policy must stay plain (plain steps that are never chosen are never timed again)."""
    policy = auto.BatchPolicy(counting_gpt, accuracy_heads(), costs=costs(free_up_to=1))
    policy.update([], None, rows=1, seconds=10 * policy.seconds(0, 1))
    assert policy.choose(16) is None


class Coin(auto.BatchPolicy):
    """A policy that picks a tree or a plain step at random: medusa_batch must handle any sequence."""
    def choose(self, rows):
        return random.choice([None, *self.trees.values()])


def test_greedy_auto_equals_plain_decoding_whatever_the_policy_chooses(counting_gpt):
    random.seed(0)
    heads = accuracy_heads()
    policy = Coin(counting_gpt, heads, costs=costs(16))
    prompts = mixed_prompts(6, seed=40)
    plain = [run(autoregressive(counting_gpt, [p], Sampling(0.0), [None], 64), 40).token_ids for p in prompts]
    rows = run_batch(medusa(counting_gpt, heads, prompts, Sampling(0.0), [None] * 6, 64, policy), 6, 40)
    assert [r.token_ids for r in rows] == plain
    assert 0 < sum(r.proposed > 0 for r in rows)


def test_measured_policy_runs(counting_gpt):
    heads = accuracy_heads()
    policy = auto.BatchPolicy(counting_gpt, heads, max_rows=3)
    assert policy.F(3, 1) > 0 and policy.H(2) > 0
    prompts = mixed_prompts(3, seed=41)
    plain = [run(autoregressive(counting_gpt, [p], Sampling(0.0), [None], 64), 30).token_ids for p in prompts]
    rows = run_batch(medusa(counting_gpt, heads, prompts, Sampling(0.0), [None] * 3, 64, policy), 3, 30)
    assert [r.token_ids for r in rows] == plain


# ---- command lines -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("batch")
    target = save_target_and_draft(d, n_ctx=320)  # long enough for the benchmark's prompts
    heads = accuracy_heads(seed=0)
    heads.target_fingerprint = target.fingerprint()
    heads.save(d / "heads.safetensors")
    random_head(target, 2, 2.0).save(d / "eagle.safetensors")
    (d / "prompts.txt").write_text("def f(x):\nclass Stack:\n    return [i for i in range(10)] + [j * 2 for j in x]\n"
                                   "import os\nx = 1\n")
    return d


def generated(argv, capsys) -> list[list[int]]:
    generate.main(argv)
    return [json.loads(line)["token_ids"] for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("temperature", ["0", "1"])
def test_cli_batches_write_what_each_prompt_writes_alone(files, capsys, temperature):
    """generate --batch-size B: every prompt's tokens are its batch-1 tokens (sampled too: each row
    has its own generator, seeded as the prompt alone would be), for B that divides the five
    prompts and B that does not. Methods of a fixed size: a sized method's policy chooses from
    what all rows accept, so its sampled draws (not their distribution) depend on the batch; its
    greedy rows are plain decoding's whatever it chooses."""
    base = ["--prompt-file", str(files / "prompts.txt"), "--max-new-tokens", "12", "--model",
            str(files / "target.safetensors"), "--json", "--temperature", temperature]
    plain = generated(base, capsys)
    for flags in ([], ["--method", "draft", "--draft", str(files / "draft.safetensors"), "--k", "3"],
                  ["--method", "medusa", "--heads", str(files / "heads.safetensors"), "--tree-nodes", "8"],
                  ["--method", "lookup", "--k", "4"], ["--method", "lookahead", "--guesses", "2"],
                  ["--method", "eagle", "--eagle", str(files / "eagle.safetensors"), "--tree-nodes", "8"]):
        alone = generated(base + flags, capsys)
        if temperature == "0":
            assert alone == plain
        for size in ("2", "5"):
            assert generated(base + flags + ["--batch-size", size], capsys) == alone, f"{flags}, batch {size}"
    if temperature == "0":  # sized for the machine: whatever the policy chooses, plain decoding's tokens
        for flags in (["--method", "draft", "--draft", str(files / "draft.safetensors")], ["--method", "lookup"]):
            assert generated(base + flags + ["--batch-size", "2"], capsys) == plain, flags
    if temperature == "0":
        auto = generated(base + ["--method", "auto", "--heads", str(files / "heads.safetensors"), "--batch-size", "3"],
                         capsys)
        assert auto == plain


def test_cli_batch_prints_each_text_and_the_batch_rate(files, capsys):
    generate.main(["--prompt-file", str(files / "prompts.txt"), "--max-new-tokens", "6", "--model",
                   str(files / "target.safetensors"), "--batch-size", "4"])
    out, err = capsys.readouterr()
    assert out.startswith("=== prompt 1 of 5 ===\ndef f(x):") and "\n=== prompt 2 of 5 ===\nclass Stack:" in out
    assert err.count("[batch of 4:") == 1 and err.count("[batch of 1:") == 1


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "0"], "--batch-size"),
    (["--batch-size", "2", "--cuda-graph"], "batch size 1"),
    (["--batch-size", "2", "--attn", "triton"], "--attn torch"),
    (["--method", "auto", "--heads", "{d}/none.safetensors"], "not found")])
def test_cli_refuses_bad_batch_settings(files, argv, message, capsys):
    argv = [a.format(d=files) for a in argv]
    with pytest.raises(SystemExit) as e:
        generate.main(["--prompt", "x", "--model", str(files / "target.safetensors")] + argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bench_batch_curve_reports_every_method_at_every_size(files, capsys):
    bench.main(["--batch-sizes", "1,2,4", "--methods", "ar,medusa:4,lookup:4,auto", "--batch-prompts", "4",
                "--max-new-tokens", "8", "--repeats", "1", "--temperatures", "0", "--json", "--no-hf",
                "--model", str(files / "target.safetensors"), "--heads", str(files / "heads.safetensors")])
    report = json.loads(capsys.readouterr().out)
    rows = report["rows"]
    assert {(r["method"], r["batch_size"]) for r in rows} == {(m, b) for m in ("ar", "medusa:4", "lookup:4", "auto")
                                                               for b in (1, 2, 4)}
    for r in rows:
        assert r["same_as_ar"] == r["prompts"] == 4 and r["new_tokens"] == 32 and r["latency_s"] > 0
        assert r["tokens_per_s"] > 0 and (r["method"] != "ar" or r["speedup"] == 1)
    assert report["batch_sizes"] == [1, 2, 4]


def test_bench_refuses_auto_without_batch_sizes(files, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--methods", "ar,auto", "--model", str(files / "target.safetensors")])
    assert e.value.code == 2 and "--batch-sizes" in capsys.readouterr().err


def test_draft_rows_whose_prompt_fills_max_len_end_as_at_batch_one(models):
    """The draft loop's max_len is the shorter of the two models' contexts, so a valid prompt can
    reach it: at batch 1 a prompt of max_len tokens gets one token from the target alone and a
    longer one ends at once ("context"); in a batch those rows must do the same, and the others go on."""
    one, batched = methods(models, 0.0)["draft"]
    prompts = [list(range(32)) * 2 + [1, 2], [3, 4, 5], list(range(32)) * 2, [7] * 63]
    alone = [run(one(p, Sampling(0.0), None), 8) for p in prompts]
    rows = run_batch(batched(prompts, Sampling(0.0), [None] * 4), 4, 8)
    assert [(r.token_ids, r.stop_reason) for r in rows] == [(r.token_ids, r.stop_reason) for r in alone]
    assert (alone[0].token_ids, alone[0].stop_reason, alone[1].stop_reason) == ([], "context", "length")
    only_long = run_batch(batched(prompts[:1], Sampling(0.0), [None]), 1, 8)
    assert (only_long[0].token_ids, only_long[0].stop_reason) == ([], "context")
