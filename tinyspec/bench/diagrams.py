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
This file computes the data; `drawings.py` draws it.
"""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction
from itertools import product
from pathlib import Path

import torch

from ..methods.draft import expected_speedup, expected_tokens, speculative_sampling
from ..sampling import Sampling, residual, sample
from ..tree import Tree, chain, choices_of, expected_accepted, from_accuracies
from .. import verify

DIAGRAMS = ("tree-mask", "tree-step", "block-coins", "traversal-coins", "residual-walk", "cost-curve")
STEP_PROMPT = "def fibonacci(n):"  # the README's and docs/example_prompts.txt's first prompt
SUN_P, SUN_Q = (Fraction(1, 3), Fraction(2, 3)), (Fraction(2, 3), Fraction(1, 3))  # Sun et al.'s a, b


def digest(data: dict) -> str:
    """What a figure's PNG records of the JSON it was drawn from."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def fraction(x: Fraction) -> str:
    return str(x) if x.denominator > 1 else f"{x.numerator}"


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
