"""The book's worked examples as figures, each computed by tinyspec's own functions or the shipped
weights (`python -m tinyspec figures NAME`, `figures.py`):

- `tree-mask`: the static Medusa tree of 8 nodes that `tree.from_accuracies` builds from the shipped
  heads' accuracies, and its `tree_mask` as a grid (chapter 6, trees);
- `tree-step`: two real greedy steps of `medusa:8` after "def fibonacci(n):", as `decoding.verify`
  judged them: the accepted path, the rejected and unjudged nodes, the correction or bonus;
- `block-coins`: Sun et al.'s example (p = (1/3, 2/3), q = (2/3, 1/3), k = 2): the coins of the
  token-level rule and of block verification, and how many tokens each block keeps, exactly and as
  `verify.block` and `draft.speculative_sampling` did in seeded runs;
- `traversal-coins`: the same p and q on a tree of a first token and two children: accepted tokens
  per draw, traversal against the top-down walk, exactly and as `verify.traversal` and
  `verify.lossless` did; and the first two tokens out, which are the target's;
- `residual-walk`: chapter 6's two siblings, each rejection leaving `sampling.residual` of what was
  left: p, p', p'' and what comes out, exactly p;
- `cost-curve`: chapter 5's cost model on the measured forward costs F(t): the speedup of a draft
  chain against the tokens t = k + 1 in its forward, as `draft.expected_speedup` has it (F = 1, a
  GPU) and with this CPU's F(t).

Each figure is a PNG with the JSON of what it shows beside it (same name); the PNG records the
JSON's digest (`digest`, its `Description`), so tests/test_figures.py can recompute the data from
the code and know that the picture is of that data. Exact quantities are kept as fractions ("1/3").
"""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction
from itertools import product
from pathlib import Path

import torch

from ..files import atomic_path, atomic_write_json
from ..methods.draft import expected_speedup, expected_tokens, speculative_sampling
from ..sampling import Sampling, residual, sample
from ..tree import Tree, chain, choices_of, expected_accepted, from_accuracies
from .. import verify

DIAGRAMS = ("tree-mask", "tree-step", "block-coins", "traversal-coins", "residual-walk", "cost-curve")
COLOURS = {"accepted": "tab:green", "rejected": "tab:orange", "unjudged": "0.85", "correction": "tab:red",
           "bonus": "tab:blue", "root": "0.6"}
STEP_PROMPT = "def fibonacci(n):"  # the README's and docs/example_prompts.txt's first prompt
SUN_P, SUN_Q = (Fraction(1, 3), Fraction(2, 3)), (Fraction(2, 3), Fraction(1, 3))  # Sun et al.'s a, b


def digest(data: dict) -> str:
    """What a figure's PNG records of the JSON it was drawn from."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def write(out: Path, name: str, data: dict, fig) -> list[Path]:
    """NAME.json, then NAME.png carrying its digest: each appears whole or not at all."""
    import matplotlib.pyplot as plt
    atomic_write_json(out / f"{name}.json", data)
    fig.tight_layout()
    with atomic_path(out / f"{name}.png") as tmp:
        fig.savefig(tmp, dpi=100, format="png", metadata={"Description": f"sha256 of {name}.json: {digest(data)}"})
    plt.close(fig)
    return [out / f"{name}.json", out / f"{name}.png"]


def fraction(x: Fraction) -> str:
    return str(x) if x.denominator > 1 else f"{x.numerator}"


def shown(text: str) -> str:
    """A token as a label: each space a middle dot, a newline \\n, nothing matplotlib reads as mathematics."""
    return repr(text)[1:-1].replace(" ", "\u00b7").replace("$", r"\$") or "''"


# ---- the data ------------------------------------------------------------------------------------

def tree_mask_data(heads_path, nodes: int = 8) -> dict:
    """The Medusa tree of `nodes` nodes built from the heads' measured accuracies, with each node's
    chance of acceptance (the product along its path), its depth and the ancestor mask."""
    from ..methods.medusa import MedusaHeads
    accuracy = MedusaHeads.load(heads_path).accuracy
    tree = from_accuracies(accuracy, nodes)
    chance = []
    for p, r, d in zip(tree.parents, tree.ranks, tree.depth[1:].tolist()):
        chance.append((chance[p] if p >= 0 else 1.0) * float(accuracy[d - 1, r]))
    return {"heads": Path(heads_path).name, "nodes": nodes, "parents": list(tree.parents), "ranks": list(tree.ranks),
            "choices": [list(c) for c in choices_of(tree)], "depth": tree.depth.tolist(),
            "chance": [round(c, 4) for c in chance], "expected_accepted": round(expected_accepted(tree, accuracy), 4),
            "mask": tree.tree_mask.int().tolist()}


@torch.no_grad()
def tree_step_data(model_path, heads_path, tokenizer_path, prompt: str = STEP_PROMPT, size: str = "8",
                   steps: int = 2) -> dict:
    """The first `steps` steps of greedy Medusa at `size` after `prompt`: what the tree proposed,
    the target's argmax after every token fed, the path `verify.greedy` accepted and the next token."""
    from ..commands.cli import load_model
    from ..decoding import BONUS, CORRECTION, decode
    from ..methods.medusa import Medusa, MedusaHeads
    from ..tokenizer import load_tokenizer
    enc, cpu = load_tokenizer(tokenizer_path), torch.device("cpu")
    target = load_model(model_path, cpu, torch.float32)
    medusa = Medusa(target, MedusaHeads.load(heads_path))
    tree, seen = medusa.shape(size), []

    def watched(name):
        def rule(tokens, p, tree_, q, generator):
            path, nxt = verify.RULES[name](tokens, p, tree_, q, generator)
            seen.append((tokens.tolist(), p.argmax(-1).tolist(), path.tolist(), int(nxt)))
            return path, nxt
        return rule
    medusa.rule = watched  # the loop asks its proposer for the rule: this one also writes down what it judged
    text = enc.encode_ordinary(prompt)
    for _ in decode(target, medusa, [text], Sampling(), [None], 64, shapes={size: tree}):
        if len(seen) == steps:
            break
    out = []
    for n, (tokens, argmax, path, nxt) in enumerate(seen, start=1):
        kind = CORRECTION if tree.child_lists[path[-1]] else BONUS
        out.append({"step": n, "tokens": tokens, "shown": [enc.decode([t]) for t in tokens], "argmax": argmax,
                    "path": path, "next": nxt, "next_shown": enc.decode([nxt]), "kind": kind})
    return {"prompt": prompt, "size": size, "parents": list(tree.parents), "ranks": list(tree.ranks),
            "prompt_tokens": len(text), "steps": out}


def measured(rule, tokens: list[int], parents: tuple, p, q, samples: int, seed: int) -> dict:
    """`samples` runs of a rule of `verify.RULES`' signature on context-free p and q (every node's
    target distribution is p, every node drawn from q): how often it accepted 0, 1, 2, ... tokens,
    and how often the first two tokens out were each pair (a step that gives one token is followed
    by a token of the target's, as the next step would give)."""
    V = len(p)
    P, Q = torch.tensor([float(x) for x in p], dtype=torch.float64), torch.tensor([float(x) for x in q], dtype=torch.float64)
    tree, x = Tree(parents), torch.tensor(tokens)
    generator = torch.Generator().manual_seed(seed)
    accepted, pairs = [0] * (Tree(parents).max_depth + 1), [0] * (V * V)
    for _ in range(samples):
        path, nxt = rule(x, P.expand(len(tokens), V), tree, Q.expand(len(tokens), V), generator)
        out = [tokens[i] for i in path.tolist()[1:]] + [int(nxt)]
        if len(out) == 1:
            out.append(int(sample(P, generator)))
        accepted[len(path) - 1] += 1
        pairs[out[0] * V + out[1]] += 1
    return {"accepted": accepted, "pairs": pairs}


def walk_exact(name: str, tokens: list[int], parents: tuple, p, q) -> tuple[list, list]:
    """The walk of `verify.traversal` or `verify.lossless` (its docstring) on context-free p and q, every
    coin weighed by its probability in fractions: P(accepted = 0, 1, ...) and P(first two tokens)."""
    tree, V = Tree(parents), len(p)

    def traversal(node, w, P):  # [(probability, accepted indices below node, next-token distribution)], P(rejected)
        out, carry = [], Fraction(1)
        for c in tree.children(node):
            x = tokens[c]
            found, rejected = traversal(c, min(Fraction(1), w * P[x] / q[x]), p)
            out += [(carry * pr, [c] + path, nd) for pr, path, nd in found]
            carry *= rejected
            R = [max(Fraction(0), w * P[y] - q[y]) for y in range(V)]
            S = sum(R)
            w, P = (S / (S + 1 - w) if S + 1 - w > 0 else Fraction(1)), ([r / S for r in R] if S > 0 else P)
        return out + [(carry * w, [], P)], carry * (1 - w)

    def top_down(node, P):
        out, carry = [], Fraction(1)
        for c in tree.children(node):
            x = tokens[c]
            accept = min(Fraction(1), P[x] / q[x])
            out += [(carry * accept * pr, [c] + path, nd) for pr, path, nd in top_down(c, p)[0]]
            carry *= 1 - accept
            R = [max(Fraction(0), P[y] - q[y]) for y in range(V)]
            P = [r / sum(R) for r in R] if sum(R) > 0 else P
        return out + [(carry, [], P)], Fraction(0)

    found, _ = traversal(0, Fraction(1), p) if name == "traversal" else top_down(0, p)
    accepted, pairs = [Fraction(0)] * (tree.max_depth + 1), [Fraction(0)] * (V * V)
    for pr, path, nd in found:
        accepted[len(path)] += pr
        out = [tokens[i] for i in path]  # the accepted tokens, then the next from nd, then (if need be) from p
        for y, z in product(range(V), repeat=2):
            if len(out) >= 2:
                pairs[y * V + z] += pr if (y, z) == tuple(out[:2]) else 0
            elif out:
                pairs[y * V + z] += pr * nd[z] if y == out[0] else 0
            else:
                pairs[y * V + z] += pr * nd[y] * p[z]
    return accepted, pairs


def block_coins_data(samples: int = 1000, seed: int = 0) -> dict:
    """Sun et al.'s example, block by block: the token-level rule's coins min(1, p/q), block
    verification's weights p_i, S_1 and coins h_i (chapter 6's algorithm), P(tau = 0, 1, 2) for each
    rule, and the counts of `samples` seeded runs of each."""
    p, q = SUN_P, SUN_Q
    rows = []
    for block in product(range(2), repeat=2):
        ratios = [p[x] / q[x] for x in block]
        coins = [min(Fraction(1), r) for r in ratios]  # token level: x_i passes with min(1, p/q)
        token_level = [1 - coins[0], coins[0] * (1 - coins[1]), coins[0] * coins[1]]
        w1 = min(Fraction(1), ratios[0])
        w2 = min(Fraction(1), w1 * ratios[1])
        S1 = sum(max(Fraction(0), w1 * p[y] - q[y]) for y in range(2))
        h = [S1 / (S1 + 1 - w1) if S1 + 1 - w1 > 0 else Fraction(1), w2]
        tau = [(1 - h[0]) * (1 - h[1]), h[0] * (1 - h[1]), h[1]]  # tau is the LAST i with eta_i < h_i
        tokens = [0, *block]
        rows.append({"block": "".join("ab"[x] for x in block), "proposed": fraction(q[block[0]] * q[block[1]]),
                     "coins_token_level": [fraction(c) for c in coins], "p1": fraction(w1), "p2": fraction(w2),
                     "S1": fraction(S1), "h": [fraction(x) for x in h],
                     "tau_token_level": [fraction(t) for t in token_level], "tau_block": [fraction(t) for t in tau],
                     "measured_token_level": measured(speculative_sampling, tokens, chain(2).parents, p, q, samples,
                                                      seed)["accepted"],
                     "measured_block": measured(verify.block, tokens, chain(2).parents, p, q, samples, seed)["accepted"]})
    mean = lambda key: sum(Fraction(r["proposed"]) * sum(i * Fraction(t) for i, t in enumerate(r[key])) for r in rows)
    return {"p": [fraction(x) for x in p], "q": [fraction(x) for x in q], "k": 2, "samples": samples, "seed": seed,
            "blocks": rows, "expected_token_level": fraction(mean("tau_token_level")),
            "expected_block": fraction(mean("tau_block"))}


def traversal_coins_data(samples: int = 400, seed: int = 0) -> dict:
    """Chapter 6's traversal example: a first token x1 ~ q with two children ~ q, all eight draws:
    P(accepted = 0, 1, 2) and P(first two tokens) for traversal and the top-down walk, exactly and
    in `samples` seeded runs of `verify.traversal` and `verify.lossless` per draw."""
    p, q, parents = SUN_P, SUN_Q, (-1, 0, 0)
    draws, totals = [], {"traversal": Fraction(0), "lossless": Fraction(0)}
    out_pairs = {"traversal": [Fraction(0)] * 4, "lossless": [Fraction(0)] * 4}
    for x1, c1, c2 in product(range(2), repeat=3):
        tokens, chance = [0, x1, c1, c2], q[x1] * q[c1] * q[c2]
        row = {"draw": "ab"[x1] + "(" + "ab"[c1] + "ab"[c2] + ")", "probability": fraction(chance)}
        for name in ("traversal", "lossless"):
            accepted, pairs = walk_exact(name, tokens, parents, p, q)
            totals[name] += chance * sum(i * a for i, a in enumerate(accepted))
            out_pairs[name] = [o + chance * x for o, x in zip(out_pairs[name], pairs)]
            run = measured(getattr(verify, name), tokens, parents, p, q, samples, seed)
            row |= {f"accepted_{name}": [fraction(a) for a in accepted], f"pairs_{name}": [fraction(x) for x in pairs],
                    f"measured_accepted_{name}": run["accepted"], f"measured_pairs_{name}": run["pairs"]}
        draws.append(row)
    return {"p": [fraction(x) for x in p], "q": [fraction(x) for x in q], "parents": list(parents), "samples": samples,
            "seed": seed, "draws": draws, "expected_traversal": fraction(totals["traversal"]),
            "expected_lossless": fraction(totals["lossless"]),
            "pairs": {name: [fraction(x) for x in v] for name, v in out_pairs.items()}}


def residual_walk_data() -> dict:
    """Chapter 6's two siblings drawn from q below a node whose target is p: what the first child
    passes (min(p, q)), the residual p' = `sampling.residual(p, q)` its rejection leaves, the second
    child against p', what is left (p''), and what comes out, which is p."""
    p = torch.tensor([1 / 2, 1 / 3, 1 / 6], dtype=torch.float64)
    q = torch.tensor([1 / 3, 1 / 6, 1 / 2], dtype=torch.float64)
    first = torch.minimum(p, q)
    p1 = residual(p, q)
    second = torch.minimum(p1, q)
    p2 = residual(p1, q)
    reject1, reject2 = 1 - float(first.sum()), 1 - float(second.sum())
    emitted = first + reject1 * (second + reject2 * p2)
    rounded = lambda t: [round(float(x), 6) for x in t]
    return {"tokens": ["a", "b", "c"], "p": rounded(p), "q": rounded(q), "first_child": rounded(first),
            "first_rejected": round(reject1, 6), "p_after_first": rounded(p1), "second_child": rounded(second),
            "second_rejected": round(reject2, 6), "p_after_second": rounded(p2), "emitted": rounded(emitted)}


def cost_curve_data(forward_cost: dict, alpha: float = 0.8, c: float = 0.1) -> dict:
    """A draft chain of k proposals verified in a forward over t = k + 1 tokens: tau(alpha, k)
    (`expected_tokens`), and its speedup by chapter 5's model, tau / (F(t) + k c), with F = 1
    (`expected_speedup`: a GPU) and with the measured F(t) of `forward_cost` (a `figures cost`
    report), for a draft of cost c and for free proposals (c = 0, prompt lookup's)."""
    F = {r["tokens"]: r["plain_steps"] for r in forward_cost["rows"]}
    rows = []
    for k in range(17):  # chains of up to 16, the sizes chapters 5-8 use; F where it was measured
        tau, t = expected_tokens(alpha, k), k + 1
        rows.append({"tokens": t, "k": k, "tau": round(tau, 6), "gpu": round(expected_speedup(alpha, c, k), 6),
                     "F": F.get(t), "measured": round(tau / (F[t] + k * c), 6) if t in F else None,
                     "measured_free": round(tau / F[t], 6) if t in F else None})
    return {"alpha": alpha, "c": c, "device": forward_cost["device"], "model": forward_cost["model"],
            "forward_cost": [{"tokens": r["tokens"], "plain_steps": r["plain_steps"]} for r in forward_cost["rows"]],
            "rows": rows}


# ---- the pictures --------------------------------------------------------------------------------

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
