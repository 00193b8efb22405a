"""Every `python -m tinyspec...` command shown in README.md and walkthrough.md is valid as shown:
each one's arguments parse, and the quick ones run on the shipped weights."""
import importlib
import re
import shlex

import pytest
import torch

from tinyspec.cli import WEIGHTS

DOCS = [WEIGHTS.parent / "README.md", WEIGHTS.parent / "walkthrough.md"]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")


def quick(argv) -> bool:
    """Run in full (seconds each): generation, handouts, the benchmark's --quick mode. The rest
    (training, the full benchmark, grading) are only parsed."""
    module, args = argv[2], argv[3:]
    if "--cuda-graph" in args and not torch.cuda.is_available():
        return False
    return (module in ("tinyspec", "tinyspec.generate") or (module == "tinyspec.bench" and "--quick" in args)
            or (module == "tinyspec.course" and args[:1] in (["handout"], ["list"])))


def shown_commands():
    """(doc, argv) for each command in a code block (one per line, `&&` chains split, comments
    dropped) or in an inline code span."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for block in FENCE.findall(text):
            for line in block.splitlines():
                for part in line.split("#")[0].split("&&"):
                    found.append((doc.name, part))
        for span in INLINE.findall(FENCE.sub("", text)):
            found.append((doc.name, " ".join(span.split())))
    return [(doc, shlex.split(c.strip())) for doc, c in found if c.strip().startswith("python -m tinyspec")]


COMMANDS = shown_commands()


def parser_and_args(argv):
    module, args = argv[2], argv[3:]
    if module == "tinyspec.bench" and args[:1] == ["kernels"]:
        module, args = "tinyspec.kernels.bench", args[1:]
    if module == "tinyspec.bench" and args[:1] == ["report"]:
        module, args = "tinyspec.report", args[1:]
    if module == "tinyspec":  # the overview: no flags
        module = "tinyspec.__main__"
    return importlib.import_module(module), args


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 15 and sum(map(quick, (a for _, a in COMMANDS))) >= 6
    assert any(argv[2] == "tinyspec.generate" and "medusa" in argv for _, argv in COMMANDS)


@pytest.mark.parametrize("doc,argv", COMMANDS, ids=[" ".join(a[2:])[:60] for _, a in COMMANDS])
def test_shown_command_parses(doc, argv):
    module, args = parser_and_args(argv)
    if not hasattr(module, "build_parser"):
        assert not args, f"{argv} takes no arguments"
        return
    parser = module.build_parser()
    if args:  # a bare `python -m tinyspec.x` in prose names the tool; with arguments it must parse
        parser.parse_args(args)


@pytest.mark.parametrize("doc,argv", [pytest.param(d, a, marks=[pytest.mark.slow] if a[2] == "tinyspec.bench" else [])
                                      for d, a in COMMANDS if quick(a)],
                         ids=lambda v: " ".join(v[2:])[:60] if isinstance(v, list) else v)
def test_quick_command_runs(doc, argv, tmp_path, monkeypatch, capsys):
    module, args = parser_and_args(argv)
    if args[:1] == ["handout"]:
        args = ["handout", str(tmp_path / "hw")] + args[2:]
    monkeypatch.setenv("NO_COLOR", "1")
    module.main(args) if args else module.main()
    assert capsys.readouterr().out.strip()
