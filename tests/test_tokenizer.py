import re
import random

import pytest
from hypothesis import given, settings, strategies as st

from tiktoken._educational import bpe_train  # tiktoken's own slow reference trainer: the oracle

from tinyspec.tokenizer import EOT, PAT_STR, count_chunks, load_ranks, load_tokenizer, make_encoding, save_ranks, train_bpe

SAMPLE = '''def mean(data):
    """Return the sample arithmetic mean of data.

    >>> mean([1, 2, 3, 4, 4])
    2.8
    """
    T, total, n = _sum(data)
    if n < 1:
        raise StatisticsError('mean requires at least one data point')
    return _convert(total / n, T)
'''


@pytest.mark.parametrize("text, vocab_size", [(SAMPLE * 3, 256 + 60), ("héllo wörld, 日本語のテキスト ünïcödé 123456 " * 4, 256 + 25)])
def test_merges_equal_tiktoken_reference_trainer(text, vocab_size):
    assert train_bpe(count_chunks(text), vocab_size) == bpe_train(text, vocab_size, PAT_STR, visualise=None)


def test_merges_equal_reference_on_random_texts_full_of_ties():
    for seed in range(10):
        rng = random.Random(seed)
        text = "".join(rng.choice("ab c\n_1é") for _ in range(300))
        assert train_bpe(count_chunks(text), 256 + 30) == bpe_train(text, 256 + 30, PAT_STR, visualise=None), seed


def test_training_counts_chunks_not_positions():
    # the first merge is the most frequent pair: "aa" twice in "aaab" beats "ab" once
    ranks = train_bpe(count_chunks("aaab"), 257)
    assert ranks[b"aa"] == 256


def test_save_load_roundtrip(tmp_path):
    ranks = train_bpe(count_chunks(SAMPLE), 300)
    save_ranks(ranks, tmp_path / "t.tiktoken")
    assert load_ranks(tmp_path / "t.tiktoken") == ranks
    enc = load_tokenizer(tmp_path / "t.tiktoken")
    assert enc.n_vocab == 301 and enc.eot_token == 300
    assert enc.decode(enc.encode_ordinary(SAMPLE)) == SAMPLE


def test_shipped_tokenizer_shape(enc):
    assert enc.n_vocab == 8192
    assert enc.encode(EOT, allowed_special="all") == [enc.eot_token] == [8191]
    # user text containing the special string is ordinary text, not a document break
    assert enc.eot_token not in enc.encode_ordinary("x = '<|endoftext|>'")
    # trained on Python: common keywords with their leading space are single tokens
    for word in [" return", " self", " import", "def"]:
        assert len(enc.encode_ordinary(word)) == 1, word


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_shipped_tokenizer_roundtrips_any_unicode(enc, text):
    assert enc.decode(enc.encode_ordinary(text)) == text


def test_missing_tokenizer_file_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape("python -m tinyspec train tokenizer")):
        load_tokenizer(tmp_path / "nope.tiktoken")


def test_encoding_uses_training_merges():
    ranks = train_bpe(count_chunks("abab abab abab"), 256 + 3)
    enc = make_encoding(ranks)
    assert len(enc.encode_ordinary("abab")) == 1
