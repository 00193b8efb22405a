"""The parallel feature drafter (methods/parallel.py): one head forward drafts a whole block.
Held to plain decoding (greedy: token for token; sampled: the target's distribution on a
vocabulary small enough to enumerate, and a planted bug must fail that check), to batch 1 (a
row of a batch writes what it writes alone), and to EAGLE's head (depth 1 is EAGLE's guess)."""
import json
import random

import pytest
import torch

from tinyspec.commands import generate
from tinyspec.training import distill
from tinyspec.methods import Decoder
from tinyspec.methods import parallel as parallel_module
from tinyspec.methods.eagle import EagleHead
from tinyspec.methods.growth import grow_tree
from tinyspec.methods.parallel import Parallel, ParallelHead
from tinyspec.sampling import Sampling
from tinyspec.tree import Tree

from conftest import counting_sequences, generations, plain_tokens, random_gpt, refused, sampled_rows, token_counts
from test_eagle import counting_data  # noqa: F401 (a fixture)
from test_speculative import chi_square, critical_value


def random_parallel(target, seed, scale=1.0, block=4):
    torch.manual_seed(seed)
    head = ParallelHead.from_heads(EagleHead.for_target(target), None, block)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn_like(p) * scale / p.shape[1] ** 0.5)
    return head.eval()


@pytest.fixture(scope="module")
def target():
    return random_gpt(vocab_size=64, n_ctx=96, scale=3.0, seed=0)


@pytest.mark.parametrize("size, tree", [("1,4,4", None), ("2,4,8", None), ("3,2,6", None), ("1,1,1", None),
                                        (None, Tree((-1, -1, 0, 0, 2), (0, 1, 0, 1, 0)))])
def test_greedy_parallel_equals_plain_decoding(target, size, tree):
    rng, g = random.Random(5), torch.Generator().manual_seed(5)
    head = random_parallel(target, 1, 3.0)
    accepted = rejected = 0
    for _ in range(4):
        prompt = counting_sequences(1, rng.randint(2, 9), 64, g)[0].tolist()
        res = generations(target, Parallel(target, head, tree=tree), [prompt], n=40, size=size or "2,4,8")[0]
        assert res.token_ids == plain_tokens(target, prompt, 40), f"size {size}, prompt {prompt}"
        accepted, rejected = accepted + res.accepted, rejected + res.rejections
    assert rejected > 0  # the rule's judgement was needed


def test_one_forward_drafts_eagles_guess_and_medusas_heads_on_it(target):
    """The block is one head forward: depth 1 is EAGLE's own f^ (an EAGLE head with the same
    weights, fed the same pairs), depth i + 1 is Medusa's head i on it; the pairs stay in the cache."""
    head = random_parallel(target, 2, 2.0, block=5)
    wte = target.transformer.wte
    f, tokens = torch.randn(6, 32), torch.randint(64, (6,))
    cache = head.new_cache(32)
    head(f[:2][None], tokens[:2][None], wte, cache)  # pairs read in an earlier step
    out = head.draft(f[2:], tokens[2:], wte, cache, 5)
    assert out.shape == (5, 32) and cache.length == 6
    eagle = EagleHead(head.config)
    eagle.load_state_dict({k: v for k, v in head.state_dict().items() if not k.startswith("ahead.")})
    f_hat = eagle(f[None], tokens[None], wte)[0, -1]
    torch.testing.assert_close(out[0], f_hat, atol=1e-5, rtol=1e-5)
    for i, block in enumerate(head.ahead.blocks):
        w, b = block.linear.weight, block.linear.bias
        torch.testing.assert_close(out[i + 1], f_hat + torch.nn.functional.silu(w @ f_hat + b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_of_a_batch_write_what_they_write_alone(target, temperature):
    head = random_parallel(target, 3, 3.0)
    prompts, seeds, sampling = [[1, 2, 3, 4, 5], [9, 8], [30, 31, 32, 33]], [11, 12, 13], Sampling(temperature)
    rule = None if temperature == 0 else "lossless"
    together = generations(target, Parallel(target, head), prompts, sampling, seeds, n=30, size="2,3,5", rule=rule)
    for prompt, seed, res in zip(prompts, seeds, together):
        alone = generations(target, Parallel(target, head), [prompt], sampling, [seed], n=30, size="2,3,5", rule=rule)[0]
        assert res.token_ids == alone.token_ids


# ---- sampling: exactness, statistically ------------------------------------------------------

V = 8
from test_verify import PROMPT  # noqa: E402 (the prompt its exact distribution is of)
SAMPLING = Sampling(1.0, top_k=4)  # 4 tokens per step: 64 three-token continuations


@pytest.fixture(scope="module")
def tiny_vocab():
    from test_verify import exact_three_token_distribution
    target = random_gpt(vocab_size=V, n_ctx=16, n_layer=1, n_embd=16, scale=6.0, seed=1)
    return target, exact_three_token_distribution(target), random_parallel(target, 2, 3.0)


def three_token_counts(tiny, rule, n, size="2,3,6", tree=None):
    target, _, head = tiny
    [runs] = sampled_rows(Decoder(target, Parallel(target, head, tree=tree), size, rule=rule), [PROMPT], SAMPLING, n)
    assert all(res.proposed > 0 for res in runs)  # tokens 2 and 3 always came from a block step
    return token_counts(runs, V)


@pytest.mark.slow
@pytest.mark.parametrize("rule, size, tree", [("lossless", "2,3,6", None), ("pointmass", "1,3,3", None),
                                              ("pointmass", "2,3,6", None), ("traversal", "2,3,6", None),
                                              ("lossless", None, Tree((-1, -1, 0, 0, 1), (0, 1, 0, 1, 0)))],
                         ids=["lossless-tree", "pointmass-chain", "pointmass-tree", "traversal-tree", "lossless-static"])
def test_sampled_parallel_has_the_target_distribution(tiny_vocab, rule, size, tree):
    stat, dof = chi_square(three_token_counts(tiny_vocab, rule, 4000, size or "2,3,6", tree), tiny_vocab[1], V)
    assert stat < critical_value(dof), f"{rule}: chi-square {stat:.1f} with {dof} dof"


@pytest.mark.slow
def test_a_tree_of_top_k_judged_as_samples_is_caught(tiny_vocab, monkeypatch):
    """The distribution test can fail: EAGLE-2's top-k tree handed to the lossless rule with the
    q it was ranked from, as if its nodes had been drawn from it."""
    def top_k_as_samples(root_logits, expand, k, depth, nodes, sampling, generator):
        parents, tokens = grow_tree(root_logits, expand, k, depth, nodes)
        depth_of = [0]
        for p in parents.tolist():
            depth_of.append(depth_of[p + 1] + 1)
        rows = [root_logits] + [root_logits if p < 0 else expand(torch.tensor([p]), parents, tokens[[p]], depth_of[p + 1])[0]
                                for p in parents.tolist()]
        return parents, tokens, torch.stack([sampling.probs(r) for r in rows])
    monkeypatch.setattr(parallel_module, "grow_sampled_tree", top_k_as_samples)
    stat, dof = chi_square(three_token_counts(tiny_vocab, "lossless", 2000), tiny_vocab[1], V)
    assert stat > 3 * critical_value(dof), f"chi-square {stat:.1f} with {dof} dof looked exact"


# ---- training --------------------------------------------------------------------------------

def test_training_makes_the_block_guess_further_ahead(counting_gpt, counting_data):
    """On the counting target's own text (the next tokens follow from the stride) trained Medusa
    heads on depth 1's predicted feature guess depths 2-4 where an untrained head does not
    (`distill.unrolled_loss` teaches them on that predicted feature)."""
    seqs, heldout = counting_data
    torch.manual_seed(0)
    head = ParallelHead.for_target(counting_gpt)  # Medusa's heads start as the identity: depth d guesses depth 1's token
    before = distill.eagle_accuracy(counting_gpt, head.eval(), heldout, 8, depth=4)
    curve = distill.train_eagle(counting_gpt, head.train(), seqs, distill.target_features(counting_gpt, seqs), 400, 16,
                                1e-2, w=1.0, depth=4, anchors=24, progress=False, every=100)
    after = distill.eagle_accuracy(counting_gpt, head.eval(), heldout, 8, depth=4)
    assert max(before) < 0.1 and after[0] > 0.6 and min(after) > 0.3, (before, after)  # chance: 1/32
    assert curve[-1]["ce_per_depth"][3] < curve[0]["ce_per_depth"][3]


# ---- command line ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from test_eagle import random_head
    d = tmp_path_factory.mktemp("parallel")
    target = random_gpt(vocab_size=8192, n_ctx=64, scale=4.0)
    target.save(d / "target.safetensors")
    random_parallel(target, 0, 2.0).save(d / "parallel.safetensors")
    random_head(target, 0, scale=2.0).save(d / "eagle.safetensors")
    return d


def test_cli_parallel_equals_ar(files, capsys):
    base = ["--prompt", "def f(x):", "--max-new-tokens", "24", "--model", str(files / "target.safetensors"), "--json"]
    generate.main(base)
    ar = json.loads(capsys.readouterr().out)
    for extra in ([], ["--size", "2,3,5"], ["--size", "auto"]):
        generate.main(base + ["--method", "parallel", "--parallel", str(files / "parallel.safetensors")] + extra)
        out = json.loads(capsys.readouterr().out)
        assert out["token_ids"] == ar["token_ids"], extra
        assert "sized" in out["stats"] if extra[1:] == ["auto"] else out["stats"]["proposed_tokens"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--size", "1,5,5"], "drafts 4 deep at most"), (["--size", "1,6,6"], "DEPTH must be in 1..5"),
    (["--size", "2,4"], "TOPK,DEPTH,NODES"),
    (["--parallel", "{d}/eagle.safetensors"], "holds an EAGLE head"),
    (["--eagle", "{d}/parallel.safetensors"], "--eagle applies to --method eagle"),
])
def test_cli_refuses_bad_parallel_settings(files, argv, message, capsys):
    argv = [a.format(d=files) for a in argv]
    assert message in refused(generate.main, ["--prompt", "x", "--model", str(files / "target.safetensors"), "--method",
                                              "parallel", "--parallel", str(files / "parallel.safetensors")] + argv,
                              capsys)


def test_train_parallel_command_starts_from_an_eagle_head_and_resumes(corpus_dir, tmp_path, capsys):
    from tinyspec.commands import train
    from test_eagle import random_head
    target = random_gpt(vocab_size=8192, n_ctx=64, scale=3.0)
    target.save(tmp_path / "target.safetensors")
    eagle = random_head(target, 0, 2.0)
    eagle.save(tmp_path / "eagle.safetensors")
    argv = ["parallel", "--target", str(tmp_path / "target.safetensors"), "--sequences", "32", "--prompt-len", "8",
            "--gen-len", "24", "--gen-batch", "16", "--steps", "6", "--batch-size", "4", "--checkpoint-every", "3",
            "--depth", "3", "--heads-from", "none", "--data-dir", str(corpus_dir), "--stdlib-only", "--run-dir",
            str(tmp_path / "run"), "--medusa-run-dir", str(tmp_path / "none"), "--init-from",
            str(tmp_path / "eagle.safetensors"), "--out", str(tmp_path / "p.safetensors")]
    train.main(argv)
    head = ParallelHead.load(tmp_path / "p.safetensors")
    assert head.block_size == 3 and len(head.accuracy) == 3
    assert head.target_fingerprint == target.fingerprint()
    assert not torch.equal(head.fc.weight, eagle.fc.weight.to(head.fc.weight.dtype))  # it trained ...
    assert (head.fc.weight.float() - eagle.fc.weight.float()).abs().max() < 0.05  # ... from the EAGLE head
    card = (tmp_path / "p.md").read_text()
    assert "Medusa head" in card and "tau =" in card and "| 6 |" in card
    train.main(argv + ["--resume"])  # the last checkpoint is the end: nothing left to train, same head
    for a, b in zip(head.state_dict().values(), ParallelHead.load(tmp_path / "p.safetensors").state_dict().values()):
        assert torch.equal(a, b)
    capsys.readouterr()
    again = argv[:argv.index("--init-from")] + ["--init-from", str(tmp_path / "p.safetensors"), "--depth", "4"]
    assert "holds an earlier run's checkpoints" in refused(train.main, again, capsys)  # not removed in silence
    assert "drafts 3 deep" in refused(train.main, again + ["--force"], capsys)
