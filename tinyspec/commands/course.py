"""`python -m tinyspec course`: hand out parts of tinyspec as assignments, and grade them.

    python -m tinyspec course list
    python -m tinyspec course handout /tmp/hw --chapters sampling,kvcache
    python -m tinyspec course grade /tmp/hw

An assignment is a set of whole functions, named in `CHAPTERS` below; the code a reader reads
carries no markers. `handout` copies the project and replaces the body of each of the chosen
chapters' functions by `raise NotImplementedError(...)`, keeping its signature and docstring
(the docstring says what to write), and writes GRADING.md naming the tests that grade each
chapter. `grade` runs those tests against a student's copy (its own `tinyspec` package, not the
installed one), shows the failures, prints a score per chapter, and exits with status 1 unless
every graded test passed. The tests are the project's own: a student's code is held to what
ours is held to.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from .cli import ArgumentParser, HelpFormatter, check_output, die, examples, run_main

ROOT = Path(__file__).resolve().parent.parent.parent  # the checkout: tinyspec/commands/ is two below it
HANDOUT_FILES = ["README.md", "pyproject.toml", "walkthrough.md", "tinyspec", "tests", "weights"]
MANIFEST = ".course.json"  # in a handout: which chapters it hands out


@dataclass(frozen=True)
class Chapter:
    walkthrough: str  # the walkthrough chapter that teaches it
    functions: tuple[str, ...]  # "file.py:function" or "file.py:Class.method", relative to tinyspec/
    tests: tuple[str, ...]  # pytest node ids of the tests that grade it (one score point each)
    needs: tuple[str, ...] = ()  # chapters whose code these tests run too


CHAPTERS = {
    "tokenizer": Chapter("1 Tokenizer", ("tokenizer.py:train_bpe",),
                         ("tests/test_tokenizer.py::test_merges_equal_tiktoken_reference_trainer",
                          "tests/test_tokenizer.py::test_merges_equal_reference_on_random_texts_full_of_ties",
                          "tests/test_tokenizer.py::test_training_counts_chunks_not_positions",
                          "tests/test_tokenizer.py::test_save_load_roundtrip",
                          "tests/test_tokenizer.py::test_encoding_uses_training_merges")),
    "kvcache": Chapter("3 KV cache", ("kvcache.py:KVCache.truncate", "kvcache.py:KVCache.keep"),
                       ("tests/test_kvcache.py::test_truncate_then_redecode_equals_fresh_cache",
                        "tests/test_kvcache.py::test_keep_compacts_an_accepted_tree_path",
                        "tests/test_kvcache.py::test_keep_rejects_unsorted_or_stale_slots",
                        "tests/test_speculative.py::test_caches_after_speculative_steps_equal_plain_decoding")),
    "sampling": Chapter("4 Sampling", ("sampling.py:probs", "sampling.py:sample"),
                        ("tests/test_sampling.py::test_matches_huggingface_warpers",
                         "tests/test_sampling.py::test_greedy_is_one_hot_at_argmax",
                         "tests/test_sampling.py::test_top_p_keeps_smallest_set_reaching_mass",
                         "tests/test_sampling.py::test_top_p_keeps_the_set_whose_mass_is_exactly_p_and_no_more",
                         "tests/test_sampling.py::test_seeded_sampling_is_reproducible_and_follows_p",
                         "tests/test_sampling.py::test_zero_probability_tokens_are_never_drawn_and_one_hot_gives_its_token")),
    "speculative": Chapter("5 Speculative sampling", ("methods/draft.py:accept_or_resample",),
                           ("tests/test_speculative.py::test_greedy_equals_plain_decoding_for_every_k_and_draft",
                            "tests/test_speculative.py::test_acceptance_rule_reproduces_p_for_fixed_distributions",
                            "tests/test_speculative.py::test_sampled_output_has_the_target_distribution",
                            "tests/test_speculative.py::test_a_k_chosen_anew_every_step_is_still_exact"),
                           needs=("kvcache", "sampling")),
    "tree": Chapter("6 Trees and verification", ("tree.py:depths", "tree.py:tree_mask", "tree.py:root_to_leaf_paths"),
                    ("tests/test_tree.py::test_hand_drawn_tree", "tests/test_tree.py::test_chain_and_star",
                     "tests/test_tree.py::test_choice_lists_round_trip",
                     "tests/test_tree.py::test_tree_from_accuracies_takes_the_most_likely_nodes")),
    "verify": Chapter("6 Trees and verification", ("verify.py:longest_accepted_path", "verify.py:greedy"),
                      ("tests/test_medusa.py::test_greedy_medusa_equals_plain_decoding_on_every_tree_shape",
                       "tests/test_medusa.py::test_trained_heads_make_greedy_medusa_take_fewer_target_passes",
                       "tests/test_medusa.py::test_cache_after_medusa_steps_equals_plain_decoding",
                       "tests/test_lookup.py::test_greedy_lookup_equals_plain_decoding"),
                      needs=("kvcache", "sampling", "tree")),
    "medusa": Chapter("7 Medusa", ("methods/medusa.py:propose",),
                      ("tests/test_medusa.py::test_greedy_medusa_equals_plain_decoding_on_every_tree_shape",
                       "tests/test_medusa.py::test_lossless_rules_at_temperature_zero_are_greedy_decoding",
                       "tests/test_medusa.py::test_cache_after_medusa_steps_equals_plain_decoding",
                       "tests/test_medusa.py::test_trained_heads_make_greedy_medusa_take_fewer_target_passes"),
                      needs=("kvcache", "sampling", "tree", "verify")),
    "eagle": Chapter("8 EAGLE: drafting features, growing the tree", ("methods/eagle.py:grow_tree",),
                     ("tests/test_eagle.py::test_grow_tree_on_the_docstring_example",
                      "tests/test_eagle.py::test_grow_tree_matches_a_plain_reference",
                      "tests/test_eagle.py::test_greedy_eagle_equals_plain_decoding",
                      "tests/test_eagle.py::test_caches_after_eagle_steps_equal_plain_decoding"),
                     needs=("kvcache", "sampling", "tree", "verify")),
    "lookup": Chapter("9 Draft-free speculation: prompt lookup, lookahead and retrieval", ("methods/lookup.py:NgramIndex.propose",),
                      ("tests/test_lookup.py::test_index_example_and_incremental_updates_match_a_scan",
                       "tests/test_lookup.py::test_greedy_lookup_equals_plain_decoding",
                       "tests/test_lookup.py::test_greedy_lookup_runs_to_the_end_of_the_context",
                       "tests/test_lookup.py::test_cache_after_lookup_steps_equals_plain_decoding"),
                      needs=("kvcache", "sampling", "tree", "verify")),
    "kernel": Chapter("10 The Triton kernel and the fast path", ("kernels/tree_attention.py:_online_softmax_step",),
                      ("tests/test_tree_attention.py::test_matches_reference",
                       "tests/test_tree_attention.py::test_output_ignores_tokens_outside_the_path",
                       "tests/test_tree_attention.py::test_any_strides",
                       "tests/test_tree_attention.py::test_custom_scale")),
    "batch": Chapter("13 Batch > 1: speculation against batching", ("decoding.py:feed",),
                     ("tests/test_batch.py::test_rows_of_different_lengths_equal_their_own_single_caches",
                      "tests/test_batch.py::test_greedy_rows_equal_plain_decoding_at_every_batch_size",
                      "tests/test_batch.py::test_each_rows_cache_equals_plain_decodings",
                      "tests/test_batch.py::test_rows_that_are_done_leave_the_batch_and_the_rest_go_on"),
                     needs=("kvcache", "sampling", "tree", "verify")),
}


def chapters_table() -> str:
    """`CHAPTERS` as the walkthrough's Markdown table: a row per chapter, with the walkthrough
    chapter that teaches it, its functions (`file.py: first`, then the others of that file) and
    how many tests grade it. The book holds this text verbatim (tests/test_docs.py checks it)."""
    rows = ["| chapter | walkthrough | functions to write | graded tests |", "|---|---|---|---|"]
    for c, ch in CHAPTERS.items():
        by_file = {}
        for f in ch.functions:
            file, qualname = f.split(":")
            by_file.setdefault(file, []).append(qualname)
        functions = ", ".join(f"`{file}: {names[0]}`" + "".join(f", `{n}`" for n in names[1:])
                              for file, names in by_file.items())
        rows.append(f"| `{c}` | {ch.walkthrough.split()[0]} | {functions} | {len(ch.tests)} |")
    return "\n".join(rows) + "\n"


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
        lines = ["# Grading\n", "Write the functions named below (each docstring says what it must do), then run "
                 "`python -m tinyspec course grade .` here. Each chapter is graded by these tests:\n"]
        for c in chapters:
            lines.append(f"\n## {c} (walkthrough chapter {CHAPTERS[c].walkthrough})\n\n")
            lines += [f"- write `tinyspec/{f.replace(':', '`: `')}`\n" for f in CHAPTERS[c].functions]
            lines += [f"- graded by `{t}`\n" for t in CHAPTERS[c].tests]
            if CHAPTERS[c].needs:
                lines.append(f"- these tests also run the code of: {', '.join(CHAPTERS[c].needs)}\n")
        (staging / "GRADING.md").write_text("".join(lines))
        (staging / MANIFEST).write_text(json.dumps({"chapters": chapters}) + "\n")
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        if out_dir.exists():
            out_dir.rmdir()
        shutil.move(str(staging), out_dir)  # appears whole, or not at all
    return stubbed


def grade(directory: Path, chapters: list[str], show=None) -> dict[str, tuple[int, int]]:
    """Run the chapters' tests in `directory` (its own tinyspec first on the path), in one pytest
    run (a test that grades two chapters runs once); returns {chapter: (tests passed, tests)}, a
    test counting as passed when all its cases pass. Every graded test runs whatever its pytest
    marks (`-m ""`: the project's own configuration leaves the slow ones out of a plain `pytest`).
    show(text): receives pytest's report of the failures, and a line for each graded test that was
    skipped or did not run at all."""
    env = dict(os.environ, PYTHONPATH=str(directory) + os.pathsep + os.environ.get("PYTHONPATH", ""))
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
            print(f"{c:12s} walkthrough {ch.walkthrough}: write {', '.join(ch.functions)}; {len(ch.tests)} tests{needs}")
        return
    if args.verb == "grade":
        directory = Path(args.directory)
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
    total = [0, 0]
    for c, (passed, n) in grade(directory, chapters, show=lambda text: print(text, file=sys.stderr)).items():
        print(f"{c:12s} {passed}/{n} tests passed")
        total = [total[0] + passed, total[1] + n]
    print(f"{'total':12s} {total[0]}/{total[1]}")
    if total[0] < total[1]:
        raise SystemExit(1)


if __name__ == "__main__":
    run_main(main)
