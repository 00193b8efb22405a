"""What `python -m tinyspec.bench` measures: every method on the same held-out prompts, same
device, same run (`bench.py` is the command; `report.py` calls `measure` too).

The prompts (`tinyspec/prompts.jsonl`, made by `python -m tinyspec.data prompts`) come from standard
library modules no model trained or validated on, in three categories: code (write a function
body), docs (continue a docstring) and structured (continue a literal table).

Per method, temperature and category it reports tau (tokens per target forward, the
correction/bonus token included), the acceptance rate, tokens/s (the median over --repeats
passes, after a warm-up pass), the speedup over `ar` (our own plain decoding, measured in the
same run on the same prompts) and the speedup the cost model predicts: every step the pass took
at the cost that sizing measured for its size on this device (`sizing.Sizing.predicted_s`), the
prompts' forwards as the pass measured them. A method named without a size (`draft`, `medusa`,
`eagle`, `lookup`, `lookahead`) is sized for this device first and chooses its size per step.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import re
import statistics
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm import tqdm

from .cli import (DEFAULT_DRAFT, DEFAULT_EAGLE, DEFAULT_HEADS, DEFAULT_MODEL, DEFAULT_TOKENIZER, DTYPE_HELP, DTYPES,
                  ArgumentParser, HelpFormatter, check_tokenizer, die, examples, load_draft_vocab, load_encoding,
                  load_model, pick_device, pick_dtype, set_threads)
from .methods import EAGLE_DEPTH, EAGLE_TOPK, Decoder, check_rule, load_eagle, load_heads, use_attention
from .decoding import run, run_batch
from .ledger import Ledger
from .peer import compare_with_huggingface
from .model import DraftVocab
from .sampling import Sampling
from .sizing import candidates, device_name, report_rows, shape_of, size, sizing_prompts
from .timing import copy_bandwidth, weight_bytes
from .specs import check_specs, label, parse_method, read_prompt_rows
from .tree import from_accuracies

PROMPTS = Path(__file__).resolve().parent / "prompts.jsonl"
EXAMPLES = [
    "python -m tinyspec.bench --quick                      # a minute or two on a CPU",
    "python -m tinyspec.bench --methods ar,draft,medusa,eagle,lookup   # each sized for this device",
    "python -m tinyspec.bench --methods ar,draft:4,draft:4@block --temperatures 1 --json",
    "python -m tinyspec.bench --plot docs/figures          # and PNG figures (matplotlib)",
    "python -m tinyspec.bench --batch-sizes 1,2,4,8,16 --methods ar,medusa:16,auto --temperatures 0",
    "python -m tinyspec.bench report --out runs/report     # every GPU figure in one command (GPU)",
    "python -m tinyspec.bench kernels                      # the tree-attention kernel (CUDA GPU)",
]
CATEGORIES = ("code", "docs", "structured")


class Runner:
    """Holds the models and runs one method over a list of prompts. A method named without a
    size is sized for this device on first use at each sampling (`sizing.py`), and every method's
    sizes are measured for the cost model's prediction."""

    def __init__(self, target, draft, heads, device, max_new_tokens, seed, cuda_graph=False, eagle=None, max_rows=1,
                 sizing_prompts=None, remeasure=False):
        self.target, self.draft, self.heads, self.device, self.eagle = target, draft, heads, device, eagle
        self.max_rows = max_rows  # the largest batch, for the policy of `auto`
        self.cuda_graph = cuda_graph  # CUDA graphs for ar and medusa (fastpath.py); drafts run eagerly
        self.max_new, self.seed = max_new_tokens, seed
        self.sizing_prompts, self.remeasure = sizing_prompts, remeasure
        self.decoders = {}  # one per method (and sampling, if sized), made on first use and reused for every prompt
        self.sizings = {}  # (method, sampling) -> what sizing measured (`sizing.Sizing`)
        self.fixed = {}  # method -> the shapes the benchmark names with a size, measured beside the candidates
        self.draft_vocab = None  # --draft-vocab: the token ids drafters propose from (default: all)
        self.profile = False  # --profile: each pass's time split by ledger.Ledger
        self.progress = None  # called with a line of text while sizing measures

    def base(self, name: str, size: str, rule: str | None) -> Decoder:
        """The decoder of a method at a fixed size (a sized method: at its defaults, before sizing)."""
        sized = size in ("", "auto")
        if name == "ar":
            return Decoder(self.target, cuda_graph=self.cuda_graph)
        if name == "auto":  # Medusa trees or plain steps, per step: measures forward costs now
            return Decoder(self.target, "auto", heads=self.heads, rule=rule, batch_size=self.max_rows)
        if name == "draft":
            return Decoder(self.target, "draft", self.draft, 4 if sized else int(size), rule=rule)
        if name == "eagle":  # EAGLE-2's dynamic tree of NODES nodes, default top-k and depth; runs eagerly
            return Decoder(self.target, "eagle", heads=self.eagle, rule=rule,
                           eagle_tree=(EAGLE_TOPK, EAGLE_DEPTH, 16 if sized else int(size)))
        if name == "lookup":
            return Decoder(self.target, "lookup", k=8 if sized else int(size), rule=rule)
        if name == "lookahead":
            window, ngram, guesses = (3, 3, 2) if sized else map(int, size.split(","))
            return Decoder(self.target, "lookahead", rule=rule, window=window, ngram=ngram, guesses=guesses)
        return Decoder(self.target, "medusa", heads=self.heads, tree=None if sized else
                       from_accuracies(self.heads.accuracy, int(size)), rule=rule, cuda_graph=self.cuda_graph and not sized)

    def stored(self, name: str, size: str):
        """A fixed size as sizing stores its shape: k, nodes, [top_k, depth, total] or G."""
        if name == "eagle":
            return [EAGLE_TOPK, EAGLE_DEPTH, int(size)]
        return int(size.split(",")[-1]) if name in ("draft", "medusa", "lookup", "lookahead") else None

    def sizing(self, name: str, rule: str | None, sampling):
        """What sizing measured for this method, rule and sampling (measured now, or read)."""
        key = (name, rule, sampling.temperature, sampling.top_k, sampling.top_p)
        if key not in self.sizings and name not in ("ar", "auto"):
            d = self.base(name, "", rule)
            extra = [(int(s.split(",")[-1]) if name != "lookahead" else (d.window + int(s.split(",")[-1])) * (d.ngram - 1),
                      self.stored(name, s)) for s in self.fixed.get(name, [])]
            shapes = list({repr(x): x for x in candidates(name, d) + [(n, tuple(st) if isinstance(st, list) else st)
                                                                   for n, st in extra]}.values())
            self.sizings[key] = size(name, d, self.sizing_prompts, sampling, remeasure=self.remeasure, shapes=shapes,
                                     progress=self.progress)
        return self.sizings.get(key)

    def decoder(self, spec, sampling) -> Decoder:
        name, param = spec
        size_, _, rule = param.partition("@")
        rule = rule or None  # None: each temperature's default rule
        sized = size_ in ("", "auto") and name not in ("ar", "auto")
        key = (spec, sampling.temperature, sampling.top_k, sampling.top_p) if sized else spec
        if key not in self.decoders:
            if self.draft_vocab is not None and name in ("draft", "medusa", "eagle", "auto"):
                drafter, head = (self.draft, self.draft.lm_head) if name == "draft" else \
                    (self.eagle if name == "eagle" else self.heads, self.target.lm_head)
                drafter.draft_vocab = DraftVocab(head, self.draft_vocab)  # model.DraftVocab
            d = self.base(name, size_, rule)
            if sized:
                policy = self.sizing(name, rule, sampling).policy(lambda stored: shape_of(name, d, stored))
                d = Decoder(d.target, name, d.draft, "auto", d.heads, d.tree, rule, eagle_tree=d.eagle_tree,
                            max_ngram=d.max_ngram, window=d.window, ngram=d.ngram, policy=policy)
            self.decoders[key] = d
        return self.decoders[key]

    def run(self, spec, prompts, sampling, first: int = 0) -> dict:
        """One pass of `spec` over `prompts`, prompt i (counted from `first`) sampling with seed + i."""
        totals = dict(new_tokens=0, target_steps=0, proposed=0, accepted=0, rejections=0, wall_s=0.0, prefill_s=0.0,
                      outputs=[], sizes=Counter())
        decoder, ledger = self.decoder(spec, sampling), Ledger(self.device)
        with ledger.watching(decoder) if self.profile else contextlib.nullcontext():
            for i, prompt in enumerate(prompts, first):
                generator = torch.Generator(device=self.device).manual_seed(self.seed + i)
                res = run(decoder.steps(prompt, sampling, generator, self.max_new), self.max_new, None, None, self.device)
                for key in ("target_steps", "proposed", "accepted", "rejections", "wall_s", "prefill_s", "sizes"):
                    totals[key] += getattr(res, key)
                totals["new_tokens"] += len(res.token_ids)
                totals["outputs"].append(res.token_ids)
        if self.profile:  # where the time went, in seconds (ledger.py)
            totals["ledger"] = ledger.split(totals["wall_s"])
        return totals

    def run_batches(self, spec, prompts, sampling, size: int) -> dict:
        """The prompts `size` at a time, each batch decoded together (`batch.run_batch`); prompt i
        samples with seed + i, as in `run`. Latency: each row's time from its batch's start."""
        totals = dict(new_tokens=0, target_steps=0, proposed=0, accepted=0, rejections=0, wall_s=0.0, outputs=[],
                      latencies=[])
        decoder = self.decoder(spec, sampling)
        for first in range(0, len(prompts), size):
            rows = prompts[first:first + size]
            generators = [torch.Generator(device=self.device).manual_seed(self.seed + first + i) for i in range(len(rows))]
            t0 = time.perf_counter()
            results = run_batch(decoder.batch_steps(rows, sampling, generators, self.max_new), len(rows), self.max_new)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            totals["wall_s"] += time.perf_counter() - t0
            for res in results:
                for key in ("target_steps", "proposed", "accepted", "rejections"):
                    totals[key] += getattr(res, key)
                totals["new_tokens"] += len(res.token_ids)
                totals["outputs"].append(res.token_ids)
                totals["latencies"].append(res.wall_s)
        return totals


def together(runs: list[dict]) -> dict:
    """One pass made of runs over single prompts: counts and seconds added, outputs in order."""
    out = dict(runs[0])
    for more in runs[1:]:
        for key, value in more.items():
            out[key] = {part: s + value[part] for part, s in out[key].items()} if key == "ledger" else out[key] + value
    return out


def summarise(spec, temperature, category, passes, runner, ar_passes) -> dict:
    """One row of the table from the passes of one (method, temperature, category) and of `ar`."""
    name, param = spec
    first = passes[0]
    rate = lambda p: p["new_tokens"] / p["wall_s"]
    # Paired: each pass against the ar pass of the same repeat, run seconds before it on a machine in
    # the same state; the median of those ratios shrugs off slow spells that a ratio of medians feels.
    speedup = statistics.median(rate(p) / rate(a) for p, a in zip(passes, ar_passes))
    row = {"method": label(spec), "temperature": temperature, "category": category,
           "prompts": first["prompts"], "new_tokens": first["new_tokens"], "target_steps": first["target_steps"],
           "tau": round(first["new_tokens"] / first["target_steps"], 3),
           "tokens_per_s": round(statistics.median(map(rate, passes)), 2), "speedup": round(speedup, 3),
           "acceptance_rate": None, "predicted_speedup": None}
    if temperature == 0:  # greedy: how many prompts got exactly plain decoding's tokens (all, in float32)
        row["same_as_ar"] = sum(a == b for a, b in zip(first["outputs"], ar_passes[0]["outputs"]))
    if first["proposed"]:
        row["acceptance_rate"] = round(first["accepted"] / first["proposed"], 4)
    if name == "draft" and first["accepted"] + first["rejections"]:  # chapter 5's alpha: of the proposals judged
        row["alpha"] = round(first["accepted"] / (first["accepted"] + first["rejections"]), 4)
    if "ledger" in first:  # as shares of the pass
        row["ledger"] = {part: round(s / first["wall_s"], 3) for part, s in first["ledger"].items()}
    size, _, rule = param.partition("@")
    sizing = runner.sizing(name, rule or None, Sampling(temperature))
    if sizing is not None:  # the cost model: each step the pass took at its measured cost (sizing.py)
        sized = size in ("", "auto")
        stored = None if sized else runner.stored(name, size)
        ar = ar_passes[0]
        ours = sizing.predicted_s(first["sizes"], first["prompts"], first["prefill_s"], stored)  # None: a size never timed
        row["predicted_speedup"] = ours and round(sizing.predicted_s(ar["sizes"], first["prompts"], ar["prefill_s"]) / ours, 3)
        row["steps_by_size"] = {str(k): v for k, v in sorted(first["sizes"].items())}
        if sized:
            chosen = sizing.chosen()
            row["sized"] = chosen and chosen["shape"]
        else:
            step_size = int(size.split(",")[-1]) if name != "lookahead" else max(first["sizes"])
            seconds = sizing.seconds(step_size, stored)
            row["step_cost"] = seconds and round(seconds / sizing.plain_s, 3)
    return row


QUICK = dict(methods="ar,draft:4,medusa:16", temperatures="0", prompts_per_category=2, max_new_tokens=48, repeats=1)
FULL = dict(methods="ar,draft:2,draft:4,draft:6,medusa:16", temperatures="0,1", prompts_per_category=8,
            max_new_tokens=128, repeats=3)


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec.bench", description="every method on the same held-out prompts, "
                        "same device, same run", formatter_class=HelpFormatter, epilog=examples(*EXAMPLES) + "\n\n"
                        "Two more commands: `bench report --out DIR` runs the GPU tests, the kernel table, every method on both paths "
                        "and Hugging Face, and writes DIR/report.json and report.md (on a CPU, a quick subset); `bench "
                        "kernels` times the tree-attention kernel against SDPA. Each has its own --help.")
    ap.add_argument("--methods", help="comma-separated: ar, draft:K, medusa:NODES, eagle:NODES, lookup:K (prompt lookup), "
                    "lookahead:W,N,G (its commas stay inside the spec), or a method without a size (draft, medusa, eagle, "
                    "lookup, lookahead: sized for this device, chosen per step), each optionally @RULE to pick the "
                    "acceptance rule (draft:4@block, medusa@pointmass; default: greedy at T=0, else lossless); ar is "
                    f"always run: speedups are against it (default: {FULL['methods']})")
    ap.add_argument("--temperatures", help=f"comma-separated sampling temperatures, 0 = greedy (default: {FULL['temperatures']})")
    ap.add_argument("--categories", default=",".join(CATEGORIES), help="prompt categories to run")
    ap.add_argument("--prompts-per-category", type=int, help="the first N prompts of each category; more than a "
                    f"category has is refused (default: {FULL['prompts_per_category']}, or as many as a category has)")
    ap.add_argument("--max-new-tokens", type=int, help=f"tokens generated per prompt (default: {FULL['max_new_tokens']})")
    ap.add_argument("--repeats", type=int, help="timed passes per setting, interleaved across methods prompt by prompt; the median is "
                    f"reported (default: {FULL['repeats']})")
    ap.add_argument("--quick", action="store_true", help="a small run for a CPU, for any of the five settings above "
                    "not given: " + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in QUICK.items()))
    ap.add_argument("--prompts", default=str(PROMPTS), help="JSONL with category and prompt fields")
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="target weights")
    ap.add_argument("--draft", default=str(DEFAULT_DRAFT), help="draft model weights (for draft:K rows)")
    ap.add_argument("--heads", default=str(DEFAULT_HEADS), help="Medusa heads (for medusa:NODES rows)")
    ap.add_argument("--eagle", default=str(DEFAULT_EAGLE), help="the EAGLE head (for eagle:NODES rows)")
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="tiktoken ranks file")
    ap.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:N")
    ap.add_argument("--dtype", choices=["auto", *DTYPES], default="auto", help=DTYPE_HELP + " (column same)")
    ap.add_argument("--threads", type=int, help="CPU threads for torch (default: 1 on a CPU; see README)")
    ap.add_argument("--cuda-graph", action="store_true", help="ar and medusa steps as recorded CUDA graphs "
                    "(fastpath.py; CUDA only; speedups are then against ar on the graph path); draft rows run eagerly")
    ap.add_argument("--attn", choices=["torch", "triton"], default="torch", help="tree attention for medusa")
    ap.add_argument("--seed", type=int, default=0, help="prompt i samples with seed + i, the same for every method")
    ap.add_argument("--remeasure", action="store_true", help="measure every method's sizes again (sizing.py) instead "
                    "of reading them from $TINYSPEC_HOME/sizing (default ~/.cache/tinyspec/sizing)")
    ap.add_argument("--profile", action="store_true", help="each row also splits its time into the target's forward, "
                    "proposing, the rule, cache work and the rest (ledger.py; on CUDA it slows the pass)")
    ap.add_argument("--draft-vocab", type=int, metavar="N", help="draft, medusa and eagle rows propose only from the N "
                    "most frequent tokens of the corpus (model.DraftVocab; default: all)")
    ap.add_argument("--plot", metavar="DIR", help="write PNG figures here (needs matplotlib: pip install -e '.[plot]')")
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face transformers comparison (run "
                    "when transformers is installed)")
    ap.add_argument("--hf-modes", default="hf,hf-assisted", help="Hugging Face rows: hf (generate), hf-assisted (with "
                    "the draft), hf-static-compiled (static cache, compiled step; for a GPU)")
    ap.add_argument("--batch-sizes", help="the speculation-versus-batching curve instead of the table by category: "
                    "each method decodes --batch-prompts prompts this many at a time (comma-separated, e.g. "
                    "1,2,4,8,16), reporting total tokens/s and the mean latency per sequence; --methods may then "
                    "include auto (speculate or not per step, auto.BatchPolicy)")
    ap.add_argument("--batch-prompts", type=int, default=16, help="with --batch-sizes: how many prompts, taken in "
                    "turn from each category")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    ap.add_argument("--save", metavar="FILE", help="also write the JSON report to FILE (the table still prints)")
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
    specs = [parse_method(m) for m in dict.fromkeys(["ar"] + methods)]
    sizes = parse_batch_sizes(args.batch_sizes)
    if ("auto", "") in specs and not sizes:
        die("--methods auto chooses between speculation and batching: it needs --batch-sizes")
    try:
        temperatures = [float(t) for t in args.temperatures.split(",")]
        for t in temperatures:
            Sampling(t).check()
    except ValueError as e:
        die(f"--temperatures must be comma-separated temperatures, 0 or >= 0.001: {args.temperatures!r} ({e})")
    for (name, param), t in itertools.product(specs, temperatures):
        problem = check_rule(name, param.partition("@")[2] or None, t)
        if problem:
            die(f"{name}:{param} at temperature {t:g}: {problem}")
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
    if args.cuda_graph and (device.type != "cuda" or args.attn == "triton"):
        die("--cuda-graph needs a CUDA device (--device cuda) and --attn torch")
    rows = read_prompt_rows(Path(args.prompts))
    enc = load_encoding(args.tokenizer)
    counts = {c: sum(r["category"] == c for r in rows) for c in categories}
    if given and 0 < min(counts.values()) < args.prompts_per_category:  # not a smaller run than asked for, in silence
        die(f"--prompts-per-category {args.prompts_per_category}: {args.prompts} has "
            f"{', '.join(f'{n} {c}' for c, n in counts.items())} prompts; ask for {max(1, min(counts.values()))} or fewer")
    prompts = {c: [enc.encode_ordinary(r["prompt"]) for r in rows if r["category"] == c][: args.prompts_per_category]
               for c in categories}
    target = load_model(args.model, device, dtype)
    check_tokenizer(target, enc)
    use_attention(target, args.attn, device)
    check_specs(specs, target.config.n_ctx)
    n_ctx = target.config.n_ctx
    for c in categories:
        if not prompts[c]:
            die(f"no prompts of category {c} in {args.prompts}")
        longest = max(map(len, prompts[c]))
        if longest >= n_ctx:
            die(f"a {c} prompt is {longest} tokens, the model's context is {n_ctx}: shorten it in {args.prompts}")
        if longest + args.max_new_tokens > n_ctx:
            die(f"a {c} prompt of {longest} tokens plus --max-new-tokens {args.max_new_tokens} does not fit the "
                f"model's context of {n_ctx}: lower --max-new-tokens to {n_ctx - longest} or less")
    draft = load_model(args.draft, device, dtype, "draft") if any(n == "draft" for n, _ in specs) else None
    if draft is not None:
        check_tokenizer(draft, enc, "draft")
    heads = load_heads(args.heads, target, device, dtype) if any(n in ("medusa", "auto") for n, _ in specs) else None
    if heads is not None and heads.accuracy is None:
        die(f"{args.heads} records no head accuracies, which the benchmark's trees are built from")
    eagle = load_eagle(args.eagle, target, device, dtype) if any(n == "eagle" for n, _ in specs) else None
    runner = Runner(target, draft, heads, device, args.max_new_tokens, args.seed, cuda_graph=args.cuda_graph, eagle=eagle,
                    max_rows=max(sizes, default=1), sizing_prompts=sizing_prompts(enc), remeasure=args.remeasure)
    runner.profile = args.profile
    if args.draft_vocab is not None:
        runner.draft_vocab = load_draft_vocab(args.draft_vocab, target.config.vocab_size)
    for name, param in specs:  # the sizes the benchmark names are measured beside the candidates (sizing.py)
        size_ = param.partition("@")[0]
        if size_ not in ("", "auto") and name not in ("ar", "auto"):
            runner.fixed.setdefault(name, []).append(size_)
    return runner, specs, temperatures, prompts


def measure(args, argv: list[str]) -> dict:
    """Run the benchmark the parsed `args` describe; returns the report (rows, HF rows, setup)."""
    runner, specs, temperatures, prompts = prepare(args)
    categories, target, device = list(prompts), runner.target, runner.device
    with tqdm(total=None, desc="sizing", bar_format="{desc}", disable=args.json) as bar:  # minutes, on first use
        runner.progress = bar.set_description_str
        for temperature, (name, param) in itertools.product(temperatures, specs):  # sizing first, never inside a pass
            runner.sizing(name, param.partition("@")[2] or None, Sampling(temperature))
    runner.progress = None
    for spec in specs:  # warm-up: one prompt through every method (allocations, caches, clocks)
        runner.run(spec, prompts[categories[0]][:1], Sampling(temperatures[0]))
    total = len(specs) * len(temperatures) * len(categories) * args.repeats
    out, bar = [], tqdm(total=total, desc="benchmark", disable=args.json)
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
            for spec in specs:
                out.append(summarise(spec, temperature, category, passes[spec], runner, passes[("ar", "")]))
    bar.close()
    peers = [] if args.no_hf else compare_with_huggingface(runner, prompts, temperatures, args.repeats, out,
                                                           args.hf_modes.split(","))
    # Each target forward reads every weight once: bytes x forwards / s, the memory traffic a step achieves
    for row in out:
        forwards_per_s = row["tokens_per_s"] * row["target_steps"] / row["new_tokens"]
        row["weights_GBps"] = round(weight_bytes(target) * forwards_per_s / 1e9, 3)
    if device.type == "cuda":
        peak = copy_bandwidth(device)
        for row in out:
            row["of_copy_bandwidth"] = round(row["weights_GBps"] * 1e9 / peak, 3)
    return report_of(args, argv, runner, out) | {"huggingface": peers, "sizing": report_rows(runner.sizings)}


def report_of(args, argv, runner, rows) -> dict:
    device, dtype = runner.device, runner.target.lm_head.weight.dtype
    threads = torch.get_num_threads()
    name = device_name(device) + ("" if device.type == "cuda" else f", {threads} thread{'s' * (threads > 1)}")
    return {"device": name, "dtype": str(dtype).removeprefix("torch."), "cuda_graph": args.cuda_graph,
            "torch": torch.__version__, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
            "command": "python -m tinyspec.bench " + " ".join(argv), "rows": rows}


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
