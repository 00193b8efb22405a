"""Speculation sized to the device it runs on: `--size auto` measures on first use, then chooses
(chapter 13).

How much to propose per step depends on two things. Acceptance belongs to the models and the
text: how many of k proposals, or of a tree's nodes, the target keeps. Cost belongs to the
device: a forward over 17 tokens costs about one plain step on a GPU and about two on a CPU core,
and a step also proposes, judges and compacts its cache, which a small model on a CPU feels most
(`ledger.py`). Neither can be assumed, so `size` measures both at once, on the device, the first
time a method runs at `--size auto`.

For every candidate size of the method (`candidates`: the method's own list, `Method.sizes`),
it decodes the sizing prompts at that size, and times every step on its own:

    C(s): the mean seconds of a step of size s,
    A(s): the mean tokens such a step accepted (the correction or bonus not counted),
    C(plain): the mean seconds of a plain decoding step,

all sizes in turn, prompt by prompt, so a slow spell of the machine hits every size alike, and
plain decoding before and after them, so C(plain) spans the same minutes as the sizes.
Means, not medians: a pass takes as long as its steps added up, which is their number times the
mean; a median, blind to the occasional slow step, undercounts most where steps are cheap and
many (plain decoding), and so underrates every method that saves steps.
Size s is predicted to run at (1 + A(s)) C(plain) / C(s) times plain decoding's speed; the best
is the method's size here. The sizing prompts are held out from training and from the
benchmark: the last of each category in tinyspec/prompts.jsonl, of which the benchmark reads
the first eight.

The measurement is cached in the sizing folder (`DIRECTORY`), keyed by the device, dtype,
threads, torch version, the weights, the method's settings, the sampling settings and the rule,
so later runs start at once (`--remeasure` measures again). A measurement made while the machine
was busy would steer every later run: a slow spell that lengthens the plain passes more than the
sizes' makes every size look cheaper than it is, and the run speculates where it loses. So the
measurement records its `noise`, how far the plain passes before the sizes and those after them
(the same steps timed twice) disagree, and where they disagree by more than `NOISE` it is made once
more, the quieter of the two kept; and a later run, before it trusts a cached sizing, times
plain steps now (`plain_now`, a fraction of a second). Where the cached plain passes disagreed,
or a plain step now and the cached C(plain) do, by more than `NOISE`, the machine is not the one
that was measured: sizing measures again, and its line says why. The result becomes a
`policy.Policy` whose menu is every measured size: the chosen one while the text accepts as
held-out text did, smaller ones or plain steps where it accepts less.
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

from ..decoding import PLAIN, Steps
from ..files import SIZING as DIRECTORY  # where measurements are kept: $TINYSPEC_HOME/sizing (files.home)
from ..files import atomic_write_json
from ..methods import Decoder
from ..methods.base import Method
from ..model import DraftVocab
from ..sampling import Sampling
from ..tree import chain
from .policy import MARGIN, Policy
from .timing import forward_call, interleaved_medians

PROMPTS = Path(__file__).resolve().parent.parent / "prompts.jsonl"
PER_CATEGORY, NEW_TOKENS = 1, 32  # sizing prompts per category, tokens decoded from each
VERSION = 6  # of the measurement: a cached file of another version is measured again
NOISE = 0.25  # two timings of the same plain steps that differ by more (max / min - 1): a machine busy in between


def candidates(proposer: Method, n_ctx: int) -> list[str]:
    """The sizes `proposer` is measured at: its own list (`Method.sizes`) and its default, those
    that leave room in a context of n_ctx for a prompt and the tokens sizing decodes."""
    sizes = dict.fromkeys([*proposer.sizes, proposer.default_size])
    return [s for s in sizes if s and proposer.room(proposer.shape(s)) <= n_ctx // 4]


def timed_steps(steps: Steps):
    """(seconds, Step) for every step of a one-row loop after its prefill, each step timed alone
    (a step's tokens reach the host before it yields, so on a GPU its work is done)."""
    next(steps)  # the prefill and the first token: not a step
    while True:
        t0 = time.perf_counter()
        try:
            produced = next(steps)
        except StopIteration:  # the row is done
            return
        yield time.perf_counter() - t0, produced[0]


@dataclass
class Sizing:
    """What `measure` found for one method on this device: the plain step's seconds; per measured
    size C (seconds) and A (accepted tokens) of its steps, how many there were, and the mean F(n)
    of what they fed (`forward_s`); and F, the target's forward over n tokens ({n: seconds})."""
    method: str
    plain_s: float
    shapes: list[dict]
    forward: dict = field(default_factory=dict)
    key: dict = field(default_factory=dict)
    noise: float = 0.0
    measured_s: float = 0.0
    path: str = ""
    why: str = ""  # why it was measured again, though a cached sizing was there

    def speedup(self, row: dict) -> float:
        """Predicted tokens/s over plain decoding's for steps of this size: (1 + A) C(plain) / C."""
        return (1 + row["accepted"]) * self.plain_s / row["seconds"]

    def menu(self) -> dict[str, dict]:
        """Every measured size whose steps proposed on the sizing prompts."""
        return {row["size"]: row for row in self.shapes if row["steps"]}

    def chosen(self) -> dict | None:
        """The size predicted to be fastest, or None if none beats plain decoding by the policy's
        margin (then the policy, too, takes plain steps on held-out text)."""
        best = max(self.menu().values(), key=self.speedup, default=None)
        return best if best is not None and self.speedup(best) > MARGIN else None

    def forward_s(self, n: int) -> float:
        """F(n): the seconds of the target's forward over n tokens and its LM head, as measured,
        straight lines between the widths measured (and beyond the widest, the last one's slope)."""
        widths = sorted(int(w) for w in self.forward)
        F = lambda w: self.forward[str(w)]
        low = max([w for w in widths if w <= n], default=widths[0])
        high = min([w for w in widths if w > low], default=None) if n != low else low
        if high is None:  # past the widest: the last slope
            low, high = widths[-2:]
        return F(low) if high == low else F(low) + (F(high) - F(low)) * (n - low) / (high - low)

    def step_s(self, size: str, fed: int) -> float | None:
        """C(size) for a step that fed `fed` tokens: the size's measured mean, moved by the
        forward's cost of feeding `fed` tokens instead of what its steps fed on average. A
        lookup's chain or a retrieved tree is as long as the text allows, not always the same:
        the forward, most of a step, follows what was fed."""
        if size == PLAIN:
            return self.plain_s
        row = self.menu().get(size)
        return row and row["seconds"] - row["forward_s"] + self.forward_s(fed)

    def predicted_s(self, fed: dict, prompts: int, prefill_s: float) -> float | None:
        """The cost model: the seconds a run takes whose steps were `fed` ({(size, tokens fed):
        steps}, the prefill's first token among the plain ones), each step at `step_s`; the
        prompts' forwards (`prefill_s`, common to every method) as they were measured in the run."""
        costs = {key: self.step_s(*key) for key, n in fed.items() if n}
        if None in costs.values():  # a size the pass took that sizing never measured (or saw propose)
            return None
        return prefill_s - prompts * self.plain_s + sum(fed[key] * c for key, c in costs.items())

    def policy(self) -> Policy:
        """The per-step policy over the menu (`speed/policy.py`)."""
        menu = self.menu() or {r["size"]: r | {"seconds": float("inf")} for r in self.shapes}  # none measured: never
        seconds = {None: self.plain_s} | {s: r["seconds"] for s, r in menu.items()}  # looked up every step: a dict
        return Policy({s: r["accepted"] for s, r in menu.items()}, lambda size, rows: seconds[size])

    def describe(self) -> str:
        """One line: what was chosen here and why."""
        best = self.chosen()
        where = f"measured in {self.measured_s:.1f} s" if self.measured_s else "measured earlier"
        if self.why:
            where += f" ({self.why}: measured again)"
        if self.noise > NOISE:
            where += f" (its plain steps, timed twice, differed by {self.noise:.0%}: a busy machine; the next run " \
                     "measures again)"
        if not self.menu():
            return f"{self.method} --size auto: no step proposed anything on the sizing prompts: plain steps; " \
                   f"{where}, {self.path}"
        if best is None:
            top = max(self.menu().values(), key=self.speedup)
            return (f"{self.method} --size auto: no size pays on this device (the best, {top['size']}, is predicted "
                    f"at {self.speedup(top):.2f}x plain decoding, and a size must promise {MARGIN:.2f}x): plain steps, "
                    f"probing now and then; {where}, {self.path}")
        return (f"{self.method} --size auto: {best['size']}, predicted {self.speedup(best):.2f}x plain decoding (tau "
                f"{1 + best['accepted']:.2f} on held-out prompts, a step costs {best['seconds'] / self.plain_s:.2f} "
                f"plain steps), smaller sizes or plain steps where the text accepts less; {where}, {self.path}")


@torch.no_grad()
def measure(target, proposer: Method, rule: str | None, prompts: list[list[int]], sampling: Sampling,
            sizes: list[str], seed: int = 0, new_tokens: int | None = None,
            progress: Callable[[str], None] | None = None) -> Sizing:
    """C and A of every size of `proposer` in `sizes`, and C(plain), decoding `prompts` (one warm-up
    pass on the first, untimed)."""
    prompts, new_tokens = fitted(target, proposer, sizes, prompts, new_tokens)
    decoders = [Decoder(target, proposer, size, rule=rule) for size in sizes]
    plain = Decoder(target)
    times, fed = {i: [] for i in range(len(sizes))}, {i: [] for i in range(len(sizes))}
    accepted, plain_times, t0 = {i: [] for i in range(len(sizes))}, [], time.perf_counter()
    halves = ([], [])  # the plain steps timed before the sizes, and after them
    for p, prompt in enumerate([prompts[0]] + prompts):  # the first pass warms up
        if progress:
            what = f"sizing {proposer.name}" + (f"@{rule}" if rule else "") + f" at T = {sampling.temperature:g}"
            progress(f"{what}: prompt {p} of {len(prompts)}" if p else f"{what}: warming up")
        # every size in turn on the same prompt, between two plain passes: C(plain) is then timed across
        # the same spell of the machine as the sizes (a drift within the round weighs on both ends)
        runs = [(None, plain)] + list(enumerate(decoders)) + [(None, plain)]
        for j, (i, dec) in enumerate(runs):
            generator = torch.Generator(device=target.lm_head.weight.device).manual_seed(seed + p)
            for seconds, step in timed_steps(dec.steps(prompt, sampling, generator, new_tokens)):
                if p == 0:
                    continue
                if i is None:
                    plain_times.append(seconds)
                    halves[j > 0].append(seconds)
                elif step.size != PLAIN:  # a step of the size (a lookup may find nothing: a plain step)
                    times[i].append(seconds)
                    accepted[i].append(step.accepted)
                    fed[i].append(step.fed)
    widest = max((n for f in fed.values() for n in f), default=1)
    sizing = Sizing(proposer.name, statistics.fmean(plain_times), [], forward_costs(target, widest))
    sizing.noise = disagree(*map(statistics.fmean, halves))  # the same steps twice: what the machine did in between
    sizing.shapes = [{"size": size, "steps": len(times[i]), "seconds": statistics.fmean(times[i]) if times[i] else None,
                      "accepted": statistics.fmean(accepted[i]) if accepted[i] else 0.0,
                      "forward_s": statistics.fmean(map(sizing.forward_s, fed[i])) if fed[i] else None}
                     for i, size in enumerate(sizes)]
    sizing.measured_s = time.perf_counter() - t0
    return sizing


def fitted(target, proposer: Method, sizes: list[str], prompts: list[list[int]],
           new_tokens: int | None = None) -> tuple[list[list[int]], int]:
    """The sizing prompts and the tokens decoded from each, as `measure` decodes them: fewer tokens
    in a small context, and the ends of the prompts that leave room for them and the widest size."""
    n_ctx = target.config.n_ctx
    new_tokens = min(new_tokens or NEW_TOKENS, n_ctx // 4)
    longest = max(proposer.room(proposer.shape(s)) for s in sizes) if sizes else 0
    return [p[-(n_ctx - new_tokens - longest - 2):] for p in prompts], new_tokens


def disagree(a: float, b: float) -> float:
    """How far two timings of the same work differ: the larger over the smaller, less one."""
    return max(a, b) / min(a, b) - 1


@torch.no_grad()
def plain_now(target, prompts: list[list[int]], sampling: Sampling, new_tokens: int, seed: int = 0) -> float:
    """C(plain) timed now, as `measure` times it, at half the cost: the mean plain step of a pass
    over each prompt decoding half its tokens (after a short untimed one: a process's first steps
    run cold). A step's cost hardly depends on where in the text it is: half the tokens will do."""
    plain, times = Decoder(target), []
    for p, prompt in enumerate([prompts[0]] + prompts):
        generator = torch.Generator(device=target.lm_head.weight.device).manual_seed(seed + p)
        if p == 0:  # the warm-up
            list(plain.steps(prompt, sampling, generator, 4))
            continue
        times += [s for s, _ in timed_steps(plain.steps(prompt, sampling, generator, max(2, new_tokens // 2)))]
    return statistics.fmean(times)


def why_stale(sizing: Sizing, target, sampling: Sampling, prompts: list[list[int]], new_tokens: int) -> str:
    """Why a cached sizing does not describe the machine now, or "" if it does: its plain passes
    disagreed (it was measured while the machine was busy), or a plain step now does not take its
    C(plain) (the machine was busier when it was measured, or is now). Plain steps are timed now
    twice at most, the closer time counting, so that one slow spell does not discard a good
    measurement."""
    if sizing.noise > NOISE:
        return f"its plain steps, timed twice, differed by {sizing.noise:.0%}"
    now = None
    for _ in range(2):
        seconds = plain_now(target, prompts, sampling, new_tokens)
        now = seconds if now is None else min(now, seconds, key=lambda s: disagree(s, sizing.plain_s))
        if disagree(now, sizing.plain_s) <= NOISE:
            return ""
    return f"a plain step took {sizing.plain_s * 1e3:.3g} ms then, {now * 1e3:.3g} ms now"


def forward_costs(target, widest: int) -> dict[str, float]:
    """F(n) for n = 1, 2, 4, 8, 12, 16, 24, 32, 48, ... up to past `widest`: the median seconds of
    the target's forward over n tokens (a chain after 128 cached ones) and its LM head, timed in turn
    (`timing.py`)."""
    widths = [1, 2, 4, 8, 12, 16, 24, 32]
    while widths[-1] < widest:
        widths.append(widths[-1] + 16)
    widths = [n for n in widths if n < target.config.n_ctx // 2]
    calls = {}
    for n in widths:
        fn, reset = forward_call(target, 1, n, 128, chain(n - 1) if n > 1 else None)
        calls[n] = (lambda fn=fn: target.lm_head(fn()[0]), reset)
    return {str(n): s for n, s in interleaved_medians(calls, target.lm_head.weight.device, rounds=5).items()}


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


def settings_of(proposer: Method) -> dict:
    """What a measurement depends on besides the weights: the method's settings, and the size of
    a reduced draft vocabulary."""
    out = {name: getattr(proposer, name, None) for name in proposer.settings}
    out = {name: v if isinstance(v, (int, float, str, type(None))) else repr(v) for name, v in out.items()}
    vocab = getattr(proposer, "lm_head", None)
    out["draft_vocab"] = len(vocab.ids) if isinstance(vocab, DraftVocab) else None
    return out


def cache_key(target, proposer: Method, rule: str | None, sampling: Sampling) -> dict:
    device = target.lm_head.weight.device
    modules = [target] + [m for m in vars(proposer).values() if isinstance(m, torch.nn.Module) and m is not target]
    return {"version": VERSION, "method": proposer.name, "device": device_name(device),
            "dtype": str(target.lm_head.weight.dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "weights": weights_hash(*modules),
            "sampling": [sampling.temperature, sampling.top_k, sampling.top_p], "rule": rule,
            "settings": settings_of(proposer), "identity": proposer.identity()}


def size(target, proposer: Method, rule: str | None, prompts: list[list[int]], sampling: Sampling,
         directory: str | Path | None = None, remeasure: bool = False, progress: Callable[[str], None] | None = None,
         sizes: list[str] | None = None) -> Sizing:
    """The sizing of `proposer` on this device: read from `directory` if it was measured for the
    same key and still describes the machine (`why_stale`), else measured now (`measure`), once
    more if the machine was busy meanwhile (the quieter of the two kept), and saved there. sizes:
    to measure (default: `candidates`)."""
    sizes = sizes if sizes is not None else candidates(proposer, target.config.n_ctx)
    key = cache_key(target, proposer, rule, sampling) | {"sizes": sizes}
    name = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    path = Path(directory or DIRECTORY) / f"{proposer.name}-{name}.json"
    why = ""
    if path.is_file() and not remeasure:
        try:
            saved = json.loads(path.read_text())
            cached = Sizing(**{**saved, "measured_s": 0.0, "path": str(path)}) if saved.get("key") == key else None
        except (json.JSONDecodeError, TypeError, AttributeError):  # a damaged file: measure again, write it anew
            cached = None
        if cached is not None:
            why = why_stale(cached, target, sampling, *fitted(target, proposer, sizes, prompts))
            if not why:
                return cached
    sizing = measure(target, proposer, rule, prompts, sampling, sizes, progress=progress)
    if sizing.noise > NOISE:  # the machine was busy meanwhile: once more, and the quieter kept
        again = f" (again: its plain steps, timed twice, differed by {sizing.noise:.0%})"
        second = measure(target, proposer, rule, prompts, sampling, sizes,
                         progress=progress and (lambda line: progress(line + again)))
        spent = sizing.measured_s + second.measured_s
        sizing = min(sizing, second, key=lambda s: s.noise)
        sizing.measured_s = spent
    sizing.key, sizing.path, sizing.why = key, str(path), why
    atomic_write_json(path, {k: v for k, v in asdict(sizing).items() if k not in ("measured_s", "path", "why")}
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
    """The benchmark's report of every size measured, per method, rule and temperature (`sizings`:
    {(name, rule, temperature, ...): Sizing}): C over C(plain) (`step_cost`), tau on the sizing
    prompts, the predicted speedup, and whether `--size auto` chose it."""
    rows = []
    for (name, rule, temperature, *_), sizing in sizings.items():
        chosen = sizing.chosen()
        for r in sizing.shapes:
            if r["steps"]:
                rows.append({"method": name + (f"@{rule}" if rule else ""), "temperature": temperature, "size": r["size"],
                             "steps": r["steps"], "step_cost": round(r["seconds"] / sizing.plain_s, 3),
                             "tau": round(1 + r["accepted"], 3), "predicted_speedup": round(sizing.speedup(r), 3),
                             "chosen": r is chosen})
    return rows
