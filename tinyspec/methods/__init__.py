"""The decoding methods, one file each in this folder: draft.py (a draft model), medusa.py,
eagle.py, lookup.py (prompt lookup), lookahead.py, and any new one. Each file defines a
`decoding.Proposer` and names it `METHOD`; `METHODS` is built from the files found here, so a new
method is one new file, and every command (`generate`, `bench`, sizing) offers it.

Here too: `check_rule` (which acceptance rules keep a method's output the target's own) and
`build` (a method from its loaded weights and settings). `decoding.Decoder` runs one.
"""

from __future__ import annotations

import importlib
import pkgutil

import torch

from ..decoding import Decoder, Proposer, rule_problem  # noqa: F401 (Decoder: a method's runner, for `methods.Decoder`)
from ..model import GPT
from ..verify import RULES


def discover() -> dict[str, type[Proposer]]:
    """{name: the method's class}: plain decoding ("ar"), then every file of this folder that
    names a `METHOD`, in the order of the walkthrough's chapters."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        method = getattr(importlib.import_module(f"{__name__}.{info.name}"), "METHOD", None)
        if method is not None:
            found.append(method)
    return {"ar": Proposer} | {m.name: m for m in sorted(found, key=lambda m: (m.chapter, m.name))}


METHODS = discover()


def build(name: str, target: GPT, weights=None, draft_vocab: torch.Tensor | None = None, **settings) -> Proposer:
    """Method `name` over `target`: with its loaded weights (a draft model, heads), the token ids
    its LM head may propose from (--draft-vocab), and its settings (default: each one's own)."""
    cls = METHODS[name]
    if cls is Proposer:
        return Proposer()
    kwargs = {key: value for key, value in settings.items() if key in cls.settings and value is not None}
    if draft_vocab is not None and cls.reduced_vocab:
        kwargs["draft_vocab"] = draft_vocab
    return cls(target, weights, **kwargs) if cls.weights is not None else cls(target, **kwargs)


def check_rule(method: str, rule: str | None, temperature: float = 0.0) -> str | None:
    """The one-line reason `rule` cannot judge `method`'s proposals at `temperature` and keep the
    output the target's own, or None if it can (`decoding.rule_problem`)."""
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
