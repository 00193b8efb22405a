"""The decoding methods, one file each in this folder: draft.py (a draft model), medusa.py,
eagle.py, parallel.py, lookup.py (prompt lookup), lookahead.py, rest.py (retrieval), and any new
one. Each file defines a `base.Method` and names it `METHOD`; `METHODS` is built from the files
found here, so a new method is one new file, and every command (`generate`, `bench`, sizing)
offers it.

Here too: `build` (a method from its loaded weights and settings), `check_rule` (which acceptance
rules keep a method's output the target's own) and `Decoder`, a method ready to decode prompt
after prompt.
"""

from __future__ import annotations

import importlib
import pkgutil

import torch

from ..decoding import NO_CLOCK, NO_OBSERVER, Steps, decode
from ..kvcache import KVCache
from ..model import GPT
from ..sampling import Sampling
from ..verify import RULES
from .base import Method, default_rule, rule_problem


def discover() -> dict[str, type[Method]]:
    """{name: the method's class}: plain decoding ("ar"), then every file of this folder that
    names a `METHOD`, in the order of the walkthrough's chapters."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        method = getattr(importlib.import_module(f"{__name__}.{info.name}"), "METHOD", None)
        if method is not None:
            found.append(method)
    return {"ar": Method} | {m.name: m for m in sorted(found, key=lambda m: (m.chapter, m.name))}


METHODS = discover()


def build(name: str, target: GPT, weights=None, draft_vocab: torch.Tensor | None = None, **settings) -> Method:
    """Method `name` over `target`: with its loaded weights (a draft model, heads), the token ids
    its LM head may propose from (--draft-vocab), and its settings (default: each one's own)."""
    cls = METHODS[name]
    if cls is Method:
        return Method()
    kwargs = {key: value for key, value in settings.items() if key in cls.settings and value is not None}
    if draft_vocab is not None and cls.reduced_vocab:
        kwargs["draft_vocab"] = draft_vocab
    return cls(target, weights, **kwargs) if cls.weights is not None else cls(target, **kwargs)


def check_rule(method: str, rule: str | None, temperature: float = 0.0) -> str | None:
    """The one-line reason `rule` cannot judge `method`'s proposals at `temperature` and keep the
    output the target's own, or None if it can (`base.rule_problem`)."""
    if rule is not None and METHODS[method].proposes == "nothing":
        return f"plain decoding ({method}) proposes nothing: an acceptance rule applies to " + \
            ", ".join(m for m, spec in METHODS.items() if spec.proposes != "nothing")
    problem = rule_problem(METHODS[method], rule, temperature)
    if problem and rule == "greedy":
        problem += f": with --method {method} use --accept {' or '.join(exact_rules(method))} (exact) or typical " \
                   "(lossy), or --temperature 0"
    return problem


def exact_rules(method: str) -> list[str]:
    """The rules that keep `method`'s sampled output exactly the target's distribution."""
    return [r for r in RULES if r not in ("greedy", "typical") and check_rule(method, r, 1.0) is None]


class Decoder:
    """A method over loaded models, ready for prompt after prompt: `batch_steps(prompts, ...)` is
    its loop for several prompts at once (`decoding.decode`), `steps(prompt, ...)` for one.

    proposer: the method (default: plain decoding); size: the size every step takes (default:
    the method's default size), or policy: a `speed/policy.Policy` that chooses each step's size,
    or a plain step, from the sizes it knows; rule: the acceptance rule's name (default: see
    `base.default_rule`). The target's cache at batch 1 is made once, here, and every prompt
    reuses it; a batch makes its own. (`recorded.Recorded` runs a method at one size the same way,
    its whole step recorded as one CUDA graph.)"""

    def __init__(self, target: GPT, proposer: Method | None = None, size: str | None = None, *, policy=None,
                 rule: str | None = None):
        self.target, self.proposer, self.policy, self.rule = target, proposer or Method(), policy, rule
        if policy is not None:
            self.shapes = {s: self.proposer.shape(s) for s in policy.promise}
        else:
            size = size or self.proposer.default_size
            self.shapes = {size: self.proposer.shape(size)} if size else {}
        self.size = None if policy is not None else next(iter(self.shapes), None)
        room = max((self.proposer.room(s) for s in self.shapes.values()), default=0)
        self.cache = KVCache.for_model(target, target.config.n_ctx + room + 1)
        self.clock = NO_CLOCK  # `speed/ledger.py` sets its own while it watches
        self.observer = NO_OBSERVER  # `trace.py` sets its own while it records

    def steps(self, prompt: list[int], sampling: Sampling, generator, max_new_tokens: int,
              stop_id: int | None = None) -> Steps:
        """The loop for one prompt (drive it with `results.run`, or read its steps)."""
        return self.batch_steps([prompt], sampling, [generator], max_new_tokens, stop_id)

    def batch_steps(self, prompts: list[list[int]], sampling: Sampling, generators: list, max_new_tokens: int,
                    stop_id: int | None = None) -> Steps:
        """The loop for these prompts, prompt i row i, generators[i] its own (drive it with
        `results.run_batch`). Batch 1 reuses the cache made here."""
        problem = rule_problem(self.proposer, self.rule, sampling.temperature)
        if problem:
            raise ValueError(problem)
        proposer, shapes, policy = self.proposer, self.shapes, self.policy
        if policy is not None:
            policy.reset()  # a new text: the policy's acceptance starts from its promise again
            if not policy.may_speculate(len(prompts)):
                # no size pays on this device even on held-out text, so every step would be a plain step:
                # the method is plain decoding here, and runs as plain decoding, without its bookkeeping
                proposer, shapes, policy = Method(), {}, None
        own = self.cache if len(prompts) == 1 else None
        return decode(self.target, proposer, prompts, sampling, generators, max_new_tokens, stop_id, shapes, policy,
                      default_rule(self.proposer, self.rule, sampling.temperature), own, self.clock,
                      self.observer)
