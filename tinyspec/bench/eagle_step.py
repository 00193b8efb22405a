"""Chapter 9's EAGLE step, printed (`python -m tinyspec figures eagle-tree eagle-costs`): every node
EAGLE-2's `grow_tree` makes in the first step after a prompt, and what each piece of a step costs."""

from __future__ import annotations

from functools import partial

import torch

from ..commands.cli import load_encoding, load_model
from ..commands.method import load_weights
from ..kvcache import KVCache
from ..speed.timing import forward_call, interleaved_medians
from ..tree import chain


@torch.no_grad()
def eagle_tree(model_path, head_path, tokenizer_path, top_k: int = 2, depth: int = 6, total_tokens: int = 16,
               prompt: str = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n") -> None:
    """Print every node `grow_tree` makes in the first step after `prompt` (value = the product of
    the head's probabilities along its path; * = kept), then the step the target took."""
    from ..decoding import Proposal, Row, verify
    from ..methods.eagle import HeadDrafter
    from ..methods.growth import grow_tree
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
