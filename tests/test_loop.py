"""What the one loop (`decoding.decode`) guarantees whatever the method: a plain step is plain
decoding and nothing more; a size chosen anew every step keeps every method's greedy output plain
decoding's; each row of a batch takes its own size near the end of its context, so that its
tokens are its batch-1 tokens; and the figures of a run (`Result.stats`) mean what they say."""
import numpy as np
import pytest
import torch

from tinyspec.methods import METHODS
from tinyspec.methods.draft import DraftModel
from tinyspec.methods.eagle import EagleHead
from tinyspec.methods.parallel import ParallelHead
from tinyspec.methods.medusa import MedusaHeads
from tinyspec.methods.rest import Datastore
from tinyspec.model import GPT
from tinyspec.sampling import Sampling

from conftest import Coin, generations, random_gpt, random_heads
from test_speculative import perturbed

SPECULATIVE = [name for name in METHODS if name != "ar"]  # every method the loop runs, a new one too


@pytest.fixture(scope="module")
def target():
    return random_gpt(vocab_size=64, n_ctx=64, scale=3.0, seed=0)


def weights_for(target, kind):
    """Small random weights of each kind a method loads (`Proposer.weights`), for `target`."""
    if kind is GPT:  # a draft model close to the target
        return perturbed(target, 0.3, 1)
    if kind is MedusaHeads:
        heads = random_heads(target.config.n_embd, 3, seed=1)
        heads.accuracy = torch.tensor([[0.6, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.1]])  # made up: shapes the trees
        return heads
    if kind is EagleHead:
        torch.manual_seed(2)
        return EagleHead.for_target(target).eval()
    if kind is ParallelHead:
        from test_parallel import random_parallel
        return random_parallel(target, 2, 2.0, block=5)  # as deep as every size of the class
    if kind is Datastore:  # a corpus of the target's own greedy continuations, so that lookups match
        docs = [generations(target, None, [[a, b]], n=24)[0].token_ids for a, b in ((1, 2), (3, 4), (5, 6))]
        return Datastore(np.array([t for doc in docs for t in doc + [63]]), eot=63)
    raise AssertionError(f"a method loads {kind.__name__}: say here how to make a small random one")


def proposer(target, name, cls=None):
    """Method `name` over `target`, with small random weights (cls: a subclass of its class)."""
    cls = cls or METHODS[name]
    return cls(target) if cls.weights is None else cls(target, weights_for(target, cls.weights.kind))


# ---- (1) a plain step is plain decoding, and nothing more ---------------------------------------

class Plain(Coin):
    """A policy that could speculate (it promises every size of the method) but never does."""

    def choose(self, rows):
        return None


def spy(cls):
    """A subclass of method `cls` that records every call of `propose` and of the rule it hands
    the loop."""
    class Spy(cls):
        calls = []

        def propose(self, *args):
            self.calls.append("propose")
            return super().propose(*args)

        def rule(self, name):
            rule = super().rule(name)

            def recorded(*args):
                self.calls.append("rule")
                return rule(*args)
            return recorded
    return Spy


@pytest.mark.parametrize("name", SPECULATIVE)
@pytest.mark.parametrize("sampling", [Sampling(0.0), Sampling(1.0)], ids=["greedy", "sampled"])
def test_a_plain_step_is_plain_decoding_and_nothing_more(target, name, sampling):
    """Where the policy takes plain steps only, the method neither proposes nor judges (the rule
    judged nothing, yet ran every step: 5% of a pass), and the text is plain decoding's, row by
    row, greedy and sampled."""
    method = proposer(target, name, spy(METHODS[name]))
    prompts, seeds = [[3, 4], [5, 6, 7]], None if sampling.temperature == 0 else [1, 2]
    plain = generations(target, None, prompts, sampling, seeds, n=40)
    ours = generations(target, method, prompts, sampling, seeds, n=40, policy=Plain(METHODS[name].sizes))
    assert [r.token_ids for r in ours] == [r.token_ids for r in plain]
    assert method.calls == [] and all(r.sizes == {"0": 40} for r in ours)


# ---- (2) a size chosen at random every step ------------------------------------------------------

@pytest.mark.parametrize("name", SPECULATIVE)
def test_a_size_chosen_at_random_every_step_keeps_greedy_output_plain_decodings(target, name):
    prompts = [[3, 4], [9, 1, 9, 1, 9, 1, 9], list(range(20, 50))]  # the last reaches the end of the context
    coin = Coin(METHODS[name].sizes, seed=1)
    rows = generations(target, proposer(target, name), prompts, n=40, policy=coin)
    assert [r.token_ids for r in rows] == [r.token_ids for r in generations(target, None, prompts, n=40)]
    assert set(coin.chosen) == {None, *METHODS[name].sizes}  # plain steps and every size were taken
    assert sum(r.proposed for r in rows) > 0


# ---- (3) each row its own size, near the end of the context -------------------------------------

@pytest.mark.parametrize("sampling", [Sampling(0.0), Sampling(1.0)], ids=["greedy", "sampled"])
def test_rows_near_the_end_of_the_context_each_take_their_own_size(sampling):
    """A row whose context is nearly full proposes fewer tokens than k (what it has room for); the
    row beside it still proposes k. Neither row's text depends on the other: each is its batch-1
    text, token for token, sampled too (a row's k decides how many draws it takes)."""
    target = random_gpt(vocab_size=16, n_ctx=48, scale=3.0, seed=0)
    method = DraftModel(target, perturbed(target, 0.3, 1))
    prompts, seeds = [list(range(16)) * 2 + list(range(12)), [3, 5, 7]], [None, None]  # 44 and 3 tokens of 48
    if sampling.temperature:
        seeds = [1, 2]
    both = generations(target, method, prompts, sampling, None if seeds[0] is None else seeds, n=30, size="6")
    alone = [generations(target, method, [p], sampling, None if s is None else [s], n=30, size="6")[0]
             for p, s in zip(prompts, seeds)]
    assert [r.token_ids for r in both] == [r.token_ids for r in alone]
    assert [r.proposed for r in both] == [r.proposed for r in alone]  # each row proposed what it proposes alone
    assert [r.stop_reason for r in both] == ["context", "length"]
    assert alone[1].sizes["6"] > 0 and alone[1].proposed == 6 * alone[1].sizes["6"]  # the short row: always k = 6


# ---- (5) the figures of a run ---------------------------------------------------------------------

def test_stats_count_tokens_per_target_forward_and_acceptance_by_depth(target):
    plain = generations(target, None, [[3, 4]], n=40)[0].stats()
    assert plain["tau"] == 1.0 and plain["new_tokens"] == plain["target_steps"] == 40  # the prefill's token included
    assert "acceptance_by_depth" not in plain and "empty_steps" not in plain and plain["steps_by_size"] == {"0": 40}
    res = generations(target, proposer(target, "draft"), [[3, 4]], n=40, size="4")[0]
    stats = res.stats()
    assert stats["tau"] == pytest.approx(stats["new_tokens"] / stats["target_steps"], abs=1e-4) and stats["tau"] > 1
    by_depth = stats["acceptance_by_depth"]
    assert 0 < len(by_depth) <= 4 and all(1 >= a >= b for a, b in zip(by_depth, by_depth[1:]))  # deeper: rarer
    assert by_depth[0] + stats["empty_steps"] == pytest.approx(1.0, abs=1e-3)  # a step accepted something, or nothing
    assert stats["steps_by_size"] == {"0": 1, "4": res.target_steps - 1}  # the prefill, then steps of k = 4
