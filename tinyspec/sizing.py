"""Speculation sized to the device it runs on: measure on first use, then choose (chapter 12).

How much to propose per step depends on two things. Acceptance belongs to the models and the
text: how many of k proposals, or of a tree's nodes, the target keeps. Cost belongs to the
device: a forward over 17 tokens costs about one plain step on a GPU and about two on a CPU core,
and a step also proposes, judges and compacts its cache, which a small model on a CPU feels most
(`ledger.py`). Neither can be assumed, so `size` measures both at once, on the device, the first
time a method is named without a size.

For every candidate shape of the method (`candidates`: a draft's k, a Medusa tree of s nodes, an
EAGLE-2 tree's (top_k, depth, total_tokens), a lookup's k, lookahead's G), it decodes the sizing
prompts with a chooser that always proposes that shape, and times every step on its own:

    C(s): the mean seconds of a step that proposed at shape s,
    A(s): the mean tokens such a step accepted (the correction or bonus not counted),
    C(0): the mean seconds of a plain decoding step (`decoding.autoregressive`),

all shapes in turn, prompt by prompt, so a slow spell of the machine hits every shape alike, and
plain decoding before and after them, so C(0) spans the same minutes as the shapes it is compared with.
Means, not medians: a pass takes as long as its steps added up, which is their number times the
mean; a median, blind to the occasional slow step, undercounts most where steps are cheap and
many (plain decoding), and so underrates every method that saves steps.
Shape s is predicted to run at (1 + A(s)) C(0) / C(s) times plain decoding's speed; the best
shape is the method's size here. The sizing prompts are held out from training and from the
benchmark: the last two of each category in tinyspec/prompts.jsonl, of which the benchmark reads
the first eight.

The measurement is cached under runs/sizing/, keyed by the device, dtype, threads, torch version,
the weights, the sampling settings and the rule, so later runs start at once (`--remeasure`
measures again). The result becomes a `policy.Policy` whose menu is every measured size: the
chosen one while the text accepts as held-out text did, smaller ones or plain steps where it
accepts less.
"""

from __future__ import annotations

import hashlib
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .decoding import Steps
from .files import atomic_write_json
from .methods import Decoder
from .policy import MARGIN, Policy
from .sampling import Sampling
from .tree import from_accuracies

PROMPTS = Path(__file__).resolve().parent / "prompts.jsonl"
PER_CATEGORY, NEW_TOKENS = 2, 40  # sizing prompts per category, tokens decoded from each
from .files import SIZING as DIRECTORY  # where measurements are kept: $TINYSPEC_HOME/sizing (files.home)
VERSION = 3  # of the measurement: a cached file of another version is measured again

# The shapes each method is measured at: size -> shape (what the loop proposes; `shape_of`).
DRAFT_KS, MEDUSA_NODES, LOOKUP_KS, LOOKAHEAD_GS = (1, 2, 3, 4, 6, 8), (2, 4, 8, 16, 32), (2, 4, 8, 16), (1, 2, 4)
# (top_k, depth, total); top_k = 1 is a chain: two head forwards for depth 2, where a small model's
# fixed cost per forward makes every forward count
EAGLE_TREES = ((1, 2, 2), (1, 3, 3), (2, 3, 4), (2, 4, 8), (4, 3, 8), (2, 6, 16), (4, 4, 16), (2, 8, 32), (4, 6, 32))


def candidates(method: str, d: Decoder) -> list[tuple[int, object]]:
    """(size, shape) for every shape `method` is measured at, on the decoder's models (sizes that
    leave room in its context window for a prompt and the tokens sizing decodes)."""
    return [(s, shape) for s, shape in all_candidates(method, d) if s <= d.n_ctx // 4]


def all_candidates(method: str, d: Decoder) -> list[tuple[int, object]]:
    if method == "draft":
        return [(k, k) for k in DRAFT_KS]
    if method == "medusa":
        return [(s, s) for s in MEDUSA_NODES if from_accuracies(d.heads.accuracy, s).max_depth <= d.heads.n_heads]
    if method == "eagle":
        return [(t, (k, depth, t)) for k, depth, t in EAGLE_TREES]
    if method == "lookup":
        return [(k, k) for k in LOOKUP_KS]
    if method == "lookahead":
        return [((d.window + g) * (d.ngram - 1), g) for g in LOOKAHEAD_GS]
    raise ValueError(f"{method} has no sizes to measure")


def shape_of(method: str, d: Decoder, stored):
    """What the loop proposes for a stored shape: Medusa's tree of that many nodes, built from the
    heads' accuracies (as it was when measured), EAGLE's tuple, or the k or G itself."""
    if method == "medusa":
        return from_accuracies(d.heads.accuracy, stored).to(d.target.lm_head.weight.device)
    return tuple(stored) if method == "eagle" else stored


class Fixed:
    """A `decoding.Chooser` that proposes the same shape every step: what sizing measures."""

    def __init__(self, size: int, shape):
        self.largest, self.shapes, self.shape = size, {size: shape}, shape

    def choose(self, rows: int = 1):
        return self.shape

    def update(self, accepted, shape, rows=None) -> None:
        pass

    def reset(self) -> None:
        pass


def timed_steps(steps: Steps, max_new_tokens: int):
    """(seconds, Step) for every step of a one-row loop after its prefill, each step timed alone
    (a step's tokens reach the host before it yields, so on a GPU its work is done)."""
    produced, made = next(steps), 1  # the prefill and the first token: not a step
    while made < max_new_tokens:
        t0 = time.perf_counter()
        try:
            produced = steps.send([])
        except StopIteration:  # the context is full
            return
        yield time.perf_counter() - t0, produced[0]
        made += len(produced[0].tokens)


@dataclass
class Sizing:
    """What `measure` found for one method on this device: the plain step's seconds, and per
    measured shape its size, the shape as stored, C (seconds) and A (accepted tokens) of the
    steps that proposed, and how many there were."""
    method: str
    plain_s: float
    shapes: list[dict]
    key: dict = field(default_factory=dict)
    measured_s: float = 0.0
    path: str = ""

    def speedup(self, row: dict) -> float:
        """Predicted tokens/s over plain decoding's for steps of this shape: (1 + A) C(0) / C."""
        return (1 + row["accepted"]) * self.plain_s / row["seconds"]

    def menu(self) -> dict[int, dict]:
        """The best measured shape of each size (EAGLE measures two trees of some sizes)."""
        best = {}
        for row in self.shapes:
            if row["steps"] and (row["size"] not in best or self.speedup(row) > self.speedup(best[row["size"]])):
                best[row["size"]] = row
        return dict(sorted(best.items()))

    def chosen(self) -> dict | None:
        """The shape predicted to be fastest, or None if none beats plain decoding by the policy's
        margin (then the policy, too, takes plain steps on held-out text)."""
        best = max(self.menu().values(), key=self.speedup, default=None)
        return best if best is not None and self.speedup(best) > MARGIN else None

    def seconds(self, size: int, stored=None) -> float:
        """C(size) of the menu's shape of that size, or of the shape `stored` (C(0): a plain step)."""
        if size == 0:
            return self.plain_s
        if stored is None:
            return self.menu()[size]["seconds"]
        return next(r["seconds"] for r in self.shapes if r["shape"] == stored and r["size"] == size)

    def predicted_s(self, sizes: dict, prompts: int, prefill_s: float, stored=None) -> float | None:
        """The cost model: the seconds a run takes whose steps verified `sizes` ({size: steps}, the
        prefill's first token among the plain ones), each step at its measured C; the prompts'
        forwards (`prefill_s`, common to every method) as they were measured in the run."""
        steps = dict(sizes)
        steps[0] = steps.get(0, 0) - prompts
        costs = {s: self.seconds(s, stored) for s, n in steps.items() if n}
        if None in costs.values():  # a size the pass took that never proposed while sizing measured it
            return None
        return prefill_s + sum(steps[s] * c for s, c in costs.items())

    def policy(self, shape: Callable[[object], object]) -> Policy:
        """The per-step policy over the menu; shape(stored) gives what the loop proposes."""
        menu = self.menu() or {r["size"]: r | {"seconds": float("inf")} for r in self.shapes}  # none measured: never
        seconds = {0: self.plain_s} | {s: r["seconds"] for s, r in menu.items()}  # looked up every step: a dict
        return Policy({s: r["accepted"] for s, r in menu.items()}, lambda size, rows: seconds[size],
                      {s: shape(r["shape"]) for s, r in menu.items()})

    def describe(self) -> str:
        """One line: what was chosen here and why."""
        best = self.chosen()
        what = {"draft": "k = {}", "medusa": "a tree of {} nodes", "eagle": "EAGLE-2 trees of (top_k, depth, total) = {}",
                "lookup": "k = {}", "lookahead": "G = {}"}[self.method]
        where = f"measured in {self.measured_s:.1f} s" if self.measured_s else "measured earlier"
        if not self.menu():
            return f"{self.method}: no step proposed anything on the sizing prompts: plain steps; {where}, {self.path}"
        if best is None:
            top = max(self.menu().values(), key=self.speedup)
            return (f"{self.method}: no size pays on this device (the best, {what.format(fmt(top['shape']))}, is "
                    f"predicted at {self.speedup(top):.2f}x plain decoding, and a size must promise {MARGIN:.2f}x): "
                    f"plain steps, probing now and then; {where}, {self.path}")
        return (f"{self.method} sized for this device: {what.format(fmt(best['shape']))}, predicted "
                f"{self.speedup(best):.2f}x plain decoding (tau {1 + best['accepted']:.2f} on held-out prompts, a step "
                f"costs {best['seconds'] / self.plain_s:.2f} plain steps); {where}, {self.path}")


def fmt(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ")" if isinstance(shape, (list, tuple)) else str(shape)


@torch.no_grad()
def measure(method: str, d: Decoder, prompts: list[list[int]], sampling: Sampling, seed: int = 0,
            shapes: list[tuple[int, object]] | None = None, new_tokens: int = NEW_TOKENS,
            progress: Callable[[str], None] | None = None) -> Sizing:
    """C and A of every shape (default: `candidates`) of `method` on the decoder's models, and C(0),
    decoding `prompts` (one warm-up pass on the first, untimed). d: the decoder whose models and
    settings the shapes are tried with."""
    shapes = shapes if shapes is not None else candidates(method, d)
    new_tokens = min(new_tokens, d.n_ctx // 4)  # a small context: shorter runs, the ends of the prompts
    prompts = [p[-(d.n_ctx - new_tokens - max(s for s, _ in shapes) - 2):] for p in prompts]
    kwargs = dict(draft=d.draft, heads=d.heads, rule=d.rule, eagle_tree=d.eagle_tree, max_ngram=d.max_ngram,
                  window=d.window, ngram=d.ngram)
    decoders = [(size, stored, Decoder(d.target, method, policy=Fixed(size, shape_of(method, d, stored)),
                                        **{**kwargs, "k": "auto"} if method == "draft" else kwargs))
                for size, stored in shapes]
    plain = Decoder(d.target, "ar")
    times = {i: [] for i in range(len(decoders))}
    accepted, plain_times, t0 = {i: [] for i in range(len(decoders))}, [], time.perf_counter()
    for p, prompt in enumerate([prompts[0]] + prompts):  # the first pass warms up
        if progress:
            what = f"sizing {method}" + (f"@{d.rule}" if d.rule else "") + f" at T = {sampling.temperature:g}"
            progress(f"{what}: prompt {p} of {len(prompts)}" if p else f"{what}: warming up")
        # every shape in turn on the same prompt, between two plain passes: C(0) is then timed across
        # the same spell of the machine as the shapes (a drift within the round weighs on both ends)
        runs = [(None, plain)] + [(i, dec) for i, (_, _, dec) in enumerate(decoders)] + [(None, plain)]
        for i, dec in runs:
            generator = torch.Generator(device=d.target.lm_head.weight.device).manual_seed(seed + p)
            for seconds, step in timed_steps(dec.steps(prompt, sampling, generator, new_tokens), new_tokens):
                if p == 0:
                    continue
                if i is None:
                    plain_times.append(seconds)
                elif step.size:  # a step that proposed (a lookup may find nothing: a plain step)
                    times[i].append(seconds)
                    accepted[i].append(len(step.tokens) - 1)
    rows = [{"size": size, "shape": list(stored) if isinstance(stored, tuple) else stored, "steps": len(times[i]),
             "seconds": statistics.fmean(times[i]) if times[i] else None,
             "accepted": statistics.fmean(accepted[i]) if accepted[i] else 0.0}
            for i, (size, stored, _) in enumerate(decoders)]
    return Sizing(method, statistics.fmean(plain_times), rows, measured_s=time.perf_counter() - t0)


def device_name(device: torch.device) -> str:
    """The device as a measurement depends on it: a GPU's name; a CPU's model and instruction set."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("model name")), model)
    return f"{model} ({torch.backends.cpu.get_cpu_capability()})"


def weights_hash(*modules) -> str:
    """A short hash of the modules' parameters: a measurement is valid for these weights only."""
    h = hashlib.sha1()
    for module in modules:
        if module is not None:
            for p in module.parameters():
                h.update(p.detach().float().cpu().contiguous().numpy().tobytes()[:4096])  # the first values: enough
    return h.hexdigest()[:16]


def cache_key(method: str, d: Decoder, sampling: Sampling) -> dict:
    device = d.target.lm_head.weight.device
    return {"version": VERSION, "method": method, "device": device_name(device),
            "dtype": str(d.target.lm_head.weight.dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "weights": weights_hash(d.target, d.draft, d.heads),
            "sampling": [sampling.temperature, sampling.top_k, sampling.top_p], "rule": d.rule,
            "draft_vocab": None if getattr(d.draft or d.heads, "draft_vocab", None) is None else
            len((d.draft or d.heads).draft_vocab.ids),
            "lookahead": [d.window, d.ngram] if method == "lookahead" else None,
            "max_ngram": d.max_ngram if method == "lookup" else None}


def size(method: str, d: Decoder, prompts: list[list[int]], sampling: Sampling, directory: str | Path | None = None,
         remeasure: bool = False, progress: Callable[[str], None] | None = None,
         shapes: list[tuple[int, object]] | None = None) -> Sizing:
    """The sizing of `method` with the decoder's models on this device: read from `directory` if
    it was measured for the same key, else measured now (`measure`) and saved there. shapes:
    (size, shape) to measure (default: `candidates`)."""
    shapes = shapes if shapes is not None else candidates(method, d)
    key = cache_key(method, d, sampling) | {"shapes": json.loads(json.dumps(shapes))}
    name = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    path = Path(directory or DIRECTORY) / f"{method}-{name}.json"
    if path.is_file() and not remeasure:
        try:
            saved = json.loads(path.read_text())
            if saved.get("key") == key:
                return Sizing(**{**saved, "measured_s": 0.0, "path": str(path)})
        except (json.JSONDecodeError, TypeError):  # a damaged file: measure again, and write it anew
            pass
    sizing = measure(method, d, prompts, sampling, shapes=shapes, progress=progress)
    sizing.key, sizing.path = key, str(path)
    atomic_write_json(path, {k: v for k, v in asdict(sizing).items() if k not in ("measured_s", "path")}
                      | {"measured_s": round(sizing.measured_s, 2)})
    return sizing


def sizing_prompts(enc) -> list[list[int]]:
    """The held-out prompts sizing decodes: the last PER_CATEGORY of each category in PROMPTS."""
    rows = [json.loads(line) for line in PROMPTS.read_text(encoding="utf-8").splitlines() if line.strip()]
    out = []
    for category in dict.fromkeys(r["category"] for r in rows):
        out += [enc.encode_ordinary(r["prompt"]) for r in rows if r["category"] == category][-PER_CATEGORY:]
    return out


def report_rows(sizings: dict) -> list[dict]:
    """The benchmark's report of every shape measured, per method, rule and temperature (`sizings`:
    {(name, rule, temperature, ...): Sizing}): C over C(0) (`step_cost`), tau on the sizing
    prompts, the predicted speedup, and whether the sized method chose it."""
    rows = []
    for (name, rule, temperature, *_), sizing in sizings.items():
        chosen = sizing.chosen()
        for r in sizing.shapes:
            if r["steps"]:
                rows.append({"method": name + (f"@{rule}" if rule else ""), "temperature": temperature, "size": r["size"],
                             "shape": ",".join(map(str, r["shape"])) if isinstance(r["shape"], list) else str(r["shape"]),
                             "steps": r["steps"], "step_cost": round(r["seconds"] / sizing.plain_s, 3),
                             "tau": round(1 + r["accepted"], 3), "predicted_speedup": round(sizing.speedup(r), 3),
                             "chosen": r is chosen})
    return rows
