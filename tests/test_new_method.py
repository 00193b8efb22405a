"""A new method is one new file: dropped into methods/, it runs through generate, bench and sizing
with no other file touched (METHODS is built from the files; every command reads it)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tinyspec.commands.cli import WEIGHTS

ECHO = '''"""A toy method: it proposes the root again, k times (fixed tokens, so pointmass at T > 0)."""
import torch

from ..decoding import Proposal
from ..tree import chain, tree_on
from .base import Method


class Echo(Method):
    name = "echo"
    chapter = 99
    summary = "proposes the last token again, k times"
    proposes = "fixed tokens"
    default_size = "2"
    sizes = ("1", "2")
    size_format = (("K", 1, 4, "repeats"),)

    def __init__(self, target):
        self.device = target.lm_head.weight.device

    def room(self, k):
        return k

    def propose(self, rows, k, room, sampling, sampled):
        out = []
        for r, left in zip(rows, room):
            n = min(k, left)
            out.append(Proposal(torch.full((n,), r.text[-1], device=self.device), tree_on(chain(n).parents, self.device))
                       if n > 0 else None)
        return out


METHOD = Echo
'''

SCRIPT = '''
import json, sys
from tinyspec.commands import generate
from tinyspec.bench import command as bench
base = ["--prompt", "aaaa aaaa aaaa", "--max-new-tokens", "16", "--json"]
for extra in ([], ["--method", "echo"], ["--method", "echo", "--size", "1"], ["--method", "echo", "--size", "auto"],
              ["--method", "echo", "--temperature", "1", "--seed", "3"]):
    generate.main(base + extra)
bench.main(["--methods", "ar,echo,echo:auto", "--categories", "code", "--prompts-per-category", "1", "--max-new-tokens",
            "8", "--repeats", "1", "--temperatures", "0", "--no-hf", "--json"])
'''


@pytest.mark.slow
def test_a_method_in_a_new_file_runs_through_generate_bench_and_sizing(tmp_path):
    root = Path(__file__).resolve().parent.parent
    copy = tmp_path / "checkout"
    shutil.copytree(root / "tinyspec", copy / "tinyspec", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "weights").symlink_to(WEIGHTS)
    (copy / "tinyspec" / "methods" / "echo.py").write_text(ECHO)
    env = dict(os.environ, PYTHONPATH=str(copy), TINYSPEC_HOME=str(tmp_path / "home"))
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    ar, echo, echo1, auto, sampled = map(json.loads, lines[:5])
    assert echo["token_ids"] == echo1["token_ids"] == auto["token_ids"] == ar["token_ids"]  # greedy: exact
    assert echo["stats"]["steps_by_size"].get("2", 0) > 0 and echo1["stats"]["steps_by_size"].get("1", 0) > 0
    assert auto["stats"]["sized"]["file"]  # sized on first use, and cached
    assert sampled["stats"]["new_tokens"] == 16
    report = json.loads("\n".join(lines[5:]))
    assert {r["method"] for r in report["rows"]} == {"ar", "echo", "echo:auto"}
    assert all(r["same_as_ar"] == 1 for r in report["rows"])
    assert any(row["method"] == "echo" for row in report["sizing"])  # sizing measured the new method's sizes
