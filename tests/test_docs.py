"""The book, its appendix (docs/appendix.md), the README and the results (docs/results.md) are held to the code
and to the saved benchmark.

1. Every `python -m tinyspec COMMAND ...` shown in these documents (`DOCS`) is valid as shown:
   the command exists, its arguments parse, and the quick ones run on the shipped weights.
2. Every name they give the code exists in it: `file.py: function` references, backticked
   identifiers that look like code (calls, dotted names, CamelCase classes, snake_case names,
   test names), `--flags`, `from tinyspec... import` lines, figures, and links to headings of the
   same document or of another (`docs/appendix.md#chapter-6`).
3. Every table marked `<!-- bench: FILE ... -->` agrees, cell by cell and rounded as printed,
   with the saved benchmark report it names (or, with `key=FIELD`, with the saved curve's rows).
"""
import ast
import importlib
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from tinyspec.commands.cli import WEIGHTS

ROOT = WEIGHTS.parent
DOCS = [ROOT / "README.md", ROOT / "walkthrough.md", ROOT / "docs" / "appendix.md", ROOT / "docs" / "results.md"]
GUIDE = ROOT / "docs" / "instructor.md"  # its commands are held like the DOCS' (1.); its prose by test_instructor.py
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")


def unquoted(doc) -> str:
    """A document's text with the quote markers of its boxes removed (their code and spans may
    run over several quoted lines)."""
    return re.sub(r"^> ?", "", doc.read_text(), flags=re.M)


def quick(argv) -> bool:
    """Run in full (seconds each): generation, handouts, the benchmark's --quick mode. The rest
    (training, the full benchmark, grading, generation over a whole prompt file) are only parsed."""
    command, args = (argv[3] if len(argv) > 3 else None), argv[4:]
    if ("--cuda-graph" in args and not torch.cuda.is_available()) or "--prompt-file" in args:
        return False  # no GPU here; a whole prompt file is a benchmark's worth of generation
    return (command is None or (command == "generate" and bool(args)) or (command == "bench" and "--quick" in args)
            or (command == "course" and args[:1] in (["handout"], ["list"])))


def shown_commands():
    """(doc, argv) for each command in a code block (one per line, `&&` chains split, comments
    dropped) or in an inline code span. The guide also shortens a command to its verb and flags
    (`bench --methods ...`): that is `python -m tinyspec bench --methods ...`."""
    found = []
    for doc in DOCS + [GUIDE]:
        text = unquoted(doc)
        if doc == GUIDE:  # its exercise headings quote the book's first line, a span cut off at its end
            text = re.sub(r"^#+ .*$", "", text, flags=re.M).replace("\\`", "'")  # and it escapes a backtick
        for block in FENCE.findall(text):
            for line in block.splitlines():
                for part in line.split("#")[0].split("&&"):
                    found.append((doc.name, part))
        for span in INLINE.findall(FENCE.sub("", text)):
            span = " ".join(span.split())
            if doc == GUIDE and re.match(r"(bench|generate|train|evaluate|figures|data|course) --", span):
                span = "python -m tinyspec " + span
            found.append((doc.name, span))
    return [(doc, spelled_out(shlex.split(c.strip()))) for doc, c in found if c.strip().startswith("python -m tinyspec")]


def spelled_out(argv: list[str]) -> list[str]:
    """`python -m tinyspec.generate ARGS`, the README's spelling, as `python -m tinyspec generate ARGS`:
    the same command (tinyspec/generate.py calls it)."""
    return argv[:2] + ["tinyspec", "generate"] + argv[3:] if argv[2:3] == ["tinyspec.generate"] else argv


COMMANDS = shown_commands()


def parser_and_args(argv):
    """The module that runs a shown `python -m tinyspec COMMAND ARGS` and its ARGS: the command's
    module (`tinyspec/__main__.py: parser_of`; `bench kernels` and `bench report` have modules of
    their own), or, for bare `python -m tinyspec`, the overview's."""
    assert argv[2] == "tinyspec", f"`{' '.join(argv)}`: no such module; a command is `python -m tinyspec COMMAND`"
    if len(argv) == 3:  # the overview: no flags
        return importlib.import_module("tinyspec.__main__"), []
    from tinyspec.__main__ import COMMANDS
    command, args = argv[3], argv[4:]
    assert command in COMMANDS, f"`{' '.join(argv)}`: no command {command!r} (python -m tinyspec lists them)"
    from tinyspec.__main__ import parser_of
    module, args = parser_of([command] + args)
    return importlib.import_module(f"tinyspec.{module}"), args


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 15 and sum(map(quick, (a for _, a in COMMANDS))) >= 6
    assert any(argv[2:4] == ["tinyspec", "generate"] and "medusa" in argv for _, argv in COMMANDS)


@pytest.mark.parametrize("doc,argv", COMMANDS, ids=[" ".join(a[2:])[:60] for _, a in COMMANDS])
def test_shown_command_parses(doc, argv):
    module, args = parser_and_args(argv)
    if not hasattr(module, "build_parser"):
        assert not args, f"{argv} takes no arguments"
        return
    parser = module.build_parser()
    if args:  # a bare `python -m tinyspec x` in prose names the command; with arguments it must parse
        parser.parse_args(args)



def recorded_commands():
    """(file, command) for each command a saved report or model card records (a JSON value under a
    key naming "command", or a card's `Reproduce:` line), from `python -m tinyspec` or `python FILE`
    on, a trailing "(...)" aside dropped."""
    found = []
    for path in sorted([*ROOT.glob("docs/**/*.json"), *ROOT.glob("weights/*.json")]):
        def walk(value, key=""):
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(v, k)
            elif isinstance(value, list):
                for v in value:
                    walk(v, key)
            elif isinstance(value, str) and "command" in key and re.search(r"\bpython ", value):
                found.append((path.relative_to(ROOT).as_posix(), value))
        walk(json.loads(path.read_text()))
    for path in sorted(ROOT.glob("weights/*.md")):
        for command in re.findall(r"`(python -m tinyspec[^`]+)`", path.read_text()):
            found.append((path.relative_to(ROOT).as_posix(), command))
    return [(f, re.sub(r"\s*\([^)]*\)$", "", c[c.index("python "):]).strip()) for f, c in found]


RECORDED = recorded_commands()


@pytest.mark.parametrize("where,command", RECORDED, ids=[f"{f}: {c[10:70]}" for f, c in RECORDED])
def test_recorded_command_runs_today(where, command):
    """A report or card says how it was made; that command must be one tinyspec runs today (its
    flags parse), so a reader can make it again. A script it names must exist."""
    argv = spelled_out(shlex.split(command))
    if argv[1] != "-m":
        assert (ROOT / argv[1]).is_file(), f"{where}: {command}: no {argv[1]}"
        return
    module, args = parser_and_args(argv)
    try:
        module.build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"{where} records `{command}`, which no longer parses: record today's spelling")


def test_recorded_commands_are_found():
    assert len(RECORDED) >= 40 and {"docs/bench.json", "weights/target.md", "docs/tour.json"} <= {f for f, _ in RECORDED}

def quick_commands():
    """(doc, argv) of each quick command, once: a command shown twice runs where it is first shown."""
    first = {}
    for doc, argv in COMMANDS:
        if quick(argv):
            first.setdefault(tuple(argv), doc)
    return [(doc, list(argv)) for argv, doc in first.items()]


@pytest.mark.parametrize("doc,argv", [pytest.param(d, a, marks=[pytest.mark.slow] if a[3:4] == ["bench"] else [])
                                      for d, a in quick_commands()],
                         ids=lambda v: " ".join(v[2:])[:60] if isinstance(v, list) else v)
def test_quick_command_runs(doc, argv, tmp_path, monkeypatch, capsys):
    module, args = parser_and_args(argv)
    if args[:1] == ["handout"]:
        args = ["handout", str(tmp_path / "hw")] + args[2:]
    if "--trace" in args:  # the page goes to the test's folder, not into the checkout
        args = with_value(args, "--trace", str(tmp_path / "trace.html"))
    monkeypatch.setenv("NO_COLOR", "1")
    module.main(args)
    assert capsys.readouterr().out.strip()


# ---- 1b. the long commands, shrunk ----------------------------------------------------------------

# Long commands that are only parsed, each with why it cannot run here. Every other long command
# runs below on flags it already has, with the shown flags kept, or replaced where they set a size,
# a place to write, or a placeholder.
NOT_RUN = {
    ("course",): "names the command in prose: it needs a verb (list, handout, grade, each shown and run)",
    ("data", "third-party-prompts"): "downloads the held-out packages with pip (no network here, and the tests "
                                     "download nothing) and rewrites tinyspec/prompts_third_party.jsonl, the shipped "
                                     "prompts, with no flag to write elsewhere",
    ("figures", "tour"): "runs every command of the README's tour (which test_quick_command_runs runs) as a fresh "
                         "process, bench --quick among them: minutes, and no flag shrinks it",
}
AS_RECORDED = {  # a saved report's command as it was run, shown with the doc's own note on what changed since
    "lookahead:3,3,2,auto": "walkthrough chapter 13: docs/batch.json's command, `auto` since spelled medusa:auto and "
                            "`eagle:16` 2,6,16 (the doc says so)",
}
TOO_SLOW = {  # shown command (after `python -m tinyspec`) -> why it is only parsed: over ~20 s on one thread, shrunk
    **dict.fromkeys(["train eagle", "train eagle --steps 800",
                     "train eagle --steps 200 --run-dir runs/eagle-pos --out runs/eagle-pos/eagle.safetensors"],
                    "a random head's card measures its tau on 16 held-out sequences of 64 tokens, which no flag "
                    "shrinks: about 25 s; the same job from the shipped head (`train eagle --init-from ...`) runs"),
    "bench --methods "
    "ar,draft:auto,draft:2,draft:4,draft:4@block,medusa:auto,medusa:16,medusa:16@pointmass,medusa:16@traversal,eagle:auto,eagle:2,6,16,eagle:2,6,16@pointmass,eagle:2,6,16@traversal,lookup:auto,lookup:8,lookahead:auto,lookahead:3,3,2 "
    "--temperatures 0,1 --max-new-tokens 96 --repeats 2 --profile --remeasure --plot docs/figures --save "
    "docs/bench.json":
        "--remeasure sizes five methods at two temperatures before the first token: about 47 s at 4 tokens a prompt",
    "bench --methods ar,draft,draft:auto,medusa,medusa:auto,eagle,eagle:auto,lookup,lookup:auto,lookahead,lookahead:auto,"
    "rest,rest:auto --datastore ~/.cache/tinyspec/datastore.safetensors --temperatures 0,1 --max-new-tokens 96 --repeats 3 "
    "--profile --remeasure --plot docs/figures/results --save docs/results.json":
        "--remeasure sizes six methods at two temperatures before the first token: about 33 s at 4 tokens a prompt",
}
GPU_ONLY = {("bench", "kernels"): "times the Triton kernel on a CUDA GPU"}
PLACEHOLDERS = {"FILE", "DIR"}  # a value the reader fills in: substituted with a real file or folder


def long_key(argv) -> tuple:
    """The command and its verb: ("train", "eagle"), ("bench", "report"), ("figures", "tour"), ("evaluate",)."""
    command, args = argv[3] if len(argv) > 3 else "", argv[4:]
    if command in ("train", "course", "data", "figures") or (command == "bench" and args[:1] in (["report"], ["kernels"])):
        return (command, *args[:1]) if args and not args[0].startswith("-") else (command,)
    return (command,)


def with_value(args: list[str], flag: str, value: str) -> list[str]:
    """args with flag's value replaced where it is given, else with `flag value` added."""
    assert not any(a.startswith(flag + "=") for a in args), f"{flag}=VALUE: give it as two words"
    if flag in args:
        i = args.index(flag)
        return args[:i + 1] + [value] + args[i + 2:]
    return args + [flag, value]


def with_flag(args: list[str], flag: str) -> list[str]:
    return args if flag in args else args + [flag]


def shrunk(argv) -> list[str] | None:
    """A long command's arguments (after its module: `parser_and_args`) at smoke size, with {tmp} (the
    test's folder), {corpus} (the tests' --stdlib-only corpus, conftest.corpus_dir) and {datastore} (a
    small datastore) to fill in; shown flags stay as shown but for sizes, outputs and placeholders.
    None where a command is allow-listed (NOT_RUN, TOO_SLOW, AS_RECORDED; GPU_ONLY and --cuda-graph without a GPU)."""
    key, (_, args) = long_key(argv), parser_and_args(argv)
    if key in NOT_RUN or as_recorded(argv):
        return None
    if ("--cuda-graph" in args or key in GPU_ONLY) and not torch.cuda.is_available():
        return None
    if key == ("bench", "kernels"):
        return with_flag(with_value(with_value(args, "--lengths", "128"), "--trees", "16"), "--no-flex")
    if key == ("bench", "report") and not args:  # named in prose; it runs as `bench report --out DIR` does
        args = ["--out", "DIR"]
    weights = {"--eagle": WEIGHTS / "eagle.safetensors", "--parallel": WEIGHTS / "parallel.safetensors"}
    for flag, file in weights.items():  # `--eagle FILE`: the shipped file of that kind
        if flag in args and args[args.index(flag) + 1] in PLACEHOLDERS:
            args = with_value(args, flag, str(file))
    if "--datastore" in args:  # ~/.cache/tinyspec/datastore*.safetensors, built by `data datastore`: a small one
        args = with_value(args, "--datastore", "{datastore}")
    command = key[0]
    if command == "bench" and key == ("bench",):
        size = ["--batch-prompts", "2"] if "--batch-sizes" in args else ["--prompts-per-category", "1"]
        for flag, value in zip(["--max-new-tokens", "--repeats", "--categories", *size[::2]], ["4", "1", "code", *size[1::2]]):
            args = with_value(args, flag, value)
        args = with_flag(args, "--no-hf")
        for flag in ("--save", "--plot"):
            if flag in args:
                args = with_value(args, flag, "{tmp}/" + flag[2:])
    elif key == ("bench", "report"):
        args = with_value(args, "--out", "{tmp}/report")
        if torch.cuda.is_available():  # on a CPU the report is always its quick subset
            args = with_flag(args, "--quick")
    elif command == "evaluate":
        for flag, value in (("--prompts-per-category", "1"), ("--max-new-tokens", "4"), ("--categories", "code"),
                            ("--data-dir", "{corpus}")):
            args = with_value(args, flag, value)
        args = with_flag(args, "--stdlib-only")
        if "--save" in args:
            args = with_value(args, "--save", "{tmp}/evaluate.json")
    elif command == "generate":
        args = with_value(args, "--max-new-tokens", "2")
    elif command == "data":
        args = with_flag(with_value(args, "--data-dir", "{corpus}"), "--stdlib-only")  # the tests download nothing
        if key == ("data", "datastore"):
            args = with_value(with_value(args, "--tokens", "20000"), "--out", "{tmp}/datastore.safetensors")
    elif key == ("train", "tokenizer"):
        args = with_value(with_value(args, "--vocab-size", "260"), "--out", "{tmp}/tokenizer.tiktoken")
    elif key == ("train", "gpt"):
        if "--init-from" in args and not (ROOT / args[args.index("--init-from") + 1]).is_file():
            args = with_value(args, "--init-from", str(WEIGHTS / "target.safetensors"))  # an earlier run's: the shipped one
        for flag, value in (("--steps", "2"), ("--batch-size", "2"), ("--block-size", "32"), ("--eval-every", "1"),
                            ("--eval-batches", "1"), ("--data-dir", "{corpus}"), ("--run-dir", "{tmp}/run"),
                            ("--out", "{tmp}/run/final.safetensors")):
            args = with_value(args, flag, value)
        args = with_flag(args, "--stdlib-only")
    elif command == "train":  # medusa, eagle, parallel: self-distilled data, then heads
        for flag, value in (("--sequences", "8"), ("--gen-len", "8"), ("--prompt-len", "8"), ("--gen-batch", "8"),
                            ("--steps", "2"), ("--batch-size", "2"), ("--data-dir", "{corpus}"), ("--run-dir", "{tmp}/run"),
                            ("--out", "{tmp}/head.safetensors")):
            args = with_value(args, flag, value)
        if key == ("train", "medusa"):
            args = with_value(args, "--window", "8")
        else:
            args = with_value(with_value(args, "--anchors", "4"), "--medusa-run-dir", "{tmp}/none")
        args = with_flag(args, "--stdlib-only")
    elif command == "figures":
        args = with_value(args, "--out", "{tmp}/figures")
    elif key == ("course", "grade"):
        args = ["grade", "{tmp}/hw"] + args[2:]  # a handout made first (test_long_command_runs_shrunk)
    left = [a for a in args if a in PLACEHOLDERS or a.startswith("~")]
    assert not left, f"`{' '.join(argv)}`: {left} left to fill in"
    return args


def as_recorded(argv) -> str | None:
    """Why a shown command is only parsed: too slow even shrunk (TOO_SLOW), or a saved report's
    command as it was run (AS_RECORDED); None where it runs."""
    if " ".join(argv[3:]) in TOO_SLOW:
        return TOO_SLOW[" ".join(argv[3:])]
    methods = argv[argv.index("--methods") + 1] if "--methods" in argv else ""
    return next((why for spec, why in AS_RECORDED.items() if spec in methods.split(",") or f",{spec}" in methods), None)


def long_commands():
    """(argv, shrunk args) of each long command, once: shown commands that shrink to the same run
    (the same options once parsed: `train eagle` and `train eagle --steps 800`) run once."""
    first = {}
    for _, argv in COMMANDS:
        if not quick(argv) and len(argv) > 4:  # `python -m tinyspec train` alone, in prose, names the command
            args = shrunk(argv)
            run = tuple(argv)
            if args is not None:
                module, _ = parser_and_args(argv)
                try:
                    run = (module.__name__, repr(sorted(vars(module.build_parser().parse_args(args)).items())))
                except SystemExit:  # it does not parse: its test fails, with argparse's message
                    pass
            first.setdefault(run, (argv, args))
    return list(first.values())


def test_every_command_left_unrun_is_shown():
    """The allow-lists name commands the docs show: one whose command is gone is dropped, not kept."""
    shown = [argv for _, argv in COMMANDS if not quick(argv)]
    assert set(NOT_RUN) <= {long_key(a) for a in shown}
    assert all(any(as_recorded(a) == why for a in shown) for why in AS_RECORDED.values())
    assert set(TOO_SLOW) <= {" ".join(a[3:]) for a in shown}


@pytest.fixture(scope="module")
def small_datastore(tmp_path_factory, corpus_dir, tinyspec_home):
    """A datastore of 20,000 tokens for the commands shown with one of millions (`--datastore
    ~/.cache/tinyspec/datastore_all.safetensors`), made by `data datastore` as a reader makes one."""
    from tinyspec.commands import data
    path = tmp_path_factory.mktemp("datastore") / "datastore.safetensors"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINYSPEC_HOME", str(tinyspec_home))
        mp.setattr("tinyspec.training.corpus.pip_download", lambda *a: pytest.fail("a test tried to download the packages' sources"))
        data.main(["datastore", "--tokens", "20000", "--stdlib-only", "--data-dir", str(corpus_dir), "--out", str(path)])
    return path


def checkout_files() -> dict:
    """Every file of the checkout (caches aside) and when it last changed."""
    return {p: p.stat().st_mtime_ns for p in ROOT.rglob("*")
            if p.is_file() and not {".git", "__pycache__", ".pytest_cache", ".hypothesis"} & set(p.parts)}


@pytest.mark.slow
@pytest.mark.parametrize("argv,args", long_commands(), ids=lambda v: " ".join(v[3:])[:70] if v and v[0] == "python" else "-")
def test_long_command_runs_shrunk(argv, args, tmp_path, corpus_dir, request, monkeypatch):
    """Every long command shown runs, on its own flags at smoke size (`shrunk`), writing under tmp_path
    alone: a flag that is gone, a method spec that errors or a command that fails fails here."""
    key = long_key(argv)
    if args is None:
        if key in NOT_RUN or as_recorded(argv):
            pytest.skip(f"only parsed: {NOT_RUN.get(key) or as_recorded(argv)}")
        pytest.skip("needs a CUDA GPU")
    module, _ = parser_and_args(argv)
    fill = {"tmp": str(tmp_path), "corpus": str(corpus_dir)}
    if "{datastore}" in args:
        fill["datastore"] = str(request.getfixturevalue("small_datastore"))
    args = [a.format(**fill) for a in args]
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.chdir(ROOT)  # the shown paths (tinyspec/prompts.jsonl, weights/...) are the checkout's
    from tinyspec.speed import sizing  # a method at :auto or --remeasure is sized on 4 tokens a prompt, not
    monkeypatch.setattr(sizing, "NEW_TOKENS", 4)  # conftest's 12: the plumbing is the same, at a third of the cost
    if key[0] == "figures" and "tables" in args:  # it refills README.md and walkthrough.md in place: copies of them
        from tinyspec.bench import figures
        for doc in ("README.md", "walkthrough.md"):
            (tmp_path / doc).write_text((ROOT / doc).read_text())
        monkeypatch.setattr(figures, "ROOT", tmp_path)
    before = checkout_files()
    if key == ("course", "grade"):  # the handout it grades first: one chapter, its stubs fail their tests
        from tinyspec.course import handouts as course
        course.main(["handout", str(tmp_path / "hw"), "--chapters", "sampling"])
        with pytest.raises(SystemExit) as e:
            module.main(args)
        assert e.value.code == 1
    else:
        module.main(args)
    after = checkout_files()
    assert after == before, f"wrote into the checkout: {sorted(str(p) for p in set(after.items()) ^ set(before.items()))}"


# ---- 2. names --------------------------------------------------------------------------------

# Names the docs may use that are not tinyspec's: other libraries' modules and objects (their
# attributes are not checked), papers' and other projects' identifiers, and file names of
# other projects. Anything else that looks like code must be defined in tinyspec/ or tests/.
FOREIGN_ROOTS = {
    "torch", "F", "nn", "tl", "triton", "np", "numpy", "math", "tiktoken", "tiktoken_ext", "transformers",
    "regex", "re", "statistics", "time", "sys", "os", "json", "collections", "sysconfig", "pytest", "Path",
    "safetensors", "matplotlib", "plt", "random", "itertools", "heapq", "functools", "subprocess", "shlex",
    "hypothesis", "argparse", "dataclasses", "typing", "pip", "enc", "hf", "flex_attention", "ast",
}
FOREIGN_NAMES = {
    "OMP_NUM_THREADS", "TRITON_INTERPRET", "NO_COLOR", "snake_case1",  # environment variables; an example identifier
    # Hugging Face transformers
    "GPT2LMHeadModel", "GPT2Model", "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper",
    "MinPLogitsWarper", "Conv1D", "assistant_model", "prompt_lookup_num_tokens", "position_ids", "n_inner",
    "from_pretrained", "gelu_new", "generate",
    # PyTorch, Triton, NumPy, tiktoken, the standard library
    "scaled_dot_product_attention", "is_causal", "index_select", "index_copy_", "clip_grad_norm_", "do_bench",
    "perf_report", "assert_close", "allclose", "input_precision", "min_dot_size", "load_tiktoken_bpe",
    "mergeable_ranks", "encode_ordinary", "encode_ordinary_batch", "bpe_train", "bpe_encode", "r50k_pat_str",
    "flash_attn_with_kvcache", "next_power_of_2", "program_id", "memmap", "manual_seed", "set_num_threads",
    "get_paths", "findall", "perf_counter", "from_numpy", "requires_grad_", "_orig_mod", "ModuleList",
    "ResBlock", "OrderedDict", "Counter", "JITFunction", "IntEnum", "NotImplementedError", "ValueError",
    "RuntimeError", "ImportError", "KeyboardInterrupt", "JUnit", "CUDAGraph", "TF32",
    # other projects and papers
    "speculative_decode", "mc_sim_7b_63", "POOL_FROM_PROMPT", "DistillSpec", "FlashAttention", "FlashInfer",
    "SpecInfer", "FlexAttention", "EAGLE", "SGLang", "GitHub", "PyTorch", "TinyStories", "OpenAI", "NumPy",
    "minbpe", "nanoGPT", "gpt_fast", "llm_c", "vLLM",
}
EXTERNAL_FILES = {"compiler.py", "parser.py", "file.py"}  # Triton's, the standard library's, the book's `file.py: function`  # other projects' files named in prose


@lru_cache(maxsize=None)
def code_index():
    """What the code defines. defined[module] = names defined in tinyspec/<module>.py (functions,
    classes, Class.method, module-level assignments, attributes set on self); names = every
    identifier and string the sources and tests contain as a definition, argument, assignment
    target, attribute or dict key; tests = test function names; flags = every argparse option."""
    defined, names, tests = {}, set(), {}
    files = sorted((ROOT / "tinyspec").rglob("*.py")) + sorted((ROOT / "tests").glob("*.py"))
    for path in files:
        tree = ast.parse(path.read_text())
        rel = path.relative_to(ROOT).as_posix()
        own = defined.setdefault(rel, set())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                own.add(node.name)
                if isinstance(node, ast.ClassDef):
                    for item in ast.walk(node):
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            own.add(f"{node.name}.{item.name}")
                        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                            own.add(f"{node.name}.{item.target.id}")
                        elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                            own.add(f"{node.name}.{item.attr}")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for n in ast.walk(target):
                        if isinstance(n, ast.Name):
                            own.add(n.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                own.update((a.asname or a.name).split(".")[0] for a in node.names)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                names.add(node.name)
                if rel.startswith("tests/") and node.name.startswith("test_"):
                    tests.setdefault(rel, set()).add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", node.value))
        for name in list(own):
            if rel.startswith("tinyspec/"):
                names.add(name.split(".")[-1])
    return defined, names, tests


@lru_cache(maxsize=None)
def cli_flags() -> set[str]:
    """Every --flag of every command (subcommands included)."""
    import argparse
    flags = set()
    from tinyspec.__main__ import BENCH_VERBS, COMMANDS
    for module in [*COMMANDS.values(), *BENCH_VERBS.values()]:
        parsers = [importlib.import_module(f"tinyspec.{module}").build_parser()]
        while parsers:
            parser = parsers.pop()
            for action in parser._actions:
                flags.update(s for s in action.option_strings if s.startswith("--"))
                if isinstance(action, argparse._SubParsersAction):
                    parsers.extend(action.choices.values())
    return flags


ROOMS = ("kernels", "methods", "speed", "training", "commands", "bench", "course")  # the package's folders (tinyspec/__init__.py)
FILE_REF = re.compile(rf"\b((?:tinyspec/|tests/)?(?:(?:{'|'.join(ROOMS)})/)?[a-z_0-9]+\.py)"
                      r"(?:(::)|:\s*)([A-Za-z_][\w.]*)")
CODE_TOKEN = re.compile(r"(?<![\w.\-/])([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(\()?")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
TINYSPEC_IMPORT = re.compile(r"from (tinyspec(?:\.[\w.]+)?) import ([\w, ]+)")


def module_file(name: str) -> str | None:
    """'tree.py', 'methods/draft.py', 'kernels/tree_attention.py', 'tests/test_tree.py' -> its path from
    the root. A file in a folder is named with its folder: `methods/draft.py`, not `draft.py`."""
    for candidate in (name, f"tinyspec/{name}", f"tests/{name}"):
        if (ROOT / candidate).is_file():
            return candidate
    return None


def looks_like_code(token: str, call: bool, whole: bool) -> bool:
    """A call, a dotted name, a snake_case name, a class (CamelCase, or any capitalised name that
    is a whole code span), or a test's name."""
    return (call or "." in token or "_" in token.strip("_") or
            (token[0].isupper() and any(c.islower() for c in token) and (whole or sum(map(str.isupper, token)) > 1)))


def name_problem(token: str, call: bool) -> str | None:
    """Why a code-looking name is not tinyspec's, or None if it is (or is not ours to check)."""
    defined, names, tests = code_index()
    parts = token.split(".")
    if parts[0] in FOREIGN_ROOTS or token in FOREIGN_NAMES or parts[-1] in FOREIGN_NAMES:
        return None
    if token.startswith("test_") and "." not in token:
        return None if any(token in t for t in tests.values()) else f"no test named {token}"
    module = None  # the longest prefix that is a tinyspec module: tinyspec.methods.draft, tree, methods, sizing, ...
    for i in range(len(parts), 0, -1):
        path = "/".join(p for p in parts[:i] if p != "tinyspec")
        rooms = [f"{room}/{path}.py" for room in ROOMS] if i == 1 else []  # `sizing.size`
        for file in (f"{path}.py", f"{path}/__init__.py", *rooms):  # a module, a folder's (methods.METHODS), a room's
            if path and (ROOT / "tinyspec" / file).is_file():
                module, rest = f"tinyspec/{file}", parts[i:]
                break
        if module is not None:
            break
    if module is not None and (not rest or ".".join(rest[:2]) in defined[module] or rest[0] in defined[module]):
        return None if rest[1:] == [] or rest[-1] in names else f"nothing in the code is called {rest[-1]}"
    if module is not None and parts[0] != "tinyspec" and rest[0] not in names:
        return f"{module} defines no {'.'.join(rest)}"  # else a variable named like a module: `tree.depth`
    missing = [p for p in parts if p not in names and p not in FOREIGN_NAMES]
    if len(parts) > 1 and parts[0] not in names:
        missing = [p for p in parts[1:] if p not in names]  # a variable of the prose: check its attributes
    return f"nothing in the code is called {', '.join(missing)}" if missing else None


def exercise_names(text: str) -> tuple[set[str], set[str]]:
    """Names an exercise asks the reader to create ("Write `keep_loop(cache, slots)`", "Add
    `--keep-best`", "a `min_p` argument"), and their arguments' names: they exist once the
    reader has written them."""
    sections = re.split(r"^#+ ", text, flags=re.M)
    spans = [m for s in sections if s.startswith("Exercises")
             for m in re.findall(r"(?:\b[Ww]rite|\b[Aa]dd)\s+`([^`]+)`|\ban?\s+`([^`]+)`\s+argument", s) for m in m if m]
    return ({re.match(r"[\w.-]*", span).group(0) for span in spans},
            {name for span in spans for name in re.findall(r"[\w-]+", span.split(")")[0])})


def heading_anchors(text: str) -> set[str]:
    """The anchors a Markdown renderer gives a document's headings."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", text, re.M)}


def references(text: str, base=ROOT):
    """(kind, what, problem) for every reference in a document's text (relative links from `base`)."""
    defined, names, tests = code_index()
    prose = FENCE.sub("", text)
    new, new_args = exercise_names(text)
    for m in FILE_REF.finditer(text):
        path, test_ref, name = module_file(m.group(1)), m.group(2), m.group(3).rstrip(".")
        if m.group(1).split("/")[-1] in EXTERNAL_FILES:
            continue
        if path is None:
            yield "file", m.group(1), "no such file"
        elif test_ref:
            yield "test", m.group(0), None if name in tests.get(path, ()) else f"{path} has no {name}"
        else:
            ok = name in defined[path] or name.split(".")[0] in defined[path]
            yield "reference", m.group(0), None if ok else f"{path} defines no {name}"
    for span in (" ".join(s.split()) for s in INLINE.findall(prose)):
        for f in re.findall(r"\b([\w/]+\.py)\b", span):
            if f.split("/")[-1] not in EXTERNAL_FILES and module_file(f) is None:
                yield "file", f, "no such file"
        if span.startswith(("python -m tinyspec", "python -c", "pytest")) or re.match(r"[\w.-]*", span).group(0) in new:
            continue  # commands are checked by the command tests and the imports below; new names exist later
        for m in CODE_TOKEN.finditer(re.sub(r"'[^']*'|\"[^\"]*\"", "", span)):
            token, call = m.group(1), bool(m.group(2))
            if token.split(".")[-1] in ("py", "json", "md", "safetensors", "tiktoken", "png", "bin", "jsonl"):
                continue
            if token not in new_args and looks_like_code(token, call, whole=m.group(0) == span):
                yield "name", token, name_problem(token, call)
    for flag in FLAG.findall(" ".join(INLINE.findall(prose)) + " " + " ".join(FENCE.findall(text))):
        yield "flag", flag, None if flag in cli_flags() | new | {"--index-url", "--extra-index-url"} else "no command takes this flag"  # pip's
    for module, imported in TINYSPEC_IMPORT.findall(text):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            yield "import", module, "no such module"
            continue
        if not str(getattr(mod, "__file__", "")).startswith(str(ROOT / "tinyspec")):  # not another copy's
            yield "import", module, "no such module in this checkout"
            continue
        for name in (n.strip().split(" as ")[0] for n in imported.split(",")):
            yield "import", f"{module}.{name}", None if hasattr(mod, name) else "not in the module"
    for alt, target in re.findall(r"!\[([^\]]*)\]\(([^)]+)\)", text):
        yield "figure", target, None if (base / target).is_file() else "no such file"
    anchors = heading_anchors(text)
    for anchor in re.findall(r"\]\(#([^)]+)\)", text):
        yield "link", anchor, None if anchor in anchors else "no heading has this anchor"
    for target, anchor in re.findall(r"\]\(((?!https?:)[^)#\s]+\.md)(?:#([^)]+))?\)", text):  # into another document
        path = base / target
        if not path.is_file():
            yield "link", target, "no such file"
        elif anchor:
            yield "link", f"{target}#{anchor}", None if anchor in heading_anchors(path.read_text()) else "no heading has this anchor"


def test_coursework_chapters_name_headings_of_the_book():
    from tinyspec.course.handouts import CHAPTERS
    headings = set(re.findall(r"^## (.*)$", (ROOT / "walkthrough.md").read_text(), re.M))
    assert {c.walkthrough for c in CHAPTERS.values()} <= headings


def test_the_guides_chapter_references_link_the_books_headings():
    """The instructor's guide names a book chapter by a link to its heading, labelled with the
    heading's number ("[chapter 13](../walkthrough.md#13-benchmarking-costs-and-sizing)"): a bare
    "chapter 12" cannot be checked, and goes stale when the book is renumbered."""
    guide = FENCE.sub("", GUIDE.read_text())
    numbers = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-"): int(h.split()[0])
               for h in re.findall(r"^## (\d+ .*)$", (ROOT / "walkthrough.md").read_text(), re.M)}
    links = re.findall(r"\[[Cc]hapter (\d+)\]\(\.\./walkthrough\.md#([^)]+)\)", guide)
    assert len(links) >= 20
    for label, anchor in links:
        assert anchor in numbers, f"instructor.md links chapter {label} to #{anchor}, which no heading of the book has"
        assert numbers[anchor] == int(label), f"instructor.md calls #{anchor} chapter {label}: it is chapter {numbers[anchor]}"
    bare = re.findall(r"(?<!\[)\b[Cc]hapters? \d+\b(?!\])", guide)
    assert not bare, f"instructor.md names {bare[:3]} without a link to the book's heading"


def test_the_coursework_table_is_course_chapters():
    """The book's table of assignments is `course.chapters_table()` line for line: every chapter
    `course` hands out, its functions and its number of graded tests. The appendix's count for the
    `sampling` handout is that chapter's."""
    from tinyspec.course.handouts import CHAPTERS, chapters_table
    lines = (ROOT / "walkthrough.md").read_text().splitlines(keepends=True)
    header = chapters_table().splitlines(keepends=True)[0]
    assert lines.count(header) == 1, "walkthrough.md needs one coursework table"
    start = lines.index(header)
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    assert "".join(lines[start:end]) == chapters_table(), \
        "the coursework table differs from course.CHAPTERS: paste the output of python -c " \
        "'from tinyspec.course.handouts import chapters_table; print(chapters_table(), end=\"\")' into walkthrough.md"
    appendix = " ".join((ROOT / "docs" / "appendix.md").read_text().split())
    assert f"0 of its {len(CHAPTERS['sampling'].tests)} graded tests" in appendix


def test_the_books_twenty_line_loop_is_greedy_decoding():
    """Chapter 5 opens with greedy speculative decoding in plain Python: run it as printed."""
    from conftest import random_gpt
    from tinyspec.decoding import autoregressive
    from tinyspec.results import run
    from tinyspec.sampling import Sampling
    block = next(b for b in FENCE.findall((ROOT / "walkthrough.md").read_text()) if "def greedy_speculative" in b)
    namespace = {"torch": torch}
    exec(block, namespace)
    target, draft = random_gpt(scale=3.0, seed=1), random_gpt(scale=3.0, seed=2, n_layer=1)
    for prompt in ([1, 2, 3], [5, 9, 9, 2, 7]):
        plain = run(autoregressive(target, [prompt], Sampling(), [None], 30)).token_ids
        assert namespace["greedy_speculative"](target, draft, prompt, 30, k=3) == plain
        assert namespace["greedy_speculative"](target, target, prompt, 30, k=4) == plain


def test_chapter_5s_best_k_table_is_best_k_and_names_its_ties():
    """Chapter 5's table of tau and the best k is `expected_tokens`, `expected_speedup` and `best_k`
    (k_max = 8), rounded as printed; where two k give the same speedup exactly, the cell names both
    ("1 or 2, 1.25"), as `best_k`'s pick alone would hide the tie."""
    from tinyspec.methods.draft import best_k, expected_speedup, expected_tokens
    text = (ROOT / "walkthrough.md").read_text()
    table = text[text.index("<!-- computed: draft.expected_tokens, expected_speedup and best_k with k_max = 8 -->"):]
    lines = list(itertools.takewhile(lambda line: line.startswith("|"), table.splitlines()[1:]))[2:]
    header = table.splitlines()[1]
    costs = [float(c) for c in re.findall(r"c\$ = ([\d.]+)", header)]
    assert len(lines) == 4 and len(costs) == 4
    for line in lines:
        alpha, taus, *cells = [c.strip() for c in line.strip("|").split("|")]
        alpha = float(alpha)
        assert [f"{expected_tokens(alpha, k):.2f}" for k in (2, 4, 6)] == taus.split(", "), line
        for c, cell in zip(costs, cells):
            speedups = [expected_speedup(alpha, c, k) for k in range(9)]
            best = speedups[best_k(alpha, c, 8)]
            ties = [str(k) for k in range(9) if abs(speedups[k] - best) < 1e-9]
            ks, shown = cell.split(", ")
            assert ks.split(" or ") == ties and shown == f"{best:.2f}", (alpha, c, cell, ties)


def test_the_appendix_names_every_rule_the_chain_rules_test_runs():
    """The appendix lists the rules `test_chain_rules_reproduce_the_target_two_token_distribution`
    runs: its parametrize list, no more and no fewer."""
    source = (ROOT / "tests" / "test_verify.py").read_text()
    rules = ast.literal_eval(re.search(r'@pytest.mark.parametrize\("rule", (\[.*?\])\)\ndef '
                                       r'test_chain_rules_reproduce', source).group(1))
    appendix = " ".join((ROOT / "docs" / "appendix.md").read_text().split())
    said = appendix[appendix.index("`test_chain_rules_reproduce_the_target_two_token_distribution` runs"):][:200]
    said = said[:said.index(" times")]
    assert set(re.findall(r"`(\w+)`", said)) - {"test_chain_rules_reproduce_the_target_two_token_distribution"} \
        == set(rules), said


def appendix_scripts() -> list[tuple[str, str]]:
    """(Python source, what the appendix says it prints, or "") of each `cd tests && python -c "..."`
    block of the appendix: the figures it derives from the tests' own helpers."""
    text = (ROOT / "docs" / "appendix.md").read_text()
    found = []
    for m in re.finditer(r"^```\n(cd tests && python -c \"(.*?)\")\n^```\n(.*?)(?=\n\n)", text, re.S | re.M):
        after = " ".join(m.group(3).split())
        found.append((m.group(2), "\n".join(re.findall(r"`([^`]+)`", after)) if after.startswith("prints") else ""))
    return found


def test_the_appendixs_scripts_call_what_the_tests_define():
    """Each script of the appendix compiles, and every `module.name` it takes from a test module
    (`import test_verify as tv`: `tv.chain_outputs`) exists there; they run in full, slow-marked, below."""
    scripts = appendix_scripts()
    assert len(scripts) >= 3
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        for source, _ in scripts:
            tree = ast.parse(source)
            modules = {alias.asname or alias.name: importlib.import_module(alias.name)
                       for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
                    module = modules[node.value.id]
                    assert hasattr(module, node.attr), f"the appendix calls {module.__name__}.{node.attr}, which is gone"
    finally:
        sys.path.remove(str(ROOT / "tests"))


@pytest.mark.slow
@pytest.mark.parametrize("source, prints", appendix_scripts(), ids=lambda v: v.strip().splitlines()[0][:50] if v else "-")
def test_the_appendixs_scripts_run_and_print_what_it_says(source, prints):
    """Each script runs as the appendix shows it (from tests/), and where the appendix says what it
    prints, its output holds those lines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", source], cwd=ROOT / "tests", env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    for line in filter(None, prints.split("\n")):
        assert line in done.stdout, f"the appendix says it prints {line!r}; it printed {done.stdout!r}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_name_the_docs_give_the_code_exists(doc):
    bad = sorted({f"{kind} {what}: {problem}" for kind, what, problem in references(unquoted(doc), doc.parent) if problem})
    assert not bad, f"{doc.name} names what the code does not have:\n" + "\n".join(bad)


# ---- 3. tables from the saved benchmark ---------------------------------------------------------

MARKER = re.compile(r"^<!-- bench: (\S+)((?: [\w]+=\S+)*) -->\n((?:\|.*\n)+)", re.M)
TIMING_HEADER = re.compile(r"tok/s|speedup|\btau\b|τ", re.I)


def bench_tables(text: str):
    """(marker options, table rows as lists of cells) for every marked table of a document."""
    for m in MARKER.finditer(text):
        options = dict(o.split("=", 1) for o in m.group(2).split())
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in m.group(3).splitlines()]
        yield m.group(1), options, rows[2:]  # below the header and its |---| line


def printed(cell: str) -> float | None:
    """The number a cell prints ('-' is none), and how many decimals it printed."""
    cell = cell.strip("`* x")
    return None if cell in ("-", "") else float(cell)


def agrees(cell: str, value) -> bool:
    """Does a printed cell show `value`, rounded as printed?"""
    shown = printed(cell)
    if shown is None or value is None:
        return shown is None and value is None
    decimals = len(cell.strip("`* x").partition(".")[2])
    return abs(value - shown) <= 0.5 * 10 ** -decimals + 1e-9


def expected(row: dict | None, column: str):
    """The value a column shows for a saved row: a field, or one derived from fields."""
    if row is None:
        return None
    if column == "tau_from_alpha":  # Leviathan et al.'s (1 - a^(k+1)) / (1 - a), from the measured a
        alpha, k = row.get("alpha"), row["method"].partition(":")[2].partition("@")[0]
        return None if alpha is None else (1 - alpha ** (int(k) + 1)) / (1 - alpha)
    return row.get(column)


def table_problems(path: str, options: dict, rows: list[list[str]]):
    """Every cell of a marked table that disagrees with the saved report (or names no row of it)."""
    report = json.loads((ROOT / path).read_text())
    saved = report[options.get("source", "rows")]
    columns = options["columns"].split(",")
    if "key" in options:  # a curve (`key=tokens`): each row is the saved row whose key field the table shows
        yield from curve_problems(path, saved, options["key"], columns, rows)
        return
    for cells in rows:
        assert len(cells) == len(columns), f"a row of {len(cells)} cells under columns={options['columns']}: {cells}"
        key = {k: options[k] for k in ("method", "T", "category", "shape") if k in options}
        for column, cell in zip(columns, cells):
            if column in ("method", "T", "category", "shape"):
                key[column] = cell.strip("`")
        if key.get("method") not in (None, "ar") and "prefix" in options:
            key["method"] = options["prefix"] + key["method"]
        def find(category):
            match = [r for r in saved if r["method"] == key["method"] and r["temperature"] == float(key["T"])
                     and str(r.get("category", r.get("batch_size", r.get("shape", r.get("size"))))) == category]  # or batch sizes, or shapes
            return match[0] if match else None
        for column, cell in zip(columns, cells):
            if column in ("method", "T", "category", "shape", "-"):
                continue
            field, _, per = column.partition("[")
            categories = per.rstrip("]").split("/") if per else [key.get("category", key.get("shape"))]
            parts = re.split(r"\s*/\s*", cell) if per else [cell]
            for category, part in zip(categories, parts):
                row = find(category)
                if row is None:
                    yield f"{key} {category}: not in {path}"
                elif not agrees(part, expected(row, field)):
                    yield f"{key['method']} T={key['T']} {category} {field}: the table says {part}, {path} says {expected(row, field)}"


def curve_problems(path: str, saved: list[dict], key: str, columns: list[str], rows: list[list[str]]):
    """The cells of a curve's table (rows named by the values of one or more fields, `key=L,T`)
    that disagree with it."""
    keys = key.split(",")
    for cells in rows:
        assert len(cells) == len(columns), f"a row of {len(cells)} cells under columns={','.join(columns)}: {cells}"
        shown = dict(zip(columns, cells))
        name = " ".join(f"{k}={shown[k]}" for k in keys)
        match = [r for r in saved if all(printed(shown[k]) == r.get(k) for k in keys)]
        if not match:
            yield f"{name}: not in {path}"
            continue
        for column, cell in shown.items():
            if column not in keys and column != "-" and not agrees(cell, match[0].get(column)):
                yield f"{name} {column}: the table says {cell}, {path} says {match[0].get(column)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_benchmark_tables_agree_with_the_saved_report(doc):
    text = doc.read_text()
    tables = list(bench_tables(text))
    bad = [p for path, options, rows in tables for p in table_problems(path, options, rows)]
    assert not bad, f"{doc.name}: tables that disagree with the saved benchmark:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_a_rule_asked_for_at_temperature_0_shows_the_greedy_rows(doc):
    """At T = 0 every rule is greedy whatever `@RULE` asks (`methods/base.py: default_rule`), so a
    table row `METHOD@RULE` at T = 0 shows the tau of `METHOD` itself: a saved row that differs was
    recorded before that rule and is stale."""
    bad = []
    for path, options, rows in bench_tables(doc.read_text()):
        if "key" in options:
            continue
        saved = json.loads((ROOT / path).read_text())[options.get("source", "rows")]
        columns = options["columns"].split(",")
        for cells in rows:
            shown = {**{k: options[k] for k in ("method", "T") if k in options},
                     **{c: cell.strip("`") for c, cell in zip(columns, cells) if c in ("method", "T")}}
            method = options.get("prefix", "") + shown.get("method", "")
            if "@" not in method or float(shown.get("T", 1)) != 0:
                continue
            tau = lambda m: sorted((str(r.get("category")), r.get("tau")) for r in saved
                                   if r["method"] == m and r["temperature"] == 0)
            if tau(method) != tau(method.partition("@")[0]):
                bad.append(f"{path}: {method} at T = 0: tau {tau(method)}, greedy {tau(method.partition('@')[0])}")
    assert not bad, f"{doc.name}: rows of a rule at T = 0 that are not the greedy rows:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_timing_table_is_marked(doc):
    """A table of speeds is either checked against a saved report (`<!-- bench: ... -->`) or says
    which other run made it (`<!-- measured: ... -->`), or is arithmetic (`<!-- computed: ... -->`), on
    the line before it."""
    lines = doc.read_text().splitlines()
    unmarked = [lines[i] for i in range(1, len(lines) - 1)
                if lines[i].startswith("|") and lines[i + 1].startswith("|---") and not lines[i - 1].startswith("|")
                and TIMING_HEADER.search(lines[i]) and not re.match(r"<!-- (bench|measured|computed): ", lines[i - 1])]
    assert not unmarked, f"{doc.name}: tables of measurements with no <!-- bench: --> or <!-- measured: --> line:\n" + "\n".join(unmarked)


def machine_of(report: dict) -> str | None:
    """The machine a saved report names, as a table's line shows it: its device, and its threads
    where it keeps them apart (docs/kernel_launcher.json); None for a report that names none
    (a bare "cpu" names no machine)."""
    device = report.get("device")
    if not device or device.split(" ")[0] == "cpu":
        return None
    threads = report.get("threads")
    return device if not threads or "thread" in device else f"{device}, {threads} thread" + "s" * (threads > 1)


def machine_problems(text: str, root: Path = ROOT):
    """Marked tables whose next lines are not a blank line and `*Measured on: MACHINE.*`, MACHINE
    the one the table's own report records."""
    for m in MARKER.finditer(text):
        machine = machine_of(json.loads((root / m.group(1)).read_text()))
        below = text[m.end():].split("\n", 2)[:2]
        if machine is None:
            yield f"{m.group(1)} records no machine: measure it again with today's code"
        elif below != ["", f"*Measured on: {machine}.*"]:
            yield f"the table of {m.group(1)} is followed by {below}, not a blank line and *Measured on: {machine}.*"


@pytest.mark.parametrize("doc", DOCS + sorted(set((ROOT / "docs").glob("*.md")) - set(DOCS)), ids=lambda d: d.name)
def test_every_measured_table_names_its_machine(doc):
    """Under every table from a saved report, the machine that report was measured on (CPU model and
    instruction set with its threads, or the GPU), as the report itself records it."""
    bad = list(machine_problems(doc.read_text()))
    assert not bad, f"{doc.name}: run python -m tinyspec figures tables\n" + "\n".join(bad)


MEASURED_HEADER = re.compile(TIMING_HEADER.pattern + r"|\bms\b|µs", re.I)


def unmarked_problems(text: str, root: Path = ROOT):
    """Tables of measurements with no `<!-- bench: -->` marker (the instructor's guide's, say) whose
    next lines are not a blank line and `*Measured on: ...*` naming the machine of a report their
    section cites (the text since the last heading, or the line itself)."""
    lines = text.splitlines()
    for i in range(1, len(lines) - 1):
        if not (lines[i].startswith("|") and lines[i + 1].startswith("|---") and not lines[i - 1].startswith("|")
                and MEASURED_HEADER.search(lines[i]) and not lines[i - 1].startswith("<!-- ")):
            continue
        end = next((j for j in range(i, len(lines)) if not lines[j].startswith("|")), len(lines))
        below = lines[end:end + 2]
        heading = max((j for j in range(i) if lines[j].startswith("#")), default=0)
        cited = {s for s in SOURCE.findall("\n".join(lines[heading:i] + below[1:])) if s.endswith(".json")}
        machines = {m for m in (machine_of(json.loads((root / s).read_text())) for s in cited if (root / s).is_file()) if m}
        if len(below) < 2 or below[0] or not below[1].startswith("*Measured on: ") \
                or not any(m in below[1] for m in machines):
            yield f"line {i + 1}: {lines[i][:50]}: no *Measured on: ...* line naming the machine of {sorted(cited) or 'a cited report'}"


@pytest.mark.parametrize("doc", sorted((ROOT / "docs").glob("*.md")), ids=lambda d: d.name)
def test_every_unmarked_table_of_measurements_names_its_machine(doc):
    bad = list(unmarked_problems(doc.read_text()))
    assert not bad, f"{doc.name}:\n" + "\n".join(bad)


def test_a_table_without_its_machine_is_caught(tmp_path):
    """The check fails a table with no machine line, or another machine's, or a report that names
    none; and the refill refuses such a report rather than guess."""
    from tinyspec.bench.tables import fill_tables
    (tmp_path / "r.json").write_text(json.dumps({"device": "AMD EPYC (AVX2), 1 thread", "rows": [
        {"method": "ar", "temperature": 0.0, "category": "code", "tau": 1.0}]}))
    table = "<!-- bench: r.json columns=method,T,tau[code] -->\n| method | T | tau |\n|---|---|---|\n| `ar` | 0 | 1.00 |\n"
    good = fill_tables(table + "\nMore prose.\n", tmp_path)
    assert good == table + "\n*Measured on: AMD EPYC (AVX2), 1 thread.*\n\nMore prose.\n"
    assert fill_tables(good, tmp_path) == good and not list(machine_problems(good, tmp_path))
    assert list(machine_problems(table + "\nMore prose.\n", tmp_path))
    assert list(machine_problems(good.replace("AMD EPYC (AVX2)", "NVIDIA H200"), tmp_path))
    (tmp_path / "r.json").write_text(json.dumps({"device": "cpu (1 thread)", "rows": []}))
    assert list(machine_problems(good, tmp_path))
    with pytest.raises(ValueError, match="does not record the machine"):
        fill_tables(good, tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "r.json").write_text(json.dumps({"device": "NVIDIA H200", "rows": []}))
    guide = "## Expected\nOn `docs/r.json`'s GPU:\n\n| method | tok/s |\n|---|---|\n| `ar` | 900 |\n"
    assert list(unmarked_problems(guide + "\nProse.\n", tmp_path))
    assert list(unmarked_problems(guide + "\n*Measured on: AMD EPYC (AVX2), 1 thread.*\n", tmp_path))
    assert not list(unmarked_problems(guide + "\n*Measured on: NVIDIA H200.*\n", tmp_path))


def test_the_table_generator_agrees_with_the_check(tmp_path):
    """`python -m tinyspec figures tables` would leave every marked table as it is, and the
    arithmetic figures draw (to a scratch directory)."""
    pytest.importorskip("matplotlib")
    from tinyspec.bench import figures
    for doc in DOCS:
        assert figures.fill_tables(doc.read_text()) == doc.read_text(), f"{doc.name}: run python -m tinyspec figures tables"
    figures.main(["residual", "speedup", "--out", str(tmp_path)])
    assert {p.name for p in tmp_path.iterdir()} == {"residual.png", "tau_and_speedup.png"}


def test_figures_go_where_out_says_and_by_default_not_into_the_checkout(tmp_path, monkeypatch, capsys):
    """Bare `python -m tinyspec figures` draws into $TINYSPEC_HOME/figures, never over the book's
    docs/figures; a place no file can be made in (as root too) is refused before anything is drawn."""
    pytest.importorskip("matplotlib")
    from conftest import refused
    from tinyspec.bench import figures
    monkeypatch.setenv("TINYSPEC_HOME", str(tmp_path))
    before = {p.name: p.stat().st_mtime_ns for p in (ROOT / "docs" / "figures").iterdir()}
    figures.main([])
    assert {p.name for p in (tmp_path / "figures").iterdir()} == {"residual.png", "tau_and_speedup.png"}
    assert {p.name: p.stat().st_mtime_ns for p in (ROOT / "docs" / "figures").iterdir()} == before
    monkeypatch.setattr(figures, "residual_figure", lambda out: pytest.fail("drawn before --out was tried"))
    for where in ("/proc/x", "/sys/x"):
        err = refused(figures.main, ["--out", where, "residual"], capsys)
        assert f"--out {where}: cannot create a file in" in err and "Traceback" not in err


@pytest.mark.parametrize("report, message", [("README.md", "is not a saved benchmark report"),
                                             ("{tmp}/none.json", "no such file"), ("{tmp}", "is not a saved benchmark report"),
                                             ("{tmp}/list.json", "is not a saved benchmark report")])
def test_figures_refuse_a_report_that_is_not_one(report, message, tmp_path, capsys):
    """`figures bench --report FILE` with FILE not a benchmark's JSON: one line, exit 2, nothing drawn."""
    pytest.importorskip("matplotlib")
    from conftest import refused
    from tinyspec.bench import figures
    (tmp_path / "list.json").write_text("[1, 2]")
    report = str(ROOT / report) if report == "README.md" else report.format(tmp=tmp_path)
    err = refused(figures.main, ["bench", "--report", report, "--out", str(tmp_path / "out")], capsys)
    assert message in err and "Traceback" not in err and not (tmp_path / "out").exists()


def test_the_tour_can_be_checked_by_eye():
    """The README's tour: every generate command on the fibonacci prompt writes the same number of
    tokens (so "identical to plain" can be seen), and every sampled one names its seed."""
    tour = [a for d, a in shown_commands() if d == "README.md" and a[2:4] == ["tinyspec", "generate"]]
    fib = [a for a in tour if "def fibonacci(n):" in a and "--cuda-graph" not in a]
    assert len(fib) >= 5 and all(a[a.index("--max-new-tokens") + 1] == "64" for a in fib if "--max-new-tokens" in a)
    assert all("--max-new-tokens" in a for a in fib)
    sampled = [a for a in tour if "--temperature" in a and float(a[a.index("--temperature") + 1]) > 0]
    assert sampled and all("--seed" in a for a in sampled)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_no_control_characters(doc):
    """A Python string that ate a backslash (`\\beta` as a backspace, `\\nu` as a newline) leaves a
    control character or a stray line in the book's LaTeX: neither may be there."""
    text = doc.read_text(encoding="utf-8")
    bad = [(i, line[:60]) for i, line in enumerate(text.splitlines(), 1) if any(ord(c) < 32 and c != "\t" for c in line)]
    assert not bad and "\t" not in text, bad
    assert not re.findall(r"^u[(}]", text, re.M), "a line starting with 'u(' is a \\nu split by a newline"


def test_the_corpus_figures_are_the_saved_data_cards():
    """The corpus sizes docs/results.md gives come from docs/corpus.json (`python -m tinyspec data`'s meta.json)."""
    meta = json.loads((ROOT / "docs" / "corpus.json").read_text())
    sources = meta["sources"]
    packages = importlib.import_module("tinyspec.training.corpus").PACKAGES
    assert len(sources) == 21 and set(sources) - {"stdlib"} == set(packages)
    total, stdlib = sum(r["train_tokens"] for r in sources.values()) / 1e6, sources["stdlib"]["train_tokens"] / 1e6
    assert f"({total:.1f}M training tokens, {stdlib:.1f}M of them the standard library's)" in \
        " ".join((ROOT / "docs" / "results.md").read_text().split())


QUALITY = re.compile(r"^<!-- quality: before=(\S+) after=(\S+) -->\n((?:\|.*\n)+)", re.M)


def quality_value(report: dict, label: str) -> list:
    """What a row of a before/after table shows, read from a `python -m tinyspec evaluate` report:
    'validation loss' (stdlib, packages), 'loops' (greedy continuations that loop, per category),
    or 'tau METHOD' (per category)."""
    categories = ("code", "docs", "structured")
    if label == "validation loss":
        return [report["validation_loss"][k] for k in ("val", "val-packages")]
    if label == "loops":
        return [report["loops"][c][0] for c in categories]
    return [report["tau"][label.removeprefix("tau ").strip("`")][c] for c in categories]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_before_and_after_tables_are_the_saved_evaluations(doc):
    """A table marked `<!-- quality: before=FILE after=FILE -->` shows, per row, the two reports'
    figures (`quality_value`), each cell 'a/b/c' rounded as printed."""
    bad = []
    for m in QUALITY.finditer(doc.read_text()):
        reports = [json.loads((ROOT / path).read_text()) for path in m.groups()[:2]]
        for line in m.group(3).splitlines()[2:]:
            label, *cells = [c.strip() for c in line.strip().strip("|").split("|")]
            for report, cell in zip(reports, cells[-2:]):
                values = quality_value(report, label)
                parts = re.split(r"\s*/\s*", cell)
                if len(parts) != len(values) or not all(agrees(p, v) for p, v in zip(parts, values)):
                    bad.append(f"{label}: the table says {cell}, the report {values}")
    assert not bad, f"{doc.name}: " + "; ".join(bad)


def test_ci_runs_the_readmes_install_and_test_commands():
    """.ci/run reads its install and test commands from the README's blocks marked `<!-- ci: NAME -->`
    (so CI installs what a reader pastes): every block it names is there, the CPU install names the
    CPU build of torch, and between them the blocks run the fast and the slow tests without Triton,
    as the CPU install leaves a user, then install the triton extra and run the tests that need it."""
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    names = re.findall(r"^run_readme_block (\w+)", ci, re.M)
    assert names == ["install", "slow", "triton"], names
    blocks = {}
    for name in names:
        m = re.search(rf"^<!-- ci: {name} -->\n```bash\n(.*?)^```", readme, re.S | re.M)
        assert m, f"README.md has no ```bash block right after <!-- ci: {name} -->"
        blocks[name] = [line.split("#")[0].strip() for line in m.group(1).splitlines() if line.strip()]
    cpu = '"torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu'
    assert blocks["install"][0] == f'pip install -e ".[test]" {cpu}'
    assert blocks["triton"] == [f'pip install -e ".[test,triton]" {cpu}', "python -m pytest -m triton"]
    assert "python -m pytest -n auto" in blocks["install"] and blocks["slow"] == ["python -m pytest -m slow -n auto"]
    # and the fast tests on the other instruction sets (not the CPU's own: that ran), before Triton is installed
    assert ci.index("for isa in avx2 default; do") < ci.index("ATEN_CPU_CAPABILITY=$isa python -m pytest -n auto\n") \
        < ci.index("run_readme_block triton")
    installs = [line.strip() for line in ci.splitlines() if re.match(r"\s*(python -m )?pip install", line)]
    assert installs == ["python -m pip install --quiet --upgrade pip"], installs  # none of its own beside the README's


def test_the_readme_is_read_in_ten_minutes():
    """The README says what tinyspec is on its first screen, gives the install and the test command
    within its first 60 lines, and stays within 2,500 words: the long tables live in docs/results.md."""
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert "speculative decoding" in " ".join(lines[:25]).lower(), "the first screen must say what tinyspec is"
    start = lines.index("<!-- ci: install -->")
    end = lines.index("```", start + 2)  # the install block's closing fence
    assert end < 60 and "python -m pytest -n auto" in lines[start:end], "install and test commands within the first 60 lines"
    words = len(text.split())
    assert words <= 2_500, f"README.md has {words} words: move the long parts to docs/results.md"


def test_triton_is_an_extra_of_its_own():
    """The test extra does not pull Triton (about 1 GB) onto a CPU; the kernel's tests skip without it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any(r.startswith("triton") for r in extras["test"]) and extras["triton"][0].startswith("triton")



OBJECTIVES = re.compile(r"^## (\d+) [^\n]*\n\n\*\*After this chapter you can:\*\*\n\n((?:- [^\n]*\n)+)\n", re.M)


def test_every_chapter_opens_with_three_to_five_objectives():
    """Every chapter of the walkthrough opens, below its title, with what a reader can do after it:
    "**After this chapter you can:**" and three to five checkable items, one list, each beginning
    with a verb in lower case and ending with ";", the last with "." (the book's form for lists)."""
    text = (ROOT / "walkthrough.md").read_text()
    chapters = re.findall(r"^## (\d+) ", text, re.M)
    found = {n: items.splitlines() for n, items in OBJECTIVES.findall(text)}
    assert list(found) == chapters, f"chapters without objectives below their title: {sorted(set(chapters) - set(found))}"
    for n, items in found.items():
        assert 3 <= len(items) <= 5, f"chapter {n}: {len(items)} objectives"
        assert all(re.match(r"- [a-z]", item) for item in items), f"chapter {n}: an objective begins with a verb"
        assert all(item.endswith(";") for item in items[:-1]) and items[-1].endswith("."), f"chapter {n}"


def test_the_book_keeps_its_word_budget():
    """Chapters 0-14 of the walkthrough stay within 24,000 words, and each method added since
    (a file of methods/ after the seed methods: draft, medusa, eagle, lookup, lookahead) at most
    1,500 more: a book a student reads through, not a reference that grows with every feature. A
    figure is looked at, not read through: its image line and the one-line caption under it are not
    counted."""
    from tinyspec.methods import METHODS
    added = [m for m in METHODS if m not in ("ar", "draft", "medusa", "eagle", "lookup", "lookahead")]
    text = (ROOT / "walkthrough.md").read_text()
    lines = text[text.index("\n## 0 "):].splitlines()
    chapters = "\n".join(line for i, line in enumerate(lines) if not line.startswith("![")
                         and not (line.startswith("*") and i and lines[i - 1].startswith("![")))
    words = len(chapters.split())
    assert words <= 24_000 + 1_500 * len(added), f"{words} words in chapters 0-14 for {len(added)} added methods"


# Prose figures
# -------------
# A number quoted in the text (a decimal, a percentage, an integer of three or more digits such as
# 455 or 1,613; counts below 100 are too often not figures) comes from
# a saved file: the results (docs/**/*.json) or a card (weights/*.md, docs/*.md cards) that its
# paragraph or an earlier paragraph of its section names (a table's marker counts). Each must be
# found among that file's numbers, rounded as the text prints it; a number that is no measurement
# (a constant, a hyperparameter, a section of a paper) or that the text derives from measured ones
# is named below with why. So a figure cannot go stale when its file is measured again.
SOURCE = re.compile(r"(?:docs|weights)/[\w/.-]+\.(?:json|md)")
FIGURE = re.compile(r"(?<![\w.:/=,-])(\d{1,3}(?:,\d{3})+|\d+\.\d+|\d+%|[1-9]\d{2,3}(?![\w.,%]))")
YEARS = range(1900, 2100)  # a four-digit integer in this range is a year, not a figure
NOT_SOURCES = {"docs/appendix.md", "docs/results.md", "docs/example_prompts.txt"}  # prose of its own, not saved results
NOT_MEASURED = {  # (document, figure, the words after it): why it needs no file
    ("results.md", "33.8", "M tokens of 6,707"): "the size of a datastore the text builds, as its command prints it",
    ("results.md", "6,707", "modules, 193 MB"): "the size of a datastore the text builds, as its command prints it",
    ("results.md", "8,192", "-token LM head"): "the vocabulary's size",
    ("results.md", "14.0", "M parameters"): "the preset's parameter count, from its config",
    ("walkthrough.md", "0.8", "MFLOP at"): "arithmetic on the preset's shapes",
    ("walkthrough.md", "3.35", "TB/s from HBM3"): "a data sheet's figure",
    ("walkthrough.md", "0.59", "for"): "the worked example's arithmetic",
    ("walkthrough.md", "921,088", "parameters are"): "the head's parameter count, from its shapes",
    ("walkthrough.md", "4.2", "; `eagle_loss`"): "a section of a paper",
    ("walkthrough.md", "1,000", ".\n- *Decay"): "arithmetic on the optimizer's beta",
    ("walkthrough.md", "0.1", "on parameters of"): "a hyperparameter",
    ("walkthrough.md", "1.5", "M parameters match"): "the preset's parameter count, from its config",
    ("walkthrough.md", "8,192", "-row LM head"): "the vocabulary's size",
    ("walkthrough.md", "8,533,509", "training and"): "docs/corpus.json's 8,531,914 tokens and one <|endoftext|> per module (1,595)",
    ("walkthrough.md", "289,118", "validation tokens"): "docs/corpus.json's 289,048 tokens and one <|endoftext|> per module (70)",
    ("walkthrough.md", "10%", "* (`training/optim.p"): "the schedule's warm-up share, a hyperparameter",
    ("walkthrough.md", "372", "-391 for float32"): "float32 `ar` on the Xeon of docs/bench_bf16.json, in docs/bench.json's earlier run (git history)",
    ("results.md", "372", "-391 on the same"): "float32 `ar` on the Xeon of docs/bench_bf16.json, in docs/bench.json's earlier run (git history)",
    ("walkthrough.md", "1.58", "plain steps. It"): "1.90 tokens over 1.2, the speedup asked",
    ("walkthrough.md", "1.05", "(the policy's margi"): "the policy's margin, a constant of speed/policy.py",
    ("walkthrough.md", "3.5", "x (455 to 1,613"): "the ratio of the two figures that follow it",
    ("walkthrough.md", "4.4", "at $B = 16$"): "the ratio of the two step times that follow it",
    ("walkthrough.md", "0.87", "at $B = 1$"): "the cost model's formula worked on the table's figures",
    ("walkthrough.md", "0.40", "at $B = 16$"): "the cost model's formula worked on the table's figures",
    ("walkthrough.md", "10%", "or more between run"): "how far single figures move between runs, a caution",
    ("results.md", "3.5", "x from B = 1 to 16"): "the ratio of the two figures that follow it",
    ("results.md", "384", "wide, 14.0M"): "the preset's width",
    ("walkthrough.md", "990", "TFLOP/s of dense"): "a data sheet's figure",
    ("walkthrough.md", "300", "FLOP/byte"): "a data sheet's ratio (990 TFLOP/s over 3.35 TB/s)",
    ("walkthrough.md", "128", "cached tokens"): "the example's context length",
    ("walkthrough.md", "100", ": buckets"): "the hash's modulus",
}


def file_numbers(path: str) -> list[float]:
    """Every number a saved file holds: a JSON's numeric leaves and the numbers inside its strings,
    or a card's numbers."""
    text = (ROOT / path).read_text()
    if path.endswith(".json"):
        leaves, todo = [], [json.loads(text)]
        while todo:
            x = todo.pop()
            if isinstance(x, dict | list):
                todo += x.values() if isinstance(x, dict) else x
            elif isinstance(x, str):
                leaves += re.findall(r"\d[\d,]*(?:\.\d+)?", x)
            elif isinstance(x, int | float) and not isinstance(x, bool):
                leaves.append(x)
    else:
        leaves = re.findall(r"\d[\d,]*(?:\.\d+)?", text)
    return [float(str(v).rstrip(",").replace(",", "")) for v in leaves]


def found_in(figure: str, numbers: list[float]) -> bool:
    """A figure as printed agrees with one of the numbers: rounded to its decimals, a percentage
    as a fraction or as a percentage."""
    if figure.endswith("%"):
        p = float(figure[:-1])
        return any(abs(100 * v - p) <= 0.5 + 1e-9 or abs(v - p) <= 0.5 + 1e-9 for v in numbers)
    x, decimals = float(figure.replace(",", "")), len(figure.partition(".")[2])
    return any(abs(v - x) <= 0.5 * 10 ** -decimals + 1e-9 or abs(v / 1e6 - x) <= 0.5 * 10 ** -decimals + 1e-9
               for v in numbers)  # or in millions (8.5M tokens)


def prose_figures(doc: Path):
    """(line, figure, the words after it, the files its section names) for every quoted figure in
    a paragraph whose section names a saved file; code, math and tables are not prose."""
    text = doc.read_text()
    sources, line = [], 1
    for para in re.split(r"(\n\s*\n)", text):
        if para.lstrip().startswith("#"):
            sources = []
        sources += [s for s in SOURCE.findall(para) if s not in NOT_SOURCES and (ROOT / s).is_file()]
        if sources and not para.lstrip().startswith(("|", "<!--", "```")):
            prose = re.sub(r"```.*?```|\$\$.*?\$\$|\$[^$]*\$|`[^`]*`", lambda m: " " * len(m.group(0)), para, flags=re.S)
            for m in FIGURE.finditer(prose):
                if m.group(1).isdigit() and int(m.group(1)) in YEARS or prose[:m.start()].endswith("Figure "):
                    continue  # a year, or a figure's number in the book ("Figure 5.3"), not a measurement
                yield line + para[:m.start()].count("\n"), m.group(1), para[m.end():m.end() + 20], sorted(set(sources))
        line += para.count("\n")


def excused(doc: Path, figure: str, after: str) -> tuple | None:
    """The NOT_MEASURED entry that names this figure of `doc`, the words after it included; None if none does."""
    return next((k for k in NOT_MEASURED if (doc.name, figure) == k[:2]
                 and " ".join(after.split()).startswith(" ".join(k[2].split()))), None)


PROSE_DOCS = [d for d in DOCS if d.name != "appendix.md"]


@pytest.mark.parametrize("doc", PROSE_DOCS, ids=lambda d: d.name)
def test_prose_figures_come_from_the_files_they_cite(doc):
    bad = []
    for line, figure, after, sources in prose_figures(doc):
        if excused(doc, figure, after):
            continue
        if not found_in(figure, [v for s in sources for v in file_numbers(s)]):
            bad.append(f"{doc.name}:{line}: {figure} (before {after!r}) is in none of {', '.join(sources)}")
    assert not bad, "figures that their section's files do not hold (fix the figure, cite its file, " \
                    "or name it in NOT_MEASURED with why):\n" + "\n".join(bad)


def test_every_figure_excused_is_still_in_the_text():
    """Each NOT_MEASURED entry excuses a figure the docs still print: one whose text changed is
    dropped, so the list cannot hold stale excuses."""
    used = {excused(doc, figure, after) for doc in PROSE_DOCS for _, figure, after, _ in prose_figures(doc)}
    unused = sorted(set(NOT_MEASURED) - used)
    assert not unused, f"NOT_MEASURED entries that match no figure of the docs (drop them): {unused}"


def test_a_stale_prose_figure_is_caught(tmp_path, monkeypatch):
    """The check fails a figure its file no longer holds, and passes it once it does."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "r.json").write_text(json.dumps({"rows": [{"speedup": 2.274}]}))
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    doc = tmp_path / "README.md"
    doc.write_text("## Results\n\nSaved in `docs/r.json`.\n\nSo `rest` ran at 2.31x, at 99% of it.\n")
    got = [(f, found_in(f, file_numbers(s[0]))) for _, f, _, s in prose_figures(doc)]
    assert got == [("2.31", False), ("99%", False)]
    doc.write_text("## Results\n\nSaved in `docs/r.json`.\n\nSo `rest` ran at 2.27x ($x = 0.5$).\n")
    assert [(f, found_in(f, file_numbers(s[0]))) for _, f, _, s in prose_figures(doc)] == [("2.27", True)]


def paragraph_with(doc: Path, words: str) -> str:
    """The paragraph of `doc` that holds `words` (line breaks as spaces)."""
    found = [" ".join(p.split()) for p in re.split(r"\n\s*\n", doc.read_text()) if words in " ".join(p.split())]
    assert len(found) == 1, f"{doc.name}: {len(found)} paragraphs hold {words!r}"
    return found[0]


def cpu_of(report: str) -> str:
    """The CPU family a saved report was measured on, from its `device` ("AMD EPYC (AVX2), 1 thread")."""
    device = json.loads((ROOT / report).read_text())["device"]
    return next(name for name in ("Xeon", "EPYC", "Ryzen", "Core", "Apple", "cuda", "NVIDIA") if name in device)


@pytest.mark.parametrize("report, words", [
    ("docs/bench_bf16.json", "--save docs/bench_bf16.json"), ("docs/batch.json", "--save docs/batch.json"),
    ("docs/tau_seeds.json", "`docs/tau_seeds.json`")])
def test_a_paragraph_showing_a_saved_run_names_its_cpu(report, words):
    """The paragraph that shows how a report was made names the CPU it was made on (its `device`),
    not "this CPU" or another chapter's."""
    text = paragraph_with(ROOT / "walkthrough.md", words)
    assert cpu_of(report) in text, f"the paragraph showing {report} does not name its CPU, {cpu_of(report)}"


UNNAMED_MACHINE = re.compile(r"\bthis (?:shared |project's )?(?:CPU|machine|computer)\b", re.I)


@pytest.mark.parametrize("doc", DOCS + sorted(set((ROOT / "docs").glob("*.md")) - set(DOCS)), ids=lambda d: d.name)
def test_the_prose_names_the_machine_it_speaks_of(doc):
    """The saved runs come from several CPUs and GPUs, so "this CPU" names none of them: the prose
    names the machine of the report it speaks of (an AMD EPYC with AVX2, the Xeon of `docs/batch.json`),
    or says "a CPU" where the claim holds for any, or "your CPU" to a reader."""
    text = " ".join(doc.read_text().split())
    bad = [text[max(m.start() - 40, 0):m.end() + 20] for m in UNNAMED_MACHINE.finditer(text)]
    assert not bad, f"{doc.name}: name the machine of the report (its `device`):\n" + "\n".join(bad)


def test_the_guides_noise_figures_are_the_seeded_runs():
    """The rules deliverable's noise paragraph in the instructor's guide quotes tau, its spread over
    seeds and the rules' gains from `docs/tau_seeds.json` (or `docs/bench.json`'s single run), and
    the saved spreads and gains are what the saved tau make."""
    saved = json.loads((ROOT / "docs" / "tau_seeds.json").read_text())
    assert saved["seeds"] == [0, 1, 2] and saved["device"] and saved["command"].startswith("python -m tinyspec bench")
    for row in saved["tau"] + saved["gains"]:
        assert len(row["by_seed"]) == 3 and row["spread"] == pytest.approx(max(row["by_seed"]) - min(row["by_seed"]), abs=2e-3)
    tau = {(r["method"], r["category"]): r["by_seed"] for r in saved["tau"]}
    for g in saved["gains"]:
        want = [a - b for a, b in zip(tau[(g["method"], g["category"])], tau[(g["over"], g["category"])])]
        assert g["by_seed"] == pytest.approx(want, abs=2e-3), g
    paragraph = paragraph_with(GUIDE, "**Noise.** Each cell")
    assert "docs/tau_seeds.json" in paragraph
    numbers = file_numbers("docs/tau_seeds.json") + file_numbers("docs/bench.json")
    prose = re.sub(r"\$[^$]*\$|`[^`]*`", " ", paragraph)
    figures = [m.group(1) for m in FIGURE.finditer(prose)]
    assert figures and all(found_in(f, numbers) for f in figures), [f for f in figures if not found_in(f, numbers)]


def test_the_books_parameter_counts_are_the_models():
    """Chapter 2's preset sizes, chapter 8's shared and private head sizes and chapter 9's EAGLE
    head, counted from the modules themselves: figures the prose quotes without a file."""
    from tinyspec.methods.eagle import EagleHead
    from tinyspec.methods.medusa import MedusaHeads
    from tinyspec.model import GPT, PRESETS

    text = " ".join((ROOT / "walkthrough.md").read_text().split())
    small = PRESETS["small"]
    count = lambda m: sum(p.numel() for p in m.parameters())
    for name, config in PRESETS.items():
        assert f"{GPT(config).num_params():,} (`{name}`)" in text, name
    assert f"Four shared-head blocks have {count(MedusaHeads(small.n_embd, 4)):,} parameters" in text
    assert f"four private matrices would add {4 * small.n_embd * small.vocab_size:,}" in text
    assert f"Its {count(EagleHead(small)):,} parameters" in text


@pytest.mark.slow
def test_chapter_8s_eagle_tree_is_the_shipped_weights_tree(capsys):
    """The worked tree of chapter 9 is what `figures eagle-tree` prints with the shipped weights:
    the same nodes, marks and step; values within 0.001 (the last digit may round either way on
    another CPU)."""
    from tinyspec.bench.figures import eagle_tree

    text = (ROOT / "walkthrough.md").read_text()
    start = text.index("(`python -m tinyspec figures eagle-tree`):\n\n```\n") + len("(`python -m tinyspec figures eagle-tree`):\n\n```\n")
    shown = text[start:text.index("```", start)].splitlines()
    eagle_tree(WEIGHTS / "target.safetensors", WEIGHTS / "eagle.safetensors", WEIGHTS / "tokenizer.tiktoken")
    printed = capsys.readouterr().out.splitlines()
    assert len(shown) == len(printed)
    for book, now in zip(shown, printed):
        value = re.compile(r" (\d\.\d{3})$")
        if value.search(book) and value.search(now):
            assert value.sub("", book) == value.sub("", now)
            assert abs(float(value.search(book).group(1)) - float(value.search(now).group(1))) <= 0.0015, (book, now)
        else:
            assert book == now


def test_the_readmes_map_of_files_gives_the_walkthroughs_chapter_numbers():
    """README's "What is inside" gives each room's chapters, and each method file's: they are the
    walkthrough's. The table said Medusa 7, EAGLE 8 and the draft-free methods 9, a chapter before
    the book (Exact rules became chapter 7). A file's chapter is the one, after the map of chapter
    0, that names the file most; where the course grades a function of the file, its chapter too."""
    from tinyspec.course.assignments import CHAPTERS
    book = (ROOT / "walkthrough.md").read_text()
    parts = re.split(r"^## (\d+) ", book, flags=re.M)
    chapters = {int(number): text for number, text in zip(parts[1::2], parts[2::2])}
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## What is inside", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "`tinyspec/" in line]
    said = 0
    for row in rows:
        numbers = {int(n) for a, b in re.findall(r"(\d+)(?:-(\d+))?", row[-1]) for n in range(int(a), int(b or a) + 1)}
        assert numbers <= set(chapters) or not numbers, row[-1]
        for files, number in re.findall(r"((?:`tinyspec/[\w/]+\.py`(?:, )?)+) (\d+)", row[1]):
            for file in re.findall(r"`tinyspec/([\w/]+\.py)`", files):
                named = {n: text.count(file) for n, text in chapters.items() if n > 0}
                graded = {int(c.walkthrough.split()[0]) for c in CHAPTERS.values()
                          if any(f.startswith(file + ":") for f in c.functions)}
                assert max(named, key=named.get) == int(number) and graded <= {int(number)} and \
                    int(number) in numbers, f"README gives {file} chapter {number}; the walkthrough names it " \
                    f"most in chapter {max(named, key=named.get)}, the course grades it in {graded or 'none'}"
                said += 1
    assert said >= 7  # every method's file


def test_evaluates_help_says_what_its_save_holds():
    """evaluate --help showed the benchmark's --save ("before the table prints", "the rows that
    finished"): evaluate prints no table, and its report is losses, loops and taus."""
    from tinyspec.bench import evaluate
    text = " ".join(evaluate.build_parser().format_help().split())
    assert "--save FILE write the JSON report (validation loss, loops, each method's tau per category) to FILE " \
        "before it prints; after a Ctrl-C it holds what had finished" in text and "table" not in text, text
