"""--trace FILE.html (`trace.py`): the page holds the run's own steps, the trace changes nothing
in the run, bad paths are refused before it, and (slow, where Debian's chromium is installed) a
real browser draws one tree per step with the JSON's numbers."""
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from tinyspec.commands import generate
from tinyspec.decoding import ACCEPTED, BONUS, CORRECTION
from tinyspec.trace import read_data

from conftest import refused

PROMPT = "def fibonacci(n):"


def traced(tmp_path, monkeypatch, capsys, *flags, n=24, name="run.html"):
    """Runs generate with --json and --trace; returns (the page's data, the run's --json stats and
    tokens, the Steps the loop yielded, the page's text)."""
    yielded, counted = [], generate.run

    def keep(steps):
        for produced in steps:
            yielded.extend(produced.values())
            yield produced
    # the loop's own Steps, as `results.run` counts them
    monkeypatch.setattr(generate, "run", lambda steps, printer, device: counted(keep(steps), printer, device))
    path = tmp_path / name
    generate.main(["--prompt", PROMPT, "--max-new-tokens", str(n), "--json", "--trace", str(path), *flags])
    out = json.loads(capsys.readouterr().out)
    html = path.read_text(encoding="utf-8")
    return read_data(html), out, yielded, html


RUNS = [  # every kind of proposal, and every rule's coins
    ("--method", "draft"),  # a chain, greedy
    ("--method", "draft", "--temperature", "1", "--seed", "1"),  # Leviathan's rule: u against min(1, p/q)
    ("--method", "draft", "--temperature", "1", "--accept", "block"),
    ("--method", "medusa", "--temperature", "1", "--seed", "2"),  # a static tree, pointmass
    ("--method", "eagle", "--temperature", "1", "--seed", "3"),  # a dynamic tree, SpecInfer's walk
    ("--method", "eagle", "--temperature", "1", "--accept", "traversal"),
    ("--method", "medusa", "--temperature", "1", "--accept", "typical"),
    ("--method", "lookahead"),  # the window fed beside the tree
    ("--method", "rest"),  # retrieved branches
    ("--method", "ar"),  # plain steps only
]


@pytest.mark.parametrize("flags", RUNS, ids=[" ".join(f) for f in RUNS])
def test_the_page_holds_the_runs_own_steps(flags, tmp_path, monkeypatch, capsys):
    data, out, yielded, _ = traced(tmp_path, monkeypatch, capsys, *flags)
    stats, steps = out["stats"], data["steps"]
    assert len(steps) == len(yielded) == stats["target_steps"]
    assert [t for s in steps for t in s["tokens"]] == out["token_ids"]
    for s, y in zip(steps, yielded):
        assert (s["tokens"], s["sources"], s["accepted"], s["proposed"]) == (y.tokens, y.sources, y.accepted,
                                                                              y.proposed)
    for key in ("tau", "acceptance_rate", "acceptance_by_depth", "target_steps", "new_tokens"):
        assert data["summary"].get(key) == stats.get(key), key
    asked = dict(zip(flags[::2], flags[1::2]))
    if asked["--method"] != "ar":
        assert data["settings"]["rule"] == ("greedy" if "--temperature" not in asked else
                                            asked.get("--accept", data["settings"]["rule"]))
    assert data["command"].startswith("python -m tinyspec.generate --prompt 'def fibonacci(n):'")
    rule, spoke = data["settings"]["rule"], 0
    for s in steps[1:]:
        if "nodes" not in s:  # a plain step: one token, the target's
            assert s["proposed"] == 0 and len(s["slots"]) == 1
            continue
        nodes, path = s["nodes"], s["path"]
        assert s["proposed"] == max(nd["d"] for nd in nodes)  # the proposal's depth, as the Step counts it
        assert [nd["out"] for nd in nodes].count("accepted") == s["accepted"] == len(path) - 1
        assert [nodes[a - 1]["t"] for a in path[1:]][:len(s["tokens"])] == s["tokens"][:s["accepted"]]  # (cut)
        assert all(nodes[a - 1]["up"] == b for b, a in zip(path, path[1:]))  # a path down the tree
        assert s["slots"][0] == s["root_pos"] and len(s["slots"]) == s["accepted"] + 1
        assert all(nd["pos"] == s["root_pos"] + nd["d"] for nd in nodes)
        if len(s["tokens"]) > s["accepted"]:  # (unless the budget cut it) the target's own token follows
            assert s["sources"][s["accepted"]] == (CORRECTION if any(nd["up"] == s["end"] for nd in nodes) else BONUS)
        for nd in nodes:  # the rule's own coins, as it drew them
            if rule == "greedy":
                assert (nd["t"] == nd["want"]) == (nd["p"] == 1.0)  # T = 0: p is one-hot at the argmax
                assert nd["out"] != "accepted" or nd["t"] == nd["want"]
                spoke += 1
            elif rule in ("lossless", "pointmass") and nd["out"] != "unreached":
                assert (nd["u"] < nd["ratio"]) == (nd["out"] == "accepted") or abs(nd["u"] - nd["ratio"]) < 1e-3
                spoke += 1
            elif rule == "typical":
                assert nd["out"] != "accepted" or nd["p"] > nd["threshold"] * 0.999
                spoke += 1
            elif rule in ("block", "traversal") and "u" in nd:
                spoke += 1
            if rule not in ("greedy", "typical", "pointmass"):
                assert nd["q"] is not None and nd["qtop"]  # the drafter's q where it drew the node
            assert nd["ptop"] and nd["ptop"][0][1] >= nd["p"] - 1e-3  # p's top tokens at the parent
    assert spoke or asked["--method"] == "ar", "no node of the run was judged"
    assert any(ACCEPTED in s["sources"] for s in steps) or asked["--method"] == "ar"


def test_a_trace_changes_nothing_in_a_greedy_run(tmp_path, monkeypatch, capsys):
    """The same tokens and the same number of steps with and without --trace."""
    for method in ("eagle", "draft"):
        data, traced_out, _, _ = traced(tmp_path, monkeypatch, capsys, "--method", method, n=40)
        generate.main(["--prompt", PROMPT, "--max-new-tokens", "40", "--json", "--method", method])
        plain = json.loads(capsys.readouterr().out)
        assert traced_out["token_ids"] == plain["token_ids"]
        assert traced_out["stats"]["target_steps"] == plain["stats"]["target_steps"] == len(data["steps"])


def test_the_page_says_its_size_and_grows_linearly(tmp_path, monkeypatch, capsys):
    sizes = {}
    for n in (32, 128):
        data, _, _, html = traced(tmp_path, monkeypatch, capsys, "--method", "medusa", n=n, name=f"{n}.html")
        stated = int(re.search(r'const SIZE = Number\("\s*(\d+)"', html).group(1))
        assert stated == os.path.getsize(tmp_path / f"{n}.html")
        assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html
        sizes[n] = stated, sum(len(s.get("nodes", ())) for s in data["steps"])
    (small, nodes_small), (big, nodes_big) = sizes[32], sizes[128]
    per_node = (big - small) / (nodes_big - nodes_small)
    assert per_node < 1500  # bytes a node adds: its token, p, q, coins and top-5 of p and q, never a distribution
    assert big < small + per_node * (nodes_big - nodes_small) * 1.01 + 1


@pytest.mark.parametrize("argv, message", [
    ("--trace {tmp}", "--trace {tmp}: is a folder: give a file name"),
    ("--trace /dev/full", "--trace /dev/full: is a device, not a file"),
    ("--trace {tmp}/dangling", "--trace {tmp}/dangling: cannot write through the link"),
    ("--trace {tmp}/file/run.html", "--trace {tmp}/file/run.html: {tmp}/file is a file, not a folder"),
    ("--trace {tmp}/run.html --batch-size 2", "--trace draws one row's steps"),
    ("--trace {tmp}/run.html --cuda-graph", "--trace draws one row's steps"),
    ("--trace {tmp}/run.html --prompt-file {tmp}/two.txt", "--trace draws one prompt's run"),
])
def test_a_bad_trace_path_is_refused_before_the_run(argv, message, tmp_path, capsys):
    (tmp_path / "dangling").symlink_to(tmp_path / "missing" / "target")
    (tmp_path / "file").write_text("mine")
    (tmp_path / "two.txt").write_text("a\nb\n")
    before = sorted(os.listdir(tmp_path))
    args = argv.format(tmp=tmp_path).split()
    if "--prompt-file" not in args:
        args = ["--prompt", "x"] + args
    err = refused(generate.main, args, capsys)
    assert message.format(tmp=tmp_path) in err
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / "file").read_text() == "mine"


def test_a_trace_into_a_missing_folder_makes_it(tmp_path, monkeypatch, capsys):
    """As every output path: the folders on the way are made (`files.unwritable`)."""
    data, _, _, _ = traced(tmp_path, monkeypatch, capsys, "--method", "draft", n=4, name="new/dir/run.html")
    assert data["steps"]


# ---- in a real browser --------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Dom(HTMLParser):
    """The parts of a dumped page the test reads: each step's section and the nodes of its tree."""

    def __init__(self):
        super().__init__()
        self.steps, self.facts, self.stack = [], {}, []
        self.node, self.texts = None, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = a.get("class", "").split()
        if tag == "section" and "step" in classes:
            self.steps.append({"trees": 0, "nodes": []})
        elif tag == "svg" and "tree" in classes:
            self.steps[-1]["trees"] += 1
        elif tag == "g" and "node" in classes:
            self.node = {"classes": classes, **a, "text": []}
            self.steps[-1]["nodes"].append(self.node)

    def handle_endtag(self, tag):
        if tag == "g":
            self.node = None

    def handle_data(self, data):
        if self.node is not None:
            self.node["text"].append(data)
        self.texts.append(data)


def browse(page, out, tmp_path):
    """The page's DOM once its script ran, and a screenshot of it (Debian's chromium, headless)."""
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1000"]
    dom = subprocess.run(flags + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    subprocess.run(flags + [f"--screenshot={out}", page.as_uri()], capture_output=True, timeout=120)
    return dom


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (CI installs Debian's: apt-get install chromium)")
@pytest.mark.parametrize("flags", [("--method", "eagle", "--temperature", "1", "--seed", "3"),
                                   ("--method", "draft")], ids=["eagle T=1", "draft greedy"])
def test_a_browser_draws_every_step_with_the_jsons_numbers(flags, tmp_path, monkeypatch, capsys):
    data, _, _, _ = traced(tmp_path, monkeypatch, capsys, *flags, n=24)
    shot = tmp_path / "trace.png"
    parser = Dom()
    parser.feed(browse(tmp_path / "run.html", shot, tmp_path))
    steps = data["steps"]
    assert len(steps) <= 20  # one page: every step is drawn
    assert len(parser.steps) == len(steps), "one section per step"
    for s, drawn in zip(steps, parser.steps):
        nodes = s.get("nodes")
        assert drawn["trees"] == (1 if nodes else 0)
        if not nodes:
            continue
        proposed = [g for g in drawn["nodes"] if g.get("data-index", "").isdigit() and g["data-index"] != "0"]
        assert len(proposed) == len(nodes), "as many nodes drawn as the step proposed"
        assert [("accepted" in g["classes"]) for g in proposed] == [nd["out"] == "accepted" for nd in nodes]
        for g, nd in zip(proposed, nodes):
            assert float(g["data-p"]) == nd["p"] and int(g["data-token"]) == nd["t"]
            assert (g.get("data-q") is None) if nd["q"] is None else float(g["data-q"]) == nd["q"]
            label = " ".join(g["text"])
            assert "p " in label and (nd["q"] is None or "q " in label)
            shown_p = float(re.search(r"(?:^|\s)p (\d[-0-9.e]*)", label).group(1))  # two digits in the box
            assert shown_p == pytest.approx(float(f"{nd['p']:.2g}"))
        if len(s["tokens"]) > s["accepted"]:
            assert sum("next" in g["classes"] for g in drawn["nodes"]) == 1  # the correction or the bonus
    text = "".join(parser.texts)
    assert f"tau: {data['summary']['tau']:g}" in text
    assert data["command"] in text
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
