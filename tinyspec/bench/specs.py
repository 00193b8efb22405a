"""Method specs as the benchmark's --methods names them (`draft:4`, `medusa@pointmass`,
`lookahead:3,3,2`, `eagle:auto`, a method at its default size), checked the way generate checks
its arguments, and the held-out prompts file they run on. Bad input ends in a one-line error
(`cli.die`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..methods import METHODS, check_rule
from ..verify import RULES
from ..commands.cli import check_input, die, read_lines


def parse_method(spec: str) -> tuple[str, str, str | None]:
    """METHOD[:SIZE][@RULE] -> (name, size, rule): a method of `methods.METHODS`, its size as the
    method spells it ('' for its default size, 'auto' for sized on this device; the method checks
    the spelling once it is loaded, `commands/method.py: parse_size`), and an acceptance rule of
    verify.py or None (each temperature's default)."""
    head, _, rule = spec.partition("@")
    name, _, size = head.partition(":")
    if name not in METHODS or (size and not re.fullmatch(r"[\d,]+|auto", size)) or (size and not METHODS[name].sizes):
        forms = ", ".join(f"{n}[:SIZE]" if m.sizes else n for n, m in METHODS.items())
        die(f"unknown method {spec!r}: use {forms} (SIZE as the method spells it, or auto: sized for this device), "
            "each optionally @RULE")
    if rule and rule not in RULES:
        die(f"unknown acceptance rule {rule!r} in {spec!r}: use one of {', '.join(RULES)}")
    problem = check_rule(name, rule or None)
    if problem:
        die(f"{spec}: {problem}")
    return name, size, rule or None


def label(spec) -> str:
    """The spec as rows name it: 'medusa:16', 'medusa@pointmass' (default size), 'draft:4@block'."""
    name, size, rule = spec
    return name + (f":{size}" if size else "") + (f"@{rule}" if rule else "")


def read_prompt_rows(path: Path, most: int) -> list[dict]:
    """The rows of a --prompts JSONL file ({"category", "prompt"} each); a line too long to hold a prompt
    of `most` bytes, the most the model's context holds, is refused unread (`cli.read_lines`)."""
    if not check_input(path, "--prompts").is_file():
        die(f"--prompts {path} not found: make it with python -m tinyspec data")
    lines = read_lines(path, "--prompts", most, "give a JSONL file made by python -m tinyspec data")
    rows = []
    for i, line in lines:
        try:
            row = json.loads(line)
            ok = isinstance(row["category"], str) and isinstance(row["prompt"], str)
        except (json.JSONDecodeError, KeyError, TypeError):
            ok = False
        if not ok:
            die(f"--prompts {path}, line {i}: expected a JSON object with string \"category\" and \"prompt\" fields")
        rows.append(row)
    return rows
