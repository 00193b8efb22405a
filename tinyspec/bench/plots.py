"""Figures of a benchmark run (`python -m tinyspec bench --plot DIR`, or redrawn from its saved report
with `python -m tinyspec figures bench --report FILE`), drawn with matplotlib.

matplotlib is optional (`pip install -e ".[plot]"`): without it the benchmark says so and
writes no figures. Every figure is drawn from the rows the same run measured, with its numbers
written on it where a reader would otherwise guess them from the axes.
"""

from __future__ import annotations

from pathlib import Path

from ..files import atomic_path

WITHIN = 0.15  # DESIGN.md: measured speedups sit within 15% of predicted, or the gap is named (a share of the measured)


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


def family(method: str) -> str:
    """A method's name without its size or rule (`eagle:2,6,16@traversal` is eagle): one colour each."""
    return method.partition(":")[0].partition("@")[0]


def ledger_figure(rows: list[dict], out: Path) -> Path:
    """Where a step's time goes: each method's time per token over ar's (greedy, mean over
    categories), split by the ledger's parts, its total written on the bar."""
    plt = pyplot()
    names = list(dict.fromkeys(r["method"] for r in rows))
    parts = list(rows[0]["ledger"])
    fig, ax = plt.subplots(figsize=(8, 4.2))
    bottom = [0.0] * len(names)
    for part in parts:
        heights = []
        for name in names:
            sel = [r for r in rows if r["method"] == name]
            heights.append(sum(r["ledger"][part] / r["speedup"] for r in sel) / len(sel))
        ax.bar(names, heights, bottom=bottom, label=part)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for i, total in enumerate(bottom):
        ax.text(i, total + 0.02, f"{total:.2f}", ha="center", va="bottom", fontsize=6)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(ylabel="time per token (ar = 1)", ylim=(0, max(bottom) * 1.1),
           title="Where the time goes (greedy, mean over categories)")
    ax.set_xticks(range(len(names)), names, rotation=55, ha="right", rotation_mode="anchor", fontsize=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    return save(fig, out / "ledger.png")


def predicted_figure(rows: list[dict], out: Path) -> Path:
    """Every row's measured speedup against the cost model's prediction: one colour per method
    family, one marker per temperature, the band where the two agree within 15%, and how many do."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4.4))
    top = max(max(r["predicted_speedup"], r["speedup"]) for r in rows) * 1.08
    ax.fill_between([0, top], [0, top / (1 + WITHIN)], [0, top / (1 - WITHIN)], color="0.9",  # |s - p| <= 15% of s
                    label=f"prediction within {WITHIN:.0%}")
    ax.plot([0, top], [0, top], color="grey", lw=0.8)
    markers = dict(zip(sorted({r["temperature"] for r in rows}), "o^sD"))
    for i, name in enumerate(dict.fromkeys(family(r["method"]) for r in rows)):
        for t, marker in markers.items():
            sel = [r for r in rows if family(r["method"]) == name and r["temperature"] == t]
            if sel:
                ax.scatter([r["predicted_speedup"] for r in sel], [r["speedup"] for r in sel], s=18, marker=marker,
                           color=f"C{i}", label=f"{name}, T = {t:g}", alpha=0.8)
    near = sum(abs(r["speedup"] - r["predicted_speedup"]) <= WITHIN * r["speedup"] for r in rows)
    ax.set(xlabel="predicted speedup (cost model)", ylabel="measured speedup over ar", xlim=(0, top), ylim=(0, top),
           title=f"Predicted vs measured: {near} of {len(rows)} rows within {WITHIN:.0%}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    return save(fig, out / "predicted_vs_measured.png")


def write_plots(rows: list[dict], directory: str | Path) -> list[Path]:
    """ledger.png (rows measured with --profile) and predicted_vs_measured.png; returns the paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    profiled = [r for r in rows if "ledger" in r and r["temperature"] == 0]
    if profiled:
        written.append(ledger_figure(profiled, out))
    predicted = [r for r in rows if r.get("predicted_speedup") is not None]
    if predicted:
        written.append(predicted_figure(predicted, out))
    return written


def write_batch_plots(rows: list[dict], directory: str | Path) -> list[Path]:
    """The speculation-versus-batching curve of `bench --batch-sizes`: batch_throughput.png (total
    tokens/s against batch size, per method) and batch_speedup.png (over ar at the same batch size),
    each method one colour, its value at the largest batch written at the line's end."""
    plt = pyplot()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    sizes = sorted({r["batch_size"] for r in rows})
    for name, key, label, decimals in (("batch_throughput.png", "tokens_per_s", "tokens/s, all rows together", 0),
                                       ("batch_speedup.png", "speedup", "speedup over ar at the same batch size", 2)):
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        temperatures = sorted({r["temperature"] for r in rows})
        ends = []  # (value at the largest batch, its label, colour): written at the lines' right ends
        for i, method in enumerate(dict.fromkeys(r["method"] for r in rows)):
            for t, style in zip(temperatures, ("-", "--", ":")):
                pts = sorted((r["batch_size"], r[key]) for r in rows if r["method"] == method and r["temperature"] == t)
                if not pts:
                    continue
                colour, width = ("black", 2.5) if method == "auto" else (f"C{i}", 1.5)
                ax.plot(*zip(*pts), style, marker="o", color=colour, lw=width,
                        label=method if len(temperatures) == 1 else f"{method}, T={t:g}")
                ends.append((pts[-1][1], f"{pts[-1][1]:.{decimals}f}", colour))
        low, high = ax.get_ylim()
        at = None
        for value, text, colour in sorted(ends):  # spread apart so that two close ends stay legible
            at = value if at is None else max(value, at + (high - low) * 0.045)
            ax.text(sizes[-1] * 1.12, at, text, va="center", fontsize=7, color=colour)
        if key == "speedup":
            ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])  # the batch sizes measured, as integers
        ax.minorticks_off()
        ax.set_xlim(sizes[0] / 1.3, sizes[-1] * 1.6)
        ax.set(xlabel="batch size (rows per forward)", ylabel=label, title="Speculation vs batching"
               + (f" (T = {temperatures[0]:g})" if len(temperatures) == 1 else ""))
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
        written.append(save(fig, out / name))
    return written
