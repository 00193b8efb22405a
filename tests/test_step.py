"""The recorded step (recorded.py, with each method's part in its own file) held to the readable loop, as the Triton kernel is held to
PyTorch's attention: at T = 0 every method's recorded step writes the readable loop's tokens,
token for token, at three sizes each; at T > 0 its text has exactly the target's distribution
(chi-square on a tiny vocabulary; a planted bug fails it); and a step reads nothing back to the
host, which a recording on a GPU could not replay (checked here on the CPU, where any such call
is made to raise)."""
import contextlib
import random

import numpy as np
import pytest
import torch

from tinyspec import recorded as recorded_module
from tinyspec.recorded import Recorded
from tinyspec.kvcache import KVCache
from tinyspec.methods import Decoder, check_rule
from tinyspec.methods.base import default_rule
from tinyspec.methods.draft import DraftModel
from tinyspec.methods.eagle import Eagle
from tinyspec.methods.lookup import PromptLookup
from tinyspec.methods.medusa import Medusa, MedusaPart
from tinyspec.methods.parallel import Parallel
from tinyspec.methods.rest import Datastore, Rest
from tinyspec.results import run
from tinyspec.sampling import Sampling, draw
from tinyspec.tree import Tree, from_choices, tree_tensors
from tinyspec.verify import fixed_block, fixed_match, fixed_walk

from conftest import counting_sequences, random_heads, token_counts
from test_eagle import random_head
from test_exactness import PROMPTS, N, V, with_accuracy
from test_exactness import tiny  # noqa: F401 (a fixture)
from test_medusa import trained_heads  # noqa: F401 (a fixture)
from test_parallel import random_parallel
from test_speculative import chi_square, critical_value, perturbed


@pytest.fixture(scope="module")
def counting(counting_gpt, trained_heads):
    """The trained counting model with every drafter, and prompts of 1 to 40 tokens: greedy text
    with wide margins, so the two computations (a forward over every slot of the cache with a
    mask, and over the prefix) agree on every argmax on any CPU."""
    t, g = counting_gpt, torch.Generator().manual_seed(4)
    docs = [counting_sequences(1, 40, 32, g)[0].tolist() + [31] for _ in range(30)]
    store = Datastore(np.array([x for doc in docs for x in doc]), eot=31)
    methods = {"draft": DraftModel(t, perturbed(t, 0.5, 1)), "medusa": Medusa(t, with_accuracy(trained_heads)),
               "eagle": Eagle(t, random_head(t, 1, 3.0)), "parallel": Parallel(t, random_parallel(t, 1, 3.0, block=5)),
               "lookup": PromptLookup(t), "rest": Rest(t, store)}
    rng = random.Random(2)
    prompts = [counting_sequences(1, n, 32, g)[0].tolist() if i % 2 else [rng.randrange(32) for _ in range(n)]
               for i, n in enumerate((1, 3, 7, 12, 40))]
    return t, methods, prompts


SIZES = [("ar", None), ("draft", "1"), ("draft", "2"), ("draft", "4"), ("medusa", "2"), ("medusa", "4"),
         ("medusa", "8"), ("eagle", "1,2,2"), ("eagle", "2,3,4"), ("eagle", "2,4,8"), ("parallel", "1,3,3"),
         ("parallel", "2,3,4"), ("parallel", "2,4,8"), ("lookup", "2"), ("lookup", "4"), ("lookup", "8"),
         ("rest", "4,2"), ("rest", "8,4"), ("rest", "16,4")]


@pytest.mark.parametrize("method, size", SIZES)
def test_a_recorded_step_writes_the_readable_loops_tokens(counting, method, size):
    target, methods, prompts = counting
    proposer = methods.get(method)
    recorded, readable = Recorded(target, proposer, size), Decoder(target, proposer, size)
    accepted = rejected = 0
    for prompt in prompts:  # longest last: stale entries of the cache lie beyond the shorter prompts
        got = run(recorded.steps(prompt, Sampling(0.0), None, 30))
        want = run(readable.steps(prompt, Sampling(0.0), None, 30))
        assert got.token_ids == want.token_ids, f"{method}:{size}, a prompt of {len(prompt)}"
        if len(prompt) + 30 + recorded.slots - recorded.n_ctx < recorded.n_ctx:  # (near the context's end the
            # recorded loop takes plain steps where the readable one proposes less): the same proposals, step by step
            assert got.sources == want.sources, f"{method}:{size}, a prompt of {len(prompt)}: other proposals"
        accepted, rejected = accepted + got.accepted, rejected + got.rejections
    assert method == "ar" or (accepted > 0 and rejected > 0)  # paths were kept, and proposals refused


@pytest.mark.triton
def test_a_recorded_step_attends_with_the_kernel_too(counting):
    """With the Triton kernel as the model's attention (on a CPU in Triton's interpreter), the
    recorded step writes the readable loop's tokens: the kernel reads L on the device."""
    tree_attention = pytest.importorskip("tinyspec.kernels.tree_attention")
    target, methods, prompts = counting
    readable = [run(Decoder(target, methods["medusa"], "4").steps(p, Sampling(0.0), None, 8)).token_ids
                for p in prompts[:2]]
    sdpa = target.attention
    target.set_attention(tree_attention.TreeAttention())
    try:
        recorded = Recorded(target, methods["medusa"], "4")
        assert [run(recorded.steps(p, Sampling(0.0), None, 8)).token_ids for p in prompts[:2]] == readable
    finally:
        target.set_attention(sdpa)  # (the counting model serves every test of the session)


# ---- the rules as index arithmetic, against the readable rules ---------------------------------

def test_the_device_tree_is_the_trees_own():
    tree = from_choices([(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (1, 0), (2,)])
    mask, depth, parent = tree_tensors(torch.tensor(tree.parents), tree.max_depth)
    assert torch.equal(mask, tree.tree_mask) and torch.equal(depth, tree.depth)
    assert parent.tolist() == [0] + tree.parent_index.tolist()


def test_match_keeps_the_longest_path_of_the_targets_own_tokens():
    """Greedy: tokens [root, 5, 6, 7, 5, 9] on the tree root - 0 - 2 - 4, root - 1, 0 - 3 (parents
    [-1, -1, 0, 0, 2]); the target's argmax after each: root 5, node 0 -> 7 (so node 2, a 7, is
    accepted, node 3, a 5, is not), node 2 -> 8 (node 4, a 9, refused): path root, 0, 2; next 8."""
    tree = Tree((-1, -1, 0, 0, 2))
    tokens, y = torch.tensor([1, 5, 6, 7, 5, 9]), torch.tensor([5, 7, 0, 8, 0, 0])
    mask, depth, parent = tree_tensors(torch.tensor(tree.parents), 3)
    path, n, nxt, last = fixed_match(tokens, y, parent, mask, depth, torch.ones(6, dtype=torch.bool), 3)
    assert path[:int(n)].tolist() == [0, 1, 3] and nxt.tolist() == [8] and last.tolist() == [3]
    valid = torch.tensor([True, True, True, False, True, True])  # node 2 padding: never accepted
    path, n, nxt, _ = fixed_match(tokens, y, parent, mask, depth, valid, 3)
    assert path[:int(n)].tolist() == [0, 1] and nxt.tolist() == [7]


def test_match_is_exact_when_siblings_repeat_a_token():
    """The point-mass rule on a tree whose siblings all carry token 0 (parents [-1, -1, 0, 1], a
    tree file's parents without ranks once loaded so): the first two tokens a step produces must
    be two draws from p. Drawing once per duplicate node instead, the second token comes out 0
    with probability 1 - 0.5^2 = 0.75, not p(0) = 0.5; 20,000 steps put the estimate within 0.004
    (one standard deviation) of the truth, and the bound is 0.02."""
    p = torch.tensor([0.5, 0.3, 0.2])  # the target's p after every token (V = 3)
    tree = Tree((-1, -1, 0, 1))
    mask, depth, parent = tree_tensors(torch.tensor(tree.parents), tree.max_depth)
    tokens, valid = torch.zeros(5, dtype=torch.long), torch.ones(5, dtype=torch.bool)
    g, n_steps, pairs = torch.Generator().manual_seed(0), 20000, torch.zeros(3, 3)
    for u in torch.rand(n_steps, 5, generator=g):
        y = draw(p.expand(5, 3), u)  # the target's own draw after each token
        path, n, nxt, _ = fixed_match(tokens, y, parent, mask, depth, valid, tree.max_depth)
        produced = tokens[path[1:int(n)]].tolist() + [int(nxt)]
        if len(produced) < 2:  # the step stopped at the root: its next token is the first, and a
            produced.append(int(torch.multinomial(p, 1, generator=g)))  # plain step draws the second
        pairs[produced[0], produced[1]] += 1
    assert (pairs / n_steps - p[:, None] * p).abs().max() < 0.02, f"{pairs / n_steps} against {p[:, None] * p}"


def test_block_is_verify_block_with_the_same_numbers():
    """The loop-free block rule against `verify.block`, fed the same uniform numbers: the same path
    and the same next token, on random chains whose weights clip at different places."""
    from tinyspec import verify
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        k, V_ = 1 + seed % 4, 6
        p = torch.softmax(2 * torch.randn(k + 1, V_, generator=g), -1)
        q = torch.softmax(2 * torch.randn(k + 1, V_, generator=g), -1)
        tokens = torch.cat([torch.zeros(1, dtype=torch.long), torch.multinomial(q[1:], 1, generator=g)[:, 0]])
        u = torch.rand(k + 1, generator=g)
        replay = iter([u[:k], u[k:]])  # verify.block draws eta (k,), then one number to sample the next token
        rand = torch.rand
        torch.rand = lambda *a, **kw: next(replay).to(kw.get("dtype") or torch.float32)
        try:
            want_path, want_next = verify.block(tokens, p, verify.chain(k), q)
        finally:
            torch.rand = rand
        path, n, nxt, _ = fixed_block(tokens, p, q, None, u, k)
        assert path[:int(n)].tolist() == want_path.tolist() and int(nxt) == int(want_next), f"seed {seed}"


def test_walk_is_speculative_sampling_on_a_chain():
    """On a chain with q = p everywhere nothing is ever rejected; with q a point mass on a token p
    gives 0, everything is (and the next token comes from p, not from the residual's 0 mass)."""
    p = torch.softmax(torch.randn(4, 6, generator=torch.Generator().manual_seed(0)), -1)
    tokens, kids = torch.tensor([0, 1, 2, 3]), torch.tensor([[1], [2], [3], [-1]])
    u = torch.rand(4, generator=torch.Generator().manual_seed(1))
    path, n, _, _ = fixed_walk(tokens, p, p, kids, u, 3)
    assert int(n) == 4 and path.tolist() == [0, 1, 2, 3]
    p0 = p.clone()
    p0[0, 1] = 0
    path, n, nxt, _ = fixed_walk(tokens, p0 / p0.sum(-1, keepdim=True), torch.eye(6)[tokens], kids, u, 3)
    assert int(n) == 1 and int(nxt) != 1


# ---- sampling: the target's distribution ---------------------------------------------------------

def tiny_method(m, method):
    t = m["target"]
    store = Datastore(np.array([x % V for x in range(200)] + [V - 1]), eot=V - 1)  # every token, then the next
    return {"ar": (None, None), "draft": (DraftModel(t, m["draft"]), "3"),
            "medusa": (Medusa(t, m["heads"], tree=Tree((-1, -1, -1, 0, 0, 1), (0, 1, 2, 0, 1, 0))), None),
            "eagle": (Eagle(t, m["eagle"]), "2,2,4"), "parallel": (Parallel(t, random_parallel(t, 3, 2.0)), "2,2,4"),
            "lookup": (PromptLookup(t), "3"), "rest": (Rest(t, store), "2,3")}[method]


def recorded_counts(m, method, rule, n_samples):
    """Counts of each prompt's first N tokens over seeds 0..n_samples - 1, batch 1, recorded step."""
    proposer, size = tiny_method(m, method)
    recorded = Recorded(m["target"], proposer, size, rule=rule)
    counts, proposed = [], 0
    for prompt in PROMPTS:
        runs = [run(recorded.steps(prompt, Sampling(1.0), torch.Generator().manual_seed(seed), N))
                for seed in range(n_samples)]
        counts.append(token_counts(runs, V, N))
        proposed += sum(res.proposed for res in runs)
    return counts, proposed


EXACT = [("ar", None), ("draft", "lossless"), ("draft", "block"), ("draft", "pointmass"), ("medusa", "lossless"), ("medusa", "pointmass"),
         ("eagle", "pointmass"), ("parallel", "pointmass"), ("lookup", "pointmass"), ("rest", "pointmass")]


@pytest.mark.slow
@pytest.mark.parametrize("method, rule", EXACT)
def test_a_recorded_step_has_the_target_distribution(tiny, method, rule):  # noqa: F811 (the fixture)
    counts, proposed = recorded_counts(tiny, method, rule, 1536)
    for prompt, c, exact in zip(PROMPTS, counts, tiny["exact"]):
        stat, dof = chi_square(c, exact, V)
        assert stat < critical_value(dof), f"{method}@{rule}, prompt {prompt}: chi-square {stat:.1f} with {dof} dof"
    assert method == "ar" or proposed > 0


@pytest.mark.slow
@pytest.mark.parametrize("method, rule", [("medusa", "pointmass"), ("draft", "lossless"), ("draft", "block")])
def test_a_planted_bug_in_the_recorded_rule_is_caught(tiny, method, rule, monkeypatch):  # noqa: F811
    """The greedy rule's argmax where the target's draw belongs (point-mass), or every proposal the
    target could write accepted, whatever its odds (lossless and block, u = 0): each must fail."""
    if rule == "pointmass":
        monkeypatch.setattr(recorded_module, "draw", lambda p, u: p.argmax(-1))
    else:
        right = getattr(recorded_module, {"lossless": "fixed_walk", "block": "fixed_block"}[rule])
        monkeypatch.setattr(recorded_module, right.__name__, lambda tokens, p, q, kids, u, D: right(tokens, p, q, kids, 0 * u, D))
    counts, _ = recorded_counts(tiny, method, rule, 768)
    stats = [chi_square(c, exact, V) for c, exact in zip(counts, tiny["exact"])]
    assert any(stat > 3 * critical_value(dof) for stat, dof in stats), f"{method}@{rule}: {stats}"


# ---- no host round trip inside a step --------------------------------------------------------------

@contextlib.contextmanager
def no_round_trips():
    """Every way a tensor's value reaches Python raises inside: what a CUDA graph cannot record."""
    def refuse(name):
        def refused(*args, **kwargs):
            raise AssertionError(f"Tensor.{name}: a host round trip inside a recorded step")
        return refused
    getitem, setitem = torch.Tensor.__getitem__, torch.Tensor.__setitem__

    def by_mask(index):
        index = index if isinstance(index, tuple) else (index,)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.dim() > 0 for i in index)

    def checked_get(self, index):
        if by_mask(index):
            raise AssertionError("boolean-mask indexing: its size is read back to the host")
        return getitem(self, index)

    def checked_set(self, index, value):
        if by_mask(index):
            raise AssertionError("boolean-mask indexing: its size is read back to the host")
        return setitem(self, index, value)
    names = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "unique", "masked_select")
    saved = {name: getattr(torch.Tensor, name) for name in names}
    functions = {name: getattr(torch, name) for name in ("nonzero", "unique", "masked_select", "argwhere")}
    try:
        for name in names:
            setattr(torch.Tensor, name, refuse(name))
        for name in functions:
            setattr(torch, name, refuse(name))
        torch.Tensor.__getitem__, torch.Tensor.__setitem__ = checked_get, checked_set
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.Tensor, name, value)
        for name, value in functions.items():
            setattr(torch, name, value)
        torch.Tensor.__getitem__, torch.Tensor.__setitem__ = getitem, setitem


def steps_without_round_trips(target, proposer, size, rule, sampling, prompt, n_steps=4):
    """Prefill as usual, then `n_steps` steps (and a plain one) with every round trip refused."""
    recorded = Recorded(target, proposer, size, rule=rule)
    loop = recorded.steps(prompt, sampling, torch.Generator().manual_seed(0), 100)
    next(loop)  # the prefill, and the method's reading of the prompt (the host's work, before any step)
    part, step, _, plain, _ = recorded.recording(sampling)
    if part is not None and part.on_host:
        assert part.offer(10)  # the host's proposal, copied in before the step
    with torch.no_grad(), no_round_trips():
        for _ in range(n_steps):
            step()
        plain()
    return step.result.tolist()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method, size", [("ar", None), ("draft", "3"), ("medusa", "8"), ("eagle", "2,3,6"),
                                          ("parallel", "2,3,6"), ("lookup", "4"), ("rest", "8,4")])
def test_a_step_makes_no_host_round_trip(counting, method, size, temperature):
    target, methods, _ = counting
    prompt = [5, 6, 7, 8, 9, 5, 6, 7]  # lookup and the datastore both propose after it
    steps_without_round_trips(target, methods.get(method), size, None, Sampling(temperature), prompt)


def test_a_planted_round_trip_is_caught(counting, monkeypatch):
    target, methods, prompts = counting
    propose = MedusaPart.propose
    monkeypatch.setattr(MedusaPart, "propose", lambda self, root, L, u: (int(L.item()), propose(
        self, root, L, u))[1])
    with pytest.raises(AssertionError, match="Tensor.item"):
        steps_without_round_trips(target, methods["medusa"], "8", None, Sampling(0.0), prompts[3])


# ---- what a recorded step cannot run is refused in one line --------------------------------------

@pytest.mark.parametrize("method, rule, tree, message", [
    ("draft", "traversal", None, "not traversal: pass --accept pointmass"), ("eagle", "lossless", None, "--accept pointmass"),
    ("medusa", "typical", None, "not typical"), ("eagle", None, Tree((-1, 0)), "drop --tree")])
def test_what_a_recorded_step_cannot_run_is_refused(counting, method, rule, tree, message):
    target, methods, _ = counting
    proposer = Eagle(target, methods["eagle"].head, tree=tree) if tree is not None else methods[method]
    with pytest.raises(ValueError, match=message) as e:
        recorded = Recorded(target, proposer, None, rule=rule)
        next(recorded.steps([1, 2], Sampling(1.0), torch.Generator(), 10))
    assert "\n" not in str(e.value)


# ---- the readable loop's contracts, kept --------------------------------------------------------------

@pytest.mark.parametrize("method, size", [("ar", None), ("draft", "2"), ("medusa", "4"), ("eagle", "2,3,6")])
def test_a_recorded_step_records_no_autograd_graph(counting, method, size):
    """As `decoding.decode`, the recorded step runs without autograd: with it, every eager step
    chained a graph through the cache that the next prompt reuses (a 50,000-run test grew to 24 GB)."""
    target, methods, prompts = counting
    recorded = Recorded(target, methods.get(method), size)
    modules = [target] + [m for m in vars(methods.get(method, object)).values() if isinstance(m, torch.nn.Module)]
    weights = [w for m in modules for w in m.parameters()]
    frozen = [w.requires_grad for w in weights]
    try:
        for w in weights:
            w.requires_grad_(True)  # weights as loaded (training froze the session's model)
        for prompt in prompts[:2]:
            run(recorded.steps(prompt, Sampling(1.0), torch.Generator().manual_seed(0), 12))
    finally:
        for w, f in zip(weights, frozen):
            w.requires_grad_(f)
    kept = vars(recorded.recording(Sampling(1.0))[0] or object).values()  # what the method's part keeps
    state = [recorded.cache.k, recorded.cache.v, *recorded.state[:2]] + [t for t in kept if isinstance(t, torch.Tensor)] \
        + [t for c in kept if isinstance(c, KVCache) for t in (c.k, c.v)]
    assert len(state) > 4 or method == "ar"
    assert not [t for t in state if t.requires_grad or t.grad_fn is not None], f"{method}: tensors with a graph"


def test_without_a_generator_each_run_draws_fresh_numbers(tiny):  # noqa: F811 (the fixture)
    """generator=None: the step's generator is seeded from torch's global one, as the readable loop
    draws from it: under one global seed a run repeats, and runs that start with the same token go on
    differently (seeded 0 on every call, every run's text was its first token's)."""
    recorded = Recorded(tiny["target"])
    def text(seed):
        torch.manual_seed(seed)
        return tuple(run(recorded.steps(PROMPTS[0], Sampling(1.0), None, 12)).token_ids)
    texts = [text(seed) for seed in range(16)]
    assert text(3) == texts[3]
    assert len(set(texts)) > len({t[0] for t in texts}), texts


def test_the_recorded_step_refuses_what_the_readable_loop_refuses(counting):
    target, methods, _ = counting
    problem = check_rule("medusa", "greedy", 1.0)
    for driver in (Recorded, Decoder):
        with pytest.raises(ValueError, match="neither sampling nor greedy") as e:
            next(driver(target, methods["medusa"], "4", rule="greedy").steps([1, 2], Sampling(1.0), None, 10))
        assert str(e.value) in problem and "\n" not in str(e.value)


def test_both_drivers_take_policy_and_rule_by_keyword(counting):
    target, methods, _ = counting
    for driver in (Recorded, Decoder):
        with pytest.raises(TypeError):
            driver(target, methods["medusa"], "4", "pointmass")


@pytest.mark.parametrize("method", ["draft", "medusa", "eagle", "parallel", "lookup", "rest"])
def test_a_recorded_step_runs_the_default_rule_or_says_which_it_runs(counting, method):
    """At T > 0 without --accept: the readable loop's default rule, or one line naming the rule
    run instead (EAGLE's default, lossless, judges a sampled tree; its part grows the top-k one)."""
    target, methods, _ = counting
    recorded, readable = Recorded(target, methods[method], None), default_rule(methods[method], None, 1.0)
    part = recorded.recording(Sampling(1.0))[1]
    note = recorded.instead(1.0)
    if part.rule == readable:
        assert note is None
    else:
        assert note is not None and part.rule in note and readable in note and "\n" not in note
    assert recorded.instead(0.0) is None and (method not in ("eagle", "parallel") or note is not None)


# ---- on a GPU: the recorded graph replays the step ---------------------------------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("method, size", [("ar", None), ("draft", "4"), ("medusa", "8"), ("eagle", "2,4,8"),
                                          ("parallel", "2,4,8"), ("lookup", "4"), ("rest", "8,4")])
def test_a_recorded_graph_writes_the_readable_loops_tokens_on_the_gpu(counting_gpt, method, size):
    """float32 on the GPU: the step replayed from its CUDA graph against the readable loop, prompt
    after prompt; sampled, a seed's text is the same on every replay and another seed's differs."""
    target = counting_gpt.cuda()
    rng, g = random.Random(2), torch.Generator().manual_seed(4)
    store = Datastore(np.array(counting_sequences(1, 400, 32, g)[0].tolist() + [31]), eot=31)
    proposer = {"ar": None, "draft": DraftModel(target, perturbed(counting_gpt, 0.5, 1).cuda()),
                "medusa": Medusa(target, with_accuracy(random_heads(32, 3, seed=1)).cuda()),
                "eagle": Eagle(target, random_head(target, 1, 3.0).cuda()),
                "parallel": Parallel(target, random_parallel(target, 1, 3.0, block=5).cuda()),
                "lookup": PromptLookup(target), "rest": Rest(target, store)}[method]
    recorded, readable = Recorded(target, proposer, size), Decoder(target, proposer, size)
    for n in (12, 1, 40):
        prompt = [rng.randrange(32) for _ in range(n)]
        got, want = (run(d.steps(prompt, Sampling(0.0), None, 30)).token_ids for d in (recorded, readable))
        assert got == want, f"{method}:{size}, a prompt of {n}"
    sampled = [tuple(run(recorded.steps([3, 4, 5], Sampling(2.0), torch.Generator("cuda").manual_seed(s), 30)).token_ids)
               for s in (1, 1, 2, 3, 4, 5)]
    assert sampled[0] == sampled[1] and len(set(sampled)) > 1  # a replay draws fresh numbers, a seed the same


def test_the_benchmark_times_a_recorded_step_and_its_ledger(counting):
    """The benchmark's graph rows run `Recorded` (on a CPU, eagerly: the code path a GPU replays),
    and its ledger splits a step into the replay and the host's proposing."""
    from tinyspec.bench.runner import Runner
    target, methods, prompts = counting
    runner = Runner(target, {"lookup": methods["lookup"], "ar": None}, torch.device("cpu"), 20, 0, cuda_graph=True)
    runner.profile = True
    assert isinstance(runner.decoder(("lookup", "4", None), Sampling(0.0)), Recorded)
    totals = runner.run(("lookup", "4", None), prompts[:3], Sampling(0.0))
    assert totals["new_tokens"] == 60 and totals["ledger"]["step"] > 0 and totals["ledger"]["propose"] > 0
    assert totals["ledger"]["target"] == 0  # every forward inside the step
