"""Figures of a benchmark run (`python -m tinyspec bench --plot DIR`), drawn with matplotlib.

matplotlib is optional (`pip install -e ".[plot]"`): without it the benchmark says so and
writes no figures. Every figure is drawn from the rows the same run measured.
"""

from __future__ import annotations

from pathlib import Path

from ..files import atomic_path


def write_plots(rows: list[dict], directory: str | Path) -> list[Path]:
    """speedup_vs_k.png, tau_vs_temperature.png, predicted_vs_measured.png and (rows measured with
    --profile) ledger.png; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, name):
        fig.tight_layout()
        with atomic_path(out / name) as tmp:  # a figure appears whole or not at all
            fig.savefig(tmp, dpi=120, format="png")
        plt.close(fig)
        written.append(out / name)

    categories = sorted({r["category"] for r in rows})
    drafts = [r for r in rows if r["method"].startswith("draft:") and r["method"][6:].isdigit()]  # token-level, fixed k
    if drafts:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for t in sorted({r["temperature"] for r in drafts}):
            for c in categories:
                pts = sorted((int(r["method"][6:]), r["speedup"]) for r in drafts if r["temperature"] == t and r["category"] == c)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"{c}, T={t:g}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xlabel="k (tokens proposed per step)", ylabel="speedup over ar", title="Draft model: speedup vs k")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))  # beside the axes: it covers no line
        save(fig, "speedup_vs_k.png")

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    methods = sorted({r["method"] for r in rows if r["method"] != "ar"})
    colours = plt.get_cmap("tab20")  # 20 colours, and a marker per ten: no two series look alike
    for i, method in enumerate(methods):
        pts = {}
        for r in rows:
            if r["method"] == method:
                pts.setdefault(r["temperature"], []).append(r["tau"])
        xs = sorted(pts)
        ax.plot(xs, [sum(pts[x]) / len(pts[x]) for x in xs], marker="osD^v"[i // 10 % 5], color=colours(i % 20),
                label=method)
    ax.set(xlabel="temperature", ylabel="tau (tokens per target forward)", title="Tokens per target forward")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    save(fig, "tau_vs_temperature.png")

    profiled = [r for r in rows if "ledger" in r and r["temperature"] == 0]
    if profiled:  # where a step's time goes: each method's time per token over ar's, split by the ledger
        names = list(dict.fromkeys(r["method"] for r in profiled))
        parts = list(profiled[0]["ledger"])
        fig, ax = plt.subplots(figsize=(8, 4.2))
        bottom = [0.0] * len(names)
        for part in parts:
            heights = []
            for name in names:
                sel = [r for r in profiled if r["method"] == name]
                heights.append(sum(r["ledger"][part] / r["speedup"] for r in sel) / len(sel))
            ax.bar(names, heights, bottom=bottom, label=part)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(ylabel="time per token (ar = 1)", title="Where the time goes (greedy, mean over categories)")
        ax.set_xticks(range(len(names)), names, rotation=55, ha="right", rotation_mode="anchor", fontsize=7)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
        save(fig, "ledger.png")

    predicted = [r for r in rows if r.get("predicted_speedup") is not None]
    if predicted:
        fig, ax = plt.subplots(figsize=(4.5, 4))
        for method in sorted({r["method"] for r in predicted}):
            sel = [r for r in predicted if r["method"] == method]
            ax.scatter([r["predicted_speedup"] for r in sel], [r["speedup"] for r in sel], label=method)
        top = max(max(r["predicted_speedup"], r["speedup"]) for r in predicted) * 1.1
        ax.plot([0, top], [0, top], color="grey", lw=0.8)
        ax.set(xlabel="predicted speedup", ylabel="measured speedup", xlim=(0, top), ylim=(0, top),
               title="Predicted vs measured")
        ax.legend(fontsize=7)
        save(fig, "predicted_vs_measured.png")
    return written


def write_batch_plots(rows: list[dict], directory: str | Path) -> list[Path]:
    """The speculation-versus-batching curve of `bench --batch-sizes`: batch_throughput.png (total
    tokens/s against batch size, per method) and batch_speedup.png (over ar at the same batch size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, key, label in (("batch_throughput.png", "tokens_per_s", "tokens/s, all rows together"),
                             ("batch_speedup.png", "speedup", "speedup over ar at the same batch size")):
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for t in sorted({r["temperature"] for r in rows}):
            for method in dict.fromkeys(r["method"] for r in rows):
                pts = sorted((r["batch_size"], r[key]) for r in rows if r["method"] == method and r["temperature"] == t)
                style = dict(lw=2.5, color="black") if method == "auto" else {}
                ax.plot(*zip(*pts), marker="o", label=f"{method}, T={t:g}", **style)
        if key == "speedup":
            ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="batch size (rows per forward)", ylabel=label, title="Speculation vs batching")
        ax.legend(fontsize=7)
        fig.tight_layout()
        with atomic_path(out / name) as tmp:
            fig.savefig(tmp, dpi=120, format="png")
        plt.close(fig)
        written.append(out / name)
    return written
