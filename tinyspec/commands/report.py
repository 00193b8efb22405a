"""`python -m tinyspec bench report --out DIR`: every GPU figure of the README, in one command.

    python -m tinyspec bench report --out runs/report            # on a CUDA GPU: the full report
    python -m tinyspec bench report --out /tmp/report --quick    # a few seconds' subset, any device

On the current device it runs, in this order, and writes DIR/report.json, DIR/report.md (the
tables as they go into README.md and walkthrough.md) and the plots:

1. the GPU-only tests (`pytest -m cuda`: bf16 kernel cases, the recorded CUDA graph against the
   eager forward, graph and kernel decoding against eager decoding);
2. the kernel table: Triton tree attention against SDPA with the dense mask, SDPA with no mask
   (flash attention, a floor) and FlexAttention, microseconds and the K+V bandwidth reached as a
   fraction of the measured copy bandwidth;
3. the methods table on held-out prompts, eager and with CUDA graphs, each path's speedups
   against `ar` on the same path, the `same` count, and the weight bandwidth of each method;
4. Hugging Face on the same weights: `generate`, with a static cache and a compiled step, and
   assisted generation with the draft.

On a CPU every part runs a tiny subset (the kernels in Triton's interpreter when
TRITON_INTERPRET=1 is set), so the code paths are tested before a GPU sees them; the figures
then mean nothing and the report says so.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from . import benchmark
from .cli import ArgumentParser, HelpFormatter, check_output, die, examples, pick_device
from ..files import atomic_write_json, atomic_write_text

ROOT = Path(__file__).resolve().parent.parent.parent  # the checkout: tinyspec/commands/ is two below it
FULL_METHODS = "ar,draft:4,draft:4@block,medusa:16,medusa:16@pointmass,medusa:32,eagle,parallel,lookup,rest,draft:auto,medusa:auto,eagle:auto,parallel:auto"
QUICK_METHODS = "ar,draft:2,medusa:8"


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec bench report", description=__doc__.split("\n\n")[0],
                        formatter_class=HelpFormatter, epilog=examples(*[
                            line.strip() for line in __doc__.split("\n\n")[1].splitlines()]))
    ap.add_argument("--out", required=True, help="directory for report.json, report.md and the figures")
    ap.add_argument("--quick", action="store_true", help="a tiny subset of every part (always on a CPU)")
    ap.add_argument("--methods", help=f"the methods table's methods (default: {FULL_METHODS}; --quick: {QUICK_METHODS})")
    ap.add_argument("--prompts-per-category", type=int, default=4, help="held-out prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="tokens per prompt")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved timed passes per setting")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: tests, kernels, methods, hf")
    for flag in ("--model", "--draft", "--heads", "--tokenizer"):
        ap.add_argument(flag, help="as in python -m tinyspec bench (default: the shipped file)")
    return ap


def gpu_tests(quick: bool) -> dict:
    """`pytest -m cuda` in a subprocess: counts, and the tail of its output."""
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device: the cuda-marked tests skip themselves"}
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "tests"],
                       cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    tail = (p.stdout + p.stderr).strip().splitlines()[-15:]
    return {"exit_status": p.returncode, "summary": tail[-1] if tail else "", "output_tail": tail,
            "seconds": round(time.time() - t0, 1)}


def kernels(device: torch.device, quick: bool) -> dict:
    from .kernel_bench import kernel_rows

    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return {"skipped": "no CUDA device, and TRITON_INTERPRET=1 is not set for the interpreter"}
    if importlib.util.find_spec("triton") is None:  # a CPU install without the triton extra
        return {"skipped": "triton is not installed: pip install -e '.[triton]'"}
    if quick or device.type != "cuda":
        rows, peak = kernel_rows(device, torch.float32 if device.type != "cuda" else torch.bfloat16, [128], [16],
                                 H=2, D=16, flex=device.type == "cuda")
    else:
        rows, peak = kernel_rows(device, torch.bfloat16, [128, 1024, 4096, 16384, 32768], [16, 64], H=8, D=64)
    return {"copy_bandwidth_GBps": round(peak / 1e9, 1), "rows": rows}


def methods(args, device: torch.device, quick: bool) -> tuple[list[dict], list[dict], list[str]]:
    """The benchmark on the eager path and (CUDA) the graph path; HF rows from the eager run."""
    paths = ["eager", "graph"] if device.type == "cuda" else ["eager"]
    rows, hf, commands = [], [], []
    for path in paths:
        argv = ["--methods", args.methods or (QUICK_METHODS if quick else FULL_METHODS),
                "--temperatures", "0" if quick else "0,1",
                "--prompts-per-category", "1" if quick else str(args.prompts_per_category),
                "--max-new-tokens", "8" if quick else str(args.max_new_tokens),
                "--repeats", "1" if quick else str(args.repeats)]
        if quick:
            argv += ["--categories", "code"]
        for flag in ("model", "draft", "heads", "tokenizer"):
            if getattr(args, flag):
                argv += [f"--{flag}", getattr(args, flag)]
        if path == "graph":
            argv += ["--cuda-graph", "--no-hf"]
        elif "hf" in args.skip.split(","):
            argv += ["--no-hf"]
        else:
            argv += ["--hf-modes", "hf,hf-assisted" + (",hf-static-compiled" if device.type == "cuda" else "")]
        parsed = benchmark.build_parser().parse_args(argv)
        report = benchmark.measure(parsed, argv)
        commands.append(report["command"])
        rows += [dict(r, path=path) for r in report["rows"]]
        hf += report["huggingface"]
    return rows, hf, commands


def markdown(report: dict) -> str:
    """The report's tables in the form README.md and walkthrough.md take them."""
    out = [f"# tinyspec on {report['device']}\n", f"torch {report['torch']}; {report['note']}\n"]
    tests = report.get("tests", {})
    out.append(f"GPU tests: {tests.get('summary') or tests.get('skipped', '-')}\n")
    k = report.get("kernels", {})
    if k.get("rows"):
        out += [f"\n## Tree attention, {k['copy_bandwidth_GBps']} GB/s copy bandwidth\n",
                "| L | T | triton µs | SDPA + mask µs (backend) | SDPA, no mask µs | Flex µs | vs SDPA | vs Flex | of copy bandwidth |",
                "|---|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['L']} | {r['T']} | {r['triton_us']} | {r['sdpa_us']} ({r['sdpa_backend']}) | {r['sdpa_nomask_us']} | "
                f"{r['flex_us'] or '-'} | {r['speedup_vs_sdpa']} | {r.get('speedup_vs_flex', '-')} | "
                f"{r['bandwidth_fraction']:.0%} |" for r in k["rows"]]
    rows = report.get("methods", [])
    if rows:
        out += ["\n## Methods (speedup against ar on the same path)\n",
                "| path | method | T | category | tau | tok/s | speedup | same | weights GB/s |",
                "|---|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['path']} | {r['method']} | {r['temperature']:g} | {r['category']} | {r['tau']} | {r['tokens_per_s']} | "
                f"{r['speedup']} | {r.get('same_as_ar', '-')} | {r['weights_GBps']}"
                f"{' (' + format(r['of_copy_bandwidth'], '.0%') + ')' if 'of_copy_bandwidth' in r else ''} |" for r in rows]
    hf = report.get("hf", [])
    if hf:
        out += ["\n## Hugging Face, same weights\n", "| mode | T | category | tok/s | tinyspec x | same |",
                "|---|---|---|---|---|---|"]
        out += [f"| {r['mode']} | {r.get('temperature', '-')} | {r.get('category', '-')} | {r.get('tokens_per_s', r.get('error'))} | "
                f"{r.get('tinyspec_speedup', '-')} | {r.get('same_as_tinyspec', '-')} |" for r in hf]
    out.append("\nCommands: " + "; ".join(f"`{c}`" for c in report.get("commands", [])) + "\n")
    return "\n".join(out)


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    out = check_output(args.out, "--out", directory=True)  # before the work: a finished report must not be lost
    skip = set(args.skip.split(",")) - {""}
    if skip - {"tests", "kernels", "methods", "hf"}:
        die(f"--skip takes tests, kernels, methods, hf; got {args.skip!r}")
    device = pick_device("auto")
    quick = args.quick or device.type != "cuda"
    t0 = time.time()
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "quick": quick,
              "note": "a quick subset: the code paths ran, the figures mean nothing" if quick else "the full report",
              "command": "python -m tinyspec bench report " + " ".join(argv if argv is not None else sys.argv[1:])}
    if "tests" not in skip:
        print("GPU tests ...", file=sys.stderr)
        report["tests"] = gpu_tests(quick)
    if "kernels" not in skip:
        print("kernel table ...", file=sys.stderr)
        report["kernels"] = kernels(device, quick)
    if "methods" not in skip:
        print("methods table ...", file=sys.stderr)
        rows, hf, commands = methods(args, device, quick)
        report["methods"], report["commands"] = rows, commands
        report["hf"] = [dict(r, mode=r.pop("method")) for r in hf]
    report["seconds"] = round(time.time() - t0, 1)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", markdown(report))
    if report.get("methods"):
        try:
            from .plots import write_plots
            write_plots([r for r in report["methods"] if r["path"] == "eager"], out)
        except ImportError:
            print("matplotlib is not installed: no figures", file=sys.stderr)
    print(markdown(report))
    print(f"wrote {out / 'report.json'} and {out / 'report.md'} in {report['seconds']:.0f} s", file=sys.stderr)
