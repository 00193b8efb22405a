"""The speculation-versus-batching curve (`python -m tinyspec bench --batch-sizes 1,2,4,8,16`):
every method decodes the same prompts B at a time, for every B, and reports total tokens/s, the
mean latency per sequence, tau and the speedup over `ar` at the same batch size (chapter 14).
The prompts, models and methods are `benchmark.prepare`'s."""

from __future__ import annotations

import itertools
import statistics


from ..sampling import Sampling
from ..progress import progress_bar
from .benchmark import parse_batch_sizes, prepare, report_of
from ..commands.cli import die
from .specs import label


def interleaved(prompts: dict[str, list], n: int) -> list:
    """The first n prompts, taken in turn from each category: code, docs, structured, code, ..."""
    out = [p for group in itertools.zip_longest(*prompts.values()) for p in group if p is not None][:n]
    if len(out) < n:
        die(f"--batch-prompts {n}: only {len(out)} prompts in these categories; raise --prompts-per-category")
    return out


def measure_batches(args, argv: list[str]) -> dict:
    """The speculation-versus-batching curve: every method at every batch size of --batch-sizes,
    each decoding the same --batch-prompts prompts `size` at a time. Per method and size: total
    tokens/s, mean latency per sequence, tau, and the speedup over `ar` at the same batch size."""
    if args.batch_prompts < 1:
        die(f"--batch-prompts must be at least 1, got {args.batch_prompts}")
    # without --prompts-per-category: enough of each category to take --batch-prompts in turn
    runner, specs, temperatures, by_category = prepare(args, -(-args.batch_prompts // len(args.categories.split(","))))
    sizes, prompts = parse_batch_sizes(args.batch_sizes), interleaved(by_category, args.batch_prompts)
    out, bar, interrupted = [], None, False
    rate = lambda p: p["new_tokens"] / p["wall_s"]
    try:
        for spec in specs:  # warm-up (a policy of medusa:auto measures its forward costs here, once)
            runner.run_batches(spec, prompts[:2], Sampling(temperatures[0]), 2)
        bar = progress_bar(total=len(specs) * len(temperatures) * len(sizes) * args.repeats, desc="batches",
                           disable=args.json)
        for temperature in temperatures:
            passes = {(spec, size): [] for spec in specs for size in sizes}
            for _ in range(args.repeats):  # interleaved: a slow spell of the machine hits every method alike
                for size in sizes:
                    for spec in specs:
                        passes[spec, size].append(runner.run_batches(spec, prompts, Sampling(temperature), size))
                        bar.update(1)
            for size in sizes:  # a temperature's rows are kept once all of them finished
                for spec in specs:
                    mine, ar, first = passes[spec, size], passes[("ar", "", None), size], passes[spec, size][0]
                    row = {"method": label(spec), "temperature": temperature,
                           "batch_size": size, "prompts": len(prompts), "new_tokens": first["new_tokens"],
                           "tau": round(first["new_tokens"] / first["target_steps"], 3),
                           "acceptance_rate": round(first["accepted"] / first["proposed"], 4) if first["proposed"] else None,
                           "tokens_per_s": round(statistics.median(map(rate, mine)), 2),
                           "latency_s": round(statistics.median(statistics.mean(p["latencies"]) for p in mine), 4),
                           "speedup": round(statistics.median(rate(p) / rate(a) for p, a in zip(mine, ar)), 3)}
                    if temperature == 0:  # greedy: the rows whose output is ar's at the smallest batch size
                        ar_first = passes[("ar", "", None), sizes[0]][0]["outputs"]
                        row["same_as_ar"] = sum(a == b for a, b in zip(first["outputs"], ar_first))
                    out.append(row)
    except KeyboardInterrupt:  # the rows that finished are kept (`benchmark.measure`)
        interrupted = True
    if bar is not None:
        bar.close()
    report = report_of(args, argv, runner, out) | {"batch_sizes": sizes, "batch_prompts": len(prompts)}
    if interrupted:
        return report | {"interrupted": True, "planned_rows": len(specs) * len(temperatures) * len(sizes)}
    if ("medusa", "auto", None) in specs:  # what its policy measured: ms of a forward of rows x tokens, and of the heads
        policy = runner.decoder(("medusa", "auto", None), Sampling(0.0)).policy
        widths = [1] + [1 + int(s) for s in policy.promise]
        report["forward_ms"] = {f"{r}x{t}": round(policy.F(r, t) * 1e3, 3) for r in sizes for t in widths}
        report["heads_ms"] = {str(r): round(policy.H(r) * 1e3, 3) for r in sizes}
    return report
