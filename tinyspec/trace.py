"""A trace of a run: every step of it drawn in one self-contained HTML page (`--trace run.html`).

A speculative step is easier to see than to read. The page shows, step after step, the tree the
method proposed below the root, the target's probability p of each node's token (at the node's
parent) and the drafter's q where it drew the node, what the rule made of each node (accepted;
rejected, with its coin u against min(1, p/q) or the target's argmax it missed; never reached),
the token the target drew at the end (a correction from the residual, or a bonus) and the cache
slots kept. Clicking a node shows the top few tokens of p (and q) there.

The trace watches the loop, it runs nothing of its own: a `Trace` is the loop's observer
(`decoding.Observer`), handed the rule to wrap (so the rule tells it each coin as it draws it,
through the rule's `note`) and each row's verified step (the tree, p, q, the path kept). With no
trace the loop's observer is `decoding.NO_OBSERVER`, which does nothing.

The page is `trace_page.html` with the run inlined as JSON: no network, no library, a few hundred
lines of plain JavaScript and SVG that draw a page of steps at a time, so a run of thousands of
steps stays usable; the file grows with the nodes proposed (top-5 of p and q per node, never a
whole distribution), and it says its own size.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .decoding import Fed, Observer, Row, Step, Steps
from .files import atomic_path

TOP = 5  # tokens of p and q kept per node: what a click shows
PAGE = Path(__file__).with_name("trace_page.html")
DATA, SIZE = "/*TRACE_DATA*/", "/*TRACE_SIZE*/"  # where the template takes the run and its own size
SIZE_WIDTH = len(SIZE)  # the size is written in the placeholder's width, so writing it changes no size


def rounded(x: float) -> float:
    """Four significant digits: what a reader compares, and a file a third the size."""
    return float(f"{x:.4g}")


def top(dist: torch.Tensor) -> list[list]:
    """(n, V) -> for each row its TOP most likely tokens, [[token, probability], ...]."""
    values, tokens = dist.float().topk(min(TOP, dist.shape[-1]), dim=-1)
    return [[[t, rounded(v)] for t, v in zip(ts, vs) if v > 0] for ts, vs in zip(tokens.tolist(), values.tolist())]


class Trace(Observer):
    """Records what the loop does for one row (batch 1) while it runs; `watch` the loop's steps,
    then `write` the page. rule_name: the acceptance rule the run judges by."""

    def __init__(self, rule_name: str):
        self.rule_name = rule_name
        self.coins: dict[int, dict] = {}  # what the rule told of each node of the step it is judging
        self.judged: dict[int, dict] = {}  # id(Step) -> the tree and its numbers, until the loop yields the Step
        self.steps: list[tuple[Step, dict | None]] = []
        self.prompt: list[int] = []

    # ---- the loop's observer ----

    def rule(self, accept):
        def watched(tokens, p, tree, q, generator):
            self.coins = {}
            return accept(tokens, p, tree, q, generator, note=self.note)
        return watched

    def note(self, node: int, **facts) -> None:
        self.coins.setdefault(node, {}).update({k: rounded(v) if isinstance(v, float) else v
                                                for k, v in facts.items()})

    def verified(self, row: Row, proposal, fed: Fed, p: torch.Tensor, path: torch.Tensor, before: int,
                 step: Step) -> None:
        kept = path if fed.at is None else fed.at[path]
        record = {"root_pos": before, "slots": [before + i for i in kept.tolist()]}
        if proposal is not None and proposal.tree is not None:
            record |= self.tree(fed, p, path, proposal, before)
        self.coins = {}
        self.judged[id(step)] = record

    def tree(self, fed: Fed, p: torch.Tensor, path: torch.Tensor, proposal, before: int) -> dict:
        """The step's tree, node by node (index a: 0 the root, node i at i + 1, as the rules count)."""
        tree, q = proposal.tree, proposal.q
        tokens = (fed.x if fed.at is None else fed.x[fed.at]).tolist()
        parents = [-1] + tree.parent_index.tolist()
        depth, on_path = tree.depth.tolist(), set(path.tolist())
        coin_rule = any("u" in c for c in self.coins.values())
        whole = self.rule_name in ("block", "traversal")  # judges nodes below a rejection too
        ptop, qtop = top(p), top(q) if q is not None else None
        nodes = []
        for a in range(1, len(tokens)):
            b, x, coins = parents[a], tokens[a], self.coins.get(a, {})
            if a in on_path:
                outcome = "accepted"
            elif (b in on_path or whole) and ("u" in coins or not coin_rule):
                outcome = "rejected"
            else:
                outcome = "unreached"
            nodes.append({"t": x, "up": b, "d": depth[a], "pos": before + depth[a], "out": outcome,
                          "p": rounded(float(p[b, x])), "q": None if q is None else rounded(float(q[a, x])),
                          "ptop": ptop[b], "qtop": None if qtop is None else qtop[a]} | coins)
        last = path.tolist()[-1]
        return {"root": tokens[0], "ptop_root": ptop[0], "nodes": nodes, "path": path.tolist(), "end": last,
                "end_ptop": ptop[last], "root_coin": self.coins.get(0)}

    # ---- the run ----

    def watch(self, steps: Steps, prompt: list[int]) -> Steps:
        """The loop's steps, passed on as they come; each is kept with what was judged in it."""
        self.prompt = list(prompt)
        for produced in steps:
            for step in produced.values():
                self.steps.append((step, self.judged.pop(id(step), None)))
            yield produced

    def data(self, enc, stats: dict, command: str, settings: dict) -> dict:
        """The run as the page reads it: each step as the loop yielded it (tokens, sources, counts)
        and what the trace saw of it; the text of every token that appears."""
        steps, seen = [], set(self.prompt)
        for i, (step, judged) in enumerate(self.steps):
            entry = {"i": i, "tokens": step.tokens, "sources": step.sources, "proposed": step.proposed,
                     "accepted": step.accepted, "size": step.size, "fed": step.fed, "stop": step.stop}
            if judged:
                entry |= judged
            steps.append(entry)
            seen.update(step.tokens)
            for node in (judged or {}).get("nodes", ()):
                seen.add(node["t"])
                seen.update(t for t, _ in node["ptop"] + (node["qtop"] or []))
            seen.update(t for t, _ in (judged or {}).get("end_ptop", ()))
        vocab = {t: enc.decode_single_token_bytes(t).decode("utf-8", errors="replace") for t in sorted(seen)}
        return {"command": command, "settings": settings, "summary": stats, "prompt": self.prompt,
                "vocab": vocab, "steps": steps}

    def write(self, path, enc, stats: dict, command: str, settings: dict) -> int:
        """Writes the page (atomically); returns its size in bytes."""
        return write_page(path, self.data(enc, stats, command, settings))


def page(data: dict) -> str:
    """The template with the run inlined: JSON inside a script element, '<' escaped so no string
    in it can close the element, and the page's own size, written in a placeholder of its width."""
    blob = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")
    template = PAGE.read_text(encoding="utf-8")
    size = len(template.encode("utf-8")) - len(DATA) + len(blob.encode("utf-8"))
    return template.replace(SIZE, f"{size:>{SIZE_WIDTH}}").replace(DATA, blob)  # the size first: not in the data


def write_page(path, data: dict) -> int:
    """Writes the page atomically (`files.atomic_path`); returns its size in bytes."""
    html = page(data).encode("utf-8")
    with atomic_path(path) as tmp:
        tmp.write_bytes(html)
    return len(html)


def read_data(html: str) -> dict:
    """The run inlined in a page (for tests and tools): the JSON of its data element."""
    start = html.index('<script id="trace-data" type="application/json">')
    start = html.index(">", start) + 1
    return json.loads(html[start:html.index("</script>", start)])
