"""`python -m tinyspec evaluate`: how good a target is for speculation, measured without a clock.

    python -m tinyspec evaluate --save docs/quality.json
    python -m tinyspec evaluate --model runs/target/final.safetensors --heads runs/medusa/medusa.safetensors

Every speedup rises with tau, and tau rises with a target that is right more often; a target that
falls into loops flatters every method, since repetitive text is easy to guess. This command
reports, for the target and the heads it is given:

- validation loss (nats per token) on the standard library's held-out modules (the figure every
  target card gives) and on the pinned packages' (`data.py`), the same fixed windows every time;
- loops: of the held-out code prompts, how many greedy 64-token continuations fall into a loop,
  a loop being some window of 8 tokens that occurs 3 times in the continuation (`loops`);
- tau (tokens per target forward, greedy) of each method on each category of held-out prompts.

Greedy decoding and these counts depend on no clock, so they can be measured on a busy machine
and compared between targets (the benchmark's tokens/s cannot).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from ..files import atomic_write_json
from ..sampling import Sampling
from ..training import corpus as data
from ..training.gpt import evaluate as validation_loss
from .benchmark import build_parser as benchmark_parser, prepare
from ..commands.cli import check_output, load_encoding, run_main
from .specs import label

METHODS = "ar,draft:4,medusa:16,eagle:2,6,16,lookup:8,lookahead:3,3,2"


def loops(tokens: list[int], window: int = 8, times: int = 3) -> bool:
    """Whether some `window` consecutive tokens occur `times` times (overlaps count) in `tokens`."""
    seen: dict[tuple, int] = {}
    for i in range(len(tokens) - window + 1):
        key = tuple(tokens[i:i + window])
        seen[key] = seen.get(key, 0) + 1
        if seen[key] >= times:
            return True
    return False


def build_parser():
    ap = benchmark_parser()
    ap.prog, ap.description = "python -m tinyspec evaluate", __doc__.split("\n\n")[0].split(": ", 1)[1]
    ap.epilog = "examples:\n" + "\n".join("  " + line.strip() for line in __doc__.split("\n\n")[1].splitlines())
    ap.set_defaults(methods=METHODS, temperatures="0", prompts_per_category=8, max_new_tokens=64, repeats=1, no_hf=True)
    for action in ap._actions:  # the benchmark's timing and output flags mean nothing here: not shown
        if action.dest in ("temperatures", "repeats", "quick", "plot", "batch_sizes", "batch_prompts", "json", "cuda_graph",
                           "no_hf", "hf_modes", "profile", "threads", "dtype", "remeasure"):
            action.help = argparse.SUPPRESS
        elif action.dest in ("methods", "max_new_tokens", "prompts_per_category"):  # this command's own defaults
            action.help = re.sub(r"\(default: [^)]*\)$", f"(default: {ap.get_default(action.dest)})", action.help)
        elif action.dest == "save":  # what this command writes, not the benchmark's rows and table
            action.help = ("write the JSON report (validation loss, loops, each method's tau per category) to FILE "
                           "before it prints; after a Ctrl-C it holds what had finished, marked \"interrupted\"")
    ap.add_argument("--data-dir", default=str(data.data_home()), help="where the corpus's token files are kept "
                    "(python -m tinyspec data; made here when missing)")
    ap.add_argument("--stdlib-only", action="store_true", help="validation loss on the standard library alone "
                    "(nothing is downloaded)")
    return ap


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if args.save is not None:  # '' is refused there
        check_output(args.save, "--save")
    check_output(args.data_dir, "--data-dir", directory=True)
    runner, specs, _, prompts = prepare(args)
    target, device = runner.target, runner.device
    corpus = data.prepare(load_encoding(args.tokenizer), Path(args.tokenizer), Path(args.data_dir),
                          packages=not args.stdlib_only)
    # the windows and batches of training's own validation, so the figures compare with a card's
    batches, batch_size, block_size = 10, 16, target.config.n_ctx
    autocast = torch.autocast(device.type, enabled=False)
    val = {}
    report = {"model": args.model, "validation_loss": val, "max_new_tokens": args.max_new_tokens, "tau": {},
              "command": "python -m tinyspec evaluate " + " ".join(argv)}
    try:  # each figure goes into the report as it is finished: a Ctrl-C keeps those
        for name in ("val", "val-packages"):
            if (corpus / f"{name}.bin").stat().st_size > 2 * (block_size + 1):
                val[name] = round(validation_loss(target, data.TokenFile(corpus / f"{name}.bin"), batches, batch_size,
                                                  block_size, device, autocast), 4)
        for spec in specs:
            for category, batch in prompts.items():
                res = runner.run(spec, batch, Sampling(0.0))  # (a Ctrl-C during it raises KeyboardInterrupt)
                report["tau"].setdefault(label(spec), {})[category] = round(res["new_tokens"] / res["target_steps"], 3)
                if spec == ("ar", "", None):
                    report.setdefault("loops", {})[category] = [sum(map(loops, res["outputs"])), len(batch)]
    except KeyboardInterrupt:
        report["interrupted"] = True
    finished = bool(val or report["tau"])
    if args.save and finished:  # before printing: a closed pipe or a full stdout cannot lose minutes of work
        atomic_write_json(args.save, report)
    if val:
        print(f"validation loss: {', '.join(f'{k} {v:.3f}' for k, v in val.items())}")
    if report.get("loops"):
        print("greedy continuations that loop: " + ", ".join(f"{c} {n}/{m}" for c, (n, m) in report["loops"].items()))
    for name, taus in report["tau"].items():
        print(f"tau {name:18s} " + "  ".join(f"{c} {t:.2f}" for c, t in taus.items()))
    if report.get("interrupted"):  # as the benchmark says it (command.py)
        kept = f"; saved in {args.save}" if args.save and finished else ""
        print(f"[interrupted] {'what finished is above' if finished else 'nothing finished'}{kept} (a figure under "
              "way is left out)", file=sys.stderr)
        raise SystemExit(130)


if __name__ == "__main__":
    run_main(main)
