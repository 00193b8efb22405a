"""Self-distillation and head training: the loss's indexing, heads that learn to look ahead,
and the `train medusa` command."""
import numpy as np
import pytest
import torch

from tinyspec.commands import train
from tinyspec.training.distill import head_accuracy, medusa_loss, self_distill, train_heads
from tinyspec.methods.medusa import MedusaHeads

from conftest import CountingCorpus, random_gpt


def test_loss_pairs_head_i_at_t_with_target_at_t_plus_i():
    """Reference: a plain loop over heads and positions."""
    torch.manual_seed(0)
    K, B, T, V = 3, 2, 7, 5
    head_logits, target_logits = torch.randn(K, B, T, V), torch.randn(B, T, V)
    loss, per_head = medusa_loss(head_logits, target_logits, decay=0.5)
    expected = 0.0
    for i in range(1, K + 1):
        ces = [-(torch.softmax(target_logits[b, t + i], -1) * torch.log_softmax(head_logits[i - 1, b, t], -1)).sum()
               for b in range(B) for t in range(T - i)]
        assert per_head[i - 1] == pytest.approx(float(torch.stack(ces).mean()), rel=1e-5)
        expected += 0.5 ** i * per_head[i - 1]
    assert float(loss) == pytest.approx(expected, rel=1e-5)


def test_trained_heads_learn_to_look_ahead(counting_gpt):
    """On counting text x_{t+1} = x_t + s, head i must learn x_{t+1+i} = x_t + (i + 1) s; a new
    head (= the base head) guesses x_{t+1} instead and is never right."""
    target = counting_gpt
    seqs = self_distill(target, CountingCorpus(), 128, 8, 24, 64, temperature=0.0, progress=False)
    assert seqs.shape == (128, 32) and seqs.dtype == np.uint16
    heldout = self_distill(target, CountingCorpus(), 32, 8, 24, 32, temperature=0.0, seed=1, progress=False)
    heads = MedusaHeads(32, 2)
    weights = {k: v.clone() for k, v in target.state_dict().items()}
    before = head_accuracy(target, heads, heldout, 8)
    train_heads(target, heads, seqs, 8, steps=400, batch=16, lr=2e-2, progress=False)
    after = head_accuracy(target, heads, heldout, 8)
    assert after.shape == (2, 10)
    top3_before, top3_after = before[:, :3].sum(1), after[:, :3].sum(1)
    assert (before[:, 0] < 0.05).all() and (top3_after > top3_before + 0.4).all(), (before[:, :3], after[:, :3])
    assert all(torch.equal(v, weights[k]) for k, v in target.state_dict().items())  # the target stayed frozen


@pytest.mark.slow
def test_train_medusa_command(corpus_dir, tmp_path):
    target = tmp_path / "target.safetensors"
    random_gpt(vocab_size=8192, n_ctx=64, scale=3.0).save(target)
    train.main(["medusa", "--target", str(target), "--heads", "2", "--sequences", "32", "--prompt-len", "8",
                "--gen-len", "24", "--gen-batch", "16", "--steps", "10", "--batch-size", "4",
                "--data-dir", str(corpus_dir), "--stdlib-only", "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "h.safetensors")])
    heads = MedusaHeads.load(tmp_path / "h.safetensors")
    assert heads.n_heads == 2 and heads.accuracy.shape == (2, 10)
    card = (tmp_path / "h.md").read_text()
    assert "top-1 accuracy" in card and "predicted tau" in card
