"""`python -m tinyspec bench report --out DIR`: every GPU figure of the README, in one command.

    python -m tinyspec bench report --out runs/report --budget 480  # on a CUDA GPU: the full report
    python -m tinyspec bench report --out /tmp/report --quick       # a small subset, any device

On the current device it runs these parts, in this order, and rewrites DIR/report.json and
DIR/report.md (the tables as they go into README.md and walkthrough.md) after each one, so that
a run cut short keeps what it finished:

1. `tests`: the GPU tests of the recorded step, the fixed-shape forward and the kernel (the
   replayed graph against the readable loop, the recording against the eager forward, the kernel
   against its PyTorch reference);
2. `methods`: held-out code, one prompt at a time: every method's recorded step replayed as a
   CUDA graph (`recorded.py`) in float32 at T = 0 and 1, beside `ar` on the same path; the
   same methods eager (the readable loop), so each graph step meets its eager one; bfloat16;
   each row's tau, tokens/s, speedup against `ar` on its path and, greedy, the `same` count;
4. `hf`: Hugging Face `generate` on the same weights, with a static cache and a compiled step,
   beside graph `ar`;
5. the step ledger (`--profile`, which synchronises, so apart from the timed rows): where a
   step's time goes, on the graph path (the replay, the host's proposing, the rest) and eager;
6. last, `kernels`: Triton tree attention against SDPA with the dense mask, SDPA with no mask and
   FlexAttention: a sweep of prefix splits at L = 16k, T = 64, the decoding benchmark's shapes,
   long prefixes; each output checked against the reference.

Each benchmark runs in its own process with the time that is left (`--budget`), so a part that
fails or overruns is recorded as such and the next one still runs. On a CPU every part runs a
tiny subset (the kernels in Triton's interpreter when TRITON_INTERPRET=1 is set), so the code
paths are tested before a GPU sees them; the figures then mean nothing and the report says so.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from ..commands.cli import WEIGHTS, ArgumentParser, HelpFormatter, check_output, die, examples, pick_device
from ..files import atomic_write_json, atomic_write_text

ROOT = Path(__file__).resolve().parent.parent.parent  # the checkout: tinyspec/commands/ is two below it
STEP_METHODS = "ar,draft:4,medusa:16,medusa:32,eagle,parallel,lookup,rest"  # each with a recorded step (recorded.py)
QUICK_METHODS = "ar,draft:2,medusa:8"
PARTS = ("tests", "kernels", "methods", "hf")
MIN_RUN_S = 5  # a benchmark run started with less time than this cannot finish: it is left out


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec bench report", description=__doc__.split("\n\n")[0],
                        formatter_class=HelpFormatter, epilog=examples(*[
                            line.strip() for line in __doc__.split("\n\n")[1].splitlines()]))
    ap.add_argument("--out", required=True, help="directory for report.json and report.md")
    ap.add_argument("--quick", action="store_true", help="a tiny subset of every part (always on a CPU)")
    ap.add_argument("--budget", type=float, help="seconds for the whole report: parts that no longer fit are "
                    "left out and named in the report (default: no limit)")
    ap.add_argument("--methods", help=f"the methods tables' methods (default: {STEP_METHODS}; --quick: {QUICK_METHODS})")
    ap.add_argument("--categories", default="code", help="held-out prompt categories (default: code)")
    ap.add_argument("--temperatures", default="0,1", help="the graph path's sampling temperatures, 0 = greedy; the "
                    "eager rows are greedy")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="the methods tables' dtypes, in order")
    ap.add_argument("--prompts-per-category", type=int, default=4, help="held-out prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="tokens per prompt")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved timed passes per setting")
    ap.add_argument("--skip", default="", help=f"comma-separated parts to leave out: {', '.join(PARTS)}")
    for flag in ("--model", "--draft", "--heads", "--tokenizer"):
        ap.add_argument(flag, help="as in python -m tinyspec bench (default: the shipped file)")
    return ap


class Clock:
    """The report's time budget: what is left, and a part's share of it."""

    def __init__(self, budget: float | None):
        self.end = None if budget is None else time.time() + budget

    def left(self, cap: float | None = None) -> float | None:
        left = None if self.end is None else max(0.0, self.end - time.time())
        return cap if left is None else left if cap is None else min(cap, left)


GPU_TESTS = ["tests/test_step.py", "tests/test_fastpath.py", "tests/test_tree_attention.py"]  # their GPU tests


def gpu_tests(clock: Clock) -> dict:
    """The recorded step's, the fixed-shape forward's and the kernel's GPU tests (`-m cuda`; the
    rest of those files runs on a CPU in CI), in a subprocess: counts, and the tail of its output."""
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device: these tests run on one (on a CPU the suite runs the rest)"}
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", *GPU_TESTS],
                           cwd=ROOT, capture_output=True, text=True, timeout=clock.left(150),
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
    except subprocess.TimeoutExpired as e:
        tail = ((e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")).splitlines()[-15:]
        return {"timed_out": round(time.time() - t0, 1), "output_tail": tail}
    tail = (p.stdout + p.stderr).strip().splitlines()[-15:]
    print("\n".join(tail), file=sys.stderr)
    return {"exit_status": p.returncode, "summary": tail[-1] if tail else "", "output_tail": tail,
            "seconds": round(time.time() - t0, 1)}


def kernels(device: torch.device, quick: bool, clock: Clock, config: dict) -> dict:
    """Rows of kernel_bench.kernel_rows: the split sweep, the benchmark's shapes, long prefixes.
    Every row is checked against the PyTorch reference before it is timed."""
    from .kernels import kernel_rows

    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return {"skipped": "no CUDA device, and TRITON_INTERPRET=1 is not set for the interpreter"}
    if importlib.util.find_spec("triton") is None:  # a CPU install without the triton extra
        return {"skipped": "triton is not installed: pip install -e '.[triton]'"}
    deadline = time.time() + clock.left(150)
    if quick or device.type != "cuda":
        groups = [dict(lengths=[128], trees=[16], H=2, D=16, flex=False)]
        dtype = torch.float32 if device.type != "cuda" else torch.bfloat16
    else:
        H, D = config["n_head"], config["n_embd"] // config["n_head"]
        dtype = torch.bfloat16
        groups = [dict(lengths=[16384], trees=[64], splits=[1, 4, 16, 32, 64], flex=False, group="splits"),
                  dict(lengths=[256, config["n_ctx"] - 33], trees=[9, 17, 33], H=H, D=D, group="decoding"),
                  dict(lengths=[1024, 4096, 16384, 32768], trees=[16, 64], group="long")]
    rows, peak = [], None
    for g in groups:
        g = dict(g)
        name = g.pop("group", "quick")
        for splits in g.pop("splits", [None]):
            if time.time() > deadline:
                return {"copy_bandwidth_GBps": peak and round(peak / 1e9, 1), "rows": rows, "cut_short": True}
            part, peak = kernel_rows(device, dtype, num_splits=splits, deadline=deadline, **g)
            rows += [dict(r, group=name, num_splits=splits or "auto") for r in part]
    return {"copy_bandwidth_GBps": round(peak / 1e9, 1), "dtype": str(dtype).removeprefix("torch."), "rows": rows}


def bench_runs(args, device: torch.device, quick: bool) -> list[tuple[str, list[str]]]:
    """(name, argv) of each `python -m tinyspec bench` run of the methods and hf parts, most wanted
    first: the graph path in float32 (what the recorded step buys), then its eager twin, bfloat16,
    Hugging Face, the ledgers."""
    common = ["--categories", "code" if quick else args.categories,
              "--prompts-per-category", "1" if quick else str(args.prompts_per_category),
              "--max-new-tokens", "8" if quick else str(args.max_new_tokens),
              "--repeats", "1" if quick else str(args.repeats)]
    for flag in ("model", "draft", "heads", "tokenizer"):
        if getattr(args, flag):
            common += [f"--{flag}", getattr(args, flag)]
    cuda, methods = device.type == "cuda", args.methods or (QUICK_METHODS if quick else STEP_METHODS)
    run = lambda name, dtype, *argv: (name, [*argv, "--dtype", dtype, *common])
    runs = []
    if "methods" not in args.skip_parts:
        for dtype in args.dtypes.split(","):
            if cuda:
                runs.append(run(f"graph-{dtype}", dtype, "--methods", methods, "--cuda-graph", "--temperatures",
                                args.temperatures, "--no-hf"))
            runs.append(run(f"eager-{dtype}", dtype, "--methods", methods, "--temperatures", "0", "--no-hf"))
            if cuda and triton_version():  # the same recorded steps attending with the Triton kernel
                runs.append(run(f"graph+kernel-{dtype}", dtype, "--methods", methods, "--cuda-graph", "--attn",
                                "triton", "--temperatures", "0", "--no-hf"))
    if "hf" not in args.skip_parts:  # HF beside our fastest ar, on the same weights
        runs.append(run("hf-float32", "float32", "--methods", "ar", "--temperatures", "0", *(
            ["--cuda-graph", "--hf-modes", "hf-static-compiled"] if cuda else ["--hf-modes", "hf"])))
    if "methods" not in args.skip_parts:  # where a step's time goes (--profile synchronises, so apart)
        if cuda:
            runs.append(run("ledger-graph-float32", "float32", "--methods", methods, "--cuda-graph", "--profile",
                            "--temperatures", "0", "--no-hf"))
        runs.append(run("ledger-eager-float32", "float32", "--methods", methods, "--profile", "--temperatures", "0",
                        "--no-hf"))
    return runs


def bench(name: str, argv: list[str], clock: Clock, tmp: Path) -> dict:
    """One `python -m tinyspec bench` run in its own process (a CUDA error or an overrun ends it
    alone); its saved report, or why there is none."""
    save, t0 = tmp / f"{name}.json", time.time()
    shown = {"run": name, "command": "python -m tinyspec bench " + " ".join(argv)}  # less the temporary --save
    try:
        p = subprocess.run([sys.executable, "-m", "tinyspec", "bench", *argv, "--save", str(save)], cwd=ROOT,
                           timeout=clock.left(), stdout=2,  # its table to stderr: stdout is the report's
                           env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"))
    except subprocess.TimeoutExpired:
        return shown | {"timed_out": round(time.time() - t0, 1)}
    if p.returncode != 0 or not save.exists():
        return shown | {"exit_status": p.returncode}
    return json.loads(save.read_text()) | shown | {"seconds": round(time.time() - t0, 1)}


def markdown(report: dict) -> str:
    """The report's tables in the form README.md and walkthrough.md take them."""
    out = [f"# tinyspec on {report['device']}\n",
           f"torch {report['torch']}, triton {report.get('triton') or '-'}; {report['note']}\n"]
    tests = report.get("tests", {})
    out.append(f"GPU tests: {tests.get('summary') or tests.get('skipped') or tests.get('error') or tests.get('timed_out', '-')}\n")
    k = report.get("kernels", {})
    if k.get("rows"):
        out += [f"\n## Tree attention ({k.get('dtype', '')}), {k['copy_bandwidth_GBps']} GB/s copy bandwidth\n",
                "Launched from Python, then (graph) replayed from a CUDA graph: the device's time alone.\n",
                "| shapes | H | D | L | T | splits | triton µs | SDPA + mask µs (backend) | SDPA, no mask µs | Flex µs | vs SDPA | vs Flex | "
                "of copy bandwidth | graph: triton µs | graph: SDPA µs | graph: vs SDPA | graph: of copy bandwidth |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        out += [f"| {r.get('group', '-')} | {r.get('H', '-')} | {r.get('D', '-')} | {r['L']} | {r['T']} | {r.get('num_splits', 'auto')} | "
                f"{r['triton_us']} | {r['sdpa_us']} ({r['sdpa_backend']}) | {r['sdpa_nomask_us']} | "
                f"{r['flex_us'] or '-'} | {r['speedup_vs_sdpa']} | {r.get('speedup_vs_flex', '-')} | "
                f"{r['bandwidth_fraction']:.0%} | {r.get('triton_graph_us', '-')} | {r.get('sdpa_graph_us', '-')} | "
                f"{r.get('speedup_vs_sdpa_graph', '-')} | "
                f"{format(r['bandwidth_fraction_graph'], '.0%') if 'bandwidth_fraction_graph' in r else '-'} |" for r in k["rows"]]
    elif k:
        out.append(f"Kernels: {k.get('skipped') or k.get('error')}\n")
    runs = report.get("runs", [])
    rows = [dict(r, run=run["run"], dtype=run.get("dtype", "-")) for run in runs for r in run.get("rows", [])
            if run["run"].startswith(("eager", "graph"))]
    if rows:
        out += ["\n## Methods (speedup against ar on the same path)\n",
                "| path | dtype | method | T | category | tau | tok/s | speedup | predicted | sized | same | weights GB/s |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['run'].split('-')[0]} | {r['dtype']} | {r['method']} | {r['temperature']:g} | {r['category']} | {r['tau']} | "
                f"{r['tokens_per_s']} | {r['speedup']} | {r.get('predicted_speedup') or '-'} | {r.get('sized') or '-'} | "
                f"{r.get('same_as_ar', '-')} | {r['weights_GBps']}"
                f"{' (' + format(r['of_copy_bandwidth'], '.0%') + ')' if 'of_copy_bandwidth' in r else ''} |" for r in rows]
    eager = {(r["dtype"], r["method"], r["temperature"], r["category"]): r for r in rows if r["run"].startswith("eager")}
    pairs = [(r, eager[key]) for r in rows if r["run"].startswith("graph")
             and (key := (r["dtype"], r["method"], r["temperature"], r["category"])) in eager]
    if pairs:
        out += ["\n## The recorded step against the readable loop (graph over eager, same method)\n",
                "| dtype | method | T | category | graph tok/s | eager tok/s | graph / eager |", "|---|---|---|---|---|---|---|"]
        out += [f"| {g['dtype']} | {g['method']} | {g['temperature']:g} | {g['category']} | {g['tokens_per_s']} | "
                f"{e['tokens_per_s']} | {g['tokens_per_s'] / e['tokens_per_s']:.2f} |" for g, e in pairs]
    sizing = [dict(s, dtype=run.get("dtype", "-")) for run in runs if run["run"].startswith("eager")
              for s in run.get("sizing", [])]
    if sizing:
        out += ["\n## Sizing on this device (eager)\n", "| dtype | method | T | size | tau | step cost (plain steps) | predicted | chosen |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {s['dtype']} | {s['method']} | {s['temperature']:g} | {s['size']} | {s['tau']} | {s['step_cost']} | "
                f"{s['predicted_speedup']} | {'yes' if s['chosen'] else ''} |" for s in sizing]
    ledgers = [dict(r, path=run["run"].split("-")[1]) for run in runs if run["run"].startswith("ledger")
               for r in run.get("rows", []) if r.get("ledger")]
    if ledgers:
        parts = ("target", "propose", "rule", "cache", "step", "rest")  # step: a recorded step's replay, all four
        out += ["\n## Where a step's time goes (--profile, float32; shares of the step)\n",
                "| path | method | tau | step cost (plain steps) | " + " | ".join(parts) + " |", "|---" * (4 + len(parts)) + "|"]
        out += [f"| {r['path']} | {r['method']} | {r['tau']} | {r.get('step_cost') or '-'} | "
                + " | ".join(f"{r['ledger'].get(p, 0):.0%}" for p in parts) + " |" for r in ledgers]
    hf = [dict(h, run=run["run"]) for run in runs for h in run.get("huggingface", [])]
    if hf:
        out += ["\n## Hugging Face, same weights\n", "| mode | T | category | tok/s | tinyspec x | same |",
                "|---|---|---|---|---|---|"]
        out += [f"| {r['method']} | {r.get('temperature', '-')} | {r.get('category', '-')} | {r.get('tokens_per_s', r.get('error'))} | "
                f"{r.get('tinyspec_speedup', '-')} | {r.get('same_as_tinyspec', '-')} |" for r in hf]
    missing = [f"{run['run']} ({'timed out' if 'timed_out' in run else 'exit ' + str(run.get('exit_status'))})"
               for run in runs if "rows" not in run]
    if missing or report.get("left_out"):
        out.append("\nNot finished: " + ", ".join(missing + report.get("left_out", [])) + "\n")
    out.append("\nCommands: " + "; ".join(f"`{run['command']}`" for run in runs if "command" in run) + "\n")
    return "\n".join(out)


def triton_version() -> str | None:
    return importlib.metadata.version("triton") if importlib.util.find_spec("triton") else None


def target_config(path) -> dict:
    """The target's config from its file's metadata (no weights loaded): the decoding shapes."""
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["config"])


def save(out: Path, report: dict) -> None:
    atomic_write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", markdown(report))


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    out = check_output(args.out, "--out", directory=True)  # before the work: a finished report must not be lost
    args.skip_parts = set(args.skip.split(",")) - {""}
    if args.skip_parts - set(PARTS):
        die(f"--skip takes {', '.join(PARTS)}; got {args.skip!r}")
    if args.budget is not None and args.budget <= 0:
        die(f"--budget must be a positive number of seconds, got {args.budget:g}")
    if set(args.dtypes.split(",")) - {"float32", "bfloat16", "float16"}:
        die(f"--dtypes takes float32, bfloat16, float16; got {args.dtypes!r}")
    device = pick_device("auto")
    quick = args.quick or device.type != "cuda"
    clock, t0 = Clock(args.budget), time.time()
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "quick": quick, "triton": triton_version(),
              "note": "a quick subset: the code paths ran, the figures mean nothing" if quick else "the full report",
              "command": "python -m tinyspec bench report " + " ".join(argv if argv is not None else sys.argv[1:]),
              "runs": [], "left_out": []}
    out.mkdir(parents=True, exist_ok=True)
    save(out, report)

    def part(name: str, fn) -> None:
        if clock.left() == 0:
            report["left_out"].append(f"{name} (the budget was spent)")
            return
        print(f"[{time.time() - t0:5.0f} s] {name} ...", file=sys.stderr)
        try:
            report[name] = fn()
        except Exception as e:  # a part's failure is a finding to report; the next part still runs
            report[name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300],
                            "traceback": traceback.format_exc().splitlines()[-12:]}
        report["seconds"] = round(time.time() - t0, 1)
        save(out, report)

    if "tests" not in args.skip_parts:
        part("tests", lambda: gpu_tests(clock))
    with tempfile.TemporaryDirectory() as tmp:
        for name, bench_argv in bench_runs(args, device, quick):
            if clock.left(MIN_RUN_S) < MIN_RUN_S:
                report["left_out"].append(f"{name} (the budget was spent)")
                continue
            print(f"[{time.time() - t0:5.0f} s] bench {name} ...", file=sys.stderr)
            report["runs"].append(bench(name, bench_argv, clock, Path(tmp)))
            report["seconds"] = round(time.time() - t0, 1)
            save(out, report)
    if "kernels" not in args.skip_parts:  # last: measured in full before, the recorded step is newer
        part("kernels", lambda: kernels(device, quick, clock, target_config(args.model or WEIGHTS / "target.safetensors")))
    report["seconds"] = round(time.time() - t0, 1)
    save(out, report)
    print(markdown(report))
    print(f"wrote {out / 'report.json'} and {out / 'report.md'} in {report['seconds']:.0f} s", file=sys.stderr)
