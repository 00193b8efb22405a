"""The book's worked examples as figures (`python -m tinyspec figures tree-mask ...`, bench/diagrams.py)
hold what the code and the shipped weights give today. Each test recomputes a figure's data with
the code and compares it with the JSON saved beside the PNG, checks the data by a second route
(the book's own fractions, a plain forward, a theorem), and checks that the PNG was drawn from that
JSON: the PNG records the JSON's digest. Integers and fractions are compared exactly; floats within
a tolerance, and no token depends on a near tie (the steps' smallest gap between the two best
logits is 0.016), so the tests pass on any CPU's instruction set."""
import json
import math
import re
import struct
from fractions import Fraction as F
from pathlib import Path

import pytest
import torch

from tinyspec.bench import diagrams, drawings
from tinyspec.commands.cli import WEIGHTS

ROOT = WEIGHTS.parent
FIGURES = ROOT / "docs" / "figures"
FILES = {name: file for name, (file, _) in drawings.FIGURE_OF.items()}
BOOK = [ROOT / "README.md", ROOT / "walkthrough.md", *sorted((ROOT / "docs").glob("*.md"))]
IMAGE = re.compile(r"^!\[[^\]]*\]\(([^)]+\.png)\)$")
ARITHMETIC = {"residual.png", "tau_and_speedup.png"}  # `figures residual speedup`: formulas, nothing measured


def png_text(path) -> dict[str, str]:
    """The tEXt chunks of a PNG file."""
    data, out, at = path.read_bytes(), {}, 8
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"tEXt":
            key, _, value = data[at + 8:at + 8 + length].partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        at += 12 + length
    return out


def saved(file: str, folder=FIGURES) -> dict:
    """A figure's saved data, once its PNG is shown to be drawn from it and small enough to ship."""
    data = json.loads((folder / f"{file}.json").read_text())
    png = folder / f"{file}.png"
    assert png.stat().st_size < 200_000, f"{png.name} is {png.stat().st_size:,} bytes: keep a figure under 200 kB"
    assert png_text(png).get("Description") == f"sha256 of {file}.json: {diagrams.digest(data)}", \
        f"{png.name} was not drawn from {file}.json: run python -m tinyspec figures {file.replace('_', '-')} --out docs/figures"
    return data


def within(count: int, n: int, p: F, sds: float = 4.5) -> bool:
    """A count of n seeded runs agrees with probability p (4.5 standard deviations, as the rules' own
    statistical tests: a correct rule fails fewer than once in 100,000 seeds)."""
    return abs(count - n * float(p)) <= sds * math.sqrt(n * float(p) * (1 - float(p))) + 1e-9


def test_every_worked_example_figure_is_drawn_shown_and_listed():
    """Each worked example is in the book (an image line), in `figures --help`, and saved."""
    from tinyspec.bench.figures import build_parser
    book, helped = (ROOT / "walkthrough.md").read_text(), build_parser().format_help()
    for name, file in FILES.items():
        assert f"](docs/figures/{file}.png)" in book, f"walkthrough.md shows no docs/figures/{file}.png"
        assert f"figures {name} --out docs/figures" in book, f"walkthrough.md does not say how {file}.png is drawn"
        assert name in " ".join(helped.split()).replace("- ", "-"), f"figures --help does not list {name}"
        saved(file)


def test_a_figure_drawn_from_other_data_is_caught(tmp_path):
    """The digest check fails a PNG whose JSON changed after it was drawn, and passes a fresh pair."""
    pytest.importorskip("matplotlib")
    data = diagrams.residual_walk_data()
    drawings.draw("residual-walk", data, tmp_path)
    assert saved("residual_walk", tmp_path) == json.loads(json.dumps(data))
    (tmp_path / "residual_walk.json").write_text(json.dumps(dict(data, first_rejected=0.25)))
    with pytest.raises(AssertionError, match="was not drawn from"):
        saved("residual_walk", tmp_path)


def test_the_tree_mask_figure_is_the_shipped_heads_tree():
    """The 8-node tree is `from_accuracies` on the shipped heads' accuracies; its mask, depths and
    rank paths are those of the parent list, walked here by hand."""
    data = saved("tree_mask")
    assert data == diagrams.tree_mask_data(WEIGHTS / "medusa.safetensors", data["nodes"])
    parents = data["parents"]
    ancestors = lambda i: {i} | (ancestors(parents[i - 1] + 1) if i else set())  # index 0 the root, node j index j + 1
    assert data["mask"] == [[int(b in ancestors(a)) for b in range(len(parents) + 1)] for a in range(len(parents) + 1)]
    assert data["depth"] == [len(ancestors(a)) - 1 for a in range(len(parents) + 1)]
    for i, (p, choice) in enumerate(zip(parents, data["choices"])):
        assert choice[:-1] == (data["choices"][p] if p >= 0 else []) and choice[-1] == data["ranks"][i]
    assert sum(data["chance"]) == pytest.approx(data["expected_accepted"], abs=1e-3)


def test_the_tree_step_figure_is_greedy_medusa_on_the_shipped_weights():
    """The two steps are what greedy `medusa:8` does today after the prompt; every argmax the
    figure's colours rest on is the target's, by a plain forward over that node's own path; the
    accepted path follows the argmaxes; and the text the steps write is plain greedy decoding's."""
    from tinyspec.commands.cli import load_model
    from tinyspec.decoding import autoregressive
    from tinyspec.results import run
    from tinyspec.sampling import Sampling
    from tinyspec.tokenizer import load_tokenizer
    data = saved("tree_step")
    assert data == diagrams.tree_step_data(WEIGHTS / "target.safetensors", WEIGHTS / "medusa.safetensors",
                                           WEIGHTS / "tokenizer.tiktoken", data["prompt"], data["size"], len(data["steps"]))
    target = load_model(WEIGHTS / "target.safetensors", torch.device("cpu"), torch.float32)
    enc, parents = load_tokenizer(WEIGHTS / "tokenizer.tiktoken"), data["parents"]
    text = enc.encode_ordinary(data["prompt"])
    written = [data["steps"][0]["tokens"][0]]  # the first root: the prefill's token
    for step in data["steps"]:
        tokens, argmax, path = step["tokens"], step["argmax"], step["path"]
        for a in range(len(tokens)):
            line, i = [], a
            while True:  # the node's own text: the root, then its ancestors' tokens and its own
                line.insert(0, tokens[i])
                if i == 0:
                    break
                i = parents[i - 1] + 1
            with torch.no_grad():
                logits, _ = target(torch.tensor(text + line)[None])
            assert int(logits[0, -1].argmax()) == argmax[a], f"step {step['step']}, token {a}"
        assert path[0] == 0 and all(parents[b - 1] + 1 == a for a, b in zip(path, path[1:]))
        assert all(tokens[b] == argmax[a] for a, b in zip(path, path[1:])) and step["next"] == argmax[path[-1]]
        leaf = path[-1] not in {p + 1 for p in parents}
        assert step["kind"] == ("bonus" if leaf else "correction")
        assert tokens[0] == written[-1], "a step's root is the token the step before ended with"
        written += [tokens[i] for i in path[1:]] + [step["next"]]  # the accepted tokens, then the next: the next root
        text += [tokens[i] for i in path]
    plain = run(autoregressive(target, [enc.encode_ordinary(data["prompt"])], Sampling(), [None], len(written))).token_ids
    assert plain == written


# Sun et al.'s example as the book works it (chapter on exact rules, block verification's table):
# block: (p_1, p_2, S_1, h_1, h_2, P(tau = 0, 1, 2)); the token-level rule's P(n = 0, 1, 2) by hand.
BOOK_BLOCKS = {"aa": ("1/2", "1/4", "0", "0", "1/4", ("3/4", "0", "1/4"), ("1/2", "1/4", "1/4")),
               "ab": ("1/2", "1", "0", "0", "1", ("0", "0", "1"), ("1/2", "0", "1/2")),
               "ba": ("1", "1/2", "1/3", "1", "1/2", ("0", "1/2", "1/2"), ("0", "1/2", "1/2")),
               "bb": ("1", "1", "1/3", "1", "1", ("0", "0", "1"), ("0", "0", "1"))}


def test_the_block_coins_figure_is_the_books_table_and_the_rules_runs():
    """The coins and kept tokens are the book's table (10/9 tokens against 11/9), and the seeded
    runs of `verify.block` and the token-level rule the figure shows are today's, and agree with it."""
    data = saved("block_coins")
    assert data == diagrams.block_coins_data(data["samples"], data["seed"])
    assert (F(data["expected_token_level"]), F(data["expected_block"])) == (F(10, 9), F(11, 9))
    n = data["samples"]
    for row in data["blocks"]:
        p1, p2, S1, h1, h2, tau, token_level = BOOK_BLOCKS[row["block"]]
        assert (row["p1"], row["p2"], row["S1"], row["h"], row["tau_block"], row["tau_token_level"]) == \
            (p1, p2, S1, [h1, h2], list(tau), list(token_level)), row["block"]
        for key in ("block", "token_level"):
            counts, exact = row[f"measured_{key}"], row[f"tau_{key}"]
            assert sum(counts) == n and all(within(c, n, F(e)) for c, e in zip(counts, exact)), (row["block"], key)


def test_the_traversal_coins_figure_is_the_books_example_and_the_rules_runs():
    """34/27 tokens against the top-down walk's 32/27; both give the first two tokens with the
    target's p(x) p(y); the seeded runs of `verify.traversal` and `verify.lossless` are today's and
    agree with the exact figures draw by draw."""
    data = saved("traversal_coins")
    assert data == diagrams.traversal_coins_data(data["samples"], data["seed"])
    assert (F(data["expected_traversal"]), F(data["expected_lossless"])) == (F(34, 27), F(32, 27))
    p = [F(x) for x in data["p"]]
    assert all([F(x) for x in data["pairs"][name]] == [a * b for a in p for b in p] for name in ("traversal", "lossless"))
    assert sum(F(d["probability"]) for d in data["draws"]) == 1
    n = data["samples"]
    for d in data["draws"]:
        for name in ("traversal", "lossless"):
            for key in ("accepted", "pairs"):
                counts, exact = d[f"measured_{key}_{name}"], d[f"{key}_{name}"]
                assert sum(counts) == n and all(within(c, n, F(e)) for c, e in zip(counts, exact)), (d["draw"], name, key)


def test_the_residual_walk_figure_is_the_books_table():
    """p' and p'' are `sampling.residual`'s, the book's (1/2, 1/2, 0) and (1/3, 2/3, 0); what comes
    out is p."""
    data = saved("residual_walk")
    now = diagrams.residual_walk_data()
    assert data.keys() == now.keys() and all(data[k] == pytest.approx(now[k], abs=1e-6) for k in data if k != "tokens")
    book = {"first_child": (1 / 3, 1 / 6, 1 / 6), "first_rejected": 1 / 3, "p_after_first": (1 / 2, 1 / 2, 0),
            "second_child": (1 / 3, 1 / 6, 0), "second_rejected": 1 / 2, "p_after_second": (1 / 3, 2 / 3, 0),
            "emitted": data["p"]}
    for key, value in book.items():
        assert data[key] == pytest.approx(value, abs=1e-6), key


def test_the_cost_curve_figure_is_the_cost_model_on_the_saved_forward_costs():
    """The curve is `expected_speedup` and tau / (F(k + 1) + k c) on today's docs/figures/forward_cost.json
    (remeasured, the figure must be redrawn); chapter 5's worked example, alpha = 0.8, c = 0.1, k = 4,
    is 2.40 at F = 1."""
    from tinyspec.methods.draft import expected_speedup
    data = saved("cost_curve")
    costs = json.loads((FIGURES / "forward_cost.json").read_text())
    assert data["forward_cost"] == [{"tokens": r["tokens"], "plain_steps": r["plain_steps"]} for r in costs["rows"]], \
        "forward_cost.json was measured again: run python -m tinyspec figures cost-curve --out docs/figures"
    now = diagrams.cost_curve_data(costs, data["alpha"], data["c"])
    assert [r["tokens"] for r in data["rows"]] == [r["tokens"] for r in now["rows"]]
    for old, new in zip(data["rows"], now["rows"]):
        assert old == pytest.approx(new, abs=1e-6)
    row = {r["k"]: r for r in data["rows"]}
    assert round(row[4]["gpu"], 2) == 2.40 and row[4]["gpu"] == pytest.approx(expected_speedup(0.8, 0.1, 4), abs=1e-6)
    assert row[4]["measured"] == pytest.approx(row[4]["tau"] / (row[4]["F"] + 0.4), abs=1e-6)
    assert all(r["measured"] is None or r["measured"] <= r["measured_free"] for r in data["rows"])


def test_the_figures_command_draws_the_worked_examples(tmp_path, capsys):
    """`figures NAME` writes NAME's PNG and JSON where --out says, and refuses a forward-cost file
    that is not one in one line."""
    pytest.importorskip("matplotlib")
    from conftest import refused
    from tinyspec.bench import figures
    figures.main(["residual-walk", "cost-curve", "--out", str(tmp_path)])
    assert {p.name for p in tmp_path.iterdir()} == {"residual_walk.png", "residual_walk.json", "cost_curve.png",
                                                   "cost_curve.json"}
    assert saved("cost_curve", tmp_path) == saved("cost_curve")
    err = refused(figures.main, ["cost-curve", "--forward-cost", str(ROOT / "README.md"), "--out", str(tmp_path)], capsys)
    assert re.search(r"--forward-cost .*README.md is not the forward_cost.json", err) and "Traceback" not in err


def figures_of(doc: Path, text: str | None = None) -> list[tuple[int, str, Path, str]]:
    """(line number, chapter, PNG, caption) of every image line of a document: its chapter is the
    number of the walkthrough's `## N` heading above it (elsewhere none: "")."""
    lines, chapter, out = (doc.read_text() if text is None else text).splitlines(), "", []
    for i, line in enumerate(lines):
        heading = re.match(r"## (\d+) ", line)
        if heading and doc.name == "walkthrough.md":
            chapter = heading.group(1)
        image = IMAGE.match(line)
        if image:
            out.append((i + 1, chapter, (doc.parent / image.group(1)).resolve(), lines[i + 1] if i + 1 < len(lines) else ""))
    return out


def machine_of(report: dict) -> str | None:
    """The machine a saved report records (its device, with its threads where kept apart); None for
    a bare "cpu" or none."""
    device = report.get("device")
    if not device or device.split(" ")[0] == "cpu":
        return None
    threads = report.get("threads")
    return device if not threads or "thread" in device else f"{device}, {threads} thread" + "s" * (threads > 1)


def caption_problems(doc: Path, text: str | None = None) -> list[str]:
    """Figures not numbered in order ("Figure C.N." in the walkthrough, C its chapter; "Figure N."
    elsewhere), without a one-line italic caption right below the image, or whose caption does not
    name the machine of the report it was drawn from: the JSON beside the PNG, else the `docs/....json`
    the caption cites. A figure with neither is arithmetic, or the caption names no source."""
    bad, count = [], {}
    for line, chapter, png, caption in figures_of(doc, text):
        count[chapter] = count.get(chapter, 0) + 1
        number = f"{chapter}.{count[chapter]}" if chapter else f"{count[chapter]}"
        where = f"{doc.name}:{line} {png.name}"
        if not re.fullmatch(rf"\*Figure {re.escape(number)}\. [^*]+\*", caption.replace(r"\*", "")):
            bad.append(f"{where}: the line below is not the caption *Figure {number}. ...*: {caption[:60]!r}")
            continue
        cited = re.findall(r"`(docs/[\w/]+\.json)`", caption)
        source = png.with_suffix(".json") if png.with_suffix(".json").is_file() else ROOT / cited[0] if cited else None
        if source is None:
            if png.name not in ARITHMETIC:
                bad.append(f"{where}: its caption cites no saved report (`docs/....json`) the figure was drawn from")
            continue
        machine = machine_of(json.loads(source.read_text()))
        if machine is None and png.stem not in FILES.values():
            bad.append(f"{where}: {source.name} records no machine: measure it again")
        elif machine is not None and f"Measured on: {machine}." not in caption:
            bad.append(f"{where}: the caption does not say Measured on: {machine}. ({source.name})")
    return bad


def test_every_figure_is_numbered_with_a_caption_naming_its_machine():
    """Every figure of the book is numbered in order per chapter, with its caption right below, and
    a figure drawn from a measurement names the machine its saved report records."""
    from tinyspec.bench.tables import fill_captions
    bad = [problem for doc in BOOK for problem in caption_problems(doc)]
    assert not bad, "\n".join(bad)
    stale = [doc.name for doc in BOOK if fill_captions(doc.read_text(), doc.parent) != doc.read_text()]
    assert not stale, f"{stale}: python -m tinyspec figures tables would change a caption's machine"


def test_every_png_of_docs_figures_is_in_the_book():
    """A PNG under docs/figures/ that no document shows is stale: show it where it teaches or delete
    it (and the code that draws it)."""
    shown_ = {png for doc in BOOK for _, _, png, _ in figures_of(doc)}
    assert all(png.is_file() for png in shown_), [str(p) for p in shown_ if not p.is_file()]
    unshown = sorted(str(p.relative_to(ROOT)) for p in FIGURES.rglob("*.png") if p.resolve() not in shown_)
    assert not unshown, f"PNGs no document shows: {unshown}"


def test_a_figure_out_of_order_or_naming_no_machine_is_caught():
    """The caption check fails a figure numbered out of order, one with no caption, and one drawn
    from a measured report whose caption does not name that machine."""
    doc = ROOT / "walkthrough.md"
    lines = doc.read_text().splitlines()
    at = {png.name: line - 1 for line, _, png, _ in figures_of(doc)}
    assert not caption_problems(doc)
    swapped = list(lines)
    swapped[at["block_coins.png"] + 1] = swapped[at["block_coins.png"] + 1].replace("Figure 7.3.", "Figure 7.4.")
    assert any("block_coins.png" in p for p in caption_problems(doc, "\n".join(swapped)))
    bare = list(lines)
    bare[at["tree_mask.png"] + 1] = ""
    assert any("tree_mask.png" in p for p in caption_problems(doc, "\n".join(bare)))
    other = list(lines)
    other[at["ledger.png"] + 1] = re.sub(r"Measured on: [^*]+\.", "Measured on: NVIDIA H200.", other[at["ledger.png"] + 1])
    assert any("ledger.png" in p and "Measured on" in p for p in caption_problems(doc, "\n".join(other)))
    from tinyspec.bench.tables import fill_captions  # and the refill puts the report's machine back
    assert fill_captions("\n".join(other) + "\n", doc.parent) == "\n".join(lines) + "\n"
