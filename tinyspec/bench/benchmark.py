"""What `python -m tinyspec bench` measures: every method on the same held-out prompts, same
device, same run (`bench.py` is the command; `report.py` calls `measure` too).

The prompts (`tinyspec/prompts.jsonl`, made by `python -m tinyspec data prompts`) come from standard
library modules no model trained or validated on, in three categories: code (write a function
body), docs (continue a docstring) and structured (continue a literal table).

Per method, temperature and category it reports tau (tokens per target forward, the
correction/bonus token included), the acceptance rate, tokens/s (the median over --repeats
passes, after a warm-up pass), the speedup over `ar` (our own plain decoding, measured in the
same run on the same prompts) and the speedup the cost model predicts: every step the pass took
at the cost that sizing measured for its size on this device (`sizing.Sizing.predicted_s`), the
prompts' forwards as the pass measured them. A method runs at its default size, at the size the
spec names (`medusa:16`), or at `:auto`, sized for this device first and choosing its size per step.
"""

from __future__ import annotations

import argparse
import itertools
import re
import statistics
from pathlib import Path

import torch

from ..decoding import PLAIN

from ..results import size_order
from ..recorded import part_of, refusal
from ..progress import progress_bar
from ..methods import check_rule
from ..sampling import Sampling
from ..speed.sizing import device_name, report_rows, sizing_prompts
from ..speed.timing import copy_bandwidth, weight_bytes
from ..commands.cli import (DEFAULT_MODEL, DEFAULT_TOKENIZER, DTYPE_HELP, DTYPES, ArgumentParser, HelpFormatter, Progress,
                  check_prompt_bytes, check_tokenizer, die, examples, load_encoding, load_model, most_prompt_bytes,
                  pick_device, pick_dtype, seed, set_threads, use_attention)
from ..commands.method import add_weights_flags, load_method, parse_size, warn_lossy
from .peer import compare_with_huggingface
from .runner import Runner, together
from .specs import label, parse_method, read_prompt_rows

PROMPTS = Path(__file__).resolve().parent.parent / "prompts.jsonl"
EXAMPLES = [
    "python -m tinyspec bench --quick                      # a minute or two on a CPU",
    "python -m tinyspec bench --methods ar,draft,medusa,eagle,lookup   # each at its default size",
    "python -m tinyspec bench --methods ar,medusa:auto,eagle:auto      # each sized for this device",
    "python -m tinyspec bench --methods ar,draft:4,draft:4@block --temperatures 1 --json",
    "python -m tinyspec bench --plot docs/figures          # and PNG figures (matplotlib)",
    "python -m tinyspec bench --batch-sizes 1,2,4,8,16 --methods ar,medusa:16,medusa:auto --temperatures 0",
    "python -m tinyspec bench report --out runs/report     # every GPU figure in one command (GPU)",
    "python -m tinyspec bench kernels                      # the tree-attention kernel (CUDA GPU)",
]
CATEGORIES = ("code", "docs", "structured")


def summarise(spec, temperature, category, passes, runner, ar_passes) -> dict:
    """One row of the table from the passes of one (method, temperature, category) and of `ar`."""
    name, size_, rule = spec
    first = passes[0]
    rate = lambda p: p["new_tokens"] / p["wall_s"]
    # Paired: each pass against the ar pass of the same repeat, run seconds before it on a machine in
    # the same state; the median of those ratios shrugs off slow spells that a ratio of medians feels.
    speedup = statistics.median(rate(p) / rate(a) for p, a in zip(passes, ar_passes))
    row = {"method": label(spec), "temperature": temperature, "category": category,
           "prompts": first["prompts"], "new_tokens": first["new_tokens"], "target_steps": first["target_steps"],
           "tau": round(first["new_tokens"] / first["target_steps"], 3),
           "tokens_per_s": round(statistics.median(map(rate, passes)), 2), "speedup": round(speedup, 3),
           "acceptance_rate": None, "predicted_speedup": None,
           "steps_by_size": {k: v for k, v in sorted(first["sizes"].items(), key=size_order)}}
    if temperature == 0:  # greedy: how many prompts got exactly plain decoding's tokens (all, in float32)
        row["same_as_ar"] = sum(a == b for a, b in zip(first["outputs"], ar_passes[0]["outputs"]))
    if first["proposed"]:
        row["acceptance_rate"] = round(first["accepted"] / first["proposed"], 4)
    if first["speculated"]:  # of the steps that proposed: the share that accepted depth d, and that accepted nothing
        row["acceptance_by_depth"] = [round(first["accepted_at"][d] / first["speculated"], 4)
                                      for d in range(1, max(first["accepted_at"], default=0) + 1)]
        row["empty_steps"] = round(first["empty"] / first["speculated"], 4)
    if name == "draft" and first["accepted"] + first["rejections"]:  # chapter 5's alpha: of the proposals judged
        row["alpha"] = round(first["accepted"] / (first["accepted"] + first["rejections"]), 4)
    if "ledger" in first:  # as shares of the pass
        row["ledger"] = {part: round(s / first["wall_s"], 3) for part, s in first["ledger"].items()}
    sizing = None if runner.cuda_graph else runner.sizing(name, rule, Sampling(temperature))  # (it prices eager steps)
    if sizing is not None:  # the cost model: each step the pass took at its measured cost (sizing.py)
        ar = ar_passes[0]
        ours = sizing.predicted_s(first["fed"], first["prompts"], first["prefill_s"])  # None: a size never timed
        row["predicted_speedup"] = ours and round(sizing.predicted_s(ar["fed"], first["prompts"], ar["prefill_s"]) / ours, 3)
        # the mean cost of the pass's speculative steps in plain steps, each as the cost model prices it
        taken = {key: n for key, n in first["fed"].items() if key[0] != PLAIN and sizing.step_s(*key)}
        if taken:
            row["step_cost"] = round(sum(n * sizing.step_s(*key) for key, n in taken.items()) / sum(taken.values())
                                     / sizing.plain_s, 3)
            row["fed"] = round(sum(n * key[1] for key, n in taken.items()) / sum(taken.values()), 2)  # tokens a step fed
        if size_ == "auto":
            chosen = sizing.chosen()
            row["sized"] = chosen and chosen["size"]
    return row


QUICK = dict(methods="ar,draft,medusa,lookup", temperatures="0", prompts_per_category=2, max_new_tokens=48,
             repeats=1)
FULL = dict(methods="ar,draft,medusa,eagle,lookup,lookahead", temperatures="0,1", prompts_per_category=8,
            max_new_tokens=128, repeats=3)


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec bench", usage="%(prog)s [--methods SPECS] [--quick] [--save FILE] [options]",
                        description="every method on the same held-out prompts, "
                        "same device, same run", formatter_class=HelpFormatter, epilog=examples(*EXAMPLES) + "\n\n"
                        "Two more commands: `bench report --out DIR` runs the GPU tests, the kernel table, every method on both paths "
                        "and Hugging Face, and writes DIR/report.json and report.md (on a CPU, a quick subset); `bench "
                        "kernels` times the tree-attention kernel against SDPA. Each has its own --help.")
    ap.add_argument("--methods", help="comma-separated METHOD[:SIZE][@RULE]: a method at its default size, at SIZE "
                    "as the method spells it (draft:4, medusa:16, eagle:2,6,16, lookup:8, lookahead:3,3,2: commas "
                    "before a digit stay inside the spec) or at :auto (sized for this device, chosen per step), "
                    "optionally @RULE to pick the acceptance rule (draft:4@block, medusa@pointmass; default: greedy at "
                    f"T=0, else lossless); ar is always run: speedups are against it (default: {FULL['methods']})")
    ap.add_argument("--temperatures", help=f"comma-separated sampling temperatures, 0 = greedy (default: {FULL['temperatures']})")
    ap.add_argument("--quick", action="store_true", help="a small run for a CPU, for any of the five settings above "
                    "not given: " + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in QUICK.items()))
    ap.add_argument("--categories", default=",".join(CATEGORIES), help="prompt categories to run")
    ap.add_argument("--prompts-per-category", type=int, help="the first N prompts of each category; more than a "
                    f"category has is refused (default: {FULL['prompts_per_category']}, or as many as a category has)")
    ap.add_argument("--max-new-tokens", type=int, help=f"tokens generated per prompt (default: {FULL['max_new_tokens']})")
    ap.add_argument("--repeats", type=int, help="timed passes per setting, interleaved across methods prompt by prompt; the median is "
                    f"reported (default: {FULL['repeats']})")
    ap.add_argument("--save", metavar="FILE", help="also write the JSON report to FILE, before the table prints; "
                    "after a Ctrl-C it holds the rows that finished, marked \"interrupted\"")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    ap.add_argument("--plot", metavar="DIR", help="write PNG figures here (needs matplotlib: pip install -e '.[plot]')")
    weights = ap.add_argument_group("weights and prompts (default: the shipped weights in weights/, the held-out prompts)")
    weights.add_argument("--prompts", default=str(PROMPTS), help="JSONL with category and prompt fields")
    weights.add_argument("--model", default=str(DEFAULT_MODEL), help="target weights")
    add_weights_flags(weights)
    weights.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="tiktoken ranks file")
    knobs = ap.add_argument_group("device and measurement")
    knobs.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:N")
    knobs.add_argument("--dtype", choices=["auto", *DTYPES], default="auto", help=DTYPE_HELP + " (column same)")
    knobs.add_argument("--threads", type=int, help="CPU threads for torch (default: 1 on a CPU; see README)")
    knobs.add_argument("--cuda-graph", action="store_true", help="every method at a fixed size as one recorded step, "
                    "replayed as a CUDA graph (recorded.py; CUDA only; speedups are then against ar on the graph "
                    "path); lookahead and :auto rows run eagerly")
    knobs.add_argument("--attn", choices=["torch", "triton"], default="torch", help="attention over a step's tokens: "
                    "torch (SDPA with a dense mask) or triton (the tree-attention kernel, inside recorded steps too)")
    knobs.add_argument("--seed", type=seed, default=0, help="0..2**63-1: prompt i samples with seed + i, the same for "
                    "every method (a method at :auto may still sample other text from run to run: its sizes follow "
                    "the clock; see generate --help)")
    knobs.add_argument("--remeasure", action="store_true", help="measure every method's sizes again "
                    "(speed/sizing.py) instead of reading them from $TINYSPEC_HOME/sizing (default "
                    "~/.cache/tinyspec/sizing)")
    knobs.add_argument("--profile", action="store_true", help="each row also splits its time into the target's forward, "
                    "proposing, the rule, cache work and the rest (speed/ledger.py; on CUDA it slows the pass)")
    others = ap.add_argument_group("Hugging Face and batches")
    others.add_argument("--no-hf", action="store_true", help="skip the Hugging Face transformers comparison (run "
                    "when transformers is installed)")
    others.add_argument("--hf-modes", default="hf,hf-assisted", help="Hugging Face rows: hf (generate), hf-assisted (with "
                    "the draft), hf-static-compiled (static cache, compiled step; for a GPU)")
    others.add_argument("--batch-sizes", help="the speculation-versus-batching curve instead of the table by category: "
                    "each method decodes --batch-prompts prompts this many at a time (comma-separated, e.g. "
                    "1,2,4,8,16), reporting total tokens/s and the mean latency per sequence; medusa:auto then "
                    "speculates or not per step by the batch's size (speed/auto.py)")
    others.add_argument("--batch-prompts", type=int, default=16, help="with --batch-sizes: how many prompts, taken in "
                    "turn from each category")
    return ap


def prepare(args, per_category: int | None = None):
    """What every benchmark needs from the parsed `args`: checked settings, the prompts by category,
    the models, and a Runner; returns (runner, specs, temperatures, prompts by category).
    per_category: how many prompts of each category to take, at most, when --prompts-per-category
    is not given (else --quick's or the full run's number); a number given is refused when a
    category has fewer."""
    given = args.prompts_per_category is not None
    if not given and per_category:
        args.prompts_per_category = per_category
    for key, value in (QUICK if args.quick else FULL).items():  # --quick fills in only what was not given
        if getattr(args, key) is None:
            setattr(args, key, value)
    methods = re.split(r",(?=[a-zA-Z])", args.methods)  # a comma before a digit is inside a spec: lookahead:7,4,7
    specs = list(dict.fromkeys(parse_method(m) for m in ["ar"] + methods))
    sizes = parse_batch_sizes(args.batch_sizes)
    try:
        temperatures = [float(t) for t in args.temperatures.split(",")]
        for t in temperatures:
            Sampling(t).check()
    except ValueError as e:
        die(f"--temperatures must be comma-separated temperatures, 0 or >= 0.001: {args.temperatures!r} ({e})")
    for spec, t in itertools.product(specs, temperatures):
        problem = check_rule(spec[0], spec[2], t)
        if problem:
            die(f"{label(spec)} at temperature {t:g}: {problem}")
        warn_lossy(spec[0], spec[2], t, f"{label(spec)} at temperature {t:g}")
    unknown = set(args.hf_modes.split(",")) - {"hf", "hf-assisted", "hf-static-compiled"}
    if unknown:
        die(f"--hf-modes: unknown {', '.join(sorted(unknown))}; use hf, hf-assisted, hf-static-compiled")
    for name in ("repeats", "prompts_per_category", "max_new_tokens"):
        if getattr(args, name) < 1:
            die(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    categories = args.categories.split(",")
    if not set(categories) <= set(CATEGORIES):
        die(f"--categories must be among {', '.join(CATEGORIES)}")
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    set_threads(args.threads, device)
    if args.cuda_graph and device.type != "cuda":
        die("--cuda-graph needs a CUDA device (--device cuda)")
    enc = load_encoding(args.tokenizer)
    target = load_model(args.model, device, dtype)
    check_tokenizer(target, enc)
    most = most_prompt_bytes(enc, target.config.n_ctx)
    rows = read_prompt_rows(Path(args.prompts), most)
    counts = {c: sum(r["category"] == c for r in rows) for c in categories}
    if given and 0 < min(counts.values()) < args.prompts_per_category:  # not a smaller run than asked for, in silence
        die(f"--prompts-per-category {args.prompts_per_category}: {args.prompts} has "
            f"{', '.join(f'{n} {c}' for c, n in counts.items())} prompts; ask for {max(1, min(counts.values()))} or fewer")
    chosen = {c: [r["prompt"] for r in rows if r["category"] == c][: args.prompts_per_category] for c in categories}
    for c in categories:  # before tokenizing: a prompt too long in bytes is too long in tokens
        check_prompt_bytes(chosen[c], most, target.config.n_ctx, lambda i: f"{c} prompt {i} of {args.prompts}")
    prompts = {c: [enc.encode_ordinary(p) for p in chosen[c]] for c in categories}
    use_attention(target, args.attn, device)
    proposers = {name: load_method(name, args, target, enc, device, dtype) for name in dict.fromkeys(n for n, _, _ in specs)}
    n_ctx = min(target.config.n_ctx, *(p.n_ctx or target.config.n_ctx for p in proposers.values()))
    for name, size_, rule in specs:
        parse_size(proposers[name], size_ or None, n_ctx, f"--methods {label((name, size_, None))}")  # one line if not
        problem = args.cuda_graph and (name == "ar" or part_of(proposers[name])) and size_ != "auto" and \
            refusal(proposers[name], rule)
        if problem:  # (lookahead and :auto rows run eagerly)
            die(f"--methods {label((name, size_, rule))} with --cuda-graph: {problem}")
    for c in categories:
        if not prompts[c]:
            die(f"no prompts of category {c} in {args.prompts}")
        longest = max(map(len, prompts[c]))
        if longest >= n_ctx:
            die(f"a {c} prompt is {longest} tokens, the model's context is {n_ctx}: shorten it in {args.prompts}")
        if longest + args.max_new_tokens > n_ctx:
            die(f"a {c} prompt of {longest} tokens plus --max-new-tokens {args.max_new_tokens} does not fit the "
                f"model's context of {n_ctx}: lower --max-new-tokens to {n_ctx - longest} or less")
    runner = Runner(target, proposers, device, args.max_new_tokens, args.seed, cuda_graph=args.cuda_graph,
                    max_rows=max(sizes, default=1), sizing_prompts=sizing_prompts(enc), remeasure=args.remeasure)
    runner.profile = args.profile
    for name, size_, _ in specs:  # the sizes the benchmark names are measured beside the candidates (sizing.py)
        if size_ and size_ != "auto":
            runner.named.setdefault(name, []).append(size_)
    runner.draft = proposers.get("draft") and proposers["draft"].draft  # Hugging Face's assisted generation uses it
    return runner, specs, temperatures, prompts


def measure(args, argv: list[str]) -> dict:
    """Run the benchmark the parsed `args` describe; returns the report (rows, HF rows, setup).
    A Ctrl-C stops it: the report then holds the rows that finished, and says it was interrupted."""
    runner, specs, temperatures, prompts = prepare(args)
    categories, target, device = list(prompts), runner.target, runner.device
    out, peers, interrupted = [], [], False
    try:
        measure_rows(args, runner, specs, temperatures, prompts, out)
        if not args.no_hf:
            compare_with_huggingface(runner, prompts, temperatures, args.repeats, out, args.hf_modes.split(","), peers)
    except KeyboardInterrupt:  # the rows that finished (and Hugging Face's) are kept; the one under way is left out
        interrupted = True
    # Each target forward reads every weight once: bytes x forwards / s, the memory traffic a step achieves
    for row in out:
        forwards_per_s = row["tokens_per_s"] * row["target_steps"] / row["new_tokens"]
        row["weights_GBps"] = round(weight_bytes(target) * forwards_per_s / 1e9, 3)
    if device.type == "cuda":
        peak = copy_bandwidth(device)
        for row in out:
            row["of_copy_bandwidth"] = round(row["weights_GBps"] * 1e9 / peak, 3)
    report = report_of(args, argv, runner, out) | {"huggingface": peers, "sizing": report_rows(runner.sizings)}
    return report | ({"interrupted": True, "planned_rows": len(specs) * len(temperatures) * len(categories)}
                     if interrupted else {})


def measure_rows(args, runner, specs, temperatures, prompts, out: list) -> None:
    """The benchmark's rows, appended to `out` a category at a time, once every method has run all
    its passes on it: sizing first (never inside a pass), a warm-up, then the timed passes."""
    categories = list(prompts)
    with Progress(quiet=args.json) as progress:  # minutes, on first use
        runner.progress = progress
        for temperature, (name, _, rule) in itertools.product(temperatures, specs):
            runner.sizing(name, rule, Sampling(temperature))
    runner.progress = None
    for spec in specs:  # warm-up: one prompt through every method (allocations, caches, clocks)
        runner.run(spec, prompts[categories[0]][:1], Sampling(temperatures[0]))
    total = len(specs) * len(temperatures) * len(categories) * args.repeats
    with progress_bar(total=total, desc="benchmark", disable=args.json) as bar:
        for temperature in temperatures:
            sampling = Sampling(temperature)
            for category in categories:
                passes = {spec: [] for spec in specs}
                for _ in range(args.repeats):
                    # interleaved prompt by prompt: each method's run of a prompt follows the others' by
                    # seconds, so a slow spell of the machine hits every method alike
                    runs = {spec: [] for spec in specs}
                    for i, prompt in enumerate(prompts[category]):
                        for spec in specs:
                            runs[spec].append(runner.run(spec, [prompt], sampling, first=i))
                    for spec in specs:
                        passes[spec].append(dict(together(runs[spec]), prompts=len(prompts[category])))
                        bar.update(1)
                out += [summarise(spec, temperature, category, passes[spec], runner, passes[("ar", "", None)])
                        for spec in specs]


def report_of(args, argv, runner, rows) -> dict:
    device, dtype = runner.device, runner.target.lm_head.weight.dtype
    threads = torch.get_num_threads()
    name = device_name(device) + ("" if device.type == "cuda" else f", {threads} thread{'s' * (threads > 1)}")
    return {"device": name, "dtype": str(dtype).removeprefix("torch."), "cuda_graph": args.cuda_graph,
            "torch": torch.__version__, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
            "command": "python -m tinyspec bench " + " ".join(argv), "rows": rows}


def parse_batch_sizes(text: str | None) -> list[int]:
    if text is None:
        return []
    try:
        sizes = [int(b) for b in text.split(",")]
    except ValueError:
        sizes = [0]
    if min(sizes) < 1 or len(set(sizes)) < len(sizes):
        die(f"--batch-sizes must be distinct positive integers, comma-separated, e.g. 1,2,4,8,16; got {text!r}")
    return sorted(sizes)
