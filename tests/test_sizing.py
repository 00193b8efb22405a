"""Speculation sized to the device (sizing.py) and chosen step by step (policy.py): the measurement,
its cache, the choice it makes and the cost model's prediction, on made-up numbers where the
answer is known, and on small random models where only its form is."""
import json

import pytest
import torch

from tinyspec.decoding import PLAIN
from tinyspec.results import run
from tinyspec.methods import Decoder
from tinyspec.methods.draft import DraftModel
from tinyspec.methods.lookahead import Lookahead
from tinyspec.methods.lookup import PromptLookup
from tinyspec.methods.medusa import Medusa
from tinyspec.sampling import Sampling
from tinyspec.speed import policy as policy_module
from tinyspec.speed import sizing
from tinyspec.speed.policy import Policy
from tinyspec.speed.sizing import Sizing

from conftest import plain_tokens, random_gpt, random_heads
from test_speculative import perturbed


FORWARD = {"1": 0.007, "2": 0.008, "4": 0.010, "8": 0.014}  # F(n) = 0.006 + 0.001 n


def made_up(plain_s=1.0, **rows) -> Sizing:
    """A Sizing of a draft with C (seconds) and A (accepted) per k given as k=(C, A); its steps fed
    k + 1 tokens each, and F(n) = 0.006 + 0.001 n seconds."""
    return Sizing("draft", plain_s, [{"size": k[1:], "steps": 10, "seconds": c, "accepted": a,
                                      "forward_s": 0.006 + 0.001 * (int(k[1:]) + 1)} for k, (c, a) in rows.items()],
                  FORWARD)


def test_the_fastest_predicted_size_is_chosen():
    s = made_up(k1=(1.2, 0.8), k2=(1.4, 1.5), k4=(2.0, 2.0))  # (1 + A) / C: 1.50, 1.79, 1.50
    assert s.chosen()["size"] == "2" and s.speedup(s.chosen()) == pytest.approx(2.5 / 1.4)
    assert "auto: 2, predicted 1.79x" in s.describe()


def test_where_no_size_pays_plain_steps_are_chosen():
    s = made_up(k1=(2.5, 0.9), k2=(3.0, 1.5))  # 0.76x and 0.83x
    assert s.chosen() is None and "no size pays" in s.describe() and "0.83x" in s.describe()
    policy = s.policy()
    assert policy.choose(1) is None  # the policy agrees: a plain step


def test_the_menu_leaves_out_sizes_never_measured():
    s = Sizing("eagle", 1.0, [{"size": "2,6,16", "steps": 5, "seconds": 2.0, "accepted": 3.0},
                              {"size": "4,4,16", "steps": 5, "seconds": 2.0, "accepted": 3.5},
                              {"size": "2,4,8", "steps": 0, "seconds": None, "accepted": 0.0}])
    assert list(s.menu()) == ["2,6,16", "4,4,16"] and s.chosen()["size"] == "4,4,16"
    assert s.step_s("0", 1) == 1.0 and s.step_s("2,4,8", 9) is None
    assert set(s.policy().promise) == {"2,6,16", "4,4,16"}


def test_the_cost_model_adds_up_each_step_at_its_measured_cost():
    s = made_up(plain_s=0.01, k2=(0.015, 1.0), k4=(0.02, 2.0))
    # 2 prompts: their prefills (0.05 s in all) gave one token each; then 3 plain steps, 4 of k = 2, 5 of k = 4
    fed = {("0", 1): 5, ("2", 3): 4, ("4", 5): 5}
    assert s.predicted_s(fed, prompts=2, prefill_s=0.05) == pytest.approx(0.05 + 0.03 + 0.06 + 0.1)
    # a step of k = 4 that fed 3 tokens (a chain cut short) costs what F saves on 2 tokens less: 0.02 - 0.002
    assert s.step_s("4", 3) == pytest.approx(0.018)
    assert s.predicted_s({("0", 1): 5, ("4", 3): 2}, prompts=2, prefill_s=0.0) == pytest.approx(0.03 + 0.036)


def test_the_forward_cost_is_interpolated_between_the_widths_measured():
    s = made_up()
    assert s.forward_s(1) == 0.007 and s.forward_s(4) == 0.010  # measured
    assert s.forward_s(3) == pytest.approx(0.009) and s.forward_s(6) == pytest.approx(0.012)  # between
    assert s.forward_s(12) == pytest.approx(0.018)  # past the widest: its last slope


def test_the_policy_speculates_less_where_the_text_accepts_less():
    """Held-out text promised A(k); text that accepts half as much makes the cheaper k the faster."""
    policy = Policy({"2": 1.5, "6": 3.0}, lambda size, rows: {None: 1.0, "2": 1.3, "6": 2.0}[size])
    assert policy.choose(1) == "6"  # (1 + 3) / 2 = 2.0 against (1 + 1.5) / 1.3 = 1.92
    for _ in range(40):
        policy.update([1], "6", 1)  # a third of the promise
    assert 0.3 < policy.a < 0.4 and policy.choose(1) == "2"  # (1 + 1.0) / 2 against (1 + 0.5) / 1.3


def test_a_size_that_merely_ties_with_a_plain_step_is_not_taken():
    """Costs are measured to a few percent: a size must promise 5% more tokens/s than a plain step."""
    cost = lambda size, rows: {None: 1.0, "2": 1.5}[size]
    assert Policy({"2": 0.53}, cost).choose(1) is None  # (1 + 0.53) / 1.5 = 1.02 plain steps' rate
    assert Policy({"2": 0.65}, cost).choose(1) == "2"  # 1.10
    assert Policy({"2": 0.53}, cost, margin=1.0).choose(1) == "2"
    s = made_up(k2=(1.5, 0.53))  # what sizing reports agrees with what the policy does
    assert s.chosen() is None and "1.02x" in s.describe() and s.policy().choose(1) is None


class Clock:
    """The policy module's clock, made up: it reads whatever `now` is set to."""
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_a_cold_first_step_does_not_shut_a_size_out(monkeypatch):
    """Sizing's costs are whole steps, the mean of many: one slow step (the first of a process runs
    cold) must not price a size out for good, since a size no longer chosen is never timed again."""
    clock = Clock()
    monkeypatch.setattr(policy_module, "time", clock)
    policy = made_up(k2=(1.4, 1.5), k4=(2.0, 2.0)).policy()
    assert policy.choose(1) == "2"
    clock.now += 14.0  # ten times the step's measured cost
    policy.update([2], "2", 1)
    policy.choose(1)
    clock.now += 0.1  # and a plain step ten times cheaper
    policy.update([], None, 1)
    assert policy.choose(1) == "2" and policy.seconds("2", 1) == 1.4 and policy.seconds(None, 1) == 1.0


@pytest.fixture(scope="module")
def models():
    target = random_gpt(vocab_size=64, n_ctx=128, scale=4.0)
    return target, perturbed(target, 0.05, 1)


def prompts(n=3):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 64, (12,), generator=g).tolist() for _ in range(n)]


def test_measure_times_every_size_and_counts_what_it_accepted(models):
    target, draft = models
    proposer = DraftModel(target, draft)
    lines = []
    sizes = sizing.candidates(proposer, target.config.n_ctx)
    s = sizing.measure(target, proposer, None, prompts(), Sampling(0.0), sizes, new_tokens=24, progress=lines.append)
    assert [r["size"] for r in s.shapes] == sizes == list(DraftModel.sizes) and s.plain_s > 0
    assert lines == ["sizing draft at T = 0: warming up"] + [f"sizing draft at T = 0: prompt {i} of 3" for i in (1, 2, 3)]
    for r in s.shapes:
        assert r["steps"] > 0 and r["seconds"] > 0 and 0 <= r["accepted"] <= int(r["size"])


def test_sizes_are_measured_once_and_read_after(models, tmp_path, monkeypatch):
    target, draft = models
    monkeypatch.setattr(sizing, "NOISE", float("inf"))  # the reading, not the check of a busy machine (below)
    proposer = DraftModel(target, draft)
    first = sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, sizes=["1", "2"])
    assert first.measured_s > 0 and len(list(tmp_path.iterdir())) == 1
    again = sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, sizes=["1", "2"])
    assert again.measured_s == 0 and again.shapes == first.shapes and "measured earlier" in again.describe()
    sampled = sizing.size(target, proposer, None, prompts(), Sampling(1.0), tmp_path, sizes=["1", "2"])
    assert sampled.measured_s > 0 and len(list(tmp_path.iterdir())) == 2  # another sampling: another measurement
    Path = type(tmp_path)
    Path(first.path).write_text("{not json")  # a damaged file is measured again, and written anew
    repaired = sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, sizes=["1", "2"])
    assert repaired.measured_s > 0 and json.loads(Path(first.path).read_text())["key"] == first.key
    forced = sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, remeasure=True, sizes=["1", "2"])
    assert forced.measured_s > 0


def test_sized_methods_decode_what_plain_decoding_does(models):
    """Whatever the measurement chooses, each step of its policy is exact: greedy output is plain
    decoding's for every method (Medusa's trees come from the heads' accuracies)."""
    target, draft = models
    heads = random_heads(32, 3, seed=1)
    heads.accuracy = torch.tensor([[0.6, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.1]])
    plain = [plain_tokens(target, p, 30) for p in prompts()]
    for proposer in (DraftModel(target, draft), Medusa(target, heads), PromptLookup(target), Lookahead(target)):
        sizes = sizing.candidates(proposer, target.config.n_ctx)
        s = sizing.measure(target, proposer, None, prompts(2), Sampling(0.0), sizes, new_tokens=16)
        d = Decoder(target, proposer, policy=s.policy())
        assert [run(d.steps(p, Sampling(0.0), None, 30)).token_ids for p in prompts()] == plain, proposer.name


def test_a_method_that_never_proposed_takes_plain_steps():
    """A lookup that found nothing on the sizing prompts: nothing to choose, so plain steps."""
    s = Sizing("lookup", 1.0, [{"size": "4", "steps": 0, "seconds": None, "accepted": 0.0}])
    assert s.chosen() is None and "plain steps" in s.describe()
    policy = s.policy()
    assert all(policy.choose(1) is None for _ in range(100))  # not even a probe: nothing was ever measured to pay


def test_a_method_no_size_of_which_can_pay_runs_plain_decodings_loop(models):
    """Where no size pays even at held-out acceptance, a never leaves 1 and no probe is made: every
    step would be plain, so the method runs plain decoding's loop itself, without its own
    bookkeeping; where a size pays at held-out acceptance, the method's own loop runs."""
    target, draft = models
    never, pays = made_up(k2=(3.0, 1.5)), made_up(k2=(1.2, 1.5))  # 0.83x and 2.08x of plain decoding
    plain = plain_tokens(target, prompts()[0], 20)
    for s, own_loop in ((never, False), (pays, True)):
        policy, asked = s.policy(), []
        choose = policy.choose
        policy.choose = lambda rows: asked.append(rows) or choose(rows)  # the loop asks every step
        d = Decoder(target, DraftModel(target, draft), policy=policy)
        assert run(d.steps(prompts()[0], Sampling(0.0), None, 20)).token_ids == plain
        assert bool(asked) == own_loop


def test_no_prediction_for_a_size_sizing_never_timed():
    """A fixed size that never proposed on the sizing prompts has no measured cost: the benchmark's
    prediction for a pass that took it is None, not a crash; plain steps are still predicted."""
    s = Sizing("lookup", 1.0, [{"size": "4", "steps": 0, "seconds": None, "accepted": 0.0, "forward_s": None}], FORWARD)
    assert s.predicted_s({("0", 1): 5, ("4", 5): 3}, 1, 0.5) is None
    assert s.predicted_s({("0", 1): 5}, 1, 0.5) == 0.5 + 4 * 1.0


# A sizing measured while the machine was busy steered every later run


def planted(path, plain=1.0, steps=1.0, **fields):
    """Rewrite the cached sizing at `path` as a machine of another load would have measured it:
    C(plain) times `plain`, each size's C, F(n) and F(fed) times `steps`; its plain passes agreed
    (noise 0) unless `fields` say otherwise."""
    saved = json.loads(open(path).read())
    fields = {"noise": 0.0} | fields if "noise" in saved else fields  # (sizing before it recorded noise: none)
    saved["plain_s"] *= plain
    saved["forward"] = {n: s * steps for n, s in saved["forward"].items()}
    for row in saved["shapes"]:
        row["seconds"], row["forward_s"] = row["seconds"] * steps, row["forward_s"] * steps
    with open(path, "w") as f:
        json.dump(saved | fields, f)
    return Sizing(**saved | fields)


@pytest.fixture(scope="module")
def disagreeing(models):
    """A draft that seldom agrees with the target, and cheaply: no size of it pays."""
    return models[0], random_gpt(vocab_size=64, n_ctx=128, n_layer=1, n_embd=16, scale=4.0, seed=7)


@pytest.fixture
def steady(monkeypatch):
    """A machine that is never busy: every step takes a made-up time, fixed by its shape (a plain
    step 1 ms, each token proposed 0.5 ms more: no size of the disagreeing draft pays), so which
    size a fresh measurement chooses does not depend on what else the machine runs."""
    real = sizing.timed_steps

    def timed_steps(steps):
        for _, step in real(steps):
            yield 1e-3 * (1 + 0.5 * step.proposed), step
    monkeypatch.setattr(sizing, "timed_steps", timed_steps)


def test_a_sizing_measured_on_a_busier_machine_is_measured_again(disagreeing, tmp_path, steady):
    """Every cost of the cached sizing three times what the machine takes now (measured while it
    was three times busier): a plain step timed now disagrees, and sizing measures again and says so."""
    target, draft = disagreeing
    proposer = DraftModel(target, draft)
    first = sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, sizes=["1", "2"])
    planted(first.path, plain=3.0, steps=3.0)
    again = sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, sizes=["1", "2"])
    assert again.measured_s > 0 and "ms then" in again.why and "measured again" in again.describe()
    assert json.loads(open(first.path).read())["plain_s"] == again.plain_s != 3 * first.plain_s  # the file, anew


def test_a_sizing_whose_plain_steps_were_slowed_does_not_make_the_run_speculate(disagreeing, tmp_path, steady):
    """The harm a busy machine does: its slow spell lengthened the plain passes (C(plain) three
    times), so every size looked three times cheaper, and the run speculated where it loses. Read
    now, the sizing is measured again and the run takes only plain steps, as plain decoding does,
    so it keeps plain decoding's speed by construction."""
    target, draft = disagreeing
    proposer = DraftModel(target, draft)
    first = sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, sizes=["1", "2"])
    assert first.chosen() is None and planted(first.path, plain=3.0).chosen() is not None  # the planted file would speculate
    again = sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, sizes=["1", "2"])
    assert again.why == "a plain step took 3 ms then, 1 ms now" and again.measured_s > 0
    assert again.chosen() is None and not again.policy().may_speculate(1)
    decoder = Decoder(target, proposer, policy=again.policy())
    for p in prompts(4):
        assert set(run(decoder.steps(p, Sampling(0.0), None, 60)).sizes) == {PLAIN}


def test_a_noisy_sizing_is_measured_again_on_the_next_run(disagreeing, tmp_path, monkeypatch):
    """A cached measurement whose plain passes before and after the sizes disagreed was made on a
    busy machine: the next run measures again, whatever a plain step takes now, and says why."""
    target, draft = disagreeing
    proposer = DraftModel(target, draft)
    first = sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, sizes=["1", "2"])
    planted(first.path, noise=0.6)
    monkeypatch.setattr(sizing, "plain_now", lambda *args: first.plain_s)  # a plain step now: as cached
    again = sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, sizes=["1", "2"])
    assert again.measured_s > 0 and "differed by 60%" in again.why
    noisy = Sizing(**{**again.__dict__, "noise": 0.6})
    assert "a busy machine; the next run measures again" in noisy.describe()


def test_a_measurement_made_while_the_machine_was_busy_is_made_once_more(disagreeing, tmp_path, monkeypatch):
    """Made-up measurements: the first one's plain passes disagreed by 60%, so sizing measures once
    more (its progress lines saying so) and keeps the quieter; where both were noisy, the quieter
    of the two, and its line says the next run measures again."""
    target, draft = disagreeing
    proposer, lines = DraftModel(target, draft), []
    for noises, kept in (([0.6, 0.1], 0.1), ([0.6, 0.4], 0.4), ([0.1], 0.1)):
        made = iter(noises)

        def measure(*args, progress, **kwargs):
            progress("sizing draft at T = 0: prompt 1 of 3")
            s = made_up(k2=(3.0, 1.5))
            s.noise, s.measured_s = next(made), 1.0
            return s
        monkeypatch.setattr(sizing, "measure", measure)
        lines.clear()
        s = sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, remeasure=True, sizes=["1", "2"],
                        progress=lines.append)
        assert s.noise == kept and s.measured_s == len(noises) and len(lines) == len(noises)
        assert lines[1:] == ["sizing draft at T = 0: prompt 1 of 3 (again: its plain steps, timed twice, differed "
                             "by 60%)"][:len(noises) - 1]
        assert ("the next run measures again" in s.describe()) == (kept > sizing.NOISE)
        assert json.loads(open(s.path).read())["noise"] == kept


def test_the_noise_is_how_far_the_plain_passes_before_and_after_the_sizes_disagree(disagreeing, monkeypatch):
    """Made-up clocks: the plain passes after the sizes take twice the steps' time of those before
    (the machine grew busy in between): noise 100%; a steady machine: none."""
    target, draft = disagreeing
    real = sizing.timed_steps
    for after, noise in ((2.0, 1.0), (1.0, 0.0)):
        calls = []

        def timed_steps(steps):  # measure's passes per prompt: plain, k = 1, k = 2, plain
            n = len(calls)
            calls.append(n)
            for _, step in real(steps):
                yield (after if n % 4 == 3 else 1.0), step
        monkeypatch.setattr(sizing, "timed_steps", timed_steps)
        s = sizing.measure(target, DraftModel(target, draft), None, prompts(), Sampling(0.0), ["1", "2"])
        assert s.noise == pytest.approx(noise) and s.plain_s == pytest.approx((1 + after) / 2)


def test_a_sizing_that_a_plain_step_now_confirms_is_read(disagreeing, tmp_path, monkeypatch):
    """Within the noise, the cached sizing stands: nothing measured again."""
    target, draft = disagreeing
    proposer = DraftModel(target, draft)
    first = sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, sizes=["1", "2"])
    planted(first.path)  # (measured without noise)
    monkeypatch.setattr(sizing, "plain_now", lambda *args: first.plain_s * 1.2)
    again = sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, sizes=["1", "2"])
    assert again.measured_s == 0 and not again.why and again.shapes == first.shapes
    monkeypatch.setattr(sizing, "plain_now", lambda *args: first.plain_s * 1.3)  # beyond it: measured again
    assert sizing.size(target, proposer, None, prompts(), Sampling(0.0), tmp_path, sizes=["1", "2"]).why
