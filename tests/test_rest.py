"""Retrieval from a datastore (REST) against references: the suffix array and the match against
scans of the corpus, greedy output token for token against plain decoding, batch rows against
batch 1, the sampled distribution (statistically, with a planted bug that must be caught), the
datastore's build and file, and the command lines."""
import json
import random

import numpy as np
import pytest
import torch

from tinyspec.commands import generate
from tinyspec.training import corpus
from tinyspec.methods import Decoder
from tinyspec.results import run_batch
from tinyspec.methods.rest import DEPTH, MAX_MATCH, MIN_SHARE, Datastore, Rest, corpus_tree, suffix_array
from tinyspec.sampling import Sampling

from conftest import counting_sequences, generations, plain_tokens, random_gpt, refused
from test_lookup import SAMPLING, V, check_distribution, sample_counts


def test_suffix_array_sorts_like_python():
    rng = np.random.default_rng(0)
    for n, vocab, depth in [(1, 3, 4), (50, 2, 16), (300, 5, 8), (200, 40, 16)]:
        tokens = rng.integers(0, vocab, n)
        order = suffix_array(tokens, depth)
        key = lambda i: tuple(tokens[i:i + depth].tolist())
        assert sorted(order.tolist()) == list(range(n))  # a permutation
        assert [key(i) for i in order] == sorted(key(i) for i in range(n))  # sorted by the first `depth` tokens


def scanned_match(corpus: list[int], text: list[int]) -> tuple[int, list[int]]:
    """The reference: the longest suffix of `text` (up to MAX_MATCH) that occurs at least twice in
    `corpus`, and where each occurrence ends (the index after it), by scanning."""
    best = (0, [])
    for m in range(1, min(MAX_MATCH, len(text)) + 1):
        q = text[-m:]
        ends = [i + m for i in range(len(corpus) - m + 1) if corpus[i:i + m] == q]
        if len(ends) < 2:
            break
        best = (m, ends)
    return best


def test_the_match_and_its_continuations_equal_a_scan_of_the_corpus():
    rng = random.Random(1)
    for trial in range(60):
        vocab = rng.choice([2, 3, 6])
        corpus = [rng.randrange(vocab) for _ in range(rng.randint(5, 120))] + [vocab]  # ends with eot = vocab
        store = Datastore(np.array(corpus), eot=vocab)
        text = [rng.randrange(vocab) for _ in range(rng.randint(1, 20))]
        m, ends = scanned_match(corpus, text)
        found, lo, hi = store.match(text)
        assert found == m, (corpus, text)
        if m == 0:
            assert len(store.continuations(text)) == 0
            continue
        assert sorted(len(corpus) - store.order[lo:hi]) == sorted(ends)  # the range holds exactly the occurrences
        conts = [tuple(t for t in row if t >= 0) for row in store.continuations(text).tolist()]
        expected = [tuple(corpus[e:e + DEPTH][:corpus[e:e + DEPTH].index(vocab)] if vocab in corpus[e:e + DEPTH]
                          else corpus[e:e + DEPTH]) for e in ends]
        if len(ends) <= 64:
            assert sorted(conts) == sorted(expected)
        else:
            assert len(conts) == 64 and set(conts) <= set(expected)


def counted_tree(conts, budget):
    """The reference: count every prefix in a dict, keep the `budget` most shared (ties: shallower)."""
    counts = {}
    for c in conts:
        for j in range(1, len(c) + 1):
            counts[c[:j]] = counts.get(c[:j], 0) + 1
    kept = sorted(((n, -len(p), p) for p, n in counts.items() if n >= MIN_SHARE * len(conts)), reverse=True)[:budget]
    return sorted(p for _, _, p in kept)


def padded(conts):
    return np.array([list(c) + [-1] * (DEPTH - len(c)) for c in conts])


def test_the_corpus_tree_keeps_the_most_shared_prefixes_as_a_tree():
    conts = [(1, 2, 3)] * 6 + [(1, 2, 4)] * 2 + [(5,)] * 1
    assert corpus_tree(padded(conts), 3) == [(1,), (1, 2), (1, 2, 3)]
    assert corpus_tree(padded(conts), 10) == [(1,), (1, 2), (1, 2, 3), (1, 2, 4)]  # (5,): 1 of 9, under MIN_SHARE
    rng = random.Random(0)
    for _ in range(200):
        conts = [tuple(rng.randrange(3) for _ in range(rng.randint(0, DEPTH))) for _ in range(rng.randint(1, 30))]
        budget = rng.randint(1, 12)
        kept = corpus_tree(padded(conts), budget)
        reference = counted_tree(conts, budget)
        count = lambda p: sum(c[:len(p)] == p for c in conts)
        assert sorted(map(count, kept)) == sorted(map(count, reference))  # as shared (ties may pick another prefix)
        assert all(p[:j] in set(kept) for p in kept for j in range(1, len(p)))  # a tree


@pytest.fixture(scope="module")
def target():
    return random_gpt(vocab_size=64, n_ctx=96, scale=3.0, seed=0)


@pytest.fixture(scope="module")
def store(target):
    """A datastore of the target's own greedy text after counting prompts (so it often guesses
    right) and of random text (so it often guesses wrong)."""
    g, rng = torch.Generator().manual_seed(3), random.Random(3)
    docs = []
    for _ in range(6):
        prompt = counting_sequences(1, rng.randint(4, 10), 64, g)[0].tolist()
        docs.append(prompt + plain_tokens(target, prompt, 30))
        docs.append([rng.randrange(64) for _ in range(30)])
    return Datastore(np.array([t for doc in docs for t in doc + [63]]), eot=63)


@pytest.mark.parametrize("size", ["8,4", "0,4", "4,0", "16,8", "2,16"])
def test_greedy_rest_equals_plain_decoding(target, store, size):
    rng, g = random.Random(7), torch.Generator().manual_seed(7)
    accepted = rejected = 0
    for _ in range(4):
        prompt = counting_sequences(1, rng.randint(3, 10), 64, g)[0].tolist()
        res = generations(target, Rest(target, store), [prompt], n=50, size=size)[0]
        assert res.token_ids == plain_tokens(target, prompt, 50), f"size {size}, prompt {prompt}"
        accepted, rejected = accepted + res.accepted, rejected + res.rejections
    assert accepted > 10 and rejected > 0  # both outcomes of the rule happened


def test_greedy_rest_catches_a_planted_bug(target, store, monkeypatch):
    """The test above has teeth: a tree of the corpus accepted without the target's judgement (the
    first branch taken whole) writes other tokens."""
    from tinyspec import decoding
    real = decoding.verify

    def trusting(target_, cache, rows, proposals, rule, *args):
        def accept_first_branch(tokens, p, tree, q, generator):
            path, node = [0], 0
            while tree.children(node):
                node = tree.children(node)[0]
                path.append(node)
            return torch.tensor(path), p[node].argmax()
        return real(target_, cache, rows, proposals, accept_first_branch, *args)
    monkeypatch.setattr(decoding, "verify", trusting)
    prompt = [1, 2, 3, 4]
    assert generations(target, Rest(target, store), [prompt], n=40, size="8,4")[0].token_ids != \
        plain_tokens(target, prompt, 40)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_of_a_batch_write_what_they_write_alone(target, store, temperature):
    prompts = [[1, 2, 3, 4, 5], [9, 8], [30, 31, 32, 33, 34, 35, 36]]
    sampling = Sampling(temperature)
    seeds = [11, 12, 13]
    together = generations(target, Rest(target, store), prompts, sampling, seeds, n=30, size="8,4")
    for prompt, seed, res in zip(prompts, seeds, together):
        alone = generations(target, Rest(target, store), [prompt], sampling, [seed], n=30, size="8,4")[0]
        assert res.token_ids == alone.token_ids


# ---- sampling: exactness, statistically ------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_vocab():
    """A tiny-vocabulary target, a prompt, and a datastore of its own likely continuations."""
    from test_lookup import exact_distribution
    model = random_gpt(vocab_size=V, n_ctx=32, n_layer=1, n_embd=16, scale=6.0, seed=1)
    prompt = [0, 1, 2, 3]
    docs = [prompt[-2:] + plain_tokens(model, prompt, 6, Sampling(1.0), seed) for seed in range(12)]
    corpus = np.array([t for doc in docs for t in doc + [V - 1]])
    return model, prompt, exact_distribution(model, prompt, SAMPLING, 3), Datastore(corpus, eot=V - 1)


def rest_counts(tiny_vocab, n_samples):
    model, prompt, _, store = tiny_vocab
    d = Decoder(model, Rest(model, store), "2,4", rule="pointmass")
    counts, proposing = sample_counts(d, prompt, n_samples)
    assert proposing > n_samples // 2  # most runs verified a tree from the corpus
    return counts


@pytest.mark.slow
def test_sampled_rest_has_the_target_distribution_and_a_planted_bug_is_caught(tiny_vocab, monkeypatch):
    check_distribution(lambda n: rest_counts(tiny_vocab, n), tiny_vocab[2], monkeypatch)


# ---- the datastore's file, its build, the command line ----------------------------------------

def test_a_datastore_saves_and_loads_with_or_without_its_order(tmp_path, store):
    for with_order in (True, False):
        path = tmp_path / f"store-{with_order}.safetensors"
        store.card = {"tokens": len(store)}
        store.save(path, with_order)
        back = Datastore.load(path)
        assert np.array_equal(back.tokens, store.tokens) and back.eot == store.eot and back.card == store.card
        for text in ([1, 2, 3], [5], [62, 62]):
            assert np.array_equal(back.continuations(text), store.continuations(text))
    (tmp_path / "not.safetensors").write_bytes(b"nonsense")
    with pytest.raises(ValueError):
        Datastore.load(tmp_path / "not.safetensors")


def test_make_datastore_draws_whole_modules_up_to_its_size(tmp_path):
    eot = 99
    docs = [[i] * (10 + i) + [eot] for i in range(20)]  # document i: token i, 10 + i times
    np.array([t for d in docs for t in d], dtype=np.uint16).tofile(tmp_path / "train.bin")
    (tmp_path / "meta.json").write_text(json.dumps({"sources": {"stdlib": {"version": "3.11.7"}}}))
    store = corpus.make_datastore(tmp_path, 100, eot)
    assert len(store) <= 100 and store.tokens[-1] == eot and store.card["modules"] == (store.tokens == eot).sum()
    for d in docs:  # whole modules or none
        inside = (store.tokens == d[0]).sum()
        assert inside in (0, len(d) - 1)
    assert np.array_equal(corpus.make_datastore(tmp_path, 100, eot).tokens, store.tokens)  # the same draw every time


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("rest")
    target = random_gpt(vocab_size=8192, n_ctx=64, scale=4.0)
    target.save(d / "target.safetensors")
    text = [t for _ in range(20) for t in range(100, 140)] + [8191]
    Datastore(np.array(text), eot=8191).save(d / "datastore.safetensors")
    return d


def test_cli_rest_equals_ar(files, capsys):
    base = ["--prompt", "a b a b a b", "--max-new-tokens", "24", "--model", str(files / "target.safetensors"), "--json"]
    generate.main(base)
    ar = json.loads(capsys.readouterr().out)
    for extra in ([], ["--size", "4,2"], ["--size", "0,8"]):
        generate.main(base + ["--method", "rest", "--datastore", str(files / "datastore.safetensors")] + extra)
        assert json.loads(capsys.readouterr().out)["token_ids"] == ar["token_ids"]


@pytest.mark.parametrize("argv, message", [
    (["--size", "0,0"], "K or B at least 1"), (["--size", "17,2"], "K must be in 0..16"), (["--size", "8"], "K,B"),
    (["--accept", "lossless"], "pointmass"), (["--datastore", "{d}/none.safetensors"], "tinyspec data datastore"),
    (["--datastore", "{d}/target.safetensors"], "GPT model")])
def test_cli_refuses_bad_rest_settings(files, argv, message, capsys):
    argv = [a.format(d=files) for a in argv]
    flags = ["--prompt", "x", "--model", str(files / "target.safetensors"), "--method", "rest",
             "--datastore", str(files / "datastore.safetensors")] + argv
    assert message in refused(generate.main, flags + (["--temperature", "1"] if "--accept" in argv else []), capsys)
