"""The corpus: the Python standard library of the running interpreter, split by whole modules.

Every Python user has the standard library on disk: about 1,800 modules and 30 MB of code,
docstrings and comments, with nothing to download. Each module (file) goes, by a hash of its
path, to one of three splits, so a module is never split between them:

- `train` (92%): what the tokenizer and the models learn from,
- `val` (4%): validation loss during training,
- `bench` (4%): held out for benchmark prompts; no model ever trains or validates on them.

The split depends only on the module's relative path (e.g. `email/parser.py`), so it is the
same on every machine and Python version. `--text FILE` adds other text to the training split.

Token ids are written once to a flat uint16 file per split (documents separated by
`<|endoftext|>`), which training reads back as a memory map: random windows cost no parsing.

`python -m tinyspec.data` regenerates the benchmark prompts (`tinyspec/prompts.jsonl`) from
the held-out modules; the committed file keeps benchmarks identical across Python versions.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sysconfig
from pathlib import Path

import numpy as np
import torch

from .files import atomic_write_json, atomic_write_text
from .cli import ArgumentParser, run_main

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SPLIT_BUCKETS = {"val": range(0, 4), "bench": range(4, 8)}  # of 100 hash buckets; the rest is train


def split_of(relpath: str) -> str:
    """'train', 'val' or 'bench' for a module path relative to the stdlib root."""
    bucket = int(hashlib.sha1(relpath.encode()).hexdigest(), 16) % 100
    return next((name for name, buckets in SPLIT_BUCKETS.items() if bucket in buckets), "train")


def stdlib_modules(split: str, root: Path = STDLIB) -> list[Path]:
    """The stdlib's .py files of one split, sorted (third-party site-packages excluded)."""
    files = (p for p in root.rglob("*.py") if "site-packages" not in p.parts and "__pycache__" not in p.parts)
    return sorted(p for p in files if split_of(p.relative_to(root).as_posix()) == split)


def read_texts(paths) -> list[str]:
    """The UTF-8 text of each file; the few stdlib test files in other encodings are skipped."""
    texts = []
    for p in paths:
        try:
            texts.append(Path(p).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def corpus(split: str, extra_text: list[str] | None = None) -> list[str]:
    """The documents of a split; extra text files (`--text`) join the training split."""
    texts = read_texts(stdlib_modules(split))
    if split == "train" and extra_text:
        for f in extra_text:
            if not Path(f).is_file():
                raise FileNotFoundError(f"--text {f}: no such file")
        texts += read_texts(extra_text)
    return texts


def prepare(enc, tokenizer_path: Path, data_dir: Path, extra_text: list[str] | None = None) -> Path:
    """Tokenize the train and val splits once into `data_dir/<key>/{train,val}.bin` (uint16);
    the key hashes what the tokens depend on, so a new tokenizer or corpus gets new files."""
    if enc.n_vocab > 2**16:
        raise ValueError(f"vocabulary of {enc.n_vocab} does not fit uint16 token files")
    h = hashlib.sha1(Path(tokenizer_path).read_bytes())
    h.update(str(STDLIB).encode())
    for f in extra_text or []:
        h.update(f"{Path(f).resolve()}:{Path(f).stat().st_size}".encode())
    out = Path(data_dir) / h.hexdigest()[:12]
    if (out / "meta.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    eot = enc.eot_token
    meta = {"stdlib": str(STDLIB), "tokenizer": str(tokenizer_path), "extra_text": extra_text or []}
    for split in ("train", "val"):
        docs = corpus(split, extra_text)
        ids = enc.encode_ordinary_batch(docs)
        flat = np.fromiter((t for doc in ids for t in (*doc, eot)), dtype=np.uint16)
        tmp = out / f".{split}.bin.tmp"
        flat.tofile(tmp)
        tmp.replace(out / f"{split}.bin")
        meta[split] = {"documents": len(docs), "tokens": int(flat.size), "bytes": sum(len(d.encode()) for d in docs)}
    atomic_write_json(out / "meta.json", meta)  # written last: its presence marks a complete dataset
    return out


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


def held_out_prompts(paths, per_module: int = 2) -> list[dict]:
    """Benchmark prompts from held-out modules, in three categories (Spec-Bench style):

    - code: a function's `def` line through its docstring; the model writes the body;
    - docs: the first line(s) of a long docstring; the model continues the prose;
    - structured: the first lines of a multi-line literal (dict, list, tuple, set); the model
      continues the table.
    At most `per_module` prompts per category and module, in file order."""
    rows = []
    for path, text in zip(paths, read_texts(paths)):
        try:
            tree = ast.parse(text)
        except SyntaxError:  # some stdlib test data is deliberately invalid
            continue
        lines, taken = text.splitlines(), {"code": 0, "docs": 0, "structured": 0}

        def add(category, prompt):
            if taken[category] < per_module and 40 <= len(prompt) <= 600:
                rows.append({"category": category, "source": path.relative_to(STDLIB).as_posix(), "prompt": prompt})
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
    rows = held_out_prompts(stdlib_modules("bench"))
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return {c: sum(r["category"] == c for r in rows) for c in ("code", "docs", "structured")}


def build_parser() -> ArgumentParser:
    return ArgumentParser(prog="python -m tinyspec.data", description="regenerate tinyspec/prompts.jsonl, the "
                          "benchmark prompts, from the held-out standard-library modules")


def main(argv=None) -> None:
    build_parser().parse_args(argv)
    out = Path(__file__).resolve().parent / "prompts.jsonl"
    print(f"{write_prompts(out)} prompts from {len(stdlib_modules('bench'))} held-out modules -> {out}")


if __name__ == "__main__":
    run_main(main)
