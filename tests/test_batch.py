"""Batch > 1 against batch 1: every row of a batch must be what it would be alone. Greedy rows
equal plain decoding token for token (B = 1..8, prompts of mixed lengths, every method); sampled
rows equal their batch-1 run with the same generator, and have the target's distribution
(statistically, per row, with planted bugs that must be caught); each row's cache equals the one
plain decoding builds."""
import json
import random

import pytest
import torch

from tinyspec import decoding
from tinyspec.commands import generate
from tinyspec.bench import command as bench
from tinyspec.decoding import decode
from tinyspec.kvcache import feed
from tinyspec.methods.base import default_rule
from tinyspec.results import run_batch
from tinyspec.kvcache import KVCache
from tinyspec.methods import Decoder
from tinyspec.methods.draft import DraftModel
from tinyspec.methods.eagle import Eagle
from tinyspec.methods.lookahead import Lookahead, NgramPool
from tinyspec.methods.lookup import PromptLookup
from tinyspec.methods.medusa import Medusa
from tinyspec.model import causal_mask, prefix_mask
from tinyspec.sampling import Sampling
from tinyspec.speed import auto
from tinyspec.speed import policy as policy_module
from tinyspec.tree import Tree

from conftest import (Coin, assert_cache_holds, counting_sequences, generations, plain_tokens, random_gpt,
                      random_heads, random_tree, sampled_rows, token_counts)
from test_eagle import random_head
from test_lookahead import Seeded
from test_speculative import chi_square, critical_value, perturbed, save_target_and_draft
from test_verify import mutant

TOL = dict(atol=1e-5, rtol=1e-5)


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


def decoder(m, name: str) -> Decoder:
    """Method `name` over the models, at a fixed size, judged by the default rules (greedy at
    T = 0; above it lossless, or pointmass for fixed tokens)."""
    t = m["target"]
    proposer, size = {
        "ar": lambda: (None, None),
        "draft": lambda: (DraftModel(t, m["draft"]), "3"),
        "medusa": lambda: (Medusa(t, m["heads"], tree=m["tree"]), None),
        "lookup": lambda: (PromptLookup(t, 3), "4"),
        "eagle": lambda: (Eagle(t, m["eagle"]), "2,3,6"),
        "lookahead": lambda: (Lookahead(t), "3,3,2"),
    }[name]()
    return Decoder(t, proposer, size)


def loop(d: Decoder, prompts, sampling, generators, cache=None, max_new_tokens=1000, stop_id=None):
    """d's loop for a batch of prompts, with the target's KVCache given (to look inside it)."""
    return decode(d.target, d.proposer, prompts, sampling, generators, max_new_tokens, stop_id, d.shapes, d.policy,
                  default_rule(d.proposer, d.rule, sampling.temperature), cache)


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


@pytest.fixture(scope="module")
def plain_alone(models):
    """Plain decoding's Result for a prompt alone (batch 1, 40 tokens), decoded once per prompt:
    every method's rows are held to the same references."""
    done = {}

    def result(prompt):
        if tuple(prompt) not in done:
            done[tuple(prompt)] = generations(models["target"], None, [prompt], n=40)[0]
        return done[tuple(prompt)]
    return result


@pytest.mark.parametrize("name", METHODS)
def test_greedy_rows_equal_plain_decoding_at_every_batch_size(models, plain_alone, name):
    d = decoder(models, name)
    uneven = False  # some batch's rows accepted different numbers of proposals: they advanced unevenly
    for B in range(1, 9):
        prompts = mixed_prompts(B, seed=B)
        plain = [plain_alone(p) for p in prompts]
        rows = run_batch(d.batch_steps(prompts, Sampling(0.0), [None] * B, 40), B)
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
    difference in a forward could move a sample across a boundary, and none does here)."""
    d, s = decoder(models, name), Sampling(1.0)
    prompts = [p[:12] for p in mixed_prompts(6, seed=10)]
    alone = [run_batch(d.steps(p, s, torch.Generator().manual_seed(i), 30), 1)[0].token_ids for i, p in enumerate(prompts)]
    rows = run_batch(d.batch_steps(prompts, s, [torch.Generator().manual_seed(i) for i in range(6)], 30), 6)
    assert [r.token_ids for r in rows] == alone


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_rows_cache_equals_plain_decodings(models, name, temperature):
    """After 8 steps, row b of the cache holds exactly what plain decoding of row b's text builds."""
    t = models["target"]
    prompts = mixed_prompts(5, seed=20)
    cache = KVCache.for_model(t, 64 + 32, 5)
    steps = loop(decoder(models, name), prompts, Sampling(temperature), [torch.Generator().manual_seed(i) for i in range(5)],
                 cache)
    texts = [list(p) for p in prompts]
    produced = next(steps)
    for i in range(9):
        for row, step in produced.items():
            texts[row] += step.tokens
        if i < 8:
            produced = next(steps)
    assert len(produced) >= 3  # most rows are still in the batch, the cache holding only theirs
    for b, row in enumerate(sorted(produced)):
        assert cache.lengths[b] == len(texts[row]) - 1  # everything but the newest token, not fed yet
        assert_cache_holds(t, cache, texts[row], b)


def stop_token_for_some_rows(target, prompts, n):
    """A stop token that some rows' plain continuations (n tokens) hold and others do not, picked
    from what this machine's model writes: which tokens a random model writes depends on float
    details of the CPU, so no fixed token can be relied on to end some rows and not others."""
    texts = [set(plain_tokens(target, p, n)) for p in prompts]
    candidates = sorted(set.union(*texts) - set.intersection(*texts), key=lambda x: -sum(x in t for t in texts))
    assert candidates, "every row wrote the same tokens: no stop token ends some rows only"
    return candidates[0]


@pytest.mark.parametrize("name", METHODS)
def test_rows_that_are_done_leave_the_batch_and_the_rest_go_on(models, name):
    """Stopping at an end-of-text token ends rows at different steps; each row's tokens are still
    its plain-decoding tokens up to its stop, and once a row is done, the next forward computes
    for the others alone (the cache has fewer rows)."""
    t, prompts = models["target"], [p[:12] for p in mixed_prompts(6, seed=30)]  # room for 30 tokens each
    stop = stop_token_for_some_rows(t, prompts, 30)
    plain = [run_batch(Decoder(t).steps(p, Sampling(0.0), None, 30, stop), 1)[0] for p in prompts]
    d = decoder(models, name)
    rows = run_batch(d.batch_steps(prompts, Sampling(0.0), [None] * 6, 30, stop), 6)
    assert [r.token_ids for r in rows] == [r.token_ids for r in plain]
    assert [r.stop_reason for r in rows] == [r.stop_reason for r in plain]
    assert {r.stop_reason for r in rows} == {"eot", "length"}
    cache, live = KVCache.for_model(t, 64 + 32, 6), set(range(6))
    for produced in loop(d, prompts, Sampling(0.0), [None] * 6, cache, 30, stop):
        assert set(produced) == live and cache.rows == len(live)  # the rows still going, and only theirs computed
        live -= {row for row, step in produced.items() if step.stop}
    assert not live


# ---- sampling: every row has the target's distribution ---------------------------------------

V = 8
SAMPLING = Sampling(1.0, top_k=4)  # 4 tokens per step: 64 three-token continuations
PROMPTS = [[0, 1, 2, 3, 4, 5, 6, 7, 0], [6, 2, 7, 1, 0, 5, 3, 4, 6, 2, 1, 0, 7, 5, 3, 4, 0]]  # rows alternate;
# every token occurs in both, so prompt lookup always proposes


@pytest.fixture(scope="module")
def tiny_vocab():
    from test_lookup import exact_distribution
    target = random_gpt(vocab_size=V, n_ctx=32, n_layer=1, n_embd=16, scale=6.0, seed=1)
    return dict(target=target, exact=[exact_distribution(target, p, SAMPLING, 3) for p in PROMPTS],
                draft=random_gpt(vocab_size=V, n_ctx=32, n_layer=1, n_embd=16, scale=6.0, seed=2),  # a poor draft
                heads=random_heads(16, 2, seed=2, scale=1.0), eagle=random_head(target, 2, 2.0), pools=seeded_pools(target))


def row_counts(d: Decoder, n_samples: int, n: int = 3):
    """Counts of each prompt's first n tokens over n_samples rows of it, rows of batches (prompts
    alternating), each row with its own seed (`sampled_rows`); and the rows whose run proposed anything."""
    runs = sampled_rows(d, PROMPTS, SAMPLING, n_samples, n)
    return [token_counts(r, V, n) for r in runs], sum(res.proposed > 0 for r in runs for res in r)


def assert_rows_have_the_target_distribution(tiny, d, n_samples=6000):
    counts, proposing = row_counts(d, n_samples)
    for prompt, c, exact in zip(PROMPTS, counts, tiny["exact"]):
        stat, dof = chi_square(c, exact, V)
        assert stat < critical_value(dof), f"prompt {prompt}: chi-square {stat:.1f} with {dof} dof"
    return proposing


def assert_caught(tiny, d, n_samples=3000):
    counts, _ = row_counts(d, n_samples)
    stats = [chi_square(c, exact, V) for c, exact in zip(counts, tiny["exact"])]
    assert any(stat > 3 * critical_value(dof) for stat, dof in stats), f"{stats}: the planted bug went unnoticed"


def tiny_decoder(tiny, name):
    t = tiny["target"]
    proposer, size, rule = {
        "ar": lambda: (None, None, None),
        "draft": lambda: (DraftModel(t, tiny["draft"]), "2", None),
        "medusa": lambda: (Medusa(t, tiny["heads"], tree=Tree((-1, -1, 0, 1))), None, "lossless"),
        "medusa-pointmass": lambda: (Medusa(t, tiny["heads"], tree=Tree((-1, -1, -1, 0, 0, 1), (0, 1, 2, 0, 1, 0))), None,
                                     "pointmass"),
        "lookup": lambda: (PromptLookup(t, 2), "3", "pointmass"),
        "eagle": lambda: (Eagle(t, tiny["eagle"]), "2,2,4", "lossless"),
        "lookahead": lambda: (Seeded(t, tiny["pools"]), "3,3,3", "pointmass"),  # row i starts from pools[i % 2]
    }[name]()
    return Decoder(t, proposer, size, rule=rule)


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


@pytest.mark.slow
@pytest.mark.parametrize("name, n_samples", [("ar", 6000), ("draft", 6000), ("medusa", 6000), ("medusa-pointmass", 6000),
                                             ("lookup", 6000), ("eagle", 3008), ("lookahead", 6000)])
def test_every_row_has_the_target_distribution(tiny_vocab, name, n_samples):
    """n_samples rows of each prompt (EAGLE and lookahead draft row by row, in Python: fewer)."""
    proposing = assert_rows_have_the_target_distribution(tiny_vocab, tiny_decoder(tiny_vocab, name), n_samples)
    assert name == "ar" or proposing == len(PROMPTS) * n_samples  # every row verified proposals, not only plain steps


class Echo:
    """A policy whose choice depends on what was drawn: a plain step after a step that accepted
    nothing, else the next of its sizes in turn. A size chosen from past acceptance, as
    `policy.Policy` chooses, must leave every row with the target's distribution."""

    def __init__(self, sizes):
        self.promise, self.turn, self.last = dict.fromkeys(sizes, 1.0), 0, 1

    def choose(self, rows):
        if not self.last:
            self.last = 1
            return None
        self.turn += 1
        return list(self.promise)[self.turn % len(self.promise)]

    def update(self, accepted, size, rows):
        self.last = sum(accepted)

    def reset(self):
        pass

    def may_speculate(self, rows):
        return True


@pytest.mark.slow
@pytest.mark.parametrize("name", ["draft", "eagle"])
def test_sizes_chosen_from_what_was_accepted_keep_the_target_distribution(tiny_vocab, name):
    t = tiny_vocab["target"]
    proposer, sizes = {"draft": (DraftModel(t, tiny_vocab["draft"]), ["1", "3"]),
                       "eagle": (Eagle(t, tiny_vocab["eagle"]), ["2,2,4", "1,3,3"])}[name]
    d = Decoder(t, proposer, policy=Echo(sizes), rule="lossless")
    assert assert_rows_have_the_target_distribution(tiny_vocab, d, 3008) > 0


@pytest.mark.slow
def test_a_draft_judged_with_another_rows_q_is_caught(tiny_vocab, monkeypatch):
    """A planted batching bug: row b's proposals judged against q of row b - 1 (an off-by-one
    in the per-row loop). Rows of different prompts have different q: the output drifts."""
    from tinyspec.methods import draft as draft_module
    monkeypatch.setattr(DraftModel, "propose", mutant(draft_module, "propose", "torch.cat([q[b, :1], q[b, :kb]])",
                                                      "torch.cat([q[b, :1], q[b - 1, :kb]])", DraftModel))
    assert_caught(tiny_vocab, tiny_decoder(tiny_vocab, "draft"))


@pytest.mark.slow
def test_a_tree_judged_with_another_rows_logits_is_caught(tiny_vocab, monkeypatch):
    """A planted batching bug: row b's tree judged by the target's logits of row b - 1."""
    monkeypatch.setattr(decoding, "verify", mutant(decoding, "verify", "p[b], prop.tree", "p[b - 1], prop.tree"))
    assert_caught(tiny_vocab, tiny_decoder(tiny_vocab, "medusa"))


# ---- Medusa at --size auto in a batch: speculate or not, per step ------------------------------

def accuracy_heads(seed=1):
    heads = random_heads(32, 3, seed=seed)
    heads.accuracy = torch.tensor([[0.6, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.1]])
    return heads


def costs(free_up_to: int):
    """A made-up machine: a forward costs 1 until it holds `free_up_to` tokens, then grows with
    them (as a memory-bound forward turns compute-bound); the heads cost 0.1 per row."""
    return (lambda rows, t: max(1.0, rows * t / free_up_to)), (lambda rows: 0.1 * rows)


class Clock:
    """The policy's clock, made up: `seconds` pass between a step's choice and its update."""
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def timed_step(policy, clock, rows, size, seconds):
    """A step of `size` (None: plain) at `rows` rows that takes `seconds` by the policy's clock and
    accepts as promised (nothing reported)."""
    clock.now = 0.0
    policy.choose(rows)  # the step starts with its choice
    clock.now = seconds
    policy.update([], size, rows)


def test_policy_speculates_where_it_pays_and_stops_where_it_does_not(counting_gpt):
    policy = auto.BatchPolicy(counting_gpt, Medusa(counting_gpt, accuracy_heads()), costs=costs(free_up_to=16))
    assert policy.choose(1) is not None  # at batch 1 a forward of 17 tokens costs what one of 1 does
    assert policy.choose(16) is None  # at batch 16 a tree multiplies the forward's cost
    for _ in range(30):  # the text at hand is much harder than held-out text: nothing is ever accepted
        policy.update([0, 0], "2", 2)
    assert policy.choose(1) is None


def test_probes_back_off_where_speculation_does_not_pay(counting_gpt):
    policy = auto.BatchPolicy(counting_gpt, Medusa(counting_gpt, accuracy_heads()), costs=costs(free_up_to=16), probe_every=4)
    for _ in range(20):
        policy.update([0], "2", 1)
    probes = [t is not None for t in (policy.choose(2) for _ in range(200))]
    assert sum(probes) == 8  # after 4, 8 and 16 plain steps, then every 32 (8 probe_every), not every 4th
    policy = auto.BatchPolicy(counting_gpt, Medusa(counting_gpt, accuracy_heads()), costs=costs(free_up_to=1))
    assert not any(policy.choose(4) for _ in range(100))  # where no tree could ever pay, no probes at all


def test_timed_steps_correct_the_costs(counting_gpt, monkeypatch):
    """Forwards alone say a tree pays at batch 4; whole tree steps that take three times their forward
    (work the forward does not count) say it does not, and the policy follows the clock. The
    correction is per size: plain steps timed at their forward keep no extra, and what steps cost
    at one batch size says nothing about another."""
    clock = Clock()
    monkeypatch.setattr(policy_module, "time", clock)
    policy = auto.BatchPolicy(counting_gpt, Medusa(counting_gpt, accuracy_heads()), costs=costs(free_up_to=64))
    assert policy.choose(4) is not None
    for size in policy.promise:
        timed_step(policy, clock, 4, size, 3 * policy.seconds(size, 4))
    timed_step(policy, clock, 4, None, policy.seconds(None, 4))
    assert policy.choose(4) is None
    assert policy.extra[None, 4] == 0 and all(policy.extra[s, 4] > 0 for s in policy.promise)
    assert policy.choose(2) is not None  # not yet timed at 2 rows: the forwards decide


def test_slow_plain_steps_at_one_row_do_not_make_trees_pay_at_sixteen(counting_gpt, monkeypatch):
    """A plain step at one row that takes ten times its forward (the per-step work of a loop, not
    of a row) must not make plain steps of sixteen rows look dear: there trees cost 17 forwards
    and the policy must stay plain (plain steps that are never chosen are never timed again)."""
    clock = Clock()
    monkeypatch.setattr(policy_module, "time", clock)
    policy = auto.BatchPolicy(counting_gpt, Medusa(counting_gpt, accuracy_heads()), costs=costs(free_up_to=1))
    timed_step(policy, clock, 1, None, 10 * policy.seconds(None, 1))
    assert policy.choose(16) is None


def test_greedy_auto_equals_plain_decoding_whatever_the_policy_chooses(counting_gpt):
    """Medusa's trees of every size of `auto`, or a plain step, chosen at random every step: the
    batch must handle any sequence."""
    heads = accuracy_heads()
    prompts = mixed_prompts(6, seed=40)
    plain = [plain_tokens(counting_gpt, p, 40) for p in prompts]
    coin = Coin([str(s) for s in (2, 4, 8, 16)], seed=0)
    rows = generations(counting_gpt, Medusa(counting_gpt, heads), prompts, n=40, policy=coin)
    assert [r.token_ids for r in rows] == plain
    assert 0 < sum(r.proposed > 0 for r in rows) and None in coin.chosen


def test_measured_policy_runs(counting_gpt):
    heads = accuracy_heads()
    policy = auto.BatchPolicy(counting_gpt, Medusa(counting_gpt, heads), max_rows=3)
    assert policy.F(3, 1) > 0 and policy.H(2) > 0
    prompts = mixed_prompts(3, seed=41)
    plain = [plain_tokens(counting_gpt, p, 30) for p in prompts]
    rows = generations(counting_gpt, Medusa(counting_gpt, heads), prompts, n=30, policy=policy)
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
    prompts and B that does not, every method at its default size and at another. At --size auto
    the policy chooses from what all rows accept, so its sampled draws (not their distribution)
    depend on the batch; its greedy rows are plain decoding's whatever it chooses."""
    base = ["--prompt-file", str(files / "prompts.txt"), "--max-new-tokens", "12", "--model",
            str(files / "target.safetensors"), "--json", "--temperature", temperature]
    plain = generated(base, capsys)
    for flags in ([], ["--method", "draft", "--draft", str(files / "draft.safetensors"), "--size", "3"],
                  ["--method", "draft", "--draft", str(files / "draft.safetensors")],
                  ["--method", "medusa", "--heads", str(files / "heads.safetensors"), "--size", "8"],
                  ["--method", "lookup", "--size", "4"], ["--method", "lookahead"],
                  ["--method", "eagle", "--eagle", str(files / "eagle.safetensors"), "--size", "2,3,8"]):
        alone = generated(base + flags, capsys)
        if temperature == "0":
            assert alone == plain
        for size in ("2", "5"):
            assert generated(base + flags + ["--batch-size", size], capsys) == alone, f"{flags}, batch {size}"
    if temperature == "0":  # sized for the machine: whatever the policy chooses, plain decoding's tokens
        for flags in (["--method", "draft", "--draft", str(files / "draft.safetensors")], ["--method", "lookup"]):
            assert generated(base + flags + ["--size", "auto", "--batch-size", "2"], capsys) == plain, flags
        auto = generated(base + ["--method", "medusa", "--size", "auto", "--heads", str(files / "heads.safetensors"),
                                 "--batch-size", "3"], capsys)  # Medusa's batch policy (speed/auto.py)
        assert auto == plain


def test_sizing_progress_reads_as_lines_in_a_log(files, capsys):
    """Where stderr is a file (a log, or here captured), sizing's progress is whole lines, each said
    once: no carriage returns that run its messages together, no line saying "sizing" twice or
    alone. Medusa sized for a batch, then the draft sized anew at batch 1, then the benchmark."""
    target = str(files / "target.safetensors")
    base = ["--prompt-file", str(files / "prompts.txt"), "--max-new-tokens", "2", "--model", target, "--size", "auto"]
    generate.main(base + ["--method", "medusa", "--heads", str(files / "heads.safetensors"), "--batch-size", "3"])
    err = capsys.readouterr().err
    generate.main(base + ["--method", "draft", "--draft", str(files / "draft.safetensors"), "--remeasure"])
    err += capsys.readouterr().err
    bench.main(["--methods", "ar,lookup:auto", "--categories", "code", "--prompts-per-category", "1", "--max-new-tokens",
                "4", "--repeats", "1", "--temperatures", "0", "--no-hf", "--remeasure", "--model", target])
    err += capsys.readouterr().err
    sizing = [line for line in err.split("\n") if "sizing" in line]
    assert not [line for line in sizing if "\r" in line], sizing
    assert err.count("sizing medusa for this device") == 1 and err.count("sizing draft for this device") == 1
    assert "sizing draft at T = 0: prompt 1 of" in err and "sizing lookup at T = 0: prompt 1 of" in err
    assert "sizing" not in [line.strip() for line in sizing] and len(sizing) == len(set(sizing)), sizing


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
    (["--method", "medusa", "--size", "auto", "--batch-size", "2", "--heads", "{d}/none.safetensors"], "not found")])
def test_cli_refuses_bad_batch_settings(files, argv, message, capsys):
    argv = [a.format(d=files) for a in argv]
    with pytest.raises(SystemExit) as e:
        generate.main(["--prompt", "x", "--model", str(files / "target.safetensors")] + argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bench_batch_curve_reports_every_method_at_every_size(files, capsys):
    bench.main(["--batch-sizes", "1,2,4", "--methods", "ar,medusa:4,lookup:4,medusa:auto", "--batch-prompts", "4",
                "--max-new-tokens", "8", "--repeats", "1", "--temperatures", "0", "--json", "--no-hf",
                "--model", str(files / "target.safetensors"), "--heads", str(files / "heads.safetensors")])
    report = json.loads(capsys.readouterr().out)
    rows = report["rows"]
    assert {(r["method"], r["batch_size"]) for r in rows} == {(m, b) for m in ("ar", "medusa:4", "lookup:4", "medusa:auto")
                                                               for b in (1, 2, 4)}
    assert report["forward_ms"] and report["heads_ms"]  # what Medusa's batch policy measured
    for r in rows:
        assert r["same_as_ar"] == r["prompts"] == 4 and r["new_tokens"] == 32 and r["latency_s"] > 0
        assert r["tokens_per_s"] > 0 and (r["method"] != "ar" or r["speedup"] == 1)
    assert report["batch_sizes"] == [1, 2, 4]


def test_the_old_auto_method_is_refused_with_its_new_name(files, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--methods", "ar,auto", "--model", str(files / "target.safetensors")])
    assert e.value.code == 2 and "auto: sized for this device" in capsys.readouterr().err


def test_draft_rows_whose_prompt_fills_the_context_end_as_at_batch_one(counting_gpt):
    """The loop's context is the shorter of the two models' (a draft of 48 positions here, the
    target's 64), so a valid prompt can reach it: a row whose prompt fills it (or passes it) gets
    its first token from the target alone and ends ("context"), one just short of it a plain step
    more; in a batch those rows must do the same, and the others go on."""
    d = Decoder(counting_gpt, DraftModel(counting_gpt, random_gpt(vocab_size=32, n_ctx=48, seed=4)), "3")
    prompts = [list(range(32)) + list(range(28)), [3, 4, 5], list(range(32)) + list(range(16)), [7] * 47]
    alone = [run_batch(d.steps(p, Sampling(0.0), None, 8), 1)[0] for p in prompts]
    rows = run_batch(d.batch_steps(prompts, Sampling(0.0), [None] * 4, 8), 4)
    assert [(r.token_ids, r.stop_reason) for r in rows] == [(r.token_ids, r.stop_reason) for r in alone]
    assert [len(r.token_ids) for r in alone] == [1, 8, 1, 2]
    assert [r.stop_reason for r in alone] == ["context", "length", "context", "context"]
    assert [r.token_ids for r in alone] == [plain_tokens(counting_gpt, p, 8)[:len(r.token_ids)]
                                            for p, r in zip(prompts, alone)]
