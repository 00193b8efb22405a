"""Where files go, and writing them safely.

Atomic writes: write to a temporary name beside the target, then rename into place, so a crash
or Ctrl-C never leaves half a checkpoint, tokenizer or dataset behind. A symlink is written
through (the temporary file goes beside what it points at, and the link stays), but only into a
folder that exists: no folder is ever made at the far end of a link, where the user did not point;
a device, a FIFO, a socket or a folder is never replaced by a file.

`unwritable` tries an output path before a command's work starts, by creating (and removing) a
file where the output will go: `os.access` answers yes to everything for root, and /proc or /sys
refuse a file whatever the permission bits say.

`home()` is the one place tinyspec keeps what it makes for itself (the sizing cache, the corpus):
$TINYSPEC_HOME, or ~/.cache/tinyspec, never the directory a command happens to run from. What
ships with tinyspec sits in the checkout beside the package (`CHECKOUT`): the weights, the docs.
"""

from __future__ import annotations

import json
import os
import stat
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


# A clone holds the package, its shipped weights and tokenizer, and its docs side by side (pip install -e .)
CHECKOUT = Path(__file__).resolve().parent.parent
WEIGHTS = CHECKOUT / "weights"


def shown(path) -> str:
    """A path as a card prints it: relative to the checkout when inside it (cards travel)."""
    path = Path(path).resolve()
    return str(path.relative_to(CHECKOUT)) if path.is_relative_to(CHECKOUT) else str(path)


def home() -> Path:
    """tinyspec's own folder: `sizing/` (measurements, `speed/sizing.py`) and `data/` (the corpus,
    `training/corpus.py`) live here. $TINYSPEC_HOME when set, else ~/.cache/tinyspec; read at each call."""
    return Path(os.environ.get("TINYSPEC_HOME") or "~/.cache/tinyspec").expanduser()


class InHome(os.PathLike):
    """A folder under `home()`, found when it is used (`os.fspath`, `Path(...)`), so a module
    constant follows TINYSPEC_HOME set after import (as the tests set it)."""

    def __init__(self, name: str):
        self.name = name

    def __fspath__(self) -> str:
        return str(home() / self.name)

    def __truediv__(self, other) -> Path:
        return Path(self) / other

    def __repr__(self) -> str:
        return f"InHome({self.name!r}) -> {os.fspath(self)}"


SIZING = InHome("sizing")  # sizing.DIRECTORY: the measurements of each method on each device


def kind(path: Path) -> str | None:
    """What `path` is, when it is something a file must not replace: 'a folder', 'a device',
    'a FIFO', 'a socket'; None for a regular file or nothing (a symlink: what it points at)."""
    try:
        mode = path.stat().st_mode
    except OSError:  # nothing there (or a dangling symlink: writing creates its target)
        return None
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None


def destination(path: str | Path) -> Path:
    """The file a write to `path` lands in: a symlink's target (the link itself stays), else `path`.
    A link whose target's folder does not exist is an error (FileNotFoundError): making that folder
    would write where the user never pointed (a link to /nonexistent/x would make /nonexistent)."""
    path = Path(path)
    if not path.is_symlink():
        return path
    target = path.resolve()
    if not target.parent.is_dir():
        raise FileNotFoundError(f"{path} is a link to {target}, in a folder that does not exist")
    return target


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


@contextmanager
def atomic_path(path: str | Path):
    """Yields a temporary path to write (the caller names the format: its suffix is .tmp); on
    success it is renamed to `path` (through a symlink), on any error removed."""
    path = destination(path)
    what = kind(path)
    if what:  # commands refuse this before their work (`unwritable`); a library caller gets an error
        raise IsADirectoryError(f"{path} is {what}, not a file: it is not replaced")
    tmp = _tmp(path)
    try:
        yield tmp
        _publish(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def atomic_save_tensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    with atomic_path(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)


def unwritable(path: str | Path, directory: bool = False) -> str | None:
    """Why nothing could be written at `path` (a file, or with `directory` a folder to write into),
    or None. Commands ask this before their work starts, so a long run is never lost at the end to
    a bad output path. A symlink counts as what it points at, and must point into a folder that
    exists. Folders missing on the way are fine (the writer makes them): the nearest one that exists
    is tried by creating and removing a file in it. Nothing is left behind."""
    try:
        path = destination(path)
    except (OSError, RuntimeError) as e:  # a symlink loop, or a link into a folder that is not there
        return f"cannot write through the link ({e})"
    what = kind(path)
    if directory and path.exists() and what != "a folder":
        return f"is {what or 'a file'}, not a folder"
    if not directory and what:
        return "is a folder: give a file name" if what == "a folder" else f"is {what}, not a file"
    folder = path if directory else path.parent
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if folder.is_symlink() and not folder.exists():  # a dangling link on the way: no folder is made through it
        return f"{folder} is a link to {os.readlink(folder)}, which does not exist"
    if not folder.is_dir():
        return f"{folder} is {kind(folder) or 'a file'}, not a folder"
    probe = folder / f".tinyspec-probe.{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as e:
        return f"cannot create a file in {folder} ({e.strerror})"
    return None


def read_tensors(path: str | Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(metadata, tensors) of a safetensors file; ValueError (not safetensors' own error types)
    for a file that is missing, truncated or not safetensors at all, or whose weights hold nan or
    inf (a training run that diverged: such a model would decode silently into nonsense). Never unpickles."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    try:
        with safe_open(path, framework="pt") as f:
            meta, tensors = f.metadata() or {}, {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e})") from None
    broken = [k for k, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if broken:
        raise ValueError(f"{path} holds weights that are not finite numbers (nan or inf in {len(broken)} of "
                         f"{len(tensors)} tensors, e.g. {broken[0]}): the training run that wrote it diverged; "
                         "train again with a lower --lr")
    return meta, tensors
