"""Method specs as the benchmark's --methods names them (`draft:4`, `medusa@pointmass`,
`lookahead:3,3,2`, a method without a size), checked the way generate checks its arguments, and
the held-out prompts file they run on. Bad input ends in a one-line error (`cli.die`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .cli import die
from .methods import METHODS, check_draft_free, check_k, check_rule, check_tree_nodes
from .verify import RULES

SIZE_PATTERNS = {"": "", "K": r"\d+", "K|auto": r"\d+|auto", "NODES": r"\d+", "W,N,G": r"\d+,\d+,\d+"}


def parse_method(spec: str) -> tuple[str, str]:
    """A method of `methods.METHODS` with its size as the registry names it ('ar', 'draft:K',
    'medusa:NODES', 'eagle:NODES', 'lookup:K', 'lookahead:W,N,G', 'auto'), or without one (sized
    for this device: 'draft', 'medusa', ...; 'draft:auto' too), each optionally with '@RULE' (an
    acceptance rule of verify.py, e.g. draft:4@block, medusa@pointmass) -> (name, parameter)."""
    name, _, param = spec.partition(":")
    name, _, at_rule = name.partition("@")  # 'medusa@pointmass': a sized method with a rule
    param = param or (f"@{at_rule}" if at_rule else "")
    size, _, rule = param.partition("@")
    if name not in METHODS or not re.fullmatch(SIZE_PATTERNS[METHODS[name].size], size) and size not in ("", "auto") \
            or size == "auto" and METHODS[name].size != "K|auto":
        forms = ", ".join(f"{n}[:{m.size}]" if m.size else n for n, m in METHODS.items())
        die(f"unknown method {spec!r}: use {forms} (without a size: sized for this device; each optionally @RULE; "
            "auto with --batch-sizes)")
    problem = check_rule(name, rule) if rule else None
    if rule and rule not in RULES:
        problem = f"unknown acceptance rule {rule!r} in {spec!r}: use one of {', '.join(RULES)}"
    if not problem and name == "lookup" and size:
        problem = check_draft_free(name, k=int(size))
    elif not problem and name == "lookahead" and size:
        window, ngram, guesses = map(int, size.split(","))
        problem = check_draft_free(name, window=window, ngram=ngram, guesses=guesses)
    if problem:
        die(f"{spec}: {problem}")
    return name, param


def label(spec) -> str:
    """The spec as rows name it: 'medusa:16', 'medusa@pointmass' (sized), 'draft:4@block'."""
    name, param = spec
    return name + (param if param.startswith("@") else f":{param}" if param else "")


def read_prompt_rows(path: Path) -> list[dict]:
    if not path.is_file():
        die(f"--prompts {path} not found: make it with python -m tinyspec.data")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        die(f"--prompts {path} is not UTF-8 text ({e.reason} at byte {e.start}): give a JSONL file made by "
            "python -m tinyspec.data")
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ok = isinstance(row["category"], str) and isinstance(row["prompt"], str)
        except (json.JSONDecodeError, KeyError, TypeError):
            ok = False
        if not ok:
            die(f"--prompts {path}, line {i}: expected a JSON object with string \"category\" and \"prompt\" fields")
        rows.append(row)
    return rows


def check_specs(specs, n_ctx: int) -> None:
    """The same limits generate puts on k and on tree sizes."""
    for name, param in specs:
        size = param.partition("@")[0]
        if not size:  # named without a size: sizing.py chooses among sizes that fit
            continue
        problem = (check_k(size if size == "auto" else int(size)) if name == "draft" else
                   check_tree_nodes(int(size), n_ctx) if name in ("medusa", "eagle") else None)
        if problem:
            die(f"--methods {name}:{param}: {problem}")
