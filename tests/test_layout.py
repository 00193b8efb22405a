"""The house: rooms, and imports that point down them, with no circles and no arrows back up.

The engine sits at the top of tinyspec/ in the order of `CORE` (the walkthrough's chapters); then
the rooms of `ROOMS`, each a folder, in order: the methods (each with its readable proposing and,
beside it, its fixed-shape part for the recorded step, `recorded.py`), the kernels (chapter 11: the
Triton kernel and the fixed-shape forward, which import no method), speed, training, the commands (the shared interface, cli.py
and method.py, and the engine's commands), measurement (bench/), the course, and the entry points of `ENTRIES` on top
(`python -m tinyspec.generate`, `python -m tinyspec`). A file may use only files before it: in CORE
or an earlier room, or earlier in its own room's order. A room's files not named in its order (a new
method, say) come after the named ones and before the room's `__init__`, so a new method is one new
file and no edit here. Every import counts, also one inside a function or under `if TYPE_CHECKING:`."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tinyspec"

CORE = ["__init__", "files", "progress", "tokenizer", "model", "kvcache", "sampling", "tree", "verify", "decoding",
        "recorded", "results", "trace"]
ROOMS = {
    "methods": ["base", "ngrams", "growth", "draft", "medusa", "eagle", "lookup", "lookahead"],
    "kernels": ["tree_attention", "fastpath"],
    "speed": ["timing", "policy", "ledger", "sizing", "auto"],
    "training": ["corpus", "optim", "checkpoint", "distill", "gpt", "heads"],
    "commands": ["cli", "method", "data", "train", "generate"],
    "bench": ["specs", "peer", "plots", "kernels", "runner", "benchmark", "batches", "report", "evaluate", "diagrams", "drawings",
              "tables", "eagle_step", "figures", "command"],
    "course": ["assignments", "handouts"],
}
ENTRIES = ["generate", "__main__"]


def name_of(path: Path) -> str:
    return path.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")


def rank(name: str, names: set[str]) -> tuple:
    """Where a file sits: (room, place in the room). A room's __init__ comes after its files."""
    if name in CORE:
        return (0, CORE.index(name), "")
    if name in ENTRIES:
        return (len(ROOMS) + 1, ENTRIES.index(name), "")
    room, _, file = name.partition(".")
    order = ROOMS[room]
    place = order.index(file) if file in order else len(order) + 1 if file == "__init__" else len(order)
    return (list(ROOMS).index(room) + 1, place, "" if file in order else file)


def imports(path: Path) -> set[str]:
    """The tinyspec modules a file imports (relative imports, resolved), as `name_of` names them."""
    module = name_of(path)
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
    files = {name_of(p) for p in PACKAGE.rglob("*.py")}
    return {f if f in files else f + ".__init__" for f in found}


def test_every_file_has_its_place():
    for path in PACKAGE.rglob("*.py"):
        name = name_of(path)
        assert name in CORE or name in ENTRIES or name.partition(".")[0] in ROOMS, \
            f"{name} is in no room: put it in a folder of ROOMS, or name it in CORE"
    for room, order in ROOMS.items():
        for file in order:
            assert (PACKAGE / room / f"{file}.py").is_file(), f"{room}/{file}.py is named in ROOMS but gone"


def test_imports_point_down_the_rooms():
    names = {name_of(p) for p in PACKAGE.rglob("*.py")}
    up = []
    for path in PACKAGE.rglob("*.py"):
        me = name_of(path)
        up += [f"{me} imports {other}" for other in imports(path) if rank(other, names) >= rank(me, names)]
    assert not up, "arrows back up (or circles):\n" + "\n".join(sorted(up))


def test_the_check_sees_a_circle_and_an_arrow_up(tmp_path, monkeypatch):
    """The check itself can fail: a planted import of a later file is reported."""
    fake = tmp_path / "tinyspec"
    (fake / "methods").mkdir(parents=True)
    (fake / "model.py").write_text("from .methods.medusa import MedusaHeads\n")
    (fake / "methods" / "medusa.py").write_text("from ..model import GPT\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert imports(fake / "model.py") == {"methods.medusa"} and imports(fake / "methods" / "medusa.py") == {"model"}
    names = {"model", "methods.medusa"}
    assert rank("methods.medusa", names) > rank("model", names)  # so model -> medusa points up, and with it a circle


def test_a_new_method_file_has_its_place_without_an_edit():
    names = {"methods.draft", "methods.toy", "methods.__init__"}
    assert rank("methods.draft", names) < rank("methods.toy", names) < rank("methods.__init__", names)
    assert rank("decoding", names) < rank("methods.toy", names) < rank("speed.sizing", names)


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
    long = {name_of(p): code_lines(p) for p in PACKAGE.rglob("*.py") if code_lines(p) > 400}
    assert not long, f"over 400 lines of code: {long}"
    assert code_lines(PACKAGE / "verify.py") > 50  # the count counts


def test_no_method_file_has_a_loop_over_steps_or_chooses_a_size():
    """The one loop is decoding.decode: a method file neither drives steps (no `yield`, no call of
    `decode` or `verify`) nor consults a policy (`choose`). (The room's __init__ is no method: its
    Decoder hands a method to the loop.)"""
    for path in (PACKAGE / "methods").glob("*.py"):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        yields = [n for n in ast.walk(tree) if isinstance(n, (ast.Yield, ast.YieldFrom))]
        calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                 for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert not yields and not calls & {"decode", "verify", "choose"}, f"{path.name} drives steps or chooses a size"
