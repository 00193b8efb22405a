import math
import os
import random
import sys
from pathlib import Path

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

from tinyspec.kvcache import KVCache
from tinyspec.methods.medusa import MedusaHeads
from tinyspec.model import GPT, GPTConfig
from tinyspec.tokenizer import load_tokenizer
from tinyspec.tree import Tree

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"  # the shipped weights and tokenizer


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
    predictable, which gives Medusa heads and drafts something real to learn and accept. The rate
    decays to nothing (cosine), so training settles wherever float rounding led it: at a constant
    rate the loss of one step swung between 0.3 and 0.6 from one instruction set (AVX-512, AVX2,
    none) to another. What the tests need is checked on fresh sequences: once a sequence has shown
    its stride, the model's greedy next token is the right one."""
    model = random_gpt(vocab_size=32, n_ctx=64, n_layer=2, n_head=2, n_embd=32, seed=0)
    model.train()
    steps, lr = 300, 1e-2
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        x = counting_sequences(32, 33, 32, g)
        logits, _ = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        x = counting_sequences(256, 33, 32, torch.Generator().manual_seed(1))
        right = (model(x[:, :-1])[0][:, 8:].argmax(-1) == x[:, 9:]).float().mean().item()
    assert right > 0.9, f"the counting model did not learn: its next token is right {right:.0%} of the time"
    return model


class CountingCorpus:
    """Stands in for corpus.TokenFile: fresh counting windows."""
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
    ranks = []  # random, but no two siblings of one rank (a Tree refuses that)
    for i, p in enumerate(parents):
        taken = {r for q, r in zip(parents, ranks) if q == p}
        ranks.append(rng.choice([r for r in range(4 + len(taken)) if r not in taken]))
    return Tree(tuple(parents), tuple(ranks))


@pytest.fixture(autouse=True)
def no_downloads(monkeypatch):
    """Nothing is downloaded by the tests: a test that would build the packages' corpus fails here
    (training commands in tests pass --stdlib-only; tests of the download itself fake pip). Only the
    corpus command downloads: where no test module has loaded it, nothing can."""
    data = sys.modules.get("tinyspec.training.corpus")
    if data is not None:
        monkeypatch.setattr(data, "pip_download", lambda *a: pytest.fail("a test tried to download the packages' sources"))


@pytest.fixture(scope="session")
def tinyspec_home(tmp_path_factory):
    return tmp_path_factory.mktemp("tinyspec-home")


@pytest.fixture(autouse=True)
def caches_in_a_temporary_home(monkeypatch, tinyspec_home):
    """tinyspec's own folder (`files.home`: the sizing cache, the corpus, figures) is a temporary
    one, shared across the session as a user's is, so the tests never read or fill the user's
    (commands the tests start as subprocesses inherit it). A method at --size auto is sized on
    first use (`sizing.py`): here on 12 tokens a prompt instead of 32 (the plumbing is the same)."""
    from tinyspec.speed import sizing
    monkeypatch.setenv("TINYSPEC_HOME", str(tinyspec_home))
    monkeypatch.setattr(sizing, "NEW_TOKENS", 12)


@pytest.fixture(scope="session", autouse=True)
def tokenizers_read_once():
    """Every command a test runs loads its tokenizer afresh, as a user's process does: 8,192 base64
    lines parsed, hashed into the fingerprint and handed to tiktoken, some 35 ms, and the fast suite
    runs about 170 commands. In the tests' one process a file is read once per name and contents:
    the same file gives the Encoding loaded before, a changed one is loaded anew, and a missing or
    bad one fails as it always does (`tokenizer.load_tokenizer`, which test_tokenizer.py tests)."""
    from tinyspec import tokenizer
    original, loaded = tokenizer.load_tokenizer, {}

    def load_tokenizer(path):
        try:
            key = (Path(path).stem, Path(path).read_bytes())
        except OSError:
            return original(path)  # its own error
        if key not in loaded:
            loaded[key] = original(path)
        return loaded[key]
    with pytest.MonkeyPatch.context() as mp:
        for name, module in list(sys.modules.items()):  # every tinyspec module that imported it by name
            if name.startswith("tinyspec") and getattr(module, "load_tokenizer", None) is original:
                mp.setattr(module, "load_tokenizer", load_tokenizer)
        yield


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """The --data-dir of the tests that train (--stdlib-only): the first prepares the corpus there
    (`corpus.prepare`: the standard library tokenized, seconds), the others find it ready, as a
    user's second training run does."""
    return tmp_path_factory.mktemp("data")


def refused(main, argv, capsys) -> str:
    """Runs a command that must refuse its input: exit status 2, one line on stderr, no traceback.
    Returns the line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


# ---- decoding through the one loop ------------------------------------------------------------

def generations(target, proposer=None, prompts=((3, 4),), sampling=None, seeds=None, n=40, **decoder):
    """The Results of decoding `prompts` together (a batch of len(prompts) rows) with `proposer`
    (default: plain decoding) through `Decoder(target, proposer, **decoder)` (size=, policy=, rule=);
    row i samples with a generator seeded seeds[i] (default: none, for greedy)."""
    from tinyspec.results import run_batch
    from tinyspec.methods import Decoder
    from tinyspec.sampling import Sampling
    d = Decoder(target, proposer, **decoder)
    prompts = [list(p) for p in prompts]
    generators = [None] * len(prompts) if seeds is None else [torch.Generator().manual_seed(s) for s in seeds]
    return run_batch(d.batch_steps(prompts, sampling or Sampling(0.0), generators, n), len(prompts))


def sampled_rows(decoder, prompts, sampling, n_samples, n=3, batch=300):
    """n_samples runs of n tokens for each of `prompts` with `decoder` (a Decoder), as [[Result] per
    prompt]: the runs are the rows of batches of up to `batch` rows, the prompts alternating, and the
    j-th row of the whole draw samples with its own generator seeded j (one prompt: run j is seed
    j's, as a loop over seeds draws it). Every row is judged alone, with its own generator, on its
    own slice of the logits (decoding.py), so its output is distributed exactly as a batch-1 run's
    whatever rows are beside it: thousands of samples cost tens of batched forwards, not thousands."""
    from tinyspec.results import run_batch
    runs, total = [[] for _ in prompts], len(prompts) * n_samples
    for first in range(0, total, batch):
        size = min(batch, total - first)
        rows = [list(prompts[(first + i) % len(prompts)]) for i in range(size)]
        generators = [torch.Generator().manual_seed(first + i) for i in range(size)]
        for i, res in enumerate(run_batch(decoder.batch_steps(rows, sampling, generators, n), size)):
            runs[(first + i) % len(prompts)].append(res)
    return runs


def token_counts(runs, vocab, n=3) -> torch.Tensor:
    """(vocab^n,): how many of `runs` (Results) began with each text of n tokens, the text's index
    its tokens as digits in base vocab, the first the most significant."""
    counts = torch.zeros(vocab ** n)
    for res in runs:
        counts[sum(t * vocab ** (n - 1 - i) for i, t in enumerate(res.token_ids[:n]))] += 1
    return counts


def plain_tokens(target, prompt, n=40, sampling=None, seed=None):
    """Plain decoding's tokens for one prompt (the reference every method is held to)."""
    return generations(target, None, [prompt], sampling, None if seed is None else [seed], n)[0].token_ids


class Coin:
    """A policy that picks one of `sizes`, or a plain step, at random every step: whatever it
    chooses, the output must be the target's."""

    def __init__(self, sizes, seed=0, plain=True):
        self.promise, self.rng, self.plain = {s: 1.0 for s in sizes}, random.Random(seed), plain
        self.chosen = []

    def choose(self, rows):
        size = self.rng.choice(([None] if self.plain else []) + list(self.promise))
        self.chosen.append(size)
        return size

    def update(self, accepted, size, rows):
        pass

    def reset(self):
        pass

    def may_speculate(self, rows):
        return True


def looped(target, proposer=None, prompts=((3, 4),), size=None, rule="greedy", sampling=None, seeds=None, n=40,
           policy=None, cache=None):
    """Like `generations`, but through the loop itself (`decoding.decode`), judged by `rule` as named:
    a Decoder judges every step at temperature 0 with the greedy rule (`decoding.default_rule`), so
    a test that holds another rule to greedy decoding at T = 0 calls the loop. size: every step's
    (default: the method's default size), or policy: a chooser of the sizes it promises; cache: the
    target's (to look inside it afterwards)."""
    from tinyspec.decoding import decode
    from tinyspec.methods.base import Method
    from tinyspec.results import run_batch
    from tinyspec.sampling import Sampling
    proposer = proposer or Method()
    sizes = list(policy.promise) if policy is not None else [s for s in [size or proposer.default_size] if s]
    prompts = [list(p) for p in prompts]
    generators = [None] * len(prompts) if seeds is None else [torch.Generator().manual_seed(s) for s in seeds]
    steps = decode(target, proposer, prompts, sampling or Sampling(0.0), generators, n, None,
                   {s: proposer.shape(s) for s in sizes}, policy, rule, cache)
    return run_batch(steps, len(prompts))


def drive(steps, prompts, n):
    """Drives a loop (`Decoder.steps`, `decoding.decode`) through its first n yields (the prefill's
    and n - 1 steps) and leaves it there, its caches as they are. Returns each row's text (prompt +
    tokens so far) and what each yield gave ([{row: Step}])."""
    texts, produced = [list(p) for p in prompts], [next(steps)]
    while True:
        for row, step in produced[-1].items():
            texts[row] += step.tokens
        if len(produced) == n:
            return texts, produced
        produced.append(next(steps))


def assert_cache_holds(model, cache, text, row=0):
    """Row `row` of `cache` holds exactly what plain decoding of text[:length] builds, one token at a
    time (the cache after speculative steps, against the one plain decoding builds)."""
    n = cache.lengths[row]
    expected = KVCache.for_model(model, max(n, 1))
    with torch.no_grad():
        for t in text[:n]:
            model(torch.tensor([[t]], device=cache.k.device), cache=expected)
    torch.testing.assert_close(cache.k[:, row, :, :n], expected.k[:, 0, :, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.v[:, row, :, :n], expected.v[:, 0, :, :n], atol=1e-5, rtol=1e-5)


@pytest.fixture
def full_stdout(monkeypatch):
    """A call that makes sys.stdout what `> /dev/full` makes it: every write fails with ENOSPC, here or
    at the exit's flush (`run_main` then sends fd 1 to /dev/null, this stand-in's descriptor). A call,
    not the fixture itself: pytest's capture takes stdout over again once the test starts."""
    class Full:
        fd = os.open(os.devnull, os.O_WRONLY)

        def write(self, text):
            raise OSError(28, "No space left on device")

        def flush(self):
            pass

        def fileno(self):
            return self.fd
    yield lambda: monkeypatch.setattr(sys, "stdout", Full())
    os.close(Full.fd)


def ctrl_c(module: str, argv: list[str], setup: str) -> tuple[int, str, str]:
    """Ctrl-C (a real SIGINT) to a command in a child process, at a point the test chooses: the child
    runs `setup` (Python that patches the place with a call to `wait_for_ctrl_c()`), then the module's
    main(argv) as `python -m tinyspec` runs it (`run_main`). SIGINT is sent when the child says it
    waits. Returns (exit status, stdout, stderr)."""
    import signal
    import subprocess
    code = "\n".join(["import sys, time", "def wait_for_ctrl_c():",
                      "    print('\\nwaiting for Ctrl-C', file=sys.stderr, flush=True)", "    time.sleep(600)",
                      setup, "from tinyspec.commands.cli import run_main", f"from {module} import main",
                      f"run_main(lambda: main({argv!r}))"])
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=Path(__file__).resolve().parent.parent,  # Python's own Ctrl-C, as in a terminal
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    err = []
    for line in p.stderr:
        if "waiting for Ctrl-C" in line:
            p.send_signal(signal.SIGINT)
            break
        err.append(line)
    out, rest = p.communicate(timeout=600)
    return p.returncode, out, "".join(err) + rest
