"""Atomic writes: write to a temporary name beside the target, then rename into place, so a
crash or Ctrl-C never leaves half a checkpoint, tokenizer or dataset behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def _tmp(path: Path) -> Path:
    """The temporary name beside `path`; the folders on the way are made here, when there is
    something to write (an output path is checked, not made, before the work: `unwritable`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _publish(tmp: Path, path: Path) -> None:
    """Rename into place with the permissions a plain open() would give (safetensors writes 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    tmp.replace(path)


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    tmp = _tmp(path)
    tmp.write_text(text)
    _publish(tmp, path)


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def atomic_save_tensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    path = Path(path)
    tmp = _tmp(path)
    save_file(tensors, tmp, metadata=metadata)
    _publish(tmp, path)


def unwritable(path: str | Path, directory: bool = False) -> str | None:
    """Why nothing could be written at `path` (a file, or with `directory` a folder to write into),
    or None. Commands ask this before their work starts, so a long run is never lost at the end to
    a bad output path. Folders missing on the way are fine (the writer makes them); the nearest one
    that exists must be a folder this process may write into. Nothing is created here."""
    path = Path(path)
    if path.exists() and directory != path.is_dir():
        return "is a file, not a folder" if directory else "is a folder: give a file name"
    folder = path if directory else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable"
    return None


def read_tensors(path: str | Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(metadata, tensors) of a safetensors file; ValueError (not safetensors' own error types)
    for a file that is missing, truncated or not safetensors at all. Never unpickles."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    try:
        with safe_open(path, framework="pt") as f:
            return f.metadata() or {}, {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e})") from None
