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


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_HELP = ("auto: bfloat16 on cuda, float32 on cpu. Greedy speculative output equals plain decoding's token "
              "for token in float32; in 16 bits a forward over many tokens rounds differently from a forward "
              "over one, so where the target's top two logits (nearly) tie, the choice can flip")


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """--dtype: 'auto' is bfloat16 on CUDA (fast) and float32 elsewhere (exact)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


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
