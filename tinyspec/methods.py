"""The decoding methods, each in one place: `METHODS` names them with a line each (every
command's help is written from it), the checks of what a method accepts (its k, its tree, its
acceptance rule at a temperature), the loaders of what it reads besides the target (Medusa
heads, an EAGLE head), and `Decoder`, which turns a method and its models into a decoding loop
for prompt after prompt, or for a batch of them.

The algorithms themselves know nothing of files or flags; this is where the commands
(`generate`, `bench`, `report`, `course`, `python -m tinyspec`) meet them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .auto import BatchPolicy
from .cli import die, refuse_other_kind
from .decoding import Chooser, autoregressive
from .eagle import DEFAULT_DEPTH as EAGLE_DEPTH, DEFAULT_TOPK as EAGLE_TOPK, EagleHead, eagle, expanded_at_most
from .fastpath import fixed_forward
from .kvcache import KVCache
from .lookahead import lookahead
from .lookup import lookup
from .medusa import MedusaHeads, medusa
from .model import GPT, DraftVocab
from .speculative import accept_or_resample, speculative
from .verify import CHAIN_ONLY, RULES, SAMPLED, chain_rule

MAX_K = 16  # draft tokens per step: beyond this, acceptance alpha^k leaves nothing to gain
MAX_TREE_NODES = 127  # the root and 127 nodes fill the Triton kernel's largest tree tile (128)


def check_k(k: int | str) -> str | None:
    """The one-line problem with a draft's k (an int or 'auto'), or None."""
    if k == "auto" or (isinstance(k, int) and 1 <= k <= MAX_K):
        return None
    return f"k must be an integer in 1..{MAX_K} or 'auto', got {k!r}"


def check_tree_nodes(nodes: int, n_ctx: int) -> str | None:
    """The one-line problem with a tree of `nodes` nodes, or None."""
    if not 1 <= nodes <= MAX_TREE_NODES:
        return f"a tree has 1..{MAX_TREE_NODES} nodes, got {nodes}"
    if nodes + 2 >= n_ctx:
        return f"a tree of {nodes} nodes does not fit the model's context of {n_ctx}: use a smaller tree"
    return None


def use_attention(model: GPT, name: str, device: torch.device) -> None:
    """--attn: 'torch' (SDPA, the reference) or 'triton' (the tree-attention kernel for tree
    verification; on a CPU only in Triton's interpreter, which must be chosen before triton loads)."""
    if name == "torch":
        return
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        die("--attn triton on a CPU needs Triton's interpreter: run with TRITON_INTERPRET=1 set")
    try:
        from .kernels.tree_attention import TreeAttention
    except ImportError:
        die("--attn triton needs the triton package: pip install triton")
    model.set_attention(TreeAttention())


def load_trained_for(cls, path: str | Path, target: GPT, device, dtype, what: str, flag: str, command: str):
    """`cls.load(path)` (Medusa heads, an EAGLE head), refused unless it was trained for `target`."""
    many = what.endswith("s")
    if not Path(path).is_file():
        die(f"{what} {path} not found: pass {flag} PATH, or train {'them' if many else 'one'} "
            f"(python -m tinyspec.train {command})")
    refuse_other_kind(path, "blocks." if cls is MedusaHeads else "block.")
    try:
        loaded = cls.load(path, device, dtype)
    except ValueError as e:
        die(str(e))
    if loaded.target_fingerprint and loaded.target_fingerprint != target.fingerprint():
        noun = "heads" if what == "Medusa heads" else what
        die(f"the {noun} in {path} {'were' if many else 'was'} trained for a different target model: train "
            f"{'heads' if many else 'one'} for this one (python -m tinyspec.train {command} --target ...)")
    return loaded


def load_heads(path: str | Path, target: GPT, device, dtype) -> MedusaHeads:
    return load_trained_for(MedusaHeads, path, target, device, dtype, "Medusa heads", "--heads", "medusa")


def load_eagle(path: str | Path, target: GPT, device, dtype) -> EagleHead:
    return load_trained_for(EagleHead, path, target, device, dtype, "EAGLE head", "--eagle", "eagle")


# ---- the decoding method, ready for prompt after prompt -------------------------------------

class Decoder:
    """One decoding method over loaded models: `batch_steps(prompts, ...)` is its decoding loop
    for several prompts at once, `steps(prompt, ...)` for one. The caches of batch 1 (and, with
    cuda_graph, the recorded forwards) are made once, here, and every prompt reuses them:
    recording a CUDA graph costs several forwards. A batch makes its own.

    method: "ar", "draft" (with `draft` and `k`, an int or "auto"), "medusa" (with `heads` and
    `tree`), "eagle" (with `heads` an EagleHead, and `tree` a static Tree or None for EAGLE-2's
    dynamic tree of `eagle_tree` = (top_k, depth, total_tokens)), "lookup" (with `k` and `max_ngram`),
    "lookahead" (with `window`, `ngram` and `guesses`) or "auto" (Medusa `heads` with a tree, or
    none, chosen per step by `auto.BatchPolicy`, measured here for batches of up to `batch_size`
    rows). policy: a `decoding.Chooser` (`policy.Policy`, made by `sizing.py` for a method named
    without a size) that chooses each step's k, tree, EAGLE-2 budget or lookahead's G, or a plain
    step, in place of the fixed one. rule: the acceptance rule's name (verify.RULES); default
    greedy at temperature 0, else lossless (pointmass for lookup and lookahead, whose guesses are
    not sampled). draft_vocab: token ids the draft model, the heads or the EAGLE head propose from
    (`model.DraftVocab`; default: all)."""

    def __init__(self, target: GPT, method: str = "ar", draft: GPT | None = None, k: int | str = 4,
                 heads: MedusaHeads | EagleHead | None = None, tree=None, rule: str | None = None,
                 cuda_graph: bool = False, eagle_tree: tuple[int, int, int] = (EAGLE_TOPK, EAGLE_DEPTH, 16),
                 max_ngram: int = 3, window: int = 3, ngram: int = 3, guesses: int = 2, batch_size: int = 1,
                 draft_vocab: torch.Tensor | None = None, policy: Chooser | None = None):
        self.target, self.method, self.draft, self.k = target, method, draft, k
        self.heads, self.tree, self.rule, self.eagle_tree = heads, tree, rule, eagle_tree
        self.max_ngram, self.window, self.ngram, self.guesses = max_ngram, window, ngram, guesses
        self.n_ctx = target.config.n_ctx if draft is None else min(target.config.n_ctx, draft.config.n_ctx)
        self.cache = KVCache.for_model(target, target.config.n_ctx)
        self.forward = None
        if cuda_graph:  # recorded now, while the cache is empty (fastpath.py)
            if method not in ("ar", "medusa"):
                raise ValueError("CUDA graphs are for plain decoding and Medusa's tree verification")
            self.forward = fixed_forward(target, self.cache, tree if method == "medusa" else None)
        self.draft_cache = KVCache.for_model(draft, draft.config.n_ctx) if draft is not None else None
        if method == "auto" and policy is None:
            policy = BatchPolicy(target, heads, max_rows=batch_size)  # measures forward costs now
        if policy is None and k == "auto":
            raise ValueError("k 'auto' is chosen by a policy measured on the device: pass one (sizing.py)")
        self.policy = policy
        if method == "eagle":  # the head's cache also holds the nodes one step expands
            shapes = policy.shapes.values() if policy is not None else [eagle_tree]
            self.draft_cache = heads.new_cache(self.n_ctx + max(expanded_at_most(*s, tree) for s in shapes))
        if draft_vocab is not None:  # the drafter proposes from these tokens only (model.DraftVocab)
            drafter, head = (draft, draft.lm_head) if method == "draft" else (heads, target.lm_head)
            drafter.draft_vocab = DraftVocab(head, draft_vocab)

    def steps(self, prompt: list[int], sampling, generator, max_new_tokens: int):
        """The loop for one prompt (drive it with `decoding.run`)."""
        return self.batch_steps([prompt], sampling, [generator], max_new_tokens)

    def batch_steps(self, prompts: list[list[int]], sampling, generators: list, max_new_tokens: int):
        """The method's loop (`METHODS[method].loop`) for these prompts, prompt i row i, generators[i]
        its own (drive it with `decoding.run_batch`): its default rule at this temperature, its
        caches sized for the output plus what one of its steps may feed beyond it. Batch 1 reuses
        the caches (and the recorded forward) made here."""
        method = METHODS[self.method]
        problem = check_rule(self.method, self.rule, sampling.temperature)
        if problem:
            raise ValueError(problem)
        if self.forward is not None and len(prompts) > 1:
            raise ValueError("a recorded forward (cuda_graph) decodes one prompt at a time")
        rule = self.rule or ("greedy" if sampling.temperature == 0 else method.sampled_rule)
        if self.policy is not None:  # a new text: the policy's acceptance starts from its promise again
            self.policy.reset()
        max_len = min(self.n_ctx, max(map(len, prompts)) + max_new_tokens + method.room(self))
        own = len(prompts) == 1  # batch 1: the caches made here
        may_speculate = getattr(self.policy, "may_speculate", None)  # a policy.Policy knows; other choosers may
        if may_speculate is not None and not may_speculate(len(prompts)):
            # no size pays on this device even on held-out text, so every step would be a plain step:
            # the method is plain decoding here, and runs plain decoding's loop, without its own bookkeeping
            return plain_loop(self, own, (prompts, sampling, generators), max_len, rule)
        return method.loop(self, own, (prompts, sampling, generators), max_len, rule)


# ---- each method's loop from a Decoder's models and settings (own: batch 1, the Decoder's caches) ----

def plain_loop(d: Decoder, own: bool, inputs, max_len: int, rule: str):
    return autoregressive(d.target, *inputs, max_len, d.cache if own else None, d.forward)


def draft_loop(d: Decoder, own: bool, inputs, max_len: int, rule: str):
    # a chain with one child per node: the lossless tree rule IS the token-level one, and at T = 0 greedy too
    accept = accept_or_resample if rule in ("greedy", "lossless") else chain_rule(rule)
    return speculative(d.target, d.draft, *inputs, max_len, d.policy or d.k, (d.cache, d.draft_cache) if own else None,
                       accept)


def medusa_loop(d: Decoder, own: bool, inputs, max_len: int, rule: str):  # auto: a tree chosen per step by the policy
    return medusa(d.target, d.heads, *inputs, max_len, d.policy or d.tree, rule, d.cache if own else None, d.forward)


def eagle_loop(d: Decoder, own: bool, inputs, max_len: int, rule: str):
    top_k, depth, _ = d.eagle_tree
    caches = (d.cache, d.draft_cache) if own else (None, None)
    return eagle(d.target, d.heads, *inputs, max_len, rule, top_k, depth, d.policy or eagle_nodes(d), d.tree, *caches)


def eagle_nodes(d: Decoder) -> int:
    return len(d.tree) if d.tree is not None else d.eagle_tree[2]


def lookup_loop(d: Decoder, own: bool, inputs, max_len: int, rule: str):
    return lookup(d.target, *inputs, max_len, d.policy or d.k, d.max_ngram, rule, d.cache if own else None)


def lookahead_loop(d: Decoder, own: bool, inputs, max_len: int, rule: str):
    return lookahead(d.target, *inputs, max_len, d.window, d.ngram, d.policy or d.guesses, rule,
                     d.cache if own else None)


def largest(d: Decoder, fixed: Callable[[Decoder], int]) -> int:
    """The most tokens a step of the decoder proposes: its policy's largest size, or fixed(d)."""
    return d.policy.largest if d.policy is not None else fixed(d)


@dataclass(frozen=True)
class Method:
    """What a decoding method is, for every command: a line saying what it does (the help), the
    flags of `generate` that only it reads, what it proposes (which says the acceptance rules it
    takes, `check_rule`), the room one of its steps needs beyond the output (tokens it may feed
    past the last accepted one), and its loop.
    A new method is one entry of METHODS."""
    summary: str
    loop: Callable  # (decoder, own caches?, (prompts, sampling, generators), max_len, rule) -> the loop
    flags: tuple[str, ...] = ()
    room: Callable[[Decoder], int] = lambda d: 0
    proposes: str = "a tree"  # "nothing", "a sampled chain", "a tree" or "fixed tokens": the rules it takes
    size: str = ""  # how the benchmark names its size: "K", "K|auto", "NODES", "W,N,G" (draft:4, lookahead:3,3,2)

    @property
    def sampled_rule(self) -> str:
        """The rule it is judged by when sampling: fixed tokens were not drawn from a q (verify.py)."""
        return "pointmass" if self.proposes == "fixed tokens" else "lossless"


METHODS = {
    "ar": Method("plain autoregressive decoding", plain_loop, proposes="nothing"),
    "draft": Method("speculative decoding with a draft model (Leviathan et al. 2022)", draft_loop,
                    ("k", "draft", "draft_vocab"), lambda d: largest(d, lambda d: d.k), proposes="a sampled chain", size="K|auto"),
    "medusa": Method("Medusa heads propose a tree, verified in one target pass (Cai et al. 2024)", medusa_loop,
                     ("heads", "tree", "tree_nodes", "draft_vocab"), lambda d: largest(d, lambda d: len(d.tree)) + 1, size="NODES"),
    "eagle": Method("an EAGLE head drafts the target's features and grows a tree (EAGLE-2), verified in one target "
                    "pass", eagle_loop, ("tree", "tree_nodes", "eagle", "eagle_topk", "eagle_depth", "draft_vocab"),
                    lambda d: largest(d, eagle_nodes) + 1, size="NODES"),
    "lookup": Method("prompt lookup: the text's own earlier continuation of its last tokens is the proposal",
                     lookup_loop, ("k", "max_ngram"), lambda d: largest(d, lambda d: d.k) + 1, proposes="fixed tokens", size="K"),
    "lookahead": Method("n-grams from the target's own Jacobi iterations, made and verified in the same pass",
                        lookahead_loop, ("window", "ngram", "guesses"),
                        lambda d: largest(d, lambda d: (d.window + d.guesses) * (d.ngram - 1)), proposes="fixed tokens",
                        size="W,N,G"),
    "auto": Method("Medusa where it pays at the batch's size and the running acceptance, plain decoding where it "
                   "does not (measures forward costs first, a few seconds, for batches up to --batch-size)", medusa_loop,
                   ("heads",), lambda d: d.policy.largest + 1),
}


def check_rule(method: str, rule: str | None, temperature: float = 0.0) -> str | None:
    """The one-line reason `rule` cannot judge `method`'s proposals at `temperature` and keep the
    output the target's own, or None if it can. Exact are: every rule at T = 0 (each reduces to
    the argmax there), and at T > 0 the rules of `exact_rules`; `typical` is the one rule allowed
    that is not exact (documented as lossy). The greedy rule at T > 0 is refused: its verified
    steps take the argmax while the first token and every plain step are sampled, so the text is
    neither sampling nor greedy decoding."""
    if rule is None:
        return None
    proposes = METHODS[method].proposes
    if proposes == "nothing":
        return f"plain decoding ({method}) proposes nothing: an acceptance rule applies to " + \
            ", ".join(m for m, spec in METHODS.items() if spec.proposes != "nothing")
    if proposes == "fixed tokens" and rule in SAMPLED:
        return f"the {rule} rule needs proposals sampled from a draft; {method} proposes fixed tokens: use pointmass"
    if proposes != "a sampled chain" and rule in CHAIN_ONLY:
        return f"the {rule} rule verifies a chain (the draft method), not a tree"
    if rule == "greedy" and temperature > 0:
        return (f"the greedy rule at temperature {temperature:g} is neither sampling nor greedy decoding: with "
                f"--method {method} use --accept {' or '.join(exact_rules(method))} (exact) or typical (lossy), "
                "or --temperature 0")
    return None


def exact_rules(method: str) -> list[str]:
    """The rules that keep `method`'s sampled output exactly the target's distribution."""
    return [r for r in RULES if r not in ("greedy", "typical") and check_rule(method, r, 1.0) is None]


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
