"""The house: imports point down the walkthrough's order, with no circles and no arrows back up.

A reader goes through the files in the order of `ORDER` (README's table, the book's chapters);
each file may use only files before it. The commands sit on top, in `COMMANDS`' order. Every
import counts, also one inside a function or under `if TYPE_CHECKING:`."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tinyspec"

ORDER = [
    "__init__", "files",  # atomic writes, used from chapter 1 on
    "tokenizer", "model",
    "cli",  # what every command shares (paths, one-line errors, arguments; loading a model or tokenizer: after them)
    "kvcache", "sampling", "decoding", "speculative", "tree", "verify", "medusa", "eagle",
    "lookup", "lookahead", "kernels.__init__", "kernels.tree_attention", "fastpath", "data", "optim", "checkpoint", "distill",
    "train_heads", "train", "timing", "policy", "auto", "methods", "ledger", "sizing",
]
COMMANDS = ["peer", "plots", "kernels.bench", "specs", "benchmark", "batches", "report", "bench", "evaluate", "generate", "figures", "course", "__main__"]


def imports(path: Path) -> set[str]:
    """The tinyspec modules a file imports (relative imports, resolved), as ORDER names them."""
    module = path.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")
    package = module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - (node.level - 1)]
            names = [node.module] if node.module else [a.name for a in node.names]
            found |= {".".join(base + name.split(".")) for name in names}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found |= {n.removeprefix("tinyspec.") for n in names if n and n.startswith("tinyspec.")}
    return {f if f in ORDER + COMMANDS else f + ".__init__" for f in found}


def test_every_file_has_its_place():
    files = {p.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".") for p in PACKAGE.rglob("*.py")}
    assert files == set(ORDER + COMMANDS), "a file is missing from ORDER or COMMANDS, or named there but gone"


def test_imports_point_down_the_walkthroughs_order():
    rank = {name: i for i, name in enumerate(ORDER + COMMANDS)}
    up = []
    for path in PACKAGE.rglob("*.py"):
        me = path.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")
        up += [f"{me} imports {other}" for other in imports(path) if rank[other] >= rank[me]]
    assert not up, "arrows back up (or circles):\n" + "\n".join(sorted(up))


def test_the_check_sees_a_circle_and_an_arrow_up(tmp_path, monkeypatch):
    """The check itself can fail: a planted import of a later file is reported."""
    fake = tmp_path / "tinyspec"
    fake.mkdir()
    (fake / "model.py").write_text("from .medusa import MedusaHeads\n")
    (fake / "medusa.py").write_text("from .model import GPT\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert imports(fake / "model.py") == {"medusa"} and imports(fake / "medusa.py") == {"model"}
    rank = {name: i for i, name in enumerate(ORDER + COMMANDS)}
    assert rank["medusa"] > rank["model"]  # so model -> medusa is an arrow up, and with medusa -> model a circle


def code_lines(path: Path) -> int:
    """Lines a reader reads as code: not blank, not a comment, not a docstring."""
    text = path.read_text()
    docs = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docs |= set(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for i, line in enumerate(text.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and i not in docs)


def test_no_file_is_longer_than_a_reader_takes_in_at_once():
    long = {p.name: code_lines(p) for p in PACKAGE.rglob("*.py") if code_lines(p) > 400}
    assert not long, f"over 400 lines of code: {long}"
    assert code_lines(PACKAGE / "verify.py") > 50  # the count counts
