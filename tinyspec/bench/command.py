"""`python -m tinyspec bench`: every method on the same held-out prompts, same device, same run.

    python -m tinyspec bench --quick
    python -m tinyspec bench report --out runs/report
    python -m tinyspec bench kernels

What is measured and how is `benchmark.py`; this file is the command: it runs the benchmark (or
`report`, or `kernels`), saves the JSON, draws the figures and prints the tables, in that order. A
Ctrl-C stops the benchmark: the rows that finished are saved and printed, and it exits 130.
"""

from __future__ import annotations

import json
import sys

from ..files import atomic_write_json
from .batches import measure_batches
from .benchmark import build_parser, measure
from ..commands.cli import check_output, die, run_main
from .kernels import main as kernel_main
from .report import main as report_main


LEGEND = ("tau = tokens per target forward, correction/bonus included; speedup = tok/s over ar's in the same "
          "interleaved pass (median over passes); predicted = the cost model's speedup: each step of the pass at the "
          "cost sizing measured for its size on this device (speed/sizing.py); same = prompts whose greedy output is plain "
          "decoding's, token for token")


BATCH_LEGEND = ("tau = tokens per row per target forward, correction/bonus included; tok/s = all rows' tokens over "
                "the wall time of all batches; latency = mean seconds from a batch's start to a row's last token; "
                "speedup = tok/s over ar's at the same batch size in the same round (median over rounds); same = "
                "rows whose greedy output is ar's at the smallest batch size, token for token")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["kernels"]:
        return kernel_main(argv[1:])
    if argv[:1] == ["report"]:
        return report_main(argv[1:])
    args = build_parser().parse_args(argv)
    # checked before the work: a finished benchmark must never be lost to a bad path
    save = check_output(args.save, "--save") if args.save is not None else None  # '' is refused there
    if args.plot:
        check_output(args.plot, "--plot", directory=True)
    report = measure_batches(args, argv) if args.batch_sizes else measure(args, argv)
    # saved first, printed after: a closed pipe (`| head -1`) or a full stdout cannot lose the results
    failed = None
    if save and report["rows"]:
        try:
            atomic_write_json(save, report)
        except OSError as e:  # the tables still print below: the results are not lost with the file
            failed = f"--save {args.save}: cannot write it ({e.strerror or e}); the results are only in the output"
    if args.plot and report["rows"]:
        try:
            from .plots import write_batch_plots, write_plots
            figures = (write_batch_plots if args.batch_sizes else write_plots)(report["rows"], args.plot)
            print(f"figures: {', '.join(str(f) for f in figures)}", file=sys.stderr)
        except ImportError:
            print("--plot: matplotlib is not installed (pip install -e '.[plot]'); no figures written", file=sys.stderr)
    show(report, args)
    if failed:
        die(failed, status=1)
    if report.get("interrupted"):  # Ctrl-C: what finished is kept and said, and the status says it was stopped
        kept = f"; saved in {save}" if save and report["rows"] else ""
        print(f"[interrupted] {len(report['rows'])} of {report['planned_rows']} rows finished{kept} (a row under way "
              "is left out)", file=sys.stderr)
        raise SystemExit(130)


def show(report: dict, args) -> None:
    """The report on stdout: JSON with --json, else its tables."""
    if args.json:
        print(json.dumps(report, indent=1), flush=True)
        return
    print(f"device: {report['device']}, {report['dtype']}; {args.max_new_tokens} new tokens per prompt; median of "
          f"{args.repeats} timed pass(es). {LEGEND if not args.batch_sizes else BATCH_LEGEND}")
    if args.batch_sizes:
        print_table(report["rows"], ["method", "temperature", "batch_size", "tau", "acceptance_rate", "tokens_per_s",
                                     "latency_s", "speedup", "same_as_ar"],
                    ["method", "T", "batch", "tau", "accept", "tok/s", "latency s", "speedup", "same"])
        return
    print_table(report["rows"], ["method", "temperature", "category", "tau", "acceptance_rate", "tokens_per_s", "speedup",
                                 "predicted_speedup", "same_as_ar"],
                ["method", "T", "category", "tau", "accept", "tok/s", "speedup", "predicted", "same"])
    if report["huggingface"]:
        print("\nHugging Face transformers, same weights (GPT2LMHeadModel.generate; assisted = with the draft; "
              "same = prompts whose greedy tokens are tinyspec's):")
        print_table(report["huggingface"], ["method", "temperature", "category", "tokens_per_s", "tinyspec_speedup",
                                            "same_as_tinyspec"], ["method", "T", "category", "tok/s", "tinyspec x", "same"])
    sys.stdout.flush()


def print_table(rows, cols, head) -> None:
    fmt = lambda v: "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))
    table = [head] + [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for j, row in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
        if j == 0:
            print("  ".join("-" * w for w in widths))



if __name__ == "__main__":
    run_main(main)  # bench, bench report and bench kernels alike: Ctrl-C or a closed pipe end quietly
