"""`python -m tinyspec.course`: hand out parts of tinyspec as assignments, and grade them.

    python -m tinyspec.course list
    python -m tinyspec.course handout /tmp/hw --chapters sampling,kvcache
    python -m tinyspec.course grade /tmp/hw

Solutions are marked in the source, inside functions:

    # BEGIN SOLUTION kvcache: set the new length, after checking 0 <= n <= length
    ...the reference code...
    # END SOLUTION

`handout` copies the project and replaces every marked region of the chosen chapters by
`raise NotImplementedError("<chapter>: <hint>")`, at the region's indentation, and writes
GRADING.md naming the tests that grade each chapter. `grade` runs those tests against a
student's copy (its own `tinyspec` package, not the installed one) and prints a score per
chapter. The tests are the project's own: a student's code is held to what ours is held to.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from .cli import ArgumentParser, die

ROOT = Path(__file__).resolve().parent.parent
HANDOUT_FILES = ["README.md", "pyproject.toml", "walkthrough.md", "tinyspec", "tests", "weights"]

# chapter -> (walkthrough chapter, the tests that grade it)
CHAPTERS = {
    "sampling": ("4 Sampling", ["tests/test_sampling.py::test_matches_huggingface_warpers",
                                "tests/test_sampling.py::test_greedy_is_one_hot_at_argmax",
                                "tests/test_sampling.py::test_top_p_keeps_smallest_set_reaching_mass"]),
    "kvcache": ("3 KV cache", ["tests/test_kvcache.py::test_truncate_then_redecode_equals_fresh_cache",
                               "tests/test_kvcache.py::test_keep_compacts_an_accepted_tree_path",
                               "tests/test_kvcache.py::test_keep_rejects_unsorted_or_stale_slots"]),
    "speculative": ("5 Speculative sampling", ["tests/test_speculative.py::test_greedy_equals_plain_decoding_for_every_k_and_draft",
                                               "tests/test_speculative.py::test_acceptance_rule_reproduces_p_for_fixed_distributions",
                                               "tests/test_speculative.py::test_sampled_output_has_the_target_distribution"]),
    "tree": ("7 Trees and verification", ["tests/test_tree.py::test_hand_drawn_tree", "tests/test_tree.py::test_chain_and_star"]),
    "verify": ("7 Trees and verification", ["tests/test_verify.py::test_greedy_medusa_equals_plain_decoding_on_every_tree_shape",
                                            "tests/test_verify.py::test_trained_heads_make_greedy_medusa_take_fewer_target_passes"]),
    "kernel": ("8 The Triton kernel", ["tests/test_tree_attention.py::test_matches_reference",
                                       "tests/test_tree_attention.py::test_output_ignores_tokens_outside_the_path"]),
}

BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION (?P<chapter>\w+): (?P<hint>.+)$")
END = re.compile(r"^\s*# END SOLUTION\s*$")


def stub_out(text: str, chapters: set[str]) -> tuple[str, int]:
    """Replace the marked regions of `chapters` in one source file; returns (text, regions)."""
    out, inside, count = [], None, 0
    for line in text.splitlines(keepends=True):
        begin = BEGIN.match(line)
        if inside is None and begin and begin["chapter"] in chapters:
            inside = begin
            hint = begin["hint"].replace('"', "'")
            out.append(f'{begin["indent"]}raise NotImplementedError("{begin["chapter"]}: {hint}")\n')
            count += 1
        elif inside is not None and END.match(line):
            inside = None
        elif inside is None:
            out.append(line)
    if inside is not None:
        raise ValueError(f"a BEGIN SOLUTION {inside['chapter']} has no END SOLUTION")
    return "".join(out), count


def handout(out_dir: Path, chapters: list[str]) -> dict[str, int]:
    """Copy the project to out_dir with the chapters' solutions stubbed; returns regions per file."""
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
        for path in sorted((staging / "tinyspec").rglob("*.py")):
            if path.name == "course.py":  # its docstring shows the markers
                continue
            text, n = stub_out(path.read_text(), set(chapters))
            if n:
                path.write_text(text)
                stubbed[path.relative_to(staging).as_posix()] = n
        lines = ["# Grading\n", "Run `python -m tinyspec.course grade .` here. Each chapter is graded by these tests:\n"]
        for c in chapters:
            lines.append(f"\n## {c} (walkthrough chapter {CHAPTERS[c][0]})\n")
            lines += [f"- `{t}`\n" for t in CHAPTERS[c][1]]
        (staging / "GRADING.md").write_text("".join(lines))
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        if out_dir.exists():
            out_dir.rmdir()
        shutil.move(str(staging), out_dir)  # appears whole, or not at all
    return stubbed


def grade(directory: Path, chapters: list[str]) -> dict[str, tuple[int, int]]:
    """Run each chapter's tests in `directory` (its own tinyspec first on the path); returns
    {chapter: (passed, total)}."""
    scores = {}
    env = dict(os.environ, PYTHONPATH=str(directory) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for c in chapters:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.xml"
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                            *CHAPTERS[c][1]], cwd=directory, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if not report.is_file():
                scores[c] = (0, len(CHAPTERS[c][1]))
                continue
            cases = ET.parse(report).getroot().iter("testcase")
            results = [not any(child.tag in ("failure", "error", "skipped") for child in case) for case in cases]
            scores[c] = (sum(results), len(results))
    return scores


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec.course", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    sub.add_parser("list", help="the chapters that can be handed out, and their tests")
    h = sub.add_parser("handout", help="copy the project with solutions replaced by stubs")
    h.add_argument("out_dir")
    h.add_argument("--chapters", default=",".join(CHAPTERS), help="comma-separated (default: all)")
    g = sub.add_parser("grade", help="run the graded tests against a student's copy")
    g.add_argument("directory")
    g.add_argument("--chapters", default=",".join(CHAPTERS), help="comma-separated (default: all)")
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.verb == "list":
        for c, (chapter, tests) in CHAPTERS.items():
            print(f"{c:12s} walkthrough {chapter}: {len(tests)} tests")
        return
    chapters = args.chapters.split(",")
    unknown = [c for c in chapters if c not in CHAPTERS]
    if unknown:
        die(f"unknown chapter(s) {', '.join(unknown)}: choose from {', '.join(CHAPTERS)}")
    if args.verb == "handout":
        stubbed = handout(Path(args.out_dir), chapters)
        for file, n in stubbed.items():
            print(f"{file}: {n} region(s) to write")
        print(f"handout in {args.out_dir}; see GRADING.md there")
    else:
        directory = Path(args.directory)
        if not (directory / "tinyspec").is_dir() or not (directory / "tests").is_dir():
            die(f"{directory} does not look like a tinyspec handout (no tinyspec/ and tests/ inside)")
        total = [0, 0]
        for c, (passed, n) in grade(directory, chapters).items():
            print(f"{c:12s} {passed}/{n} tests passed")
            total = [total[0] + passed, total[1] + n]
        print(f"{'total':12s} {total[0]}/{total[1]}")


if __name__ == "__main__":
    main()
