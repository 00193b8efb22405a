import os
import random

import torch

# Triton kernels run on the CPU through Triton's interpreter, which must be chosen before
# triton is first imported (by anything): decide here, before any test module loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

# One thread: these models are small enough that a second thread gains little, and on a busy
# two-core machine two threads wait for each other (README, "Threads"). The suite's timings in
# the README are with this setting.
torch.set_num_threads(1)

from tinyspec.cli import WEIGHTS
from tinyspec.medusa import MedusaHeads
from tinyspec.model import GPT, GPTConfig
from tinyspec.tokenizer import load_tokenizer
from tinyspec.tree import Tree


@pytest.fixture(scope="session")
def enc():
    """The shipped tokenizer."""
    return load_tokenizer(WEIGHTS / "tokenizer.tiktoken")


def random_gpt(vocab_size=64, n_ctx=64, n_layer=2, n_head=2, n_embd=32, seed=0, scale=1.0) -> GPT:
    """A GPT with random weights; `scale` > 1 sharpens its distributions (GPT-2's init is
    nearly uniform, which makes greedy decoding depend on float noise)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab_size, n_ctx=n_ctx, n_layer=n_layer, n_head=n_head, n_embd=n_embd))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return model.eval()


@pytest.fixture
def tiny_gpt():
    return random_gpt()


def counting_sequences(n, length, vocab, generator):
    """Synthetic text a small model can learn exactly: x_{t+1} = x_t + s (mod vocab), with a
    start and a stride s drawn per sequence (s in 1..5), so the next tokens follow from context."""
    start = torch.randint(vocab, (n, 1), generator=generator)
    stride = torch.randint(1, 6, (n, 1), generator=generator)
    return (start + stride * torch.arange(length)) % vocab


@pytest.fixture(scope="session")
def counting_gpt():
    return train_counting_gpt()


def train_counting_gpt():
    """A tiny GPT trained for a few seconds on counting sequences: its greedy continuations are
    predictable, which gives Medusa heads and drafts something real to learn and accept."""
    model = random_gpt(vocab_size=32, n_ctx=64, n_layer=2, n_head=2, n_embd=32, seed=0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(250):
        x = counting_sequences(32, 33, 32, g)
        logits, _ = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5, f"the counting model did not learn (loss {loss.item():.2f})"
    return model.eval()


class CountingCorpus:
    """Stands in for data.TokenFile: fresh counting windows."""
    def batch(self, b, n, generator):
        x = counting_sequences(b, n, 32, generator)
        return x, x


def random_heads(n_embd, k, seed, scale=0.5):
    torch.manual_seed(seed)
    heads = MedusaHeads(n_embd, k)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, scale)
    return heads.eval()


def random_tree(n, depth, seed):
    rng = random.Random(seed)
    parents, depths = [], []
    for i in range(n):
        options = [-1] + [j for j in range(i) if depths[j] < depth]
        parents.append(rng.choice(options))
        depths.append(1 if parents[-1] == -1 else depths[parents[-1]] + 1)
    return Tree(tuple(parents), tuple(rng.randrange(4) for _ in range(n)))


@pytest.fixture(autouse=True)
def no_downloads(monkeypatch):
    """Nothing is downloaded by the tests: a test that would build the packages' corpus fails here
    (training commands in tests pass --stdlib-only; tests of the download itself fake pip)."""
    from tinyspec import data
    monkeypatch.setattr(data, "pip_download", lambda *a: pytest.fail("a test tried to download the packages' sources"))


@pytest.fixture(scope="session")
def tinyspec_home(tmp_path_factory):
    return tmp_path_factory.mktemp("tinyspec-home")


@pytest.fixture(autouse=True)
def caches_in_a_temporary_home(monkeypatch, tinyspec_home):
    """tinyspec's own folder (`files.home`: the sizing cache, the corpus, figures) is a temporary
    one, shared across the session as a user's is, so the tests never read or fill the user's
    (commands the tests start as subprocesses inherit it). A method named without a size is sized
    on first use (`sizing.py`): on one held-out prompt a category instead of two (the plumbing is
    the same)."""
    from tinyspec import sizing
    monkeypatch.setenv("TINYSPEC_HOME", str(tinyspec_home))
    monkeypatch.setattr(sizing, "PER_CATEGORY", 1)


def refused(main, argv, capsys) -> str:
    """Runs a command that must refuse its input: exit status 2, one line on stderr, no traceback.
    Returns the line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err
