"""The method a command runs, from what each method's file declares (`methods.METHODS`): its flags
(--size, --accept, its weights flag and settings, --draft-vocab), checked against the method chosen,
and the method built over the target with its weights, refused in one line if they do not fit.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..methods import METHODS, build, exact_rules
from ..methods.base import Method
from ..model import GPT
from ..verify import RULES
from .cli import (WEIGHTS, check_home, check_input, check_tokenizer, die, load_draft_vocab, load_model,
                  refuse_other_kind, warn)


def method_flags() -> dict[str, tuple[str, ...]]:
    """{flag's dest: the methods that read it}: each method's weights flag and settings, and
    --draft-vocab for those that propose through an LM head."""
    out: dict[str, tuple[str, ...]] = {}
    for name, m in METHODS.items():
        dests = ([m.weights.flag.lstrip("-").replace("-", "_")] if m.weights else []) + list(m.settings)
        dests += ["draft_vocab"] if m.reduced_vocab else []
        for dest in dests:
            out[dest] = out.get(dest, ()) + (name,)
    return out


def add_method_flags(ap: argparse.ArgumentParser, weights=None) -> None:
    """--size, --accept, and every method's weights flag and settings, each flag once, and --draft-vocab
    (into the argument group `weights`, if given: the help shows the flags a user needs first)."""
    sizes = "; ".join(f"{name}: {m.size_help()} (default: {m.default_size})" for name, m in METHODS.items() if m.sizes)
    ap.add_argument("--size", help=f"how much a step proposes, as the method spells it, or 'auto': sized for this "
                    f"device on first use (measured, then cached) and chosen step by step, plain steps where nothing "
                    f"pays. {sizes}")
    ap.add_argument("--accept", choices=list(RULES), default=None,
                    help="the acceptance rule (verify.py). Default: lossless at temperature > 0, or pointmass for "
                    "methods that propose fixed tokens (lookup, lookahead); at temperature 0 every rule gives the "
                    "greedy text, and the greedy rule, which accepts the most, is used whatever is asked. lossless: "
                    "exact sampling with proposals drawn from the drafter; pointmass: exact sampling of fixed "
                    "(top-k) proposals; block: block verification of a draft's chain (exact; never fewer expected "
                    "tokens than lossless on a chain); traversal: traversal verification of a sampled tree from "
                    "the leaves up (exact; on a chain it is block verification, and on trees whose shape depends "
                    "on the draws, as EAGLE-2's sampled ones, it may accept slightly less than lossless); typical: "
                    "Medusa's fast rule, which does NOT keep the target's distribution")
    add_weights_flags(ap if weights is None else weights)


def add_weights_flags(ap: argparse.ArgumentParser) -> None:
    """Every method's weights flag and settings, each flag once, and --draft-vocab."""
    readers = method_flags()
    seen = set()
    for name, m in METHODS.items():
        if m.weights is not None and m.weights.flag not in seen:
            seen.add(m.weights.flag)
            ap.add_argument(m.weights.flag, help=f"{name}: {m.weights.noun}'s weights (default: {m.weights.file} in "
                            "weights/)")
        for dest, setting in m.settings.items():
            if dest not in seen:
                seen.add(dest)
                ap.add_argument("--" + dest.replace("_", "-"), type=setting.type, default=None,
                                help=f"{', '.join(readers[dest])}: {setting.help}" +
                                ("" if setting.default is None else f" (default: {setting.default})"))
    ap.add_argument("--draft-vocab", type=int, metavar="N", help=f"{', '.join(readers.get('draft_vocab', ()))}: "
                    "propose only from the N most frequent tokens of the corpus (FR-Spec): the drafter's LM head costs "
                    "N/8192 of the full one, and the target still judges over every token, so the output is exact "
                    "(default: all)")


def check_method_flags(args, method: str) -> None:
    """A flag the chosen method does not read is a mistake worth saying, not ignoring."""
    for dest, methods in method_flags().items():
        if getattr(args, dest, None) is not None and method not in methods:
            die(f"--{dest.replace('_', '-')} applies to --method {' or '.join(methods)}, not {method}")
    m = METHODS[method]
    for dest, setting in m.settings.items():
        value = getattr(args, dest, None)
        if value is not None and setting.low is not None and not setting.low <= value <= setting.high:
            die(f"--{dest.replace('_', '-')} must be in {setting.low}..{setting.high}, got {value}")


def warn_lossy(method: str, rule: str | None, temperature: float, what: str = "") -> None:
    """A rule that runs, as asked, but at temperature > 0 does not keep the target's distribution
    (typical acceptance): said in one line, so nobody takes its text for the target's samples."""
    if temperature > 0 and rule is not None and rule not in exact_rules(method):
        warn(f"{what or '--accept ' + rule}: the {rule} rule does not keep the target's distribution at temperature "
             f"{temperature:g}, so the text is not the target's own sample (exact: --accept "
             f"{' or '.join(exact_rules(method))})")


def load_weights(method: str, path: str | Path | None, target: GPT, enc, device, dtype):
    """What method `method` loads besides the target (its `Weights`), from `path` or the shipped
    file: refused in one line if missing, of another kind, or trained for another target."""
    w = METHODS[method].weights
    path = check_input(path or WEIGHTS / w.file, w.flag)
    if not path.is_file():
        die(f"{path} not found ({method} reads {w.noun}): pass {w.flag} PATH, or make one: {w.train}")
    refuse_other_kind(path, w.holds)
    if w.kind is GPT:  # a draft model: same tokenizer as the target
        model = load_model(path, device, dtype, what="draft")
        check_tokenizer(model, enc, "draft")
        return model
    try:
        loaded = w.kind.load(path, device, dtype)
    except ValueError as e:
        die(str(e))
    fingerprint = getattr(loaded, "target_fingerprint", "")
    if fingerprint and fingerprint != target.fingerprint():
        die(f"{path} was trained for a different target model: train {w.noun} for this one ({w.train} --target ...)")
    return loaded


def load_method(method: str, args, target: GPT, enc, device, dtype) -> Method:
    """The method `args.method` names, over `target`, with its weights, settings and --draft-vocab."""
    m = METHODS[method]
    weights = load_weights(method, getattr(args, m.weights.flag.lstrip("-").replace("-", "_")), target, enc, device,
                           dtype) if m.weights else None
    vocab = getattr(args, "draft_vocab", None)
    ids = load_draft_vocab(vocab, target.config.vocab_size) if vocab is not None and m.reduced_vocab else None
    settings = {dest: getattr(args, dest, None) for dest in m.settings}
    if settings.get("tree") is not None:  # a static tree's JSON file (decoding.STATIC_TREE)
        check_input(settings["tree"], "--tree")
    try:
        return build(method, target, weights, ids, **settings)
    except ValueError as e:
        die(str(e))


def parse_size(proposer: Method, size: str | None, n_ctx: int, flag: str = "--size") -> str | None:
    """--size as the method spells it ('auto' passes), checked by the method, and against a context
    of n_ctx tokens (a step of it must fit after a prompt): one line naming `flag` if not."""
    if size == "auto":
        check_home("--size auto")
    if size is None or size == "auto":
        return size
    if not proposer.sizes:
        die(f"{flag}: {proposer.name} has no sizes (it proposes nothing)")
    try:
        room = proposer.room(proposer.shape(size))
    except ValueError as e:
        die(f"{flag}: {e}")
    if room + 2 >= n_ctx:
        die(f"{flag}: a step of {proposer.name} at size {size} feeds up to {room} tokens beyond the last, which does "
            f"not fit the model's context of {n_ctx}: use a smaller size")
    return size
