"""The book's worked examples drawn (`python -m tinyspec figures tree-mask ...`): each picture from
the data `diagrams.py` computes, written as NAME.json and NAME.png, the PNG carrying the JSON's
digest so a test knows the picture is of that data."""

from __future__ import annotations

from fractions import Fraction
from itertools import product
from pathlib import Path

from ..files import atomic_path, atomic_write_json
from ..tree import Tree
from .diagrams import digest

COLOURS = {"accepted": "tab:green", "rejected": "tab:orange", "unjudged": "0.85", "correction": "tab:red",
           "bonus": "tab:blue", "root": "0.6"}


def write(out: Path, name: str, data: dict, fig) -> list[Path]:
    """NAME.json, then NAME.png carrying its digest: each appears whole or not at all."""
    import matplotlib.pyplot as plt
    atomic_write_json(out / f"{name}.json", data)
    fig.tight_layout()
    with atomic_path(out / f"{name}.png") as tmp:
        fig.savefig(tmp, dpi=100, format="png", metadata={"Description": f"sha256 of {name}.json: {digest(data)}"})
    plt.close(fig)
    return [out / f"{name}.json", out / f"{name}.png"]


def shown(text: str) -> str:
    """A token as a label: each space a middle dot, a newline \\n, nothing matplotlib reads as mathematics."""
    return repr(text)[1:-1].replace(" ", "\u00b7").replace("$", r"\$") or "''"


def layout(tree: Tree) -> dict[int, tuple[float, float]]:
    """(x, y) of every token of a tree (index 0 the root): x its depth, leaves one row apart in
    depth-first order, a parent at the middle of its children."""
    at, row = {}, [0]

    def place(i, depth):
        kids = tree.children(i)
        for k in kids:
            place(k, depth + 1)
        if not kids:
            row[0] += 1
        y = -row[0] if not kids else sum(at[k][1] for k in kids) / len(kids)
        at[i] = (depth, y)
    place(0, 0)
    return at


def draw_tree(ax, tree: Tree, labels: list[str], colours: list[str], extra=None) -> None:
    """A tree left to right, each token a box; extra: (parent index, label, colour), one more box
    below a token, joined by a dashed line (the next token after the accepted path)."""
    at = layout(tree)
    for i, parent in enumerate(tree.parents, start=1):
        (x0, y0), (x1, y1) = at[parent + 1], at[i]
        ax.plot([x0, x1], [y0, y1], color="0.5", lw=1, zorder=1)
    for i, (x, y) in at.items():
        ax.text(x, y, labels[i], ha="center", va="center", fontsize=8, zorder=2,
                bbox={"boxstyle": "round", "fc": colours[i], "ec": "0.3", "lw": 0.6})
    if extra is not None:
        parent, label, colour = extra
        x0, y0 = at[parent]
        ax.plot([x0, x0 + 1], [y0, y0 - 0.6], color=colour, lw=1.2, ls="--", zorder=1)
        ax.text(x0 + 1, y0 - 0.6, label, ha="center", va="center", fontsize=8, zorder=2, color="white",
                bbox={"boxstyle": "round", "fc": colour, "ec": "0.3", "lw": 0.6})
    ys = [y for _, y in at.values()]
    ax.set(xlim=(-0.6, tree.max_depth + 1.6), ylim=(min(ys) - 1, max(ys) + 0.8))
    ax.axis("off")


def tree_mask_figure(data: dict):
    import matplotlib.pyplot as plt
    tree = Tree(tuple(data["parents"]), tuple(data["ranks"]))
    names = ["root"] + [f"n{i}" for i in range(len(tree))]
    labels = ["root"] + [f"n{i} {tuple(c)}\n{a:.3f}" for i, (c, a) in enumerate(zip(data["choices"], data["chance"]))]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4), gridspec_kw={"width_ratios": [1.1, 1]})
    draw_tree(left, tree, labels, [COLOURS["root"]] + ["white"] * len(tree))
    left.set_title(f"{data['nodes']} nodes from the heads' accuracies: rank path,\nchance of acceptance "
                   f"(sum {data['expected_accepted']:.2f})", fontsize=9)
    right.imshow(data["mask"], cmap="Greens", vmin=0, vmax=1.4)
    right.set_xticks(range(len(names)), names, fontsize=8, rotation=90)
    right.set_yticks(range(len(names)), [f"{n} (depth {d})" for n, d in zip(names, data["depth"])], fontsize=8)
    right.set_xticks([i - 0.5 for i in range(len(names))], minor=True)
    right.set_yticks([i - 0.5 for i in range(len(names))], minor=True)
    right.grid(which="minor", color="white", lw=1)
    right.tick_params(which="minor", length=0)
    right.set_title("tree_mask: a row attends to its ancestors and itself\n(and to every cached token)", fontsize=9)
    return fig


def tree_step_figure(data: dict):
    import matplotlib.pyplot as plt
    tree = Tree(tuple(data["parents"]), tuple(data["ranks"]))
    fig, axes = plt.subplots(1, len(data["steps"]), figsize=(5 * len(data["steps"]), 4.2), squeeze=False)
    for ax, step in zip(axes[0], data["steps"]):
        path, judged = set(step["path"]), {c for a in step["path"] for c in tree.children(a)}
        colours = [COLOURS["accepted"] if a in path else COLOURS["rejected"] if a in judged else COLOURS["unjudged"]
                   for a in range(len(tree) + 1)]
        colours[0] = COLOURS["root"]
        labels = [shown(s) for s in step["shown"]]
        draw_tree(ax, tree, labels, colours, (step["path"][-1], f"{step['kind']} {shown(step['next_shown'])}",
                                              COLOURS[step["kind"]]))
        ax.set_title(f"step {step['step']}: {len(step['path']) - 1} accepted + a {step['kind']}: "
                     f"{len(step['path'])} tokens\nfor one forward", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, fc=COLOURS[k], ec="0.3") for k in ("accepted", "rejected", "unjudged")]
    fig.legend(handles, ["accepted (the target's argmax)", "judged, rejected", "not judged (below a rejection)"],
               loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f"greedy medusa:{data['size']} after {data['prompt']!r} (· is a space)", fontsize=10)
    fig.subplots_adjust(bottom=0.12)
    return fig


def block_coins_figure(data: dict):
    import matplotlib.pyplot as plt
    blocks = data["blocks"]
    fig, (coins, kept) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = range(len(blocks))
    for j, (key, name, hatch) in enumerate([("coins_token_level", "token level: min(1, p/q)", ""),
                                            ("h", "block: h_i", "//")]):
        for i in range(2):
            coins.bar([b + (j * 2 + i - 1.5) * 0.2 for b in x], [float(Fraction(r[key][i])) for r in blocks], 0.2,
                      color=["tab:purple", "tab:cyan"][i], hatch=hatch, ec="0.3", lw=0.5,
                      label=f"{name}, coin {i + 1}")
            for b, r in zip(x, blocks):
                coins.text(b + (j * 2 + i - 1.5) * 0.2, float(Fraction(r[key][i])) + 0.02, r[key][i], ha="center",
                           fontsize=6)
    coins.set_xticks(list(x), [f"{r['block']}\n(q = {r['proposed']})" for r in blocks])
    coins.set(ylabel="chance the coin says yes", ylim=(0, 1.25), title="the coins of each rule, per draft block")
    coins.legend(fontsize=7, ncol=2, loc="upper left")
    n = data["samples"]
    for j, (key, name) in enumerate([("token_level", "token level"), ("block", "block")]):
        bottom = [0.0] * len(blocks)
        for tau in range(3):
            heights = [float(Fraction(r[f"tau_{key}"][tau])) for r in blocks]
            kept.bar([b + (j - 0.5) * 0.38 for b in x], heights, 0.36, bottom=bottom, color=["0.8", "tab:olive", "tab:green"][tau],
                     ec="0.3", lw=0.5, label=f"{tau} kept" if j == 0 else None)
            bottom = [b + h for b, h in zip(bottom, heights)]
            kept.plot([b + (j - 0.5) * 0.38 for b in x], [sum(r[f"measured_{key}"][:tau + 1]) / n for r in blocks], "k_",
                      ms=14, label=f"measured ({n} runs of each)" if j == 0 and tau == 0 else None)
        for b, r in zip(x, blocks):
            kept.text(b + (j - 0.5) * 0.38, 1.02, "tok" if j == 0 else "blk", ha="center", fontsize=7)
    kept.set_xticks(list(x), [r["block"] for r in blocks])
    kept.set(ylabel="P(tau tokens kept)", ylim=(0, 1.25),
             title=f"kept: token level {data['expected_token_level']}, block {data['expected_block']} per step")
    kept.legend(fontsize=7, ncol=2, loc="upper left")
    return fig


def traversal_coins_figure(data: dict):
    import matplotlib.pyplot as plt
    draws, n = data["draws"], data["samples"]
    fig, (acc, out) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.6, 1]})
    x = range(len(draws))
    for j, (name, colour) in enumerate([("traversal", "tab:green"), ("lossless", "tab:orange")]):
        mean = [sum(i * float(Fraction(a)) for i, a in enumerate(d[f"accepted_{name}"])) for d in draws]
        runs = [sum(i * c for i, c in enumerate(d[f"measured_accepted_{name}"])) / n for d in draws]
        label = {"traversal": "traversal", "lossless": "top-down walk"}[name]
        acc.bar([b + (j - 0.5) * 0.38 for b in x], mean, 0.36, color=colour, ec="0.3", lw=0.5,
                label=f"{label}: {data[f'expected_{name}']} on average")
        acc.plot([b + (j - 0.5) * 0.38 for b in x], runs, "k_", ms=12, label=f"measured ({n} runs)" if j == 0 else None)
    acc.set_xticks(list(x), [f"{d['draw']}\n{d['probability']}" for d in draws], fontsize=8)
    acc.set(ylabel="accepted tokens (exact)", ylim=(0, 2.9),
            title="each draw x1(c1 c2) and its chance under q: tokens accepted")
    acc.legend(fontsize=7, loc="upper left", ncol=3)
    pairs = ["aa", "ab", "ba", "bb"]
    target = [float(Fraction(a) * Fraction(b)) for a, b in product(data["p"], repeat=2)]
    out.bar(range(4), target, 0.6, color="tab:blue", alpha=0.5, label="p(x) p(y), the target's")
    for j, (name, mark) in enumerate([("traversal", "o"), ("lossless", "x")]):
        chance = [Fraction(d["probability"]) for d in draws]
        runs = [sum(float(c) * d[f"measured_pairs_{name}"][i] / n for c, d in zip(chance, draws)) for i in range(4)]
        out.plot([i + (j - 0.5) * 0.2 for i in range(4)], runs, mark, color="k",
                 label=f"{'traversal' if name == 'traversal' else 'top-down'}: measured (exact: "
                       f"{', '.join(data['pairs'][name])})")
    out.set_xticks(range(4), pairs)
    out.set(ylabel="probability", ylim=(0, 0.62), title="the first two tokens out")
    out.legend(fontsize=7, loc="upper left")
    return fig


def residual_walk_figure(data: dict):
    import matplotlib.pyplot as plt
    x, names = range(3), data["tokens"]
    fig, axes = plt.subplots(1, 4, figsize=(12, 3.2), sharey=True)
    panels = [("the node: p, and q (both children's)", [("p", data["p"], "tab:blue"), ("q", data["q"], "tab:orange")]),
              (f"child 1 passes min(p, q); rejected {data['first_rejected']:.3f}",
               [("min(p, q)", data["first_child"], "tab:green"), ("p' = residual(p, q)", data["p_after_first"], "tab:red")]),
              (f"child 2 against p': min(p', q); rejected {data['second_rejected']:.3f}",
               [("min(p', q)", data["second_child"], "tab:olive"), ("p'' = residual(p', q)", data["p_after_second"], "tab:red")])]
    for ax, (title, bars) in zip(axes, panels):
        for j, (label, values, colour) in enumerate(bars):
            ax.bar([i + (j - 0.5) * 0.38 for i in x], values, 0.36, color=colour, label=label)
        ax.set_xticks(list(x), names)
        ax.set_title(title, fontsize=8)
        ax.legend(fontsize=7)
    parts = [("child 1", data["first_child"], 1.0, "tab:green"),
             ("child 2", data["second_child"], data["first_rejected"], "tab:olive"),
             ("sampled from p''", data["p_after_second"], data["first_rejected"] * data["second_rejected"], "tab:red")]
    bottom = [0.0] * 3
    for label, values, weight, colour in parts:
        heights = [v * weight for v in values]
        axes[3].bar(list(x), heights, 0.6, bottom=bottom, color=colour, label=label)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for i, pi in zip(x, data["p"]):
        axes[3].plot([i - 0.35, i + 0.35], [pi, pi], color="tab:blue", lw=2)
    axes[3].set_xticks(list(x), names)
    axes[3].set_title("what comes out: exactly p (blue lines)", fontsize=8)
    axes[3].legend(fontsize=7)
    axes[0].set_ylabel("probability")
    return fig


def cost_curve_figure(data: dict):
    import matplotlib.pyplot as plt
    rows = data["rows"]
    fig, (cost, speed) = plt.subplots(1, 2, figsize=(10, 3.8))
    measured = [r for r in rows if r["F"] is not None]
    t = [r["tokens"] for r in measured]
    cost.plot(t, [r["F"] for r in measured], "o-", label=f"F(t) measured: {data['device']}")
    cost.plot(t, [1] * len(t), "--", color="grey", label="F(t) = 1: verification is free (a GPU)")
    cost.plot(t, t, ":", color="grey", label="t one-token forwards")
    cost.set(xlabel="tokens in the target's forward, t = k + 1", ylabel="cost, in one-token forwards",
             ylim=(0, max(t) / 4), title=f"the cost of a forward ({data['model']})")
    cost.legend(fontsize=7)
    a, c = data["alpha"], data["c"]
    for key, label, style, shown_rows in [("gpu", f"expected_speedup: F = 1, c = {c}", "--", rows),
                                          ("measured", f"F measured, c = {c}", "o-", measured),
                                          ("measured_free", "F measured, free proposals (c = 0)", "s-", measured)]:
        t, values = [r["tokens"] for r in shown_rows], [r[key] for r in shown_rows]
        best = max(range(len(values)), key=values.__getitem__)
        line, = speed.plot(t, values, style, ms=4, label=f"{label}: best t = {t[best]}, {values[best]:.2f}x")
        speed.plot([t[best]], [values[best]], "*", ms=12, color=line.get_color())
    speed.axhline(1.0, color="grey", lw=0.8)
    speed.set(xlabel="tokens in the target's forward, t = k + 1", ylabel="predicted speedup",
              title=f"a draft chain at alpha = {a}: tau(alpha, k) / (F(t) + k c)")
    speed.legend(fontsize=7)
    return fig


FIGURE_OF = {"tree-mask": ("tree_mask", tree_mask_figure), "tree-step": ("tree_step", tree_step_figure),
             "block-coins": ("block_coins", block_coins_figure), "traversal-coins": ("traversal_coins", traversal_coins_figure),
             "residual-walk": ("residual_walk", residual_walk_figure), "cost-curve": ("cost_curve", cost_curve_figure)}


def draw(name: str, data: dict, out: Path) -> list[Path]:
    """Figure `name` of DIAGRAMS from its data: NAME.json and NAME.png in `out`."""
    file, figure = FIGURE_OF[name]
    return write(out, file, data, figure(data))
