"""The model against Hugging Face's GPT-2 (an independent implementation of the same math)."""

import pytest
import torch

from tinyspec.kvcache import KVCache
from tinyspec.model import GPT, GPTConfig, prefix_mask

transformers = pytest.importorskip("transformers")  # in the test extra, so CI runs these


def hf_gpt2(seed=0, vocab_size=97, n_positions=48, n_embd=48, n_layer=3, n_head=4):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
                                  n_head=n_head, bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # HF zero-initialises biases and LayerNorms: randomise them so they are tested
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(0, 0.2).add_(1.0 if ".ln_" in name or "ln_f" in name else 0.0)
    return model


def test_logits_match_huggingface_gpt2(tmp_path):
    hf = hf_gpt2()
    hf.save_pretrained(tmp_path)
    ours = GPT.from_hf(tmp_path).eval()
    x = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        expected = hf(x).logits
        logits, hidden = ours(x)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    assert hidden.shape == (2, 40, 48)


def test_explicit_positions_match_huggingface_position_ids(tmp_path):
    hf = hf_gpt2(seed=1)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_hf(tmp_path).eval()
    x = torch.randint(0, 97, (1, 10))
    pos = torch.arange(20, 30)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, positions=pos)[0], hf(x, position_ids=pos[None]).logits, atol=1e-4, rtol=1e-4)


def test_roundtrip_through_huggingface(tmp_path):
    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=50, n_ctx=32, n_layer=2, n_head=2, n_embd=16)).eval()
    ours.to_hf(tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    x = torch.randint(0, 50, (3, 32))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x)[0], atol=1e-5, rtol=1e-5)
    hf.save_pretrained(tmp_path / "back")  # and back again, from HF's own writer
    again = GPT.from_hf(tmp_path / "back")
    for (name, a), b in zip(ours.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name


def test_single_file_with_sibling_config_and_bare_gpt2model_names(tmp_path):
    hf = hf_gpt2(seed=2)
    hf.transformer.save_pretrained(tmp_path)  # GPT2Model: keys without the "transformer." prefix
    ours = GPT.from_hf(tmp_path / "model.safetensors").eval()
    x = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], hf(x).logits, atol=1e-4, rtol=1e-4)


def test_save_keeps_config_and_dtype(tmp_path):
    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=40, n_ctx=16, n_layer=1, n_head=2, n_embd=8))
    ours.save(tmp_path / "m.safetensors", dtype=torch.bfloat16)
    back = GPT.from_hf(tmp_path / "m.safetensors")
    assert back.config == ours.config and back.lm_head.weight.dtype == torch.bfloat16
    assert back.lm_head.weight.data_ptr() == back.transformer.wte.weight.data_ptr()  # still tied
    assert not list(tmp_path.glob("*.tmp"))


def test_corrupt_or_foreign_checkpoints_are_refused(tmp_path):
    (tmp_path / "bad.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        GPT.from_hf(tmp_path / "bad.safetensors")
    cfg = transformers.GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2, activation_function="relu")
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "relu")
    with pytest.raises(ValueError, match="activation"):
        GPT.from_hf(tmp_path / "relu")
    with pytest.raises(FileNotFoundError):
        GPT.from_hf(tmp_path / "missing.safetensors")


def test_tree_mask_and_positions_equal_separate_sequences(tmp_path):
    """Two branches fed as one tree (each token at position L + depth, seeing only its
    ancestors) give the logits HF computes for each branch as a plain sequence."""
    hf = hf_gpt2(seed=3)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_hf(tmp_path).eval()
    prefix = torch.randint(0, 97, (1, 7))
    a, b, c = 11, 22, 33  # tree: a -> b, and c beside a
    cache = KVCache.for_model(ours, 32)
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)
    with torch.no_grad():
        ours(prefix, cache=cache)
        tree_logits, _ = ours(torch.tensor([[a, b, c]]), positions=torch.tensor([7, 8, 7]), cache=cache, attn_mask=prefix_mask(mask, cache.length))
        ab = hf(torch.cat([prefix, torch.tensor([[a, b]])], 1)).logits[0, -2:]
        c_ = hf(torch.cat([prefix, torch.tensor([[c]])], 1)).logits[0, -1]
    torch.testing.assert_close(tree_logits[0, :2], ab, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(tree_logits[0, 2], c_, atol=1e-4, rtol=1e-4)


def test_a_model_loaded_in_bfloat16_is_the_same_model_as_in_float32(tmp_path):
    """Heads trained for a float32 target must load beside it in bf16 (--dtype bfloat16): rounding
    changes the embedding's bytes, not which model it is; a different model still differs."""
    from conftest import random_gpt
    random_gpt(seed=0).save(tmp_path / "a.safetensors")
    random_gpt(seed=1).save(tmp_path / "b.safetensors")
    a32, a16 = GPT.from_hf(tmp_path / "a.safetensors"), GPT.from_hf(tmp_path / "a.safetensors", dtype=torch.bfloat16)
    assert a16.transformer.wte.weight.dtype == torch.bfloat16
    assert a16.fingerprint() == a32.fingerprint() == random_gpt(seed=0).fingerprint()
    assert GPT.from_hf(tmp_path / "b.safetensors", dtype=torch.bfloat16).fingerprint() != a32.fingerprint()
