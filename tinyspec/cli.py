"""What every command line shares: the shipped weights, loading with clean errors, the device,
and `Decoder`, which turns the chosen method and models into a decoding loop per prompt.

The decoding algorithms themselves know nothing of files or flags; this is where `generate`,
`bench` and `course` meet them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from .decoding import autoregressive
from .fastpath import fixed_forward
from .kvcache import KVCache
from .lookahead import lookahead
from .lookup import lookup
from .medusa import MedusaHeads, medusa
from .model import GPT
from .speculative import AdaptiveK, accept_or_resample, speculative
from .tokenizer import load_tokenizer
from .verify import CHAIN_ONLY, SAMPLED, chain_rule

# The shipped checkpoints and tokenizer sit beside the package in a clone (pip install -e .).
WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
DEFAULT_MODEL = WEIGHTS / "target.safetensors"
DEFAULT_DRAFT = WEIGHTS / "draft.safetensors"
DEFAULT_HEADS = WEIGHTS / "medusa.safetensors"
DEFAULT_TOKENIZER = WEIGHTS / "tokenizer.tiktoken"


def die(message: str, status: int = 2):
    """A user mistake: one line on stderr naming the fix, exit status 2, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(status)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (`error: ... (see --help)`), exit status 2."""

    def error(self, message):
        die(f"{message} (see {self.prog} --help)")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_HELP = ("auto: bfloat16 on cuda, float32 on cpu. Greedy speculative output equals plain decoding's token "
              "for token in float32; in 16 bits a forward over many tokens rounds differently from a forward "
              "over one, so where the target's top two logits (nearly) tie, the choice can flip")


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """--dtype: 'auto' is bfloat16 on CUDA (fast) and float32 elsewhere (exact)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def pick_device(name: str = "auto") -> torch.device:
    """'auto' is cuda when present, else cpu; a device that is not there is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        die(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            die(f"--device {name}: no CUDA GPU is visible to torch; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            die(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s); use cuda:0")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        die(f"--device {name}: MPS is not available here; use --device cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        die(f"--device {name}: tinyspec runs on cpu, cuda or mps")
    return device


# ---- loading, with one-line errors ----------------------------------------------------------

def load_model(path: str | Path, device: torch.device, dtype: torch.dtype, what: str = "model") -> GPT:
    path = Path(path)
    if not path.exists():
        die(f"{what} weights {path} not found: pass --{what} PATH, or train them (see README)")
    try:
        return GPT.from_hf(path, device=device, dtype=dtype).eval()
    except (ValueError, FileNotFoundError) as e:
        die(f"cannot load {what} weights: {e}")


def load_encoding(path: str | Path):
    try:
        return load_tokenizer(path)
    except (FileNotFoundError, ValueError) as e:
        die(f"cannot load the tokenizer: {e}")


def load_heads(path: str | Path, target: GPT, device, dtype) -> MedusaHeads:
    """Medusa heads, refused unless they were trained for `target`."""
    if not Path(path).is_file():
        die(f"Medusa heads {path} not found: pass --heads PATH, or train them (python -m tinyspec.train medusa)")
    try:
        heads = MedusaHeads.load(path, device, dtype)
    except ValueError as e:
        die(str(e))
    if heads.target_fingerprint and heads.target_fingerprint != target.fingerprint():
        die(f"the heads in {path} were trained for a different target model: train heads for this one "
            "(python -m tinyspec.train medusa --target ...)")
    return heads


# ---- the decoding method, ready for prompt after prompt -------------------------------------

class Decoder:
    """One decoding method over loaded models: `steps(prompt, ...)` is its decoding loop for one
    prompt. The caches (and, with cuda_graph, the recorded forwards) are made once, here, and
    every prompt reuses them: recording a CUDA graph costs several forwards.

    method: "ar", "draft" (with `draft` and `k`, an int or "auto"), "medusa" (with `heads` and
    `tree`), "lookup" (with `k` and `max_ngram`) or "lookahead" (with `window`, `ngram` and
    `guesses`). rule: the acceptance rule's name (verify.RULES); default greedy at temperature
    0, else lossless (pointmass for lookup and lookahead, whose guesses are not sampled). cost:
    the draft's cost ratio c, for k = "auto"."""

    def __init__(self, target: GPT, method: str = "ar", draft: GPT | None = None, k: int | str = 4,
                 heads: MedusaHeads | None = None, tree=None, rule: str | None = None, cuda_graph: bool = False,
                 cost: float | None = None, k_max: int = 8, max_ngram: int = 3, window: int = 3, ngram: int = 3,
                 guesses: int = 2):
        self.target, self.method, self.draft, self.k, self.k_max = target, method, draft, k, k_max
        self.heads, self.tree, self.rule, self.cost = heads, tree, rule, cost
        self.max_ngram, self.window, self.ngram, self.guesses = max_ngram, window, ngram, guesses
        self.n_ctx = target.config.n_ctx if draft is None else min(target.config.n_ctx, draft.config.n_ctx)
        self.cache = KVCache.for_model(target, target.config.n_ctx)
        self.forward = None
        if cuda_graph:  # recorded now, while the cache is empty (fastpath.py)
            if method not in ("ar", "medusa"):
                raise ValueError("CUDA graphs are for plain decoding and Medusa's tree verification")
            self.forward = fixed_forward(target, self.cache, tree if method == "medusa" else None)
        self.draft_cache = KVCache.for_model(draft, draft.config.n_ctx) if draft is not None else None

    def steps(self, prompt: list[int], sampling, generator, max_new_tokens: int):
        limit = len(prompt) + max_new_tokens  # caches hold the output plus the look-ahead a step needs
        draft_free = self.method in ("lookup", "lookahead")
        rule = self.rule or ("greedy" if sampling.temperature == 0 else "pointmass" if draft_free else "lossless")
        if self.method == "lookup":
            return lookup(self.target, prompt, sampling, generator, min(self.n_ctx, limit + self.k + 1), self.k,
                          self.max_ngram, rule, self.cache)
        if self.method == "lookahead":
            size = (self.window + self.guesses) * (self.ngram - 1)  # the most tokens one step feeds
            return lookahead(self.target, prompt, sampling, generator, min(self.n_ctx, limit + size), self.window,
                             self.ngram, self.guesses, rule, self.cache)
        if self.method == "medusa":
            max_len = min(self.n_ctx, limit + len(self.tree) + 1)
            return medusa(self.target, self.heads, prompt, sampling, generator, max_len, self.tree, rule,
                          self.cache, self.forward)
        if self.method == "draft":
            k = AdaptiveK(self.cost, self.k_max) if self.k == "auto" else self.k
            k_ahead = self.k_max if self.k == "auto" else self.k
            # a chain with one child per node: the lossless tree rule IS the token-level one, and at T = 0 greedy too
            accept = accept_or_resample if rule in ("greedy", "lossless") else chain_rule(rule)
            return speculative(self.target, self.draft, prompt, sampling, generator, min(self.n_ctx, limit + k_ahead),
                               k, (self.cache, self.draft_cache), accept)
        return autoregressive(self.target, prompt, sampling, generator, min(self.n_ctx, limit), self.cache, self.forward)


def check_rule(method: str, rule: str | None) -> str | None:
    """The one-line reason `rule` cannot judge `method`'s proposals, or None if it can."""
    if rule is None:
        return None
    if method == "ar":
        return "--accept applies to --method draft, medusa, lookup or lookahead"
    if method == "medusa" and rule in CHAIN_ONLY:
        return f"--accept {rule} verifies a chain (--method draft), not Medusa's tree"
    if method in ("lookup", "lookahead") and rule in SAMPLED:
        return f"--accept {rule} needs proposals sampled from a draft; {method} proposes fixed tokens: use pointmass"
    return None


def check_draft_free(method: str, k: int = 4, max_ngram: int = 3, window: int = 4, ngram: int = 3, guesses: int = 4,
                     n_ctx: int | None = None) -> str | None:
    """The one-line reason these lookup / lookahead settings cannot run (in a context of n_ctx
    tokens, if given), or None if they can."""
    if method == "lookup":
        if not 1 <= k <= 16:
            return f"--k must be in 1..16 for --method lookup, got {k}"
        if not 1 <= max_ngram <= 8:
            return f"--max-ngram must be in 1..8, got {max_ngram}"
        size = k + 1
    else:
        for flag, value, low, high in (("window", window, 1, 32), ("ngram", ngram, 2, 8), ("guesses", guesses, 1, 32)):
            if not low <= value <= high:
                return f"--{flag} must be in {low}..{high}, got {value}"
        size = (window + guesses) * (ngram - 1)
    if n_ctx is not None and size + 2 >= n_ctx:
        return f"a {method} step feeds up to {size} tokens, which does not fit the model's context of {n_ctx}: " \
               "propose fewer tokens"
    return None
