"""Decoding rules against Hugging Face's logits warpers (an independent implementation)."""
import pytest
import torch

from tinyspec.sampling import check_params, probs, sample

transformers = pytest.importorskip("transformers")


def hf_probs(logits, temperature, top_k, top_p):
    warpers = transformers.LogitsProcessorList()
    warpers.append(transformers.TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(transformers.TopKLogitsWarper(top_k))
    if top_p:
        warpers.append(transformers.TopPLogitsWarper(top_p))
    return torch.softmax(warpers(None, logits.clone()), -1)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, None, None), (0.7, None, None), (1.3, 5, None),
                                                       (1.0, None, 0.9), (0.8, 20, 0.5), (1.0, 1, None)])
def test_matches_huggingface_warpers(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(8, 50) * 3
    torch.testing.assert_close(probs(logits, temperature, top_k, top_p), hf_probs(logits, temperature, top_k, top_p))


def test_greedy_is_one_hot_at_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [5.0, 4.0, 5.5]])
    assert torch.equal(probs(logits, temperature=0), torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))


def test_top_p_keeps_smallest_set_reaching_mass():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.allclose(probs(logits, top_p=0.8), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    assert torch.allclose(probs(logits, top_p=0.81), torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)


def test_top_p_keeps_the_set_whose_mass_is_exactly_p_and_no_more():
    """Where the most likely tokens' mass equals top_p exactly, they are the smallest set reaching
    it, and the next token is left out (a mask that keeps tokens while the mass *before* them is
    below p, not at most p). Eight equal tokens of 1/8 each, exact in floats, make the mass hit p
    exactly; which of the tied tokens are kept does not matter, how many does. Hugging Face's
    TopPLogitsWarper keeps as many."""
    logits = torch.zeros(1, 8)
    for top_p, kept in ((0.5, 4), (0.375, 3), (0.125, 1), (0.51, 5)):
        p = probs(logits, top_p=top_p)
        assert int((p > 0).sum()) == kept, f"top_p {top_p} over eight tokens of 1/8 keeps {int((p > 0).sum())}, not {kept}"
        assert torch.allclose(p[p > 0], torch.full((kept,), 1 / kept))
        assert int((hf_probs(logits, 1.0, None, top_p) > 0).sum()) == kept


def test_seeded_sampling_is_reproducible_and_follows_p():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    draw = lambda seed: sample(p.expand(20000, 4), torch.Generator().manual_seed(seed))
    assert torch.equal(draw(1), draw(1))
    freq = torch.bincount(draw(2), minlength=4).float() / 20000
    # 4.6 standard deviations of the likeliest token's 20000-draw frequency (0.0035), more for the others:
    # a correct sampler, whatever order it draws in, misses it about once in 200,000 runs
    assert (freq - p).abs().max() < 0.016


def test_zero_probability_tokens_are_never_drawn_and_one_hot_gives_its_token():
    p = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0])  # zeros first, in the middle and last
    counts = torch.bincount(sample(p.expand(20000, 5), torch.Generator().manual_seed(3)), minlength=5)
    assert counts[[0, 2, 4]].sum() == 0 and abs(counts[1] / 20000 - 0.25) < 0.015  # 4.9 standard deviations
    one_hot = torch.eye(6)[[5, 0, 2]]  # rows: the last, the first, a middle token
    assert sample(one_hot, torch.Generator().manual_seed(0)).tolist() == [5, 0, 2]


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_k=0), dict(top_p=0), dict(top_p=1.5)])
def test_out_of_range_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        check_params(**kwargs)
