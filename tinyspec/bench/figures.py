"""`python -m tinyspec figures`: the book's figures, each from a function of tinyspec or a measurement.

    python -m tinyspec figures residual speedup          # arithmetic: no model, a second
    python -m tinyspec figures cost --threads 1          # times target forwards on this device
    python -m tinyspec figures bench                     # redraws the benchmark's figures from docs/bench.json
    python -m tinyspec figures eagle-tree eagle-costs    # chapter 9's tree (text) and its costs, printed
    python -m tinyspec figures tables                    # refills the docs' benchmark tables from the saved report
    python -m tinyspec figures tour --out docs           # times the README's tour, as a new user runs it
    python -m tinyspec figures tree-mask tree-step block-coins traversal-coins residual-walk cost-curve  # worked examples

- `residual`: the worked example of walkthrough chapter 5, p, q, min(p, q) and the residual as
  bars (residual.png);
- `speedup`: tau(alpha, k) and the best speedup over k for each (alpha, c), from
  `speculative.expected_tokens`, `expected_speedup` and `best_k` (tau_and_speedup.png);
- `cost`: the time of one target forward over n new tokens after 128 cached ones, over that of a
  one-token forward, measured here with `timing.forward_call`, interleaved and paired
  (forward_cost.png, and the numbers with the device, threads and torch version in
  forward_cost.json);
- `bench`: the benchmark's own figures (`plots.py`) from a saved report (`--report`): ledger.png and
  predicted_vs_measured.png, or, from a `bench --batch-sizes` report (docs/batch.json), the batch curves;
- `eagle-tree` (`eagle_step.py`): every node EAGLE-2's `grow_tree` makes in the first step after a prompt, with its
  value, the kept ones marked, and what the target accepted (printed);
- `eagle-costs`: the pieces of an EAGLE step in plain decoding steps, each the minimum of 60 runs
  (printed);
- `tables`: every table of README.md, walkthrough.md and docs/*.md marked `<!-- bench: FILE columns=... -->`
  refilled from FILE, its rows kept (or, with `rows=all` in the marker, every row FILE has; with
  `key=FIELD`, FILE's rows whose FIELD the table shows, as chapter 2's forward costs), and the machine
  FILE records written under it, and in each measured figure's caption (`Measured on: ...`) the machine
  of the report it was drawn from (`tables.py`); `tests/test_docs.py` checks each cell against FILE;
- `tree-mask`, `tree-step`, `block-coins`, `traversal-coins`, `residual-walk`, `cost-curve`: the book's
  worked examples, from tinyspec's own functions and the shipped weights (`diagrams.py`, drawn by `drawings.py`): a Medusa
  tree and its mask; two greedy Medusa steps as verified; block verification's and traversal's coins
  on Sun et al.'s example; chapter 6's residuals; the speedup of a chain against the tokens in its
  forward with the measured F(t) (--forward-cost). Each is a PNG and the JSON of what it shows;
- `tour`: every command of the README's tour that runs on a CPU, in order, each a new process with an
  empty sizing cache (first use), timed, and whether its output shows accepted proposals (tour.json).

matplotlib is needed (`pip install -e ".[plot]"`). Figures go to --out: by default a folder in
tinyspec's own (`files.home`), never into the checkout unless asked (`--out docs/figures` redraws the
book's).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from ..commands.cli import (DEFAULT_EAGLE, DEFAULT_HEADS, DEFAULT_MODEL, DEFAULT_TOKENIZER, ArgumentParser, HelpFormatter,
                             check_input, check_output, die, examples, load_model, pick_device, run_main, set_threads,
                             shown)
from ..files import atomic_write_json, atomic_write_text, home
from ..methods.draft import best_k, expected_speedup, expected_tokens
from ..speed.sizing import device_name
from ..speed.timing import forward_call, interleaved_times
from .diagrams import DIAGRAMS, block_coins_data, cost_curve_data, residual_walk_data, traversal_coins_data, \
    tree_mask_data, tree_step_data
from .drawings import draw
from .eagle_step import eagle_costs, eagle_tree
from .plots import pyplot, save, write_batch_plots, write_plots
from .tables import ROOT, fill_captions, fill_tables

FIGURES = ("residual", "speedup", "cost", "bench", "eagle-tree", "eagle-costs", "tables", "tour", *DIAGRAMS)
COST_SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 13, 16, 17, 20, 24, 32, 33, 42, 48, 64)  # 9: lookup:8; 17, 33: 16- and 32-node trees


def residual_figure(out: Path) -> Path:
    """Chapter 5's example: where each of p's tokens comes from, an accepted proposal or a correction."""
    plt = pyplot()
    p, q = torch.tensor([0.6, 0.3, 0.1]), torch.tensor([0.2, 0.3, 0.5])
    overlap, excess = torch.minimum(p, q), (p - q).clamp(min=0)  # excess / its mass is sampling.residual(p, q)
    x, names = torch.arange(3).numpy(), ["a", "b", "c"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2), sharey=True)
    left.bar(x - 0.2, p.numpy(), 0.4, label="p, the target", color="tab:blue")
    left.bar(x + 0.2, q.numpy(), 0.4, label="q, the draft", color="tab:orange")
    left.set(xticks=x, xticklabels=names, ylabel="probability", title="the two distributions")
    left.legend(fontsize=8)
    right.bar(x, overlap.numpy(), 0.5, color="tab:green", label="min(p, q): proposed and accepted")
    right.bar(x, excess.numpy(), 0.5, bottom=overlap.numpy(), color="tab:red",
              label=f"(1 - beta) x residual: corrections\n(beta = {float(overlap.sum()):.1f})")
    for xi, pi in zip(x, p.tolist()):
        right.plot([xi - 0.3, xi + 0.3], [pi, pi], color="tab:blue", lw=2)
    right.set(xticks=x, xticklabels=names, title="what comes out: exactly p (blue lines)")
    right.legend(fontsize=8)
    return save(fig, out / "residual.png")


def speedup_figure(out: Path) -> Path:
    """tau(alpha, k) for several k; S(alpha, c, k) against k; and the best S over k for each (alpha, c)."""
    plt = pyplot()
    alphas = [i / 100 for i in range(0, 100)]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(13, 3.8))
    for k in (1, 2, 4, 8, 16):
        left.plot(alphas, [expected_tokens(a, k) for a in alphas], label=f"k = {k}")
    left.set(xlabel=r"$\alpha$ (chance a proposal is accepted)", ylabel=r"$\tau$ (tokens per target forward)",
             title=r"$\tau(\alpha, k) = (1 - \alpha^{k+1}) / (1 - \alpha)$")
    left.legend(fontsize=8)
    ks = list(range(0, 17))
    for c in (0.02, 0.05, 0.1, 0.2, 0.5):
        middle.plot(ks, [expected_speedup(0.8, c, k) for k in ks], marker=".", label=f"c = {c}")
    middle.axhline(1.0, color="grey", lw=0.8)
    middle.set(xlabel="k (proposals per step)", ylabel="speedup", title=r"$S(0.8, c, k) = \tau\,/\,(kc + 1)$",
               xticks=ks[::2])  # k is a count: whole ticks
    middle.legend(fontsize=8)
    cs = [i / 100 for i in range(1, 61)]
    k_max = 8  # as the table beside the figure in chapter 5
    grid = [[expected_speedup(a, c, best_k(a, c, k_max)) for a in alphas] for c in cs]
    image = right.contourf(alphas, cs, grid, levels=[1.001, 1.1, 1.25, 1.5, 2, 2.5, 3, 4, 6, 9], cmap="viridis")
    for a in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        for c in (0.05, 0.15, 0.25, 0.35, 0.45, 0.55):
            if best_k(a, c, k_max):
                right.text(a, c, str(best_k(a, c, k_max)), color="white", fontsize=7, ha="center", va="center")
    fig.colorbar(image, ax=right, label="best speedup (blank: none)")
    right.set(xlabel=r"$\alpha$", ylabel="c (draft forward / target forward)",
              title=f"the best speedup over k <= {k_max}; numbers: that k")
    return save(fig, out / "tau_and_speedup.png")


@torch.no_grad()
def measure_forward_cost(model, device: torch.device, sizes=COST_SIZES, context: int = 128,
                         rounds: int = 75) -> list[dict]:
    """The time of a forward over n new tokens after `context` cached ones, over that of a one-token
    forward, for every n in `sizes` (n = 1 is a plain decoding step; n = k + 1 verifies a draft's k
    proposals, and a tree of n - 1 nodes costs the same). Interleaved and paired, as the benchmark
    times methods (chapter 13): each round times every n (`timing.forward_call`) and divides by the
    same round's one-token time; the result is the median ratio over the rounds."""
    times = interleaved_times({n: forward_call(model, 1, n, context) for n in sizes}, device, rounds)
    one = times[sizes[0]]
    return [{"tokens": n, "seconds": round(statistics.median(times[n]), 6),
             "plain_steps": round(statistics.median(t / o for t, o in zip(times[n], one)), 3)} for n in sizes]


def cost_figure(out: Path, report: dict) -> Path:
    plt = pyplot()
    n = [r["tokens"] for r in report["rows"]]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(n, [r["plain_steps"] for r in report["rows"]], marker="o", label=f"measured: {report['device']}")
    ax.plot(n, [1] * len(n), color="grey", ls="--", label="free verification (a memory-bound step)")
    ax.plot(n, n, color="grey", ls=":", label="n separate one-token forwards")
    ax.set(xlabel="tokens in one target forward (n)", ylabel="cost, in one-token forwards", ylim=(0, max(8, n[-1] / 8)),
           title=f"cost of verifying n tokens at once ({report['model']})")
    ax.legend(fontsize=8)
    return save(fig, out / "forward_cost.png")


def bench_rows(path: str) -> list[dict]:
    """The rows of a saved benchmark report (`bench --save`), or one line naming what is wrong."""
    try:
        rows = json.loads(Path(path).read_text())["rows"]
    except FileNotFoundError:
        die(f"--report {path}: no such file; give a report saved by python -m tinyspec bench --save FILE")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        die(f"--report {path} is not a saved benchmark report ({type(e).__name__}: {e}); give the JSON that "
            "python -m tinyspec bench --save FILE wrote")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        die(f"--report {path}: its rows are not a list of objects; give the JSON that python -m tinyspec bench --save wrote")
    return rows


def forward_costs(path) -> dict:
    """A saved `figures cost` report (forward_cost.json), or one line naming what is wrong."""
    try:
        report = json.loads(Path(path).read_text())
        if all(isinstance(r["tokens"], int) and isinstance(r["plain_steps"], (int, float)) for r in report["rows"]):
            return report
    except FileNotFoundError:
        die(f"--forward-cost {path}: no such file; python -m tinyspec figures cost --out DIR writes DIR/forward_cost.json")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        pass
    die(f"--forward-cost {path} is not the forward_cost.json that python -m tinyspec figures cost writes")


def tour(out: Path) -> Path:
    """Every command of the README's tour that runs on a CPU (no --cuda-graph, no `bench report`), in
    order, each a new process as a reader runs it, with an empty tinyspec folder (sizing on first
    use): its wall time, and whether it speculated (accepted proposals in its output)."""
    import os
    import shlex
    import subprocess
    import sys
    import tempfile
    block = (ROOT / "README.md").read_text().split("## A 60-second tour", 1)[1].split("```bash", 1)[1].split("```")[0]
    commands = [shlex.split(line) for line in block.splitlines() if line.startswith("python -m tinyspec")]
    commands = [c for c in commands if "--cuda-graph" not in c and "report" not in c]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, TINYSPEC_HOME=folder, NO_COLOR="1")
        for argv in commands:
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True)
            if p.returncode:
                die(f"the tour's `{shlex.join(argv)}` failed: {p.stderr.strip().splitlines()[-1:]}")
            rows.append({"command": shlex.join(argv), "seconds": round(time.perf_counter() - t0, 2),
                         "speculated": "acceptance" in p.stderr or '"accepted_tokens"' in p.stdout})
            print(f"{rows[-1]['seconds']:6.1f} s  {rows[-1]['command']}")
    report = {"device": f"{device_name(torch.device('cpu'))}, {os.cpu_count()} cores", "torch": torch.__version__,
              "command": f"python -m tinyspec figures tour --out {shown(out)}", "commands": rows,
              "rows": [{"commands": len(rows), "speculated": sum(r["speculated"] for r in rows),
                        "wall_s": round(sum(r["seconds"] for r in rows), 1)}]}
    atomic_write_json(out / "tour.json", report)
    return out / "tour.json"


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec figures", description=__doc__.split("\n\n")[0],
                        formatter_class=HelpFormatter, epilog=examples(*[
                            line.strip() for line in __doc__.split("\n\n")[1].splitlines()]))
    ap.add_argument("figures", nargs="*", default=["residual", "speedup"], help=f"any of {', '.join(FIGURES)} "
                    "(default: the two that need no measurement)")
    ap.add_argument("--out", default=str(home() / "figures"), help="directory for the PNG files (default: "
                    "$TINYSPEC_HOME/figures, now %(default)s; the book's are in docs/figures)")
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="cost: the target whose forwards are timed")
    ap.add_argument("--device", default="cpu", help="cost: cpu, cuda, cuda:N")
    ap.add_argument("--threads", type=int, help="cost: CPU threads for torch (default: 1, as decoding)")
    ap.add_argument("--report", default=str(ROOT / "docs" / "bench.json"), help="bench: a saved benchmark report")
    ap.add_argument("--eagle", default=str(DEFAULT_EAGLE), help="eagle-tree, eagle-costs: the EAGLE head")
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="eagle-tree, tree-step: tiktoken ranks file")
    ap.add_argument("--heads", default=str(DEFAULT_HEADS), help="tree-mask, tree-step: the Medusa heads")
    ap.add_argument("--forward-cost", default=str(ROOT / "docs" / "figures" / "forward_cost.json"),
                    help="cost-curve: the forward costs `figures cost` saved (when cost is drawn too: the new ones)")
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    unknown = set(args.figures) - set(FIGURES)
    if unknown:
        die(f"unknown figure {', '.join(sorted(unknown))}: choose from {', '.join(FIGURES)}")
    drawn = set(args.figures) & {"residual", "speedup", "cost", "bench", *DIAGRAMS}  # the rest print, or refill the docs
    if drawn:
        try:
            pyplot()
        except ImportError:
            die("these figures need matplotlib: pip install -e '.[plot]'")
    out = check_output(args.out, "--out", directory=True)
    if args.threads is not None:  # a count refused before any folder is made
        set_threads(args.threads, torch.device("cpu"))
    rows = bench_rows(args.report) if "bench" in args.figures else None  # a bad report is refused before any work
    costs = forward_costs(args.forward_cost) if "cost-curve" in args.figures and "cost" not in args.figures else None
    if {"tree-mask", "tree-step"} & set(args.figures) and not check_input(args.heads, "--heads").is_file():
        die(f"--heads {args.heads} not found: give Medusa heads (python -m tinyspec train medusa makes them)")
    if drawn:
        out.mkdir(parents=True, exist_ok=True)
    written = []
    if "residual" in args.figures:
        written.append(residual_figure(out))
    if "speedup" in args.figures:
        written.append(speedup_figure(out))
    if "cost" in args.figures:
        device = pick_device(args.device)
        threads = set_threads(args.threads, device)
        model = load_model(args.model, device, torch.float32)
        name = device_name(device) + ("" if device.type == "cuda" else f", {threads} thread{'s' * (threads > 1)}")
        report = {"device": name, "dtype": "float32", "torch": torch.__version__, "context": 128,
                  "model": Path(args.model).name, "command": "python -m tinyspec figures cost"
                  + (f" --threads {args.threads}" if args.threads else "") + f" --out {shown(out)}",
                  "rows": measure_forward_cost(model, device)}
        atomic_write_json(out / "forward_cost.json", report)
        written += [out / "forward_cost.json", cost_figure(out, report)]
    if "bench" in args.figures:
        batch = all("batch_size" in r for r in rows)  # a `bench --batch-sizes` report: its own curves
        written += (write_batch_plots if batch else write_plots)(rows, out)
    if "eagle-tree" in args.figures:
        eagle_tree(args.model, args.eagle, args.tokenizer)
    data = {"tree-mask": lambda: tree_mask_data(args.heads), "residual-walk": residual_walk_data,
            "tree-step": lambda: tree_step_data(args.model, args.heads, args.tokenizer),
            "block-coins": block_coins_data, "traversal-coins": traversal_coins_data,
            "cost-curve": lambda: cost_curve_data(costs or forward_costs(out / "forward_cost.json"))}
    for name in DIAGRAMS:
        if name in args.figures:
            written += draw(name, data[name](), out)
    if "tables" in args.figures:
        filled = {}
        for doc in (ROOT / "README.md", ROOT / "walkthrough.md", *sorted((ROOT / "docs").glob("*.md"))):
            try:  # every document refilled before any is written: a report that names no machine stops them all
                filled[doc] = fill_captions(fill_tables(doc.read_text()), doc.parent)  # the checkout's reports
            except ValueError as e:
                die(f"{doc.name}: {e}")
        for doc, text in filled.items():
            if text != doc.read_text():
                atomic_write_text(doc, text)
                written.append(doc)
    if "eagle-costs" in args.figures:
        set_threads(args.threads, torch.device("cpu"))
        eagle_costs(args.model, args.eagle)
    if "tour" in args.figures:
        written.append(tour(out))
    if written:
        print("\n".join(map(str, written)))


if __name__ == "__main__":
    run_main(main)
