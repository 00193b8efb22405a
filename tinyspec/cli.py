"""What every command line shares: where the shipped weights live, the device, clean errors."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

# The shipped checkpoints and tokenizer sit beside the package in a clone (pip install -e .).
WEIGHTS = Path(__file__).resolve().parent.parent / "weights"


def die(message: str, status: int = 2):
    """A user mistake: one line on stderr naming the fix, exit status 2, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(status)


def pick_device(name: str = "auto") -> torch.device:
    """'auto' is cuda when present, else cpu; a device that is not there is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        die(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            die(f"--device {name}: no CUDA GPU is visible to torch; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            die(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s); use cuda:0")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        die(f"--device {name}: MPS is not available here; use --device cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        die(f"--device {name}: tinyspec runs on cpu, cuda or mps")
    return device


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (`error: ... (see --help)`), exit status 2."""

    def error(self, message):
        die(f"{message} (see {self.prog} --help)")
