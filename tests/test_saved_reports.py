"""The saved reports the book and README quote, held to today's code.

The docs test checks the tables against the saved reports; this checks the saved reports against
the code. At T = 0 a row's target forwards are deterministic: the same weights, prompts and method
give the same greedy text and the same steps, on any CPU (the runs here on an AVX2 machine match
reports saved on AVX-512 ones step for step). So a few T = 0 rows of each saved CPU report are run
again, one prompt category, as the benchmark runs them (`runner.Runner`), and their target forwards must match the report's, to
`TOLERANCE`: a near-tie that an instruction set breaks the other way changes one prompt's text from
that token on, a few forwards of a row; code that proposes or accepts differently moves a row more
(the stale draft rows this test was written for were 2% off). A report whose inputs are not shipped
(a datastore in ~/.cache, weights in runs/), whose sizes follow a clock (:auto) or which was
measured in bfloat16 is skipped, with the reason."""

import json
import re
import shlex
from pathlib import Path

import pytest

from tinyspec.bench import benchmark
from tinyspec.commands.cli import WEIGHTS
from tinyspec.commands.method import method_flags
from tinyspec.sampling import Sampling

ROOT = WEIGHTS.parent
TOLERANCE = 0.01  # of a row's target forwards: a near-tie or two, not a changed method
ROWS_PER_REPORT = 2  # T = 0 rows run again per report, speculative ones, in the report's first category


def commands_of(report: dict) -> list[str]:
    return report.get("commands") or [report["command"]]


def unshipped(report: dict, method: str | None = None) -> str | None:
    """Why a report (or its rows of `method`) cannot be made again from a fresh clone, or None. A
    weights or datastore flag counts only for the methods that read it (`method.method_flags`)."""
    readers = method_flags()
    for command in commands_of(report):
        argv = shlex.split(command[command.index("python"):])
        for flag, value in zip(argv, argv[1:]):
            reads = readers.get(flag.lstrip("-").replace("-", "_"))
            if flag in ("--model", "--draft", "--heads", "--eagle", "--parallel", "--datastore", "--prompts") \
                    and not (ROOT / value).is_file() and (reads is None or method is None or method in reads):
                return f"{flag} {value} is not shipped"
            if flag == "--dtype" and value != "float32":
                return f"measured in {value}: its rounding is the CPU's own"
        if "--batch-sizes" in argv:
            return "a batch curve (tests/test_batch.py holds batches to plain decoding)"
    return None


def flags_of(report: dict, row: dict) -> list[str]:
    """The flags of the report's command that change what a row generates: weights, datastore, the
    draft vocabulary (a row that records its own, `draft_vocab`, gets it from there)."""
    argv = shlex.split(commands_of(report)[0][commands_of(report)[0].index("python"):])
    keep = ("--model", "--draft", "--heads", "--eagle", "--parallel", "--datastore", "--tree", "--max-ngram",
            *(() if "draft_vocab" in row else ("--draft-vocab",)))
    paths = ("--model", "--draft", "--heads", "--eagle", "--parallel", "--datastore", "--tree")
    return [x for flag, value in zip(argv, argv[1:]) if flag in keep
            and (flag not in paths or (ROOT / value).is_file()) for x in (flag, value)]  # (rows reading one not shipped are left out)


def reports():
    """(name, report) of each saved report of a benchmark on a CPU (rows by prompt category)."""
    for path in sorted((ROOT / "docs").glob("*.json")):
        report = json.loads(path.read_text())
        if isinstance(report, dict) and report.get("rows") and isinstance(report["rows"], list) \
                and "category" in report["rows"][0] and "cuda" not in str(report.get("device", "")).lower():
            yield path.relative_to(ROOT).as_posix(), report


def rows_to_rerun(report: dict) -> list[dict]:
    """The first speculative rows at T = 0 in the report's first category, at a fixed size."""
    category = report["rows"][0]["category"]
    rows = [r for r in report["rows"] if r["temperature"] == 0 and r["category"] == category
            and r["method"] != "ar" and ":auto" not in r["method"] and not unshipped(report, r["method"].split(":")[0])]
    return rows[:ROWS_PER_REPORT]


REPORTS = list(reports())


def test_the_saved_cpu_reports_are_found():
    assert {"docs/bench.json", "docs/results.json"} <= {name for name, _ in REPORTS}


@pytest.mark.slow
@pytest.mark.parametrize("name,report", REPORTS, ids=[n for n, _ in REPORTS])
def test_saved_report_matches_todays_code(name, report, capsys):
    why = unshipped(report, "ar")  # what every row reads: the target, the prompts, the dtype
    rows = [] if why else rows_to_rerun(report)
    if not rows:
        pytest.skip(f"{name}: {why or unshipped(report) or 'no fixed-size speculative row at T = 0'}")
    command = commands_of(report)[0]
    match = re.search(r"--prompts (\S+)", command)
    category = rows[0]["category"]
    stale = []
    for row in rows:
        spec = row["method"].split(" ")[0]  # "draft:4 V'=1024": the V' is row["draft_vocab"]
        vocab = ["--draft-vocab", str(row["draft_vocab"])] if (row.get("draft_vocab") or 8192) < 8192 else []
        argv = ["--methods", spec, "--temperatures", "0", "--categories", category, "--prompts-per-category",
                str(row["prompts"]), "--max-new-tokens", str(report["max_new_tokens"]), "--no-hf", "--threads", "1",
                *(["--prompts", match.group(1)] if match else []), *vocab, *flags_of(report, row)]
        try:
            runner, specs, _, prompts = benchmark.prepare(benchmark.build_parser().parse_args(argv))
        except SystemExit:
            stale.append(f"{row['method']}: no longer runs ({capsys.readouterr().err.strip()})")
            continue
        run = runner.run(next(s for s in specs if s[0] != "ar"), prompts[category], Sampling(0.0))
        steps, tokens = run["target_steps"], run["new_tokens"]
        if tokens != row["new_tokens"] or abs(steps - row["target_steps"]) > TOLERANCE * row["target_steps"]:
            stale.append(f"{row['method']} on {category}: {row['target_steps']} target forwards for {row['new_tokens']} "
                         f"tokens saved (tau {row['tau']}), {steps} for {tokens} today (tau {tokens / steps:.3f})")
    assert not stale, f"{name} is stale, made by older code: run again `{command}`\n" + "\n".join(stale)
