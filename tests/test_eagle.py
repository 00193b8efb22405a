"""EAGLE: the feature-level draft head, its training, EAGLE-2's dynamic tree, and decoding against
plain decoding (greedy: token for token; sampled: the target's distribution, checked
statistically on a vocabulary small enough to enumerate; buggy variants must fail that check)."""
import copy
import json
import random

import pytest
import torch

from tinyspec.commands import generate
from tinyspec.bench import specs
from tinyspec.training.distill import eagle_accuracy, eagle_loss, self_distill, target_features, train_eagle
from tinyspec.kvcache import KVCache
from tinyspec.methods import Decoder
from tinyspec.methods import eagle as eagle_module
from tinyspec.methods.eagle import Eagle, EagleHead
from tinyspec.methods.growth import grow_sampled_tree, grow_tree
from tinyspec.sampling import Sampling
from tinyspec.tree import Tree, from_choices, save_tree

from conftest import (CountingCorpus, counting_sequences, drive, generations, plain_tokens, random_gpt, refused,
                      sampled_rows, token_counts)
from test_speculative import chi_square, critical_value


def random_head(target, seed, scale=1.0):
    torch.manual_seed(seed)
    head = EagleHead.for_target(target)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return head.eval()


# ---- the tree -------------------------------------------------------------------------------

def test_grow_tree_on_the_docstring_example():
    """The worked example of grow_tree's docstring, with tokens a..j = 0..9; tokens 10 and 11
    share what the example leaves of each distribution, never among the top two."""
    V = 12
    a, b, c, d, e, f, g, h, i, j = range(10)
    dist = lambda pairs: [pairs.get(t, (1 - sum(pairs.values())) / 2 if t >= 10 else 0.0) + 1e-9 for t in range(V)]
    table = {(a,): dist({c: 0.5, d: 0.3}), (b,): dist({e: 0.9, f: 0.1}),
             (a, c): dist({g: 0.8, h: 0.1}), (b, e): dist({i: 0.5, j: 0.4})}
    made = []  # the token of every node made so far, to read each node's path

    def expand(nodes, parents, tokens, depth):
        nodes, parents = nodes.tolist(), parents.tolist()
        for node, t in zip(nodes, tokens.tolist()):
            while len(made) <= node:
                made.append(None)
            made[node] = t
        out = []
        for node in nodes:
            path, x = [], node
            while x >= 0:
                path.append(made[x])
                x = parents[x]
            out.append(torch.tensor(table[tuple(path[::-1])]).log())
        return torch.stack(out)
    parents, tokens = grow_tree(torch.tensor(dist({a: 0.6, b: 0.25})).log(), expand, top_k=2, depth=3, total_tokens=4)
    assert parents.tolist() == [-1, -1, 0, 2] and tokens.tolist() == [a, b, c, g]


def reference_grow(root_logp, logp_after, k, depth, nodes):
    """EAGLE-2 written plainly with explicit paths: node = (path of tokens, value)."""
    made = [((t,), float(root_logp[t])) for t in root_logp.topk(k).indices.tolist()]
    frontier = list(made)
    for _ in range(depth - 1):
        chosen = sorted(frontier, key=lambda n: -n[1])[:k]
        frontier = []
        for path, value in chosen:
            lp = logp_after(path)
            frontier += [(path + (t,), value + float(lp[t])) for t in lp.topk(k).indices.tolist()]
        made += frontier
    kept = sorted(range(len(made)), key=lambda i: (-made[i][1], i))[:nodes]
    return {made[i][0] for i in kept}


@pytest.mark.parametrize("k, depth, nodes", [(2, 3, 5), (3, 4, 10), (4, 5, 16), (1, 4, 3), (3, 2, 12)])
def test_grow_tree_matches_a_plain_reference(k, depth, nodes):
    V = 12
    g = torch.Generator().manual_seed(k * 100 + depth)
    logp = {}

    def logp_after(path):  # a fixed random draft distribution after each path
        if path not in logp:
            logp[path] = torch.log_softmax(3 * torch.randn(V, generator=g), -1)
        return logp[path]
    made = []

    def expand(nodes_, parents, tokens, depth):
        nodes_, parents = nodes_.tolist(), parents.tolist()
        for node, t in zip(nodes_, tokens.tolist()):
            made.extend([None] * (node + 1 - len(made)))
            made[node] = (made[parents[node]] if parents[node] >= 0 else ()) + (t,)
        return torch.stack([logp_after(made[n]) for n in nodes_])
    root = logp_after(())
    parents, tokens = grow_tree(root, expand, k, depth, nodes)
    parents = parents.tolist()
    tree = Tree(tuple(parents))  # a valid tree: topological, parents kept
    paths = []
    for p, t in zip(parents, tokens.tolist()):
        paths.append((paths[p] if p >= 0 else ()) + (t,))
    assert len(tree) == min(nodes, len(paths)) and len(set(paths)) == len(paths)
    assert set(paths) == reference_grow(root, logp_after, k, depth, nodes)


def test_sampled_tree_keeps_whole_groups_of_draws():
    """Every expanded node has exactly k children (its group), drawn from the q row the rule gets."""
    V, k = 6, 3
    g = torch.Generator().manual_seed(0)
    logits = {}
    expand = lambda nodes, parents, tokens, depth: torch.stack([logits.setdefault(n, torch.randn(V, generator=g))
                                                                for n in nodes.tolist()])
    parents, tokens, q = grow_sampled_tree(torch.randn(V), expand, k, 4, 15, Sampling(1.0),
                                           torch.Generator().manual_seed(1))
    parents = parents.tolist()
    counts = [parents.count(i) for i in [-1] + list(range(len(parents)))]
    assert len(parents) <= 15 and all(c in (0, k) for c in counts) and counts[0] == k
    assert q.shape == (len(parents) + 1, V)
    for i, p in enumerate(parents):  # siblings share their parent's q, and were drawn from it
        assert q[i + 1, tokens[i]] > 0 and (p < 0 or torch.equal(q[i + 1], Sampling(1.0).probs(logits[p])))


# ---- the head and its training --------------------------------------------------------------

def test_save_load_keeps_weights_and_fingerprint(tmp_path):
    target = random_gpt()
    head = random_head(target, 0)
    head.accuracy = [0.5, 0.25]
    head.save(tmp_path / "e.safetensors")
    back = EagleHead.load(tmp_path / "e.safetensors")
    assert back.target_fingerprint == target.fingerprint() and back.accuracy == [0.5, 0.25]
    for (name, a), b in zip(head.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), name
    target.save(tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="not an EAGLE head file"):
        EagleHead.load(tmp_path / "model.safetensors")


def test_loss_is_smooth_l1_plus_weighted_cross_entropy():
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(4, 7, bias=False)
    f_hat, f = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    with torch.no_grad():
        loss, reg, ce = eagle_loss(f_hat, f, lm_head, w=0.1)
        d = (f_hat - f).abs()
        expected_reg = torch.where(d < 1, 0.5 * d ** 2, d - 0.5).mean()
        expected_ce = -(torch.softmax(lm_head(f), -1) * torch.log_softmax(lm_head(f_hat), -1)).sum(-1).mean()
    assert reg == pytest.approx(float(expected_reg), rel=1e-5) and ce == pytest.approx(float(expected_ce), rel=1e-5)
    assert float(loss) == pytest.approx(float(expected_reg) + 0.1 * float(expected_ce), rel=1e-5)


@pytest.fixture(scope="module")
def counting_data(counting_gpt):
    seqs = self_distill(counting_gpt, CountingCorpus(), 128, 8, 24, 64, temperature=0.0, progress=False)
    heldout = self_distill(counting_gpt, CountingCorpus(), 32, 8, 24, 32, temperature=0.0, seed=1, progress=False)
    return seqs, heldout


@pytest.fixture(scope="module")
def trained_head(counting_gpt, counting_data):
    seqs, _ = counting_data
    torch.manual_seed(0)
    head = EagleHead.for_target(counting_gpt)
    train_eagle(counting_gpt, head, seqs, target_features(counting_gpt, seqs), 300, 16, 1e-2, progress=False)
    return head.eval()


def test_trained_head_predicts_features_several_steps_deep(counting_gpt, counting_data, trained_head):
    """On counting text the next feature follows from the last feature and token; a trained head
    keeps guessing right on its own predicted features, an untrained one does not."""
    _, heldout = counting_data
    weights = {k: v.clone() for k, v in counting_gpt.state_dict().items()}
    before = eagle_accuracy(counting_gpt, EagleHead.for_target(counting_gpt), heldout, 8, depth=3)
    after = eagle_accuracy(counting_gpt, trained_head, heldout, 8, depth=3)
    assert max(before) < 0.1 and min(after) > 0.7, (before, after)
    assert all(torch.equal(v, weights[k]) for k, v in counting_gpt.state_dict().items())  # the target stayed frozen


def test_resumed_training_equals_straight_training(counting_gpt, counting_data):
    seqs, _ = counting_data
    features = target_features(counting_gpt, seqs)
    straight = EagleHead.for_target(counting_gpt)
    resumed = EagleHead.for_target(counting_gpt)
    resumed.load_state_dict(straight.state_dict())
    train_eagle(counting_gpt, straight, seqs, features, 6, 4, 1e-2, progress=False)
    saved = {}

    def checkpoint(step, opt, g, curve):
        if step == 3:
            saved.update(head={k: v.clone() for k, v in resumed.state_dict().items()}, opt=copy.deepcopy(opt.state_dict()),
                         g=g.get_state(), curve=list(curve))
    train_eagle(counting_gpt, resumed, seqs, features, 6, 4, 1e-2, progress=False, checkpoint=checkpoint, every=3)
    resumed.load_state_dict(saved["head"])

    def resume(opt, g):
        opt.load_state_dict(saved["opt"])
        g.set_state(saved["g"])
        return 3, saved["curve"]
    train_eagle(counting_gpt, resumed, seqs, features, 6, 4, 1e-2, progress=False, resume=resume, every=3)
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)


# ---- decoding against plain decoding --------------------------------------------------------

SETTINGS = [("1,4,4", None), ("2,3,6", None), ("4,5,16", None), ("3,6,24", None),
            (None, from_choices([(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (1, 0)]))]  # (TOPK,DEPTH,NODES, static tree)


def test_greedy_eagle_equals_plain_decoding(counting_gpt, trained_head):
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    prompts = [counting_sequences(1, rng.randint(3, 10), 32, g)[0].tolist() for _ in range(2)]
    prompts += [[rng.randrange(32) for _ in range(rng.randint(1, 10))] for _ in range(2)]  # not counting
    plain = [plain_tokens(counting_gpt, prompt, 32) for prompt in prompts]
    accepted = rejected = 0
    for head in (trained_head, random_head(counting_gpt, 1, scale=3.0)):
        for size, tree in SETTINGS:
            for prompt, expected in zip(prompts, plain):
                res = generations(counting_gpt, Eagle(counting_gpt, head, tree=tree), [prompt], n=32, size=size)[0]
                assert res.token_ids == expected, f"{size or tree}, prompt {prompt}"
                accepted, rejected = accepted + res.accepted, rejected + res.rejections
    assert accepted > 200 and rejected > 20  # long accepted paths and corrections both happened


def test_greedy_eagle_equals_plain_decoding_on_random_models():
    rng = random.Random(1)
    for seed in range(2):
        target = random_gpt(vocab_size=64, n_ctx=96, scale=3.0, seed=seed)
        head = random_head(target, seed + 10, scale=2.0)
        for size, _ in SETTINGS[1:4]:
            prompt = [rng.randrange(64) for _ in range(rng.randint(1, 12))]
            plain = generations(target, None, [prompt], n=60)[0]
            res = generations(target, Eagle(target, head), [prompt], n=60, size=size)[0]
            assert res.token_ids == plain.token_ids and res.stop_reason == plain.stop_reason, f"seed {seed}, {size}"
    prompt = [rng.randrange(64) for _ in range(70)]  # to the end of the context, with a tree wider than its budget
    plain = generations(target, None, [prompt], n=60)[0]
    res = generations(target, Eagle(target, head), [prompt], n=60, size="6,6,8")[0]
    assert res.token_ids == plain.token_ids and res.stop_reason == plain.stop_reason == "context"


def test_trained_head_makes_eagle_take_fewer_target_passes(counting_gpt, trained_head):
    prompt = counting_sequences(1, 6, 32, torch.Generator().manual_seed(3))[0].tolist()
    res = generations(counting_gpt, Eagle(counting_gpt, trained_head), [prompt], n=40, size="2,6,16")[0]
    assert res.token_ids == plain_tokens(counting_gpt, prompt, 40)
    assert len(res.token_ids) / res.target_steps > 3.0  # tau, tokens per target forward


def plain_caches(target, head, seq, n):
    """The caches plain decoding builds for seq[:n], and the head's for the true pairs (f_j, t_{j+1})."""
    cache, head_cache = KVCache.for_model(target, 64), head.new_cache(64)
    with torch.no_grad():
        f = torch.cat([target.hidden(torch.tensor([[t]]), cache=cache)[0] for t in seq[:n]])  # one token at a time
        head(f[None], torch.tensor([seq[1:n + 1]]), target.transformer.wte, head_cache)
    return cache, head_cache


@pytest.mark.parametrize("rule, temperature, setting", [("greedy", 0.0, ("2,6,16", None)),
                                                        ("lossless", 1.0, ("2,6,16", None)),
                                                        ("pointmass", 1.0, ("2,6,16", None)),
                                                        ("lossless", 1.0, SETTINGS[-1])])
def test_caches_after_eagle_steps_equal_plain_decoding(counting_gpt, trained_head, rule, temperature, setting):
    size, tree = setting
    proposer = Eagle(counting_gpt, trained_head, tree=tree)
    d = Decoder(counting_gpt, proposer, size, rule=rule)
    prompt = [3, 5, 7, 9]
    [seq], _ = drive(d.steps(prompt, Sampling(temperature), torch.Generator().manual_seed(0), 1000), [prompt], 8)
    cache, head_cache = d.cache, proposer.spare  # the target's and the head's caches at batch 1
    n = cache.length
    assert n == len(seq) - 1  # everything but the newest token, which has not been fed yet
    expected, expected_head = plain_caches(counting_gpt, trained_head, seq, n)
    torch.testing.assert_close(cache.k[:, :, :, :n], expected.k[:, :, :, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.v[:, :, :, :n], expected.v[:, :, :, :n], atol=1e-5, rtol=1e-5)
    m = head_cache.length  # the head has read the pairs of all but the last step (the rest are pending)
    assert 0 < m < n
    torch.testing.assert_close(head_cache.k[:, :, :, :m], expected_head.k[:, :, :, :m], atol=1e-4, rtol=1e-4)


# ---- sampling: the target's distribution, exactly --------------------------------------------

V, PROMPT = 8, [0, 1]
SAMPLING = Sampling(1.0, top_k=4)  # 4 tokens per step: 64 three-token continuations


@pytest.fixture(scope="module")
def tiny_vocab():
    from test_verify import exact_three_token_distribution
    target = random_gpt(vocab_size=V, n_ctx=16, n_layer=1, n_embd=16, scale=6.0, seed=1)
    return target, exact_three_token_distribution(target), random_head(target, 2, scale=3.0)


def three_token_counts(target, head, rule, n, patch=None, size=None, tree=None):
    """Counts of the first three generated tokens over seeds 0..n-1 (each from a tree step).
    patch: (name, function) replacing a tree growth methods/eagle.py calls, for the run (a planted bug)."""
    name, fn = patch or ("grow_tree", eagle_module.grow_tree)
    original = getattr(eagle_module, name)
    setattr(eagle_module, name, fn)
    d = Decoder(target, Eagle(target, head, tree=tree), size, rule=rule)
    try:
        [runs] = sampled_rows(d, [PROMPT], SAMPLING, n)
    finally:
        setattr(eagle_module, name, original)
    assert all(res.proposed > 0 for res in runs)  # tokens 2 and 3 always came from a tree step
    return token_counts(runs, V)


TREE = dict(size="2,3,6")  # a dynamic tree that branches at every depth
STATIC = dict(tree=Tree((-1, -1, -1, 0, 0, 1), (0, 1, 2, 0, 1, 0)))


@pytest.mark.slow
@pytest.mark.parametrize("rule, setting", [("lossless", TREE), ("pointmass", TREE), ("lossless", STATIC),
                                           ("traversal", TREE), ("traversal", STATIC)],
                         ids=["lossless-dynamic", "pointmass-dynamic", "lossless-static", "traversal-dynamic",
                              "traversal-static"])
def test_sampled_eagle_has_the_target_distribution(tiny_vocab, rule, setting):
    target, exact, head = tiny_vocab
    stat, dof = chi_square(three_token_counts(target, head, rule, 4000, **setting), exact)
    assert stat < critical_value(dof), f"{rule}: chi-square {stat:.1f} with {dof} dof"


def pruned_by_own_value(root_logits, expand, k, depth, nodes, sampling, generator):
    """A BUGGY sampled tree: EAGLE-2's rerank applied to sampled children. Four children are
    drawn per expanded node and the 2 nodes of highest value are kept, so a draw survives
    because of its own sampled value."""
    parents, tokens, q = grow_sampled_tree(root_logits, expand, 4, depth, 64, sampling, generator)
    parents, value = parents.tolist(), []
    for p, t, row in zip(parents, tokens.tolist(), q[1:]):
        value.append((value[p] if p >= 0 else 0.0) + float(row[t].log()))
    keep = sorted(sorted(range(len(parents)), key=lambda i: (-value[i], i))[:2])
    new = {old: i for i, old in enumerate(keep)}
    return torch.tensor([new[parents[i]] if parents[i] >= 0 else -1 for i in keep]), tokens[keep], \
        q[[0] + [i + 1 for i in keep]]


def top_k_judged_as_samples(fill):
    """A BUGGY `fill_static_tree` for the lossless rule: top-k children, handed over with the q
    they were ranked from as if they had been drawn from it (chapter 7's exercise 2, for EAGLE)."""
    def buggy(tree, root_logits, expand, sampled, sampling, generator):
        logits = {-1: root_logits}

        def recording(nodes, parents, tokens, depth):
            out = expand(nodes, parents, tokens, depth)
            logits.update(zip(nodes.tolist(), out))
            return out
        tokens, _ = fill(tree, root_logits, recording, False, sampling, generator)
        return tokens, torch.stack([sampling.probs(root_logits)] + [sampling.probs(logits[p]) for p in tree.parents])
    return buggy


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["sampled children pruned by their own value", "top-k children judged as samples"])
def test_buggy_variants_are_rejected(tiny_vocab, bug):
    """The distribution test can fail: two plausible mistakes each move the output far from p."""
    target, exact, head = tiny_vocab
    if bug.startswith("sampled"):
        counts = three_token_counts(target, head, "lossless", 2000, ("grow_sampled_tree", pruned_by_own_value), **TREE)
    else:
        counts = three_token_counts(target, head, "lossless", 2000,
                                    ("fill_static_tree", top_k_judged_as_samples(eagle_module.fill_static_tree)),
                                    **STATIC)
    stat, dof = chi_square(counts, exact)
    assert stat > 3 * critical_value(dof), f"{bug}: chi-square {stat:.1f} with {dof} dof looked exact"


# ---- command line ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("eagle")
    target = random_gpt(vocab_size=8192, n_ctx=64, scale=4.0)
    target.save(d / "target.safetensors")
    random_head(target, 0, scale=2.0).save(d / "eagle.safetensors")
    random_head(random_gpt(vocab_size=8192, n_ctx=64, seed=5), 0).save(d / "other.safetensors")
    save_tree(from_choices([(0,), (1,), (0, 0)]), d / "small.json")
    return d


def test_cli_eagle_equals_ar(files, capsys):
    base = ["--prompt", "def f(x):", "--max-new-tokens", "24", "--model", str(files / "target.safetensors"), "--json"]
    generate.main(base)
    ar = json.loads(capsys.readouterr().out)
    for extra in ([], ["--tree", str(files / "small.json")], ["--size", "2,3,5"], ["--size", "auto"]):
        generate.main(base + ["--method", "eagle", "--eagle", str(files / "eagle.safetensors")] + extra)
        out = json.loads(capsys.readouterr().out)
        assert out["token_ids"] == ar["token_ids"], extra
        assert "sized" in out["stats"] if extra[1:] == ["auto"] else out["stats"]["proposed_tokens"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--eagle", "{d}/none.safetensors"], "not found"),
    (["--eagle", "{d}/other.safetensors"], "different target"),
    (["--eagle", "{d}/target.safetensors"], "not an EAGLE head"),
    (["--size", "0,2,4"], "eagle's TOPK must be in 1..16, got 0"), (["--size", "16"], "TOPK,DEPTH,NODES"),
    (["--accept", "block"], "not a tree")])
def test_cli_refuses_bad_eagle_settings(files, argv, message, capsys):
    argv = [a.format(d=files) for a in argv]
    assert message in refused(generate.main, ["--prompt", "x", "--model", str(files / "target.safetensors"), "--method",
                                              "eagle", "--eagle", str(files / "eagle.safetensors")] + argv, capsys)


def test_bench_names_eagle_rows():
    assert specs.parse_method("eagle:2,8,32") == ("eagle", "2,8,32", None)
    assert specs.parse_method("eagle:auto@pointmass") == ("eagle", "auto", "pointmass")
    with pytest.raises(SystemExit):
        specs.parse_method("eagle:x")


@pytest.mark.slow
def test_train_eagle_command_writes_head_card_and_resumes(corpus_dir, tmp_path):
    from tinyspec.commands import train
    target = tmp_path / "target.safetensors"
    random_gpt(vocab_size=8192, n_ctx=64, scale=3.0).save(target)
    argv = ["eagle", "--target", str(target), "--sequences", "32", "--prompt-len", "8", "--gen-len", "24",
            "--gen-batch", "16", "--steps", "6", "--batch-size", "4", "--checkpoint-every", "3",
            "--data-dir", str(corpus_dir), "--stdlib-only", "--run-dir", str(tmp_path / "run"),
            "--medusa-run-dir", str(tmp_path / "none"), "--out", str(tmp_path / "e.safetensors")]
    train.main(argv)
    head = EagleHead.load(tmp_path / "e.safetensors")
    assert head.target_fingerprint == random_gpt(vocab_size=8192, n_ctx=64, scale=3.0).fingerprint()
    assert len(head.accuracy) == 5
    card = (tmp_path / "e.md").read_text()
    assert "top-1 accuracy" in card and "tau =" in card and "| 6 |" in card
    train.main(argv + ["--resume"])  # the last checkpoint is the end: nothing left to train, same head
    for a, b in zip(head.state_dict().values(), EagleHead.load(tmp_path / "e.safetensors").state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(SystemExit) as e:
        train.main([str(tmp_path / "empty") if a == str(tmp_path / "run") else a for a in argv] + ["--resume"])
    assert e.value.code == 2


def test_training_on_own_predictions_sees_what_a_draft_chain_sees(counting_gpt, counting_data, trained_head):
    """Training-time test (`distill.own_chains`): depth d's rows are what the head computes for a
    chain d deep drafted below each anchor at decoding time, one node per head forward through
    `HeadDrafter` (catch-up, then expansions), fed the true tokens."""
    from tinyspec.training.distill import own_chains
    from tinyspec.methods.eagle import HeadDrafter
    seqs, _ = counting_data
    x = torch.from_numpy(seqs[:2].astype("int64"))
    f = counting_gpt.hidden(x)
    wte = counting_gpt.transformer.wte
    pairs = trained_head.embed(f[:, :-1], x[:, 1:], wte)
    j, depth = torch.tensor([3, 9, 15]), 4
    with torch.no_grad():
        chains = own_chains(trained_head, pairs, trained_head.run(pairs), x, j, depth, wte)
        for b in range(2):
            for a, anchor in enumerate(j.tolist()):
                drafter = HeadDrafter(trained_head, wte, counting_gpt.lm_head, trained_head.new_cache(64))
                drafter.catch_up(f[b, :anchor + 1], x[b, 1:anchor + 2])  # the true pairs 0..j
                parents, tokens = [], []
                for d in range(2, depth + 1):  # node d - 2 is d deep: parent the node above (-1: the root)
                    parents.append(len(parents) - 1)
                    tokens.append(int(x[b, anchor + d]))
                    drafter.expand(torch.tensor([len(parents) - 1]), torch.tensor(parents), torch.tensor(tokens)[-1:], d - 1)
                    torch.testing.assert_close(chains[d - 2][b, a], drafter.feature[len(parents) - 1], atol=1e-4,
                                               rtol=1e-4)


def test_train_eagle_on_its_own_predictions_from_a_head(corpus_dir, tmp_path):
    """`train eagle --depth 3 --init-from HEAD`: training-time test, starting from a trained head;
    the card says so, and a parallel head is refused as a start."""
    from tinyspec.commands import train
    from test_parallel import random_parallel
    target = random_gpt(vocab_size=8192, n_ctx=64, scale=3.0)
    target.save(tmp_path / "target.safetensors")
    start = random_head(target, 0, 2.0)
    start.save(tmp_path / "start.safetensors")
    argv = ["eagle", "--target", str(tmp_path / "target.safetensors"), "--sequences", "32", "--prompt-len", "8",
            "--gen-len", "24", "--gen-batch", "16", "--steps", "4", "--batch-size", "4", "--depth", "3", "--anchors",
            "8", "--data-dir", str(corpus_dir), "--stdlib-only", "--run-dir", str(tmp_path / "run"), "--medusa-run-dir",
            str(tmp_path / "none"), "--out", str(tmp_path / "e.safetensors")]
    train.main(argv + ["--init-from", str(tmp_path / "start.safetensors")])
    head = EagleHead.load(tmp_path / "e.safetensors")
    assert (head.fc.weight.float() - start.fc.weight.float()).abs().max() < 0.05
    card = (tmp_path / "e.md").read_text()
    assert "the head's own predicted features" in card and "start.safetensors" in card
    random_parallel(target, 0).save(tmp_path / "p.safetensors")
    with pytest.raises(SystemExit) as e:
        train.main(argv[:-2] + ["--out", str(tmp_path / "e2.safetensors"), "--init-from", str(tmp_path / "p.safetensors")])
    assert e.value.code == 2
