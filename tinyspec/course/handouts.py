"""`python -m tinyspec course`: hand out parts of tinyspec as assignments, and grade them.

    python -m tinyspec course list
    python -m tinyspec course handout /tmp/hw --chapters sampling,kvcache
    python -m tinyspec course grade /tmp/hw

An assignment is a set of whole functions, named in `assignments.CHAPTERS`; the code a reader reads
carries no markers. `handout` copies the project and replaces the body of each of the chosen
chapters' functions by `raise NotImplementedError(...)`, keeping its signature and docstring
(the docstring says what to write), and writes GRADING.md: per chapter, the functions to write
(their signatures), the tests that grade them (the statistical ones said so), a written
deliverable (a measurement made with a tinyspec command, explained by the walkthrough's cost
model) and an estimate of the hours it takes. `grade` runs those tests against a student's copy (its own `tinyspec` package, not the
installed one), shows the failures, prints a score per chapter, and exits with status 1 unless
every graded test passed. The tests are the project's own: a student's code is held to what
ours is held to.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from .assignments import CHAPTERS, Chapter, chapters_table  # noqa: F401 (for course.Chapter and the walkthrough)
from ..commands.cli import ArgumentParser, HelpFormatter, check_input, check_output, die, examples, run_main

ROOT = Path(__file__).resolve().parent.parent.parent  # the checkout: tinyspec/commands/ is two below it
HANDOUT_FILES = ["README.md", "pyproject.toml", "walkthrough.md", "tinyspec", "tests", "weights"]
MANIFEST = ".course.json"  # in a handout: which chapters it hands out


def signature(root: Path, function: str) -> str:
    """`file.py:Class.name` as the line that defines it, e.g. `def probs(self, logits) -> torch.Tensor`."""
    file, qualname = function.split(":")
    fn = find_function(ast.parse((root / "tinyspec" / file).read_text()), qualname)
    returns = f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else ""
    return f"def {qualname}({ast.unparse(fn.args)}){returns}"


def statistical(root: Path, test: str) -> str | None:
    """How a graded test is statistical, or None: "chi-square" (its body computes `chi_square`),
    "total variation" (its body computes `total_variation`), or "mean" (it holds a mean or a frequency of random draws within a bound of so many standard
    deviations: `MEAN_WITHIN`, or a bound its comment counts in standard deviations)."""
    file, name = test.split("::")
    text = (root / file).read_text()
    fn = next((n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        return None
    source = ast.get_source_segment(text, fn)  # with its comments
    if "chi_square(" in source:
        return "chi-square"
    if "total_variation(" in source:
        return "total variation"
    return "mean" if "MEAN_WITHIN" in source or "standard deviations" in source else None


STATISTICAL = {  # what GRADING.md says of each kind: a correct solution fails each at most ~1e-5 of the time
    "chi-square": "statistical: a chi-square test of the output's counts against the exact distribution, on fixed "
                  "seeds, at a critical value of p ~ 1e-5, so a correct solution fails it about once in 100,000 runs",
    "total variation": "statistical: the frequencies of its outcomes on fixed seeds, held within a total variation "
                       "of the exact distribution that a correct solution exceeds far less often than once in "
                       "100,000 runs (about twice in a billion, whatever order it draws its random numbers in), and "
                       "each mistake it guards against moves the distribution twice as far",
    "mean": "statistical: a mean or frequency of random draws on fixed seeds, held to the exact figure within about "
            "4.5 standard deviations or more, so a correct solution fails it at most about once in 100,000 runs, "
            "whatever order it draws its random numbers in",
}


def grading_md(chapters: list[str], root: Path = ROOT) -> str:
    """GRADING.md for a handout of `chapters`: per chapter, what to build (each function's file,
    signature and docstring), how it is graded (its tests, the statistical ones said so), what it
    also runs, the written deliverable and the hours."""
    total = sum(CHAPTERS[c].hours for c in chapters)
    lines = ["# Grading\n\n",
             "Write the functions named below, then run `python -m tinyspec course grade .` here (or "
             "`--chapters NAME` for one chapter). Each function keeps its signature and docstring in the handout: "
             "the docstring is the specification, and its body raises `NotImplementedError` until you write it. "
             "Every graded test is worth one point, and counts only when all its cases pass; the tests are the "
             "project's own, every one of them run (`-m \"\"`: the slow-marked ones too). Each chapter also has a "
             "written deliverable: a measurement you make with a tinyspec command on your machine and a paragraph "
             "that explains it by the cost model and roofline of the walkthrough (hand in the command, its output "
             "as a table or plot, and the paragraph).\n\n",
             "The written deliverable is graded by hand, three parts of equal weight: *reproducible* (the commands "
             "as you ran them, with the machine: CPU or GPU, threads, dtype), *measured* (the table or plot, every "
             "figure from your output), and *explained* (each trend accounted for by a term of the cost model, "
             "tau, F(n) or the cost of proposing, and each difference you draw a conclusion from larger than the "
             "run-to-run noise: rerun once, and call a difference smaller than the two runs' spread noise). A "
             "result that differs from the walkthrough's is not wrong; an explanation that does not fit your own "
             "numbers is.\n\n",
             f"Chapters handed out: {', '.join(chapters)}; about {total} hours in all.\n"]
    for c in chapters:
        ch = CHAPTERS[c]
        lines.append(f"\n## {c} (walkthrough chapter {ch.walkthrough}; about {ch.hours} hours)\n\n")
        lines.append("### What to build\n\n")
        for f in ch.functions:
            file, qualname = f.split(":")
            lines.append(f"- `tinyspec/{file}`: `{signature(root, f)}`: see its docstring\n")
        if ch.notes:
            lines.append(f"\n{ch.notes}\n")
        lines.append(f"\n### How it is graded\n\n{len(ch.tests)} tests, a point each "
                     f"(`python -m tinyspec course grade . --chapters {c}`):\n\n")
        for t in ch.tests:
            kind = statistical(root, t)
            note = f" ({STATISTICAL[kind]})" if kind else ""
            lines.append(f"- `{t}`{note}\n")
        if ch.needs:
            lines.append(f"\nThese tests also run the code of: {', '.join(ch.needs)} (the project's own unless "
                         f"you were handed those chapters too).\n")
        if ch.extra:
            lines.append(f"\nThese tests need {ch.extra}: `pip install -e \".[{ch.extra}]\"` (without it the chapter "
                         "is not graded).\n")
        lines.append(f"\n### Written deliverable\n\n{ch.deliverable}\n")
    return "".join(lines)


def find_function(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    """The function `name` or method `Class.name` defined at the top of a module."""
    *owner, name = qualname.split(".")
    body = tree.body
    if owner:
        body = next(n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner[0])
    return next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)


def stub_out(text: str, chapter: str, qualnames) -> str:
    """`text` with the bodies of `qualnames` replaced by a NotImplementedError naming the task;
    each keeps its signature and docstring."""
    lines = text.splitlines(keepends=True)
    module = ast.parse(text)
    cuts = []
    for qualname in qualnames:
        fn = find_function(module, qualname)
        doc = fn.body[0] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else None
        first = (doc.end_lineno if doc else fn.body[0].lineno - 1)  # lines are 1-based: the body starts after this
        indent = re.match(r"\s*", lines[fn.body[0].lineno - 1]).group()
        cuts.append((first, fn.end_lineno, f'{indent}raise NotImplementedError("{chapter}: write {qualname} (see its docstring)")\n'))
    for first, last, stub in sorted(cuts, reverse=True):  # bottom up, so earlier line numbers hold
        lines[first:last] = [stub]
    return "".join(lines)


def handout(out_dir: Path, chapters: list[str]) -> dict[str, int]:
    """Copy the project to out_dir with the chapters' functions stubbed; returns functions per file."""
    if out_dir.exists() and any(out_dir.iterdir()):
        die(f"{out_dir} exists and is not empty: choose a new directory")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
    stubbed = {}
    with tempfile.TemporaryDirectory(dir=out_dir.parent if out_dir.parent.exists() else None) as tmp:
        staging = Path(tmp) / "handout"
        staging.mkdir()
        for name in HANDOUT_FILES:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, staging / name, ignore=ignore)
            elif src.is_file():
                shutil.copy2(src, staging / name)
        for c in chapters:
            by_file = {}
            for f in CHAPTERS[c].functions:
                file, qualname = f.split(":")
                by_file.setdefault(file, []).append(qualname)
            for file, qualnames in by_file.items():
                path = staging / "tinyspec" / file
                path.write_text(stub_out(path.read_text(), c, qualnames))
                stubbed[f"tinyspec/{file}"] = stubbed.get(f"tinyspec/{file}", 0) + len(qualnames)
        (staging / "GRADING.md").write_text(grading_md(chapters, staging))
        (staging / MANIFEST).write_text(json.dumps({"chapters": chapters}) + "\n")
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        if out_dir.exists():
            out_dir.rmdir()
        shutil.move(str(staging), out_dir)  # appears whole, or not at all
    return stubbed


def ungradable(chapter: str) -> str | None:
    """Why `chapter` cannot be graded here, or None: its tests import an optional package (its
    `extra`, Triton for the kernel) that is not installed. Such a test module skips itself, and
    pytest, asked for a test of a skipped module by name, runs no test at all."""
    extra = CHAPTERS[chapter].extra
    if extra and importlib.util.find_spec(extra) is None:
        return f"its tests need {extra}, which is not installed: pip install -e \".[{extra}]\""
    return None


def grade(directory: Path, chapters: list[str], show=None) -> dict[str, tuple[int, int]]:
    """Run the chapters' tests in `directory` (its own tinyspec first on the path), in one pytest
    run (a test that grades two chapters runs once); returns {chapter: (tests passed, tests)}, a
    test counting as passed when all its cases pass, for every chapter that can be graded here
    (`ungradable`: the others are left out). Every graded test runs whatever its pytest marks
    (`-m ""`: the project's own configuration leaves the slow ones out of a plain `pytest`).
    show(text): receives pytest's report of the failures, and a line for each graded test that was
    skipped or did not run at all."""
    env = dict(os.environ, PYTHONPATH=str(directory) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    chapters = [c for c in chapters if ungradable(c) is None]
    tests = list(dict.fromkeys(t for c in chapters for t in CHAPTERS[c].tests))
    outcome = {}  # "tests/test_x.py::name" -> "passed", "failed" or "skipped" (the worst of its cases)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "--tb=short", "-p", "no:cacheprovider", "-m", "",
                            f"--junitxml={report}", *tests], cwd=directory, env=env, capture_output=True, text=True)
        if report.is_file():
            for case in ET.parse(report).getroot().iter("testcase"):
                test = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "").split("[")[0]
                tags = {child.tag for child in case}  # parametrized cases count toward their test
                this = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
                outcome[test] = max(outcome.get(test, "passed"), this, key=["passed", "skipped", "failed"].index)
    scores, missing = {}, []
    for c in chapters:
        results = {t: outcome.get(t, "not run") for t in CHAPTERS[c].tests}
        scores[c] = (sum(r == "passed" for r in results.values()), len(results))
        missing += [f"{c}: {t} {r} (counted as not passed)\n" for t, r in results.items() if r in ("skipped", "not run")]
    if show is not None and any(passed < n for passed, n in scores.values()):
        show(p.stdout + p.stderr + "".join(missing))
    return scores


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec course", description=__doc__.split("\n\n")[0],
                        formatter_class=HelpFormatter, epilog=examples(*[
                            line.strip() for line in __doc__.split("\n\n")[1].splitlines()]))
    sub = ap.add_subparsers(dest="verb", required=True)
    sub.add_parser("list", help="the chapters that can be handed out, their functions and tests",
                   formatter_class=HelpFormatter, epilog=examples(
                       "python -m tinyspec course list                  # every chapter: its functions, its tests"))
    h = sub.add_parser("handout", help="copy the project with the chapters' functions replaced by stubs",
                       formatter_class=HelpFormatter, epilog=examples(
                           "python -m tinyspec course handout /tmp/hw --chapters sampling,kvcache",
                           "python -m tinyspec course handout /tmp/all          # every chapter"))
    h.add_argument("out_dir", help="a new (or empty) directory for the student's copy")
    h.add_argument("--chapters", default=",".join(CHAPTERS), help="comma-separated (default: all)")
    g = sub.add_parser("grade", help="run the graded tests against a student's copy; exit 1 unless all pass",
                       formatter_class=HelpFormatter, epilog=examples(
                           "python -m tinyspec course grade /tmp/hw                     # the chapters handed out",
                           "python -m tinyspec course grade /tmp/hw --chapters sampling # one chapter"))
    g.add_argument("directory", help="the student's copy (made by handout)")
    g.add_argument("--chapters", help="comma-separated (default: the chapters the handout gave out)")
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.verb == "list":
        for c, ch in CHAPTERS.items():
            needs = f"; its tests also run {', '.join(ch.needs)}" if ch.needs else ""
            print(f"{c:12s} walkthrough {ch.walkthrough}: write {', '.join(ch.functions)}; {len(ch.tests)} tests{needs}; "
                  f"about {ch.hours} h")
        return
    named = args.verb == "grade" and args.chapters is not None  # chapters grade was asked for by name
    if args.verb == "grade":
        directory = check_input(args.directory, "course grade", folder=True)  # a name too long, say: one line
        if not (directory / "tinyspec").is_dir() or not (directory / "tests").is_dir():
            die(f"{directory} does not look like a tinyspec handout (no tinyspec/ and tests/ inside)")
        if args.chapters is None:
            manifest = directory / MANIFEST
            args.chapters = ",".join(json.loads(manifest.read_text())["chapters"]) if manifest.is_file() else ",".join(CHAPTERS)
    chapters = args.chapters.split(",")
    unknown = [c for c in chapters if c not in CHAPTERS]
    if unknown:
        die(f"unknown chapter(s) {', '.join(unknown)}: choose from {', '.join(CHAPTERS)}")
    if args.verb == "handout":
        check_output(args.out_dir, "handout", directory=True)
        stubbed = handout(Path(args.out_dir), chapters)
        for file, n in stubbed.items():
            print(f"{file}: {n} function(s) to write")
        print(f"handout in {args.out_dir}; see GRADING.md there")
        return
    if not named and all(ungradable(c) for c in chapters):  # "total 0/0" and status 0 would read as a pass
        die(f"nothing could be graded here: {', '.join(chapters)}: "
            f"{'; '.join(dict.fromkeys(ungradable(c) for c in chapters))}")
    for c in chapters:  # a chapter asked for by name is refused; one of the handout's is left out, and said
        why = ungradable(c)
        if why and named:
            die(f"--chapters {c}: {why}")
        if why:
            print(f"{c:12s} not graded: {why}", file=sys.stderr)
    total = [0, 0]
    for c, (passed, n) in grade(directory, chapters, show=lambda text: print(text, file=sys.stderr)).items():
        print(f"{c:12s} {passed}/{n} tests passed")
        total = [total[0] + passed, total[1] + n]
    print(f"{'total':12s} {total[0]}/{total[1]}")
    if total[0] < total[1]:
        raise SystemExit(1)


if __name__ == "__main__":
    run_main(main)
