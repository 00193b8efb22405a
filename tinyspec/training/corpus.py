"""The corpus: the Python standard library and the sources of twenty permissively licensed
packages, split by whole modules.

Every Python user has the standard library on disk: about 1,800 modules and 30 MB of code,
docstrings and comments, with nothing to download. Beside it, `PACKAGES` pins twenty packages of
the package index (Django, SymPy, SQLAlchemy, ...), each under a permissive licence;
`python -m tinyspec data` downloads their wheels with pip (the one time anything is downloaded:
generating and the tests never do) and reads their `.py` modules. Vendored copies of other
packages (`_vendor/`) are skipped and a file whose text occurs earlier is dropped, so no text is
learned twice. Each module goes, by a hash of its path, to one of three splits, so a module is
never split between them:

- `train` (92%): what the models learn from (the tokenizer: the standard library's alone);
- `val` (4%): validation loss during training, reported for the standard library's held-out
  modules (`val.bin`, comparable with every earlier target) and the packages' (`val-packages.bin`);
- `bench` (4%): held out; the benchmark prompts come from the standard library's.

The split depends only on the module's path (e.g. `email/parser.py`, `django/db/utils.py`), so it
is the same on every machine and Python version. `--text FILE` adds other text to the training split.

Token ids are written once to a flat uint16 file per split (documents separated by
`<|endoftext|>`), which training reads back as a memory map: random windows cost no parsing. A
data card (`CORPUS.md` beside them) gives every source's version, licence, modules and tokens.

`python -m tinyspec data prompts --force` regenerates the benchmark prompts (`tinyspec/prompts.jsonl`)
from the held-out modules; the committed file keeps benchmarks identical across Python versions.
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import numpy as np
import torch

from ..files import atomic_write_json, atomic_write_text, home
from ..speed.sizing import device_name

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# the benchmark prompts, shipped with the package: the standard library's held-out modules', and code no model has read
PROMPTS = Path(__file__).resolve().parent.parent / "prompts.jsonl"
THIRD_PARTY_PROMPTS = PROMPTS.with_name("prompts_third_party.jsonl")
SPLIT_BUCKETS = {"val": range(0, 4), "bench": range(4, 8)}  # of 100 hash buckets; the rest is train


def split_of(relpath: str) -> str:
    """'train', 'val' or 'bench' for a module path relative to the stdlib root."""
    bucket = int(hashlib.sha1(relpath.encode()).hexdigest(), 16) % 100
    return next((name for name, buckets in SPLIT_BUCKETS.items() if bucket in buckets), "train")


def stdlib_modules(split: str, root: Path = STDLIB) -> list[Path]:
    """The stdlib's .py files of one split, sorted (third-party site-packages excluded)."""
    files = (p for p in root.rglob("*.py") if "site-packages" not in p.parts and "__pycache__" not in p.parts)
    return sorted(p for p in files if split_of(p.relative_to(root).as_posix()) == split)


def read_texts_of(paths) -> list[str]:
    """The UTF-8 text of each file, "" for the few stdlib test files in other encodings."""
    texts = []
    for p in paths:
        try:
            texts.append(Path(p).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            texts.append("")
    return texts


def read_texts(paths) -> list[str]:
    """The UTF-8 text of each file; the files in other encodings are skipped."""
    return [t for t in read_texts_of(paths) if t]


# name: (pinned version, licence as its metadata states it). Used for training, and for nothing
# else: benchmarks of held-out third-party code take packages that are not here.
PACKAGES = {
    "django": ("5.1.4", "BSD-3-Clause"), "sympy": ("1.13.3", "BSD-3-Clause"), "sqlalchemy": ("2.0.36", "MIT"),
    "requests": ("2.32.3", "Apache-2.0"), "flask": ("3.1.0", "BSD-3-Clause"), "click": ("8.1.7", "BSD-3-Clause"),
    "jinja2": ("3.1.4", "BSD-3-Clause"), "rich": ("13.9.4", "MIT"), "networkx": ("3.4.2", "BSD-3-Clause"),
    "pygments": ("2.18.0", "BSD-2-Clause"), "docutils": ("0.21.2", "BSD-2-Clause, public domain"),
    "sphinx": ("8.1.3", "BSD-2-Clause"), "setuptools": ("75.6.0", "MIT"), "pip": ("24.3.1", "MIT"),
    "tornado": ("6.4.2", "Apache-2.0"), "twisted": ("24.11.0", "MIT"), "attrs": ("24.2.0", "MIT"),
    "pydantic": ("2.10.3", "MIT"), "black": ("24.10.0", "MIT"), "mypy": ("1.13.0", "MIT"),
}


# Packages in no corpus: their modules give benchmark prompts of third-party code that no model has
# read (`python -m tinyspec data third-party-prompts` -> tinyspec/prompts_third_party.jsonl).
HELD_OUT_PACKAGES = {"more-itertools": ("10.5.0", "MIT"), "toolz": ("1.0.0", "BSD-3-Clause"),
                     "boltons": ("24.1.0", "BSD-3-Clause"), "packaging": ("24.2", "Apache-2.0 OR BSD-2-Clause")}


def data_home() -> Path:
    """Where the corpus is kept unless --data-dir says otherwise: $TINYSPEC_HOME/data (`files.home`),
    the same folder whatever directory a command runs from."""
    return home() / "data"


def download(wheels: Path, packages: dict | None = None) -> dict[str, Path]:
    """Each pinned package's wheel, downloaded once into `wheels` by pip (no dependencies: the
    package's own source is all we read); name -> wheel file. What is missing is named in one line
    before pip starts, and each download is counted on stderr (twenty take a minute or two). A
    package pip cannot fetch (no network, no index) is left out with one line saying so; the
    standard library needs nothing."""
    packages = PACKAGES if packages is None else packages
    missing = [f"{name}=={version}" for name, (version, _) in packages.items() if wheel_of(wheels, name, version) is None]
    if missing:
        print(f"pip downloads the wheels of {len(missing)} pinned package(s) into {wheels}, once: "
              f"{', '.join(missing)}", file=sys.stderr)
    found = {}
    for name, (version, _) in packages.items():
        have = wheel_of(wheels, name, version)
        if have is None:
            print(f"  [{missing.index(f'{name}=={version}') + 1}/{len(missing)}] {name}=={version}", file=sys.stderr,
                  flush=True)
            errors = pip_download(f"{name}=={version}", wheels)
            have = wheel_of(wheels, name, version)
            if have is None:
                print(f"{name}=={version}: not downloaded ({(errors or ['pip found no wheel'])[-1][:120]}); the corpus "
                      "goes on without it", file=sys.stderr)
                continue
        found[name] = have
    return found


def pip_download(requirement: str, wheels: Path) -> list[str]:
    """pip downloads the requirement's wheel into `wheels`; returns pip's ERROR lines, if any."""
    wheels.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--dest", str(wheels), requirement], capture_output=True, text=True)
    return [line for line in p.stderr.splitlines() if line.startswith("ERROR")]


def wheel_of(wheels: Path, name: str, version: str) -> Path | None:
    """The downloaded wheel of name==version, if any (wheel names keep the project's capitals)."""
    prefix = f"{name.replace('-', '_')}-{version}-".lower()
    return min((w for w in wheels.glob("*.whl") if w.name.lower().startswith(prefix)), default=None)


def package_modules(name: str, wheel: Path) -> list[tuple[str, str]]:
    """(path, text) of every UTF-8 `.py` module in a wheel, path prefixed by the package name so a
    split is per module of that source; vendored copies of other packages are skipped."""
    out = []
    with zipfile.ZipFile(wheel) as z:
        for member in sorted(z.namelist()):
            parts = member.split("/")
            if not member.endswith(".py") or ".dist-info" in parts[0] or any("vendor" in p for p in parts[:-1]):
                continue
            try:
                out.append((f"{name}/{member}", z.read(member).decode("utf-8")))
            except UnicodeDecodeError:
                continue
    return out


def sources(wheels: dict[str, Path], root: Path = STDLIB) -> dict[str, list[tuple[str, str]]]:
    """source -> [(module path, text)] for the standard library and each downloaded package,
    without a text that an earlier module (the standard library first) already holds."""
    stdlib = [p for split in ("train", "val", "bench") for p in stdlib_modules(split, root)]
    out, seen = {"stdlib": []}, set()
    for path, text in zip(stdlib, read_texts_of(stdlib)):
        out["stdlib"].append((path.relative_to(root).as_posix(), text))
    for name, wheel in wheels.items():
        out[name] = package_modules(name, wheel)
    for name in out:  # deduplicated in this order: the standard library keeps its files
        kept = []
        for path, text in out[name]:
            digest = hashlib.sha1(text.encode()).digest()
            if digest not in seen and text.strip():
                seen.add(digest)
                kept.append((path, text))
        out[name] = kept
    return out


def corpus(split: str, extra_text: list[str] | None = None) -> list[str]:
    """The documents of a split; extra text files (`--text`) join the training split."""
    texts = read_texts(stdlib_modules(split))
    if split == "train" and extra_text:
        for f in extra_text:
            if not Path(f).is_file():
                raise FileNotFoundError(f"--text {f}: no such file")
        texts += read_texts(extra_text)
    return texts


def prepare(enc, tokenizer_path: Path, data_dir: Path, extra_text: list[str] | None = None,
            packages: bool = True) -> Path:
    """Tokenize the splits once into `data_dir/<key>/`: train.bin, val.bin (the standard library's
    held-out modules), val-packages.bin (the packages'), uint16, with meta.json and the data card
    CORPUS.md; the key hashes what the tokens depend on (tokenizer, sources, pins, --text), so a new
    tokenizer or corpus gets new files. packages: download and add `PACKAGES` (else the standard
    library alone, as when nothing can be downloaded)."""
    if enc.n_vocab > 2**16:
        raise ValueError(f"vocabulary of {enc.n_vocab} does not fit uint16 token files")
    wheels = download(Path(data_dir) / "wheels") if packages else {}
    h = hashlib.sha1(Path(tokenizer_path).read_bytes())
    h.update(str(STDLIB).encode())
    h.update(json.dumps({name: PACKAGES[name][0] for name in sorted(wheels)}).encode())
    for f in extra_text or []:
        h.update(f"{Path(f).resolve()}:{Path(f).stat().st_size}".encode())
    out = Path(data_dir) / h.hexdigest()[:12]
    if (out / "meta.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    files = {"train": [], "val": [], "val-packages": []}  # token lists per output file
    meta = {"tokenizer": str(tokenizer_path), "extra_text": extra_text or [], "sources": {}}
    for name, modules in sources(wheels).items():
        row = {"version": PACKAGES[name][0] if name in PACKAGES else sys.version.split()[0],
               "licence": PACKAGES[name][1] if name in PACKAGES else "PSF-2.0", "modules": len(modules)}
        for split in ("train", "val"):
            docs = [text for path, text in modules if split_of(path) == split]
            ids = enc.encode_ordinary_batch(docs)
            files["val-packages" if split == "val" and name != "stdlib" else split] += ids
            row[f"{split}_modules"], row[f"{split}_tokens"] = len(docs), sum(map(len, ids))
        meta["sources"][name] = row
    files["train"] += enc.encode_ordinary_batch(read_texts(extra_text or []))
    eot = enc.eot_token
    for name, ids in files.items():
        flat = np.fromiter((t for doc in ids for t in (*doc, eot)), dtype=np.uint16)
        tmp = out / f".{name}.bin.tmp"
        flat.tofile(tmp)
        tmp.replace(out / f"{name}.bin")
        meta[name] = {"documents": len(ids), "tokens": int(flat.size)}
    atomic_write_json(out / "token_ranks.json", token_ranks(out / "train.bin"))
    atomic_write_text(out / "CORPUS.md", card(meta))
    atomic_write_json(out / "meta.json", meta)  # written last: its presence marks a complete dataset
    return out


def token_ranks(train_bin: Path) -> dict:
    """The token ids from most to least frequent in the training split, and the share of its tokens
    the most frequent V' cover: a drafter that proposes only those (`model.DraftVocab`) computes
    V'/V of its LM head and can still propose that share of the text."""
    counts = np.bincount(np.memmap(train_bin, dtype=np.uint16, mode="r"))
    order = np.argsort(-counts, kind="stable")
    covered = np.cumsum(counts[order]) / max(1, counts.sum())
    return {"ranks": order.tolist(), "covered": {str(n): round(float(covered[n - 1]), 4)
                                                 for n in (256, 512, 1024, 2048, 4096) if n <= len(order)}}


def card(meta: dict) -> str:
    """The data card: every source with its version, licence, modules and tokens per split."""
    rows = [f"| {name} | {r['version']} | {r['licence']} | {r['train_modules']} | {r['train_tokens'] / 1e6:.2f}M | "
            f"{r['val_modules']} | {r['val_tokens'] / 1e6:.3f}M |" for name, r in meta["sources"].items()]
    total = sum(r["train_tokens"] for r in meta["sources"].values())
    return ("# The training corpus\n\nPython modules, split by whole modules (`tinyspec/training/corpus.py`); files whose text occurs "
            "earlier and vendored copies are left out.\n\n| source | version | licence | train modules | train tokens | "
            "held-out modules | held-out tokens |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows) +
            f"\n\nTraining tokens in all: {total / 1e6:.1f}M" +
            (f", plus --text {', '.join(meta['extra_text'])}" if meta["extra_text"] else "") + ".\n")


def make_datastore(corpus: Path, tokens: int, eot: int, seed: int = 0):
    """A datastore (`methods/rest.py`) of whole modules of the training split, drawn at random with a
    fixed seed until about `tokens` tokens: the same modules on every machine for the same corpus."""
    from ..methods.rest import build
    train = np.fromfile(corpus / "train.bin", dtype=np.uint16)
    ends = np.flatnonzero(train == eot)
    starts = np.concatenate([[0], ends[:-1] + 1])
    chosen, total = [], 0
    for d in np.random.default_rng(seed).permutation(len(ends)):
        if total + ends[d] + 1 - starts[d] <= tokens:
            chosen.append(d)
            total += ends[d] + 1 - starts[d]
    chosen.sort()
    text = np.concatenate([train[starts[d]:ends[d] + 1] for d in chosen]).astype(np.int64)
    meta = json.loads((corpus / "meta.json").read_text())
    return build(text, eot, {"corpus": {name: row["version"] for name, row in sorted(meta["sources"].items())},
                             "modules": len(chosen), "of_modules": len(ends), "seed": seed})


def lookup_time(store, enc) -> float:
    """Microseconds of one step's lookup (the match, its continuations, the tree of B = 4), the mean
    over every position of the held-out sizing prompts (`speed/sizing.py`)."""
    from ..methods.rest import corpus_tree
    from ..speed.sizing import sizing_prompts
    texts = [p[:i] for p in sizing_prompts(enc) for i in range(8, len(p))]
    for text in texts:  # untimed: the first pass pages in what a large datastore has not touched yet
        corpus_tree(store.continuations(text), 4)
    t0 = time.perf_counter()
    for text in texts:
        corpus_tree(store.continuations(text), 4)
    return round((time.perf_counter() - t0) / len(texts) * 1e6, 1)


def datastore_card(store, path: Path, command: str) -> str:
    """The datastore's card: what it holds, its size on disk and in memory, its build time, and the
    command that made it."""
    c = store.card
    memory = (store.tokens.nbytes + store.backwards.nbytes + store.order.nbytes + store.key.nbytes) / 2**20
    order = "stored beside the tokens" if c["tokens"] > 2_000_000 else "sorted again when it loads"
    return f"""# {path.stem}

- what: the datastore of `--method rest` (`tinyspec/methods/rest.py`): {c['tokens']:,} tokens of {c['modules']} whole
  modules of the training split ({', '.join(f'{n} {v}' for n, v in c['corpus'].items())}; {c['of_modules']} modules in
  all), drawn with seed {c['seed']}, each ending in <|endoftext|>
- the suffix array of the reversed text: {order}; sorting it took {c['build_s']:.1f} s on
  {device_name(torch.device('cpu'))}, one thread
- on disk: {path.stat().st_size / 2**20:.1f} MB (safetensors); in memory: {memory:.0f} MB
- a step's lookup (the match, its continuations, their tree of B = 4) takes {c['lookup_us']:.0f} us on that CPU, the mean
  over every position of the held-out sizing prompts
- reproduce: `{command}`
"""


class TokenFile:
    """Random training windows from a uint16 token file."""

    def __init__(self, path: str | Path):
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r")

    def __len__(self) -> int:
        return len(self.tokens)

    def batch(self, batch_size: int, block_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y of shape (batch_size, block_size); y is x shifted left by one token."""
        starts = torch.randint(len(self.tokens) - block_size - 1, (batch_size,), generator=generator)
        rows = np.stack([self.tokens[s:s + block_size + 1] for s in starts.tolist()]).astype(np.int64)
        rows = torch.from_numpy(rows)
        return rows[:, :-1], rows[:, 1:]


def held_out_prompts(modules: list[tuple[str, str]], per_module: int = 2) -> list[dict]:
    """Benchmark prompts from held-out modules, in three categories (Spec-Bench style):

    - code: a function's `def` line through its docstring; the model writes the body;
    - docs: the first line(s) of a long docstring; the model continues the prose;
    - structured: the first lines of a multi-line literal (dict, list, tuple, set); the model
      continues the table.
    modules: (source path, text). At most `per_module` prompts per category and module, in file order."""
    rows = []
    for path, text in modules:
        try:
            tree = ast.parse(text)
        except SyntaxError:  # some stdlib test data is deliberately invalid
            continue
        lines, taken = text.splitlines(), {"code": 0, "docs": 0, "structured": 0}

        def add(category, prompt):
            if taken[category] < per_module and 40 <= len(prompt) <= 600:
                rows.append({"category": category, "source": path, "prompt": prompt})
                taken[category] += 1

        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node) and len(node.body) > 1:
                add("code", "\n".join(lines[node.lineno - 1:node.body[0].end_lineno]) + "\n")
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body:
                doc = node.body[0]
                if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str) \
                        and doc.end_lineno - doc.lineno >= 6:
                    add("docs", "\n".join(lines[doc.lineno - 1:doc.lineno + 1]) + "\n")
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Dict, ast.List, ast.Tuple, ast.Set)) \
                    and node.value.end_lineno - node.lineno >= 6:
                add("structured", "\n".join(lines[node.lineno - 1:node.lineno + 2]) + "\n")
    return rows


def write_prompts(path: Path) -> dict[str, int]:
    """Write the held-out benchmark prompts as JSONL ({"category", "source", "prompt"})."""
    paths = stdlib_modules("bench")
    rows = held_out_prompts([(p.relative_to(STDLIB).as_posix(), t) for p, t in zip(paths, read_texts_of(paths)) if t])
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return {c: sum(r["category"] == c for r in rows) for c in ("code", "docs", "structured")}


def write_third_party_prompts(path: Path, wheels: Path, per_category: int = 16) -> dict[str, int]:
    """Benchmark prompts from `HELD_OUT_PACKAGES` (whole packages, none in any corpus): the first
    `per_category` of each category, taken in turn from each package, with source and licence."""
    by_package = []
    for name, wheel in download(wheels, HELD_OUT_PACKAGES).items():
        rows = held_out_prompts(package_modules(name, wheel), per_module=1)
        by_package.append([dict(r, licence=HELD_OUT_PACKAGES[name][1]) for r in rows])
    rows = []
    for category in ("code", "docs", "structured"):
        each = [[r for r in package if r["category"] == category] for package in by_package]
        rows += [r for group in zip(*each) for r in group][:per_category]  # in turn, so no package dominates
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return {c: sum(r["category"] == c for r in rows) for c in ("code", "docs", "structured")}
