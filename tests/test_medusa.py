"""Medusa: the heads, their checkpoints, and decoding against plain decoding: greedy token for
token over many tree shapes, the cache afterwards, and the command line."""
import json
import random

import pytest
import torch

from tinyspec.commands import generate
from tinyspec.training.distill import self_distill, train_heads
from tinyspec.methods import Decoder
from tinyspec.methods.medusa import Medusa, MedusaHeads
from tinyspec.sampling import Sampling
from tinyspec.tree import Tree, from_accuracies, from_choices, save_tree

from conftest import (CountingCorpus, assert_cache_holds, counting_sequences, drive, generations, looped, plain_tokens,
                      random_gpt, random_heads, random_tree, refused)


def test_new_heads_are_the_base_head_and_do_not_share_weights():
    heads = MedusaHeads(32, 4)
    assert len({id(b) for b in heads.blocks}) == 4 and len({b.linear.weight.data_ptr() for b in heads.blocks}) == 4
    model = random_gpt()
    h = torch.randn(3, 32)
    out = heads(h, model.lm_head)
    assert out.shape == (4, 3, 64)
    for i in range(4):
        torch.testing.assert_close(out[i], model.lm_head(h))  # W = 0, b = 0: identity block
    with torch.no_grad():
        heads.blocks[1].linear.weight.fill_(0.1)
    assert torch.equal(heads(h, model.lm_head)[0], out[0])  # changing head 2 leaves head 1 alone


def test_save_load_keeps_weights_accuracy_and_fingerprint(tmp_path):
    heads = MedusaHeads(16, 3)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_()
    heads.accuracy = torch.rand(3, 10)
    heads.target_fingerprint = random_gpt().fingerprint()
    heads.save(tmp_path / "h.safetensors")
    back = MedusaHeads.load(tmp_path / "h.safetensors")
    assert back.n_heads == 3 and back.target_fingerprint == heads.target_fingerprint
    torch.testing.assert_close(back.accuracy, heads.accuracy, atol=1e-5, rtol=0)
    for a, b in zip(heads.state_dict().values(), back.state_dict().values()):
        assert torch.equal(a, b)
    (tmp_path / "bad.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        MedusaHeads.load(tmp_path / "bad.safetensors")
    random_gpt().save(tmp_path / "model.safetensors")  # a real checkpoint, but of a model
    with pytest.raises(ValueError, match="not a Medusa heads file"):
        MedusaHeads.load(tmp_path / "model.safetensors")
    assert random_gpt(seed=1).fingerprint() != random_gpt(seed=2).fingerprint()


@pytest.fixture(scope="module")
def trained_heads(counting_gpt):
    seqs = self_distill(counting_gpt, CountingCorpus(), 128, 8, 24, 64, temperature=0.0, progress=False)
    heads = MedusaHeads(32, 3)
    train_heads(counting_gpt, heads, seqs, 8, steps=300, batch=16, lr=2e-2, progress=False)
    return heads.eval()


TREES = {
    "chain": Tree((-1, 0, 1), (0, 0, 0)),
    "star": Tree((-1, -1, -1, -1), (0, 1, 2, 3)),
    "default": from_accuracies(torch.tensor([[0.5, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.2, 0.1]]), 10),
    "random": random_tree(12, 3, seed=0),
}


def test_greedy_medusa_equals_plain_decoding_on_every_tree_shape(counting_gpt, trained_heads):
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    prompts = [counting_sequences(1, rng.randint(3, 10), 32, g)[0].tolist() for _ in range(3)]
    prompts += [[rng.randrange(32) for _ in range(rng.randint(1, 10))] for _ in range(3)]  # not counting
    plain = [plain_tokens(counting_gpt, prompt, 40) for prompt in prompts]
    accepted = rejected = 0
    for heads in (trained_heads, random_heads(32, 3, seed=1)):
        for name, tree in TREES.items():
            for prompt, expected in zip(prompts, plain):
                res = generations(counting_gpt, Medusa(counting_gpt, heads, tree=tree), [prompt], n=40)[0]
                assert res.token_ids == expected, f"tree {name}, prompt {prompt}"
                accepted, rejected = accepted + res.accepted, rejected + res.rejections
    assert accepted > 100 and rejected > 10  # long accepted paths and corrections both happened


@pytest.mark.parametrize("rule", ["pointmass", "lossless", "traversal"])
def test_lossless_rules_at_temperature_zero_are_greedy_decoding(counting_gpt, trained_heads, rule):
    rng = random.Random(2)
    for name, tree in TREES.items():
        prompt = [rng.randrange(32) for _ in range(rng.randint(1, 10))]
        res = looped(counting_gpt, Medusa(counting_gpt, trained_heads, tree=tree), [prompt], rule=rule, n=30)[0]
        assert res.token_ids == plain_tokens(counting_gpt, prompt, 30), f"{rule}, tree {name}"


def test_trained_heads_make_greedy_medusa_take_fewer_target_passes(counting_gpt, trained_heads):
    prompt = counting_sequences(1, 6, 32, torch.Generator().manual_seed(3))[0].tolist()
    res = generations(counting_gpt, Medusa(counting_gpt, trained_heads, tree=TREES["default"]), [prompt], n=40)[0]
    assert res.token_ids == plain_tokens(counting_gpt, prompt, 40)
    assert len(res.token_ids) / res.target_steps > 1.8  # tau, tokens per target forward


@pytest.mark.parametrize("rule, temperature", [("greedy", 0.0), ("lossless", 1.0), ("typical", 0.7)])
def test_cache_after_medusa_steps_equals_plain_decoding(counting_gpt, trained_heads, rule, temperature):
    d = Decoder(counting_gpt, Medusa(counting_gpt, trained_heads, tree=TREES["random"]), rule=rule)
    prompt = [3, 5, 7, 9]
    [seq], produced = drive(d.steps(prompt, Sampling(temperature), torch.Generator().manual_seed(0), 1000), [prompt], 8)
    assert d.cache.length == len(seq) - 1  # everything but the newest token, which has not been fed yet
    assert any(len(step.tokens) > 1 for p in produced for step in p.values())  # paths of the tree were kept
    assert_cache_holds(counting_gpt, d.cache, seq)


# ---- command line ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("medusa")
    target = random_gpt(vocab_size=8192, n_ctx=64, scale=4.0)
    target.save(d / "target.safetensors")
    heads = random_heads(32, 3, seed=0)
    heads.accuracy = torch.tensor([[0.5, 0.2, 0.1], [0.3, 0.2, 0.1], [0.2, 0.1, 0.1]])
    heads.target_fingerprint = target.fingerprint()
    heads.save(d / "heads.safetensors")
    heads.target_fingerprint = random_gpt(vocab_size=8192, n_ctx=64, seed=5).fingerprint()
    heads.save(d / "other_heads.safetensors")
    save_tree(from_choices([(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]), d / "deep.json")
    save_tree(from_choices([(0,), (1,), (0, 0)]), d / "small.json")
    return d


def test_cli_medusa_equals_ar(files, capsys):
    base = ["--prompt", "def f(x):", "--max-new-tokens", "24", "--model", str(files / "target.safetensors"), "--json"]
    generate.main(base)
    ar = json.loads(capsys.readouterr().out)
    for tree in ([], ["--size", "8"], ["--tree", str(files / "small.json")], ["--size", "auto"]):
        generate.main(base + ["--method", "medusa", "--heads", str(files / "heads.safetensors")] + tree)
        out = json.loads(capsys.readouterr().out)
        assert out["token_ids"] == ar["token_ids"]
        assert "sized" in out["stats"] if tree[1:] == ["auto"] else out["stats"]["proposed_tokens"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--heads", "{d}/none.safetensors"], "not found"),
    (["--heads", "{d}/other_heads.safetensors"], "different target"),
    (["--tree", "{d}/deep.json"], "only 3 heads"),
    (["--tree", "{d}/none.json"], "cannot read tree"),
    (["--size", "0"], "1..127"), (["--size", "2,3"], "a medusa size is NODES")])
def test_cli_refuses_bad_medusa_settings(files, argv, message, capsys):
    argv = [a.format(d=files) for a in argv]
    assert message in refused(generate.main, ["--prompt", "x", "--model", str(files / "target.safetensors"), "--method",
                                              "medusa", "--heads", str(files / "heads.safetensors")] + argv, capsys)


@pytest.mark.triton
def test_cli_triton_attention_gives_the_same_tokens(files, capsys):
    """The Triton tree-attention kernel (interpreted on a CPU) against the PyTorch reference path."""
    pytest.importorskip("triton")
    base = ["--prompt", "def f(x):", "--max-new-tokens", "12", "--model", str(files / "target.safetensors"), "--json",
            "--method", "medusa", "--heads", str(files / "heads.safetensors"), "--size", "8"]
    generate.main(base + ["--attn", "torch"])
    reference = json.loads(capsys.readouterr().out)
    generate.main(base + ["--attn", "triton"])
    kernel = json.loads(capsys.readouterr().out)
    assert kernel["token_ids"] == reference["token_ids"] and reference["stats"]["proposed_tokens"] > 0
