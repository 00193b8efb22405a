"""How the benchmark runs a method (`benchmark.py` decides what to run and reports it): the
models, one decoder per spec made on first use and reused for every prompt, a pass over prompts
one at a time (`Runner.run`) or in batches (`Runner.run_batches`), each prompt sampling with its
own seed, and what sizing measured, which a method at size auto takes its policy from.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter

import torch

from ..methods import METHODS, Decoder
from ..recorded import Recorded, part_of
from ..results import run, run_batch
from ..speed.auto import policy_for
from ..speed.ledger import Ledger
from ..speed.sizing import candidates, size


class Runner:
    """Holds the models and runs one method over a list of prompts. Every method is measured by
    sizing too, at its candidate sizes and those the benchmark names, for the cost model's
    prediction; a method at size auto takes its policy from that measurement."""

    def __init__(self, target, proposers: dict, device, max_new_tokens, seed, cuda_graph=False, max_rows=1,
                 sizing_prompts=None, remeasure=False):
        self.target, self.proposers, self.device = target, proposers, device  # proposers: {method: Proposer}
        self.max_rows = max_rows  # the largest batch, for the policy of a method at size auto
        self.cuda_graph = cuda_graph  # each method at a fixed size as one recorded step (recorded.py)
        self.max_new, self.seed = max_new_tokens, seed
        self.sizing_prompts, self.remeasure = sizing_prompts, remeasure
        self.decoders = {}  # one per spec (and sampling, at size auto), made on first use and reused for every prompt
        self.sizings = {}  # (method, rule, sampling) -> what sizing measured (`sizing.Sizing`)
        self.named = {}  # method -> the sizes the benchmark names, measured beside the candidates
        self.profile = False  # --profile: each pass's time split by ledger.Ledger
        self.progress = None  # called with a line of text while sizing measures
        self.draft = None  # the draft model, for Hugging Face's assisted generation (peer.py)

    def sizing(self, name: str, rule: str | None, sampling):
        """What sizing measured for this method, rule and sampling (measured now, or read)."""
        key = (name, rule, sampling.temperature, sampling.top_k, sampling.top_p)
        if key not in self.sizings and METHODS[name].sizes:
            proposer = self.proposers[name]
            sizes = list(dict.fromkeys(candidates(proposer, self.target.config.n_ctx) + self.named.get(name, [])))
            self.sizings[key] = size(self.target, proposer, rule, self.sizing_prompts, sampling,
                                     remeasure=self.remeasure, sizes=sizes, progress=self.progress)
        return self.sizings.get(key)

    def decoder(self, spec, sampling) -> Decoder:
        name, size_, rule = spec
        auto = size_ == "auto"
        key = (spec, sampling.temperature, sampling.top_k, sampling.top_p) if auto else spec
        if key not in self.decoders:
            proposer = self.proposers.get(name)
            policy = None
            if auto:  # a batch's policy measures its forward costs now (auto.BatchPolicy)
                policy = policy_for(self.target, proposer, rule, sampling, self.sizing_prompts, self.max_rows,
                                    self.remeasure, self.progress)[0]
            if self.cuda_graph and not auto and (name == "ar" or part_of(proposer)):  # (lookahead and sized policies run eagerly)
                self.decoders[key] = Recorded(self.target, proposer, size_ or None, rule=rule)
            else:
                self.decoders[key] = Decoder(self.target, proposer, None if auto else size_ or None, policy=policy, rule=rule)
        return self.decoders[key]

    def run(self, spec, prompts, sampling, first: int = 0) -> dict:
        """One pass of `spec` over `prompts`, prompt i (counted from `first`) sampling with seed + i."""
        totals = dict(new_tokens=0, target_steps=0, proposed=0, accepted=0, rejections=0, wall_s=0.0, prefill_s=0.0,
                      outputs=[], sizes=Counter(), fed=Counter(), accepted_at=Counter(), speculated=0, empty=0)
        decoder, ledger = self.decoder(spec, sampling), Ledger(self.device)
        with ledger.watching(decoder) if self.profile else contextlib.nullcontext():
            for i, prompt in enumerate(prompts, first):
                generator = torch.Generator(device=self.device).manual_seed(self.seed + i)
                res = run(decoder.steps(prompt, sampling, generator, self.max_new), None, self.device)
                if res.stop_reason == "interrupted":  # Ctrl-C: a row cut short must not pass for a finished one
                    raise KeyboardInterrupt
                for key in ("target_steps", "proposed", "accepted", "rejections", "wall_s", "prefill_s", "sizes", "fed",
                            "accepted_at", "speculated", "empty"):
                    totals[key] += getattr(res, key)
                totals["new_tokens"] += len(res.token_ids)
                totals["outputs"].append(res.token_ids)
        if self.profile:  # where the time went, in seconds (ledger.py)
            totals["ledger"] = ledger.split(totals["wall_s"])
        return totals

    def run_batches(self, spec, prompts, sampling, size: int) -> dict:
        """The prompts `size` at a time, each batch decoded together (`results.run_batch`); prompt
        i samples with seed + i, as in `run`. Latency: each row's time from its batch's start."""
        totals = dict(new_tokens=0, target_steps=0, proposed=0, accepted=0, rejections=0, wall_s=0.0, outputs=[],
                      latencies=[])
        decoder = self.decoder(spec, sampling)
        for first in range(0, len(prompts), size):
            rows = prompts[first:first + size]
            generators = [torch.Generator(device=self.device).manual_seed(self.seed + first + i) for i in range(len(rows))]
            t0 = time.perf_counter()
            results = run_batch(decoder.batch_steps(rows, sampling, generators, self.max_new), len(rows))
            if any(res.stop_reason == "interrupted" for res in results):  # as in `run`
                raise KeyboardInterrupt
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
