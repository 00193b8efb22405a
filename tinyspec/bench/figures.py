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
- `bench`: the benchmark's own figures (`plots.write_plots`) from a saved report (`--report`), and
  by_method.png, the tau and speedup of every method and category at a glance;
- `eagle-tree`: every node EAGLE-2's `grow_tree` makes in the first step after a prompt, with its
  value, the kept ones marked, and what the target accepted (printed);
- `eagle-costs`: the pieces of an EAGLE step in plain decoding steps, each the minimum of 60 runs
  (printed);
- `tables`: every table of README.md, walkthrough.md and docs/*.md marked `<!-- bench: FILE columns=... -->`
  refilled from FILE, its rows kept (or, with `rows=all` in the marker, every row FILE has; with
  `key=FIELD`, FILE's rows whose FIELD the table shows, as chapter 2's forward costs);
  `tests/test_docs.py` checks each cell against FILE independently;
- `tree-mask`, `tree-step`, `block-coins`, `traversal-coins`, `residual-walk`, `cost-curve`: the book's
  worked examples, from tinyspec's own functions and the shipped weights (`diagrams.py`): a Medusa
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
import re
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from ..commands.cli import (DEFAULT_EAGLE, DEFAULT_HEADS, DEFAULT_MODEL, DEFAULT_TOKENIZER, ArgumentParser, HelpFormatter,
                             check_input, check_output, die, examples, load_encoding, load_model, load_weights,
                             pick_device, run_main, set_threads, shown)
from ..files import atomic_path, atomic_write_json, home
from ..kvcache import KVCache
from .diagrams import DIAGRAMS, block_coins_data, cost_curve_data, draw, residual_walk_data, traversal_coins_data, \
    tree_mask_data, tree_step_data
from .plots import write_plots
from ..methods.draft import best_k, expected_speedup, expected_tokens
from ..speed.timing import forward_call, interleaved_medians, interleaved_times
from ..tree import chain

ROOT = Path(__file__).resolve().parent.parent.parent  # the checkout: tinyspec/commands/ is two below it
FIGURES = ("residual", "speedup", "cost", "bench", "eagle-tree", "eagle-costs", "tables", "tour", *DIAGRAMS)
COST_SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 13, 16, 17, 20, 24, 32, 33, 42, 48, 64)  # 9: lookup:8; 17, 33: 16- and 32-node trees


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    with atomic_path(path) as tmp:  # a figure appears whole or not at all
        fig.savefig(tmp, dpi=120, format="png")
    pyplot().close(fig)
    return path


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
    middle.set(xlabel="k (proposals per step)", ylabel="speedup", title=r"$S(0.8, c, k) = \tau\,/\,(kc + 1)$")
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


def by_method_figure(rows: list[dict], out: Path) -> Path:
    """The whole benchmark table at a glance: tau and speedup of every method, a bar per category."""
    plt = pyplot()
    categories = sorted({r["category"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    temperatures = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(2, len(temperatures), figsize=(4 + 0.55 * len(methods) * len(temperatures), 6),
                             squeeze=False, sharex=True, sharey="row")
    width = 0.8 / len(categories)
    for j, t in enumerate(temperatures):
        for i, (field, label) in enumerate([("tau", "tau (tokens per target forward)"), ("speedup", "speedup over ar")]):
            ax = axes[i][j]
            for c, category in enumerate(categories):
                value = {r["method"]: r[field] for r in rows if r["temperature"] == t and r["category"] == category}
                ax.bar([m + (c - (len(categories) - 1) / 2) * width for m in range(len(methods))],
                       [value.get(m, 0) for m in methods], width, label=category)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.set(ylabel=label if j == 0 else None, title=f"T = {t:g}" if i == 0 else None)
            ax.set_xticks(range(len(methods)), methods, rotation=60, ha="right", fontsize=8)
    axes[0][0].legend(fontsize=7)
    return save(fig, out / "by_method.png")


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


@torch.no_grad()
def eagle_tree(model_path, head_path, tokenizer_path, top_k: int = 2, depth: int = 6, total_tokens: int = 16,
               prompt: str = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n") -> None:
    """Print every node `grow_tree` makes in the first step after `prompt` (value = the product of
    the head's probabilities along its path; * = kept), then the step the target took."""
    from ..decoding import Proposal, Row, verify
    from ..methods.eagle import HeadDrafter, grow_tree
    from ..sampling import Sampling
    from ..tree import Tree
    from ..verify import greedy
    enc, cpu = load_encoding(tokenizer_path), torch.device("cpu")
    target = load_model(model_path, cpu, torch.float32)
    head = load_weights("eagle", head_path, target, enc, cpu, torch.float32)  # a bad file: one line
    x = torch.tensor(enc.encode_ordinary(prompt))
    cache = KVCache.for_model(target, 256)
    drafter = HeadDrafter(head, target.transformer.wte, target.lm_head, head.new_cache(256))
    made = []  # (parent, token, log value) of every node grow_tree makes, in its order

    def expand(chosen, parents, tokens, d):
        logits = drafter.expand(chosen, parents, tokens, d)
        top = torch.log_softmax(logits, -1).topk(top_k)
        for n, ts, vs in zip(chosen.tolist(), top.indices.tolist(), top.values.tolist()):
            made.extend((n, t, made[n][2] + v) for t, v in zip(ts, vs))
        return logits

    f = target.hidden(x[None], cache=cache)[0]
    root = target.lm_head(f[-1]).argmax().view(1)
    root_logits = drafter.catch_up(f, torch.cat([x[1:], root]))
    top = torch.log_softmax(root_logits, -1).topk(top_k)
    made += [(-1, t, v) for t, v in zip(top.indices.tolist(), top.values.tolist())]
    parents, tokens = grow_tree(root_logits, expand, top_k, depth, total_tokens)
    drafter.rollback()
    [verified] = verify(target, cache, [Row(0, [], None, root[0])], [Proposal(tokens, Tree(tuple(parents.tolist())))], greedy,
                        Sampling(0.0), f"{top_k},{depth},{total_tokens}")
    step = verified.step

    def path(i, made_):
        return () if i < 0 else path(made_[i][0], made_) + (made_[i][1],)
    kept = {path(i, list(zip(parents.tolist(), tokens.tolist()))) for i in range(len(parents))}

    def draw(parent, indent):
        kids = [i for i, n in enumerate(made) if n[0] == parent]
        for j, i in enumerate(kids):
            last = j == len(kids) - 1
            mark = "*" if path(i, made) in kept else " "
            print(f"{indent}{'└─' if last else '├─'}{mark}{enc.decode([made[i][1]])!r} {torch.tensor(made[i][2]).exp():.3f}")
            draw(i, indent + ("   " if last else "│  "))
    print("root", repr(enc.decode([int(root)])))
    draw(-1, "")
    print("step:", [enc.decode([t]) for t in step.tokens], step.sources)


@torch.no_grad()
def eagle_costs(model_path, head_path, context: int = 128, rounds: int = 60) -> None:
    """Print the cost of each piece of an EAGLE step in plain decoding steps (a one-token target
    forward after `context` cached tokens): medians, every piece timed in turn (`speed/timing.py`)."""
    from ..methods.eagle import HeadDrafter
    cpu, L = torch.device("cpu"), context
    t = load_model(model_path, cpu, torch.float32)
    h = load_weights("eagle", head_path, t, None, cpu, torch.float32)  # a bad file: one line
    z = lambda n: torch.zeros(n, dtype=torch.long)
    calls = {"plain": forward_call(t, 1, 1, L)}
    calls |= {f"target forward over the root and {n} nodes": forward_call(t, 1, n + 1, L, chain(n)) for n in (8, 16, 32)}
    d = HeadDrafter(h, t.transformer.wte, t.lm_head, h.new_cache(512))
    f = t.hidden(z(L)[None])[0]
    d.catch_up(f[:-3], z(L - 3))
    base = d.cache.length
    calls["head catch-up (3 pairs) and LM head"] = (lambda: d.catch_up(f[-3:], z(3)), lambda: d.cache.truncate(base))
    for e in (1, 2, 4, 8):
        calls[f"head forward over {e} nodes and LM head"] = (partial(d.expand, list(range(e)), [-1] * e, z(e)), d.rollback)
    seconds = interleaved_medians(calls, cpu, rounds)
    for name, s in seconds.items():
        if name != "plain":
            print(f"{name}: {s / seconds['plain']:.2f}")


# A table from the saved benchmark: `<!-- bench: FILE key=value ... columns=c1,c2,... -->` on the line
# before it. A column is a key (method, T, category), a field of FILE's rows, `field[code/docs/structured]`
# (one cell per category, joined by "/"), tau_from_alpha (Leviathan's tau from the row's alpha),
# or - (not from FILE). Options: T=, category=, method= fix a key; prefix=draft: completes the method
# cells (`4` is draft:4, `ar` stays); source=huggingface reads FILE's Hugging Face rows; rows=all
# (every row of FILE that the fixed keys and the prefix select, `ar` only without a prefix).
# key=FIELD: a curve, not a benchmark: each row of the table is FILE's row whose FIELD is the
# table's cell in the column of that name (`key=tokens columns=tokens,plain_steps`); several
# fields, comma-separated, name a row together (`key=L,T` for the kernel's shapes).
BENCH_TABLE = re.compile(r"^<!-- bench: (\S+)((?: \w+=\S+)*) -->\n((?:\|.*\n)+)", re.M)
DECIMALS = {"tau": 2, "tau_from_alpha": 2, "predicted_tau": 2, "speedup": 2, "predicted_speedup": 2, "step_cost": 2,
            "acceptance_rate": 3, "alpha": 3, "tokens_per_s": 0, "same_as_ar": 0, "tinyspec_speedup": 2,
            "matches_tinyspec": 2, "same_as_tinyspec": 0}
KEYS = ("method", "T", "category", "shape", "size")


def bench_value(row: dict | None, field: str):
    if row is None:
        return None
    if field == "tau_from_alpha":
        alpha, k = row.get("alpha"), row["method"].partition(":")[2].partition("@")[0]
        return None if alpha is None else expected_tokens(alpha, int(k))
    return row.get(field)


def group(row: dict) -> str:
    """What a table's per-cell columns (`tau[code/docs/structured]`) range over: a benchmark row's
    category, a batch curve's batch size (`speedup[1/2/4/8/16]`), or the shape a sizing row measured."""
    return str(row.get("category", row.get("batch_size", row.get("shape", row.get("size")))))


def fill_table(options: dict, header: list[str], rows: list[list[str]], root: Path) -> list[list[str]]:
    """The table's rows with every value cell recomputed from the saved report (decimals as printed)."""
    report = json.loads((root / options["path"]).read_text())
    saved = report[options.get("source", "rows")]
    columns = options["columns"].split(",")
    if "key" in options:  # a curve: rows named by their values of the key fields, every other column a field of that row
        keys = options["key"].split(",")
        out = []
        for cells in rows:
            shown = {key: cells[columns.index(key)].strip("`") for key in keys}
            row = next((r for r in saved if all(f"{r[k]:g}" == f"{float(shown[k]):g}" for k in keys)), {})
            out.append([cell if column in keys or column == "-" else "-" if row.get(column) is None else
                        f"{row[column]:.{len(cell.partition('.')[2]) if re.fullmatch(r'-?[0-9.]+', cell) else 2}f}"
                        for column, cell in zip(columns, cells)])
        return out
    fixed = {k: options[k] for k in KEYS if k in options}
    prefix = options.get("prefix", "")
    if options.get("rows") == "all":
        keys = [c for c in columns if c in KEYS]
        seen = {}
        for r in saved:
            row_key = {"method": r["method"], "T": f"{r['temperature']:g}", "category": group(r), "shape": group(r),
                       "size": group(r)}
            if all(row_key[k] == v for k, v in fixed.items()) and r["method"].startswith(prefix):
                seen.setdefault(tuple(row_key[k] for k in keys), None)
        rows = [[(dict(zip(keys, key))[c].removeprefix(prefix) if c in KEYS else "") for c in columns] for key in seen]
        rows = [[f"`{c}`" if col == "method" and c and not prefix else c for c, col in zip(row, columns)] for row in rows]
    out = []
    for cells in rows:
        key = dict(fixed, **{c: cell.strip("`") for c, cell in zip(columns, cells) if c in KEYS})
        method = key["method"] if key["method"] == "ar" else prefix + key["method"]

        def find(category):
            match = [r for r in saved if r["method"] == method and f"{r['temperature']:g}" == f"{float(key['T']):g}"
                     and group(r) == category]
            return match[0] if match else None
        new = []
        for column, cell in zip(columns, cells):
            field, _, per = column.partition("[")
            if column in KEYS or column == "-":
                new.append(cell)
                continue
            categories = per.rstrip("]").split("/") if per else [key.get("category", key.get("shape"))]
            olds = re.split(r"\s*/\s*", cell) if per else [cell]
            joiner = " / " if " / " in cell else "/"  # the README spaces them; the book's wide tables do not
            parts = []
            for category, old in zip(categories, olds + [""] * len(categories)):
                value = bench_value(find(category), field)
                shown = old.strip("`* x")
                decimals = len(shown.partition(".")[2]) if re.fullmatch(r"-?[0-9.]+", shown) else DECIMALS.get(field, 2)
                parts.append("-" if value is None else f"{value:.{decimals}f}")
            new.append(joiner.join(parts))
        out.append(new)
    return out


def fill_tables(text: str, root: Path = ROOT) -> str:
    """Every marked table of a document refilled from the report its marker names."""
    def refill(m):
        options = dict(o.split("=", 1) for o in m.group(2).split())
        options["path"] = m.group(1)
        lines = m.group(3).splitlines()
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[2:]]
        body = ["| " + " | ".join(r) + " |" for r in fill_table(options, lines[0], rows, root)]
        return m.group(0)[: m.start(3) - m.start(0)] + "\n".join(lines[:2] + body) + "\n"
    return BENCH_TABLE.sub(refill, text)


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
    from ..speed.sizing import device_name
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
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({threads} thread{'s' * (threads > 1)})"
        report = {"device": name, "dtype": "float32", "torch": torch.__version__, "context": 128,
                  "model": Path(args.model).name, "command": "python -m tinyspec figures cost"
                  + (f" --threads {args.threads}" if args.threads else "") + f" --out {shown(out)}",
                  "rows": measure_forward_cost(model, device)}
        atomic_write_json(out / "forward_cost.json", report)
        written += [out / "forward_cost.json", cost_figure(out, report)]
    if "bench" in args.figures:
        written += write_plots(rows, out) + [by_method_figure(rows, out)]
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
        for doc in (ROOT / "README.md", ROOT / "walkthrough.md", *sorted((ROOT / "docs").glob("*.md"))):
            text = doc.read_text()
            if fill_tables(text) != text:
                doc.write_text(fill_tables(text))
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
