"""The benchmark prompts tinyspec ships (tinyspec/prompts.jsonl, `corpus.write_prompts`): each row
names the held-out standard-library module it was cut from, and that module holds it; the file is
rewritten only when asked with --force (a clone tracks it)."""
import json
import sys

import pytest

from tinyspec.commands import data
from tinyspec.training import corpus

from conftest import refused

CARD = json.loads((corpus.PROMPTS.parent.parent / "docs" / "corpus.json").read_text())["sources"]["stdlib"]
ROWS = [json.loads(line) for line in corpus.PROMPTS.read_text(encoding="utf-8").splitlines()]


@pytest.mark.skipif(sys.version.split()[0] != CARD["version"], reason=f"the prompts were cut from Python "
                    f"{CARD['version']}'s standard library (docs/corpus.json); this is {sys.version.split()[0]}")
def test_every_shipped_prompt_is_in_the_module_it_names():
    """17 of 108 named the module before theirs: an older generator skipped a file it could not read
    (not UTF-8) and every source after it slid by one."""
    available = [r for r in ROWS if (corpus.STDLIB / r["source"]).is_file()]
    assert len(available) == len(ROWS), "the standard library of this Python lacks some held-out modules"
    wrong = [(r["source"], r["prompt"][:40]) for r in available
             if r["prompt"] not in (corpus.STDLIB / r["source"]).read_text(encoding="utf-8", errors="replace")]
    assert not wrong, wrong
    assert {corpus.split_of(r["source"]) for r in ROWS} == {"bench"}  # all of them held out of training


def test_the_generator_names_each_prompts_module_past_a_file_it_cannot_read(tmp_path, monkeypatch):
    doc = '    """' + "A long docstring line.\n    " * 8 + '"""\n'
    module = "def {name}(x):\n" + doc + "    return x\n"
    (tmp_path / "a.py").write_bytes("# caf\xe9\n".encode("latin-1") + module.format(name="f_in_a").encode())
    (tmp_path / "b.py").write_text(module.format(name="f_in_b"))
    (tmp_path / "c.py").write_text(module.format(name="f_in_c"))
    monkeypatch.setattr(corpus, "STDLIB", tmp_path)
    monkeypatch.setattr(corpus, "stdlib_modules", lambda split: sorted(tmp_path.glob("*.py")))
    corpus.write_prompts(tmp_path / "p.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [(r["source"], r["prompt"].split("(")[0]) for r in rows if r["category"] == "code"] == \
        [("b.py", "def f_in_b"), ("c.py", "def f_in_c")]


@pytest.mark.parametrize("what, shipped", [("prompts", "PROMPTS"), ("third-party-prompts", "THIRD_PARTY_PROMPTS")])
def test_the_shipped_prompts_are_rewritten_only_with_force(what, shipped, tmp_path, monkeypatch, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_text("kept\n")
    monkeypatch.setattr(corpus, shipped, path)
    written = []
    monkeypatch.setattr(corpus, "write_prompts", lambda p: written.append(p) or {})
    monkeypatch.setattr(corpus, "write_third_party_prompts", lambda p, wheels: written.append(p) or {})
    monkeypatch.setattr(corpus, "stdlib_modules", lambda split: [])
    err = refused(data.main, [what, "--data-dir", str(tmp_path / "data")], capsys)
    assert err == f"error: data {what} rewrites {path}, the benchmark prompts tinyspec ships: pass --force to " \
        "replace it\n" and path.read_text() == "kept\n" and written == []
    data.main([what, "--force", "--data-dir", str(tmp_path / "data")])
    assert written == [path]
