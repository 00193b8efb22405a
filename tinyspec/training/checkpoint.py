"""Checkpoints that survive a stop: training runs for hours, across separate runs, so everything
that decides the next step is saved (the weights, AdamW's moments, the data sampler's random
state, the step, the curve so far) and `--resume` continues exactly as if it had never stopped.
`Budget` stops a run (`--max-minutes`) only where a step and the validation after it still fit.
"""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from ..files import atomic_save_tensors, atomic_write_json, atomic_write_text
from ..model import GPT


def save_checkpoint(run_dir: Path, model, opt, data_rng, state: dict) -> None:
    """Model, optimizer moments and sampler RNG as safetensors, the rest as JSON, all in a new
    directory `step-NNNNNN`; then the file `latest` is switched to it (atomically) and older
    checkpoints are removed. A crash at any moment leaves `latest` naming a complete one."""
    ckpt = run_dir / f"step-{state['step']:06d}"
    ckpt.mkdir(parents=True, exist_ok=True)
    model.save(ckpt / "model.safetensors")
    moments = {f"{i}.{name}": t for i, s in opt.state_dict()["state"].items() for name, t in s.items()}
    moments["data_rng"] = data_rng.get_state()
    atomic_save_tensors({k: v.contiguous() for k, v in moments.items()}, ckpt / "optimizer.safetensors")
    atomic_write_json(ckpt / "state.json", state)
    atomic_write_text(run_dir / "latest", ckpt.name + "\n")
    for old in run_dir.glob("step-*"):
        if old != ckpt:
            shutil.rmtree(old, ignore_errors=True)


@contextmanager
def uninterrupted():
    """Ctrl-C held back while the block runs, and raised when it ends: half an optimizer step would
    leave weights and moments that no step ever made, which a checkpoint must never hold. Python's
    own Ctrl-C only (an ignored one stays ignored), in the main thread (the only one signals reach)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


def check_fresh_start(run_dir: Path, resume: bool, force: bool, out: Path | None = None) -> None:
    """A run without --resume starts over, and its first checkpoint removes every one before it
    (`save_checkpoint`), its end writes `out`: an earlier run's checkpoints and weights are replaced
    only with --force, never in silence (ValueError otherwise: the command says it in one line)."""
    if resume or force:
        return
    earlier = sorted(run_dir.glob("step-*"))
    if earlier:
        raise ValueError(f"{run_dir} holds an earlier run's checkpoints ({earlier[-1].name}): pass --resume to "
                         "continue that run, --force to start over and remove them, or another --run-dir")
    if out is not None and out.exists():
        raise ValueError(f"{out} already exists (an earlier run's weights?): pass --force to replace it, or give "
                         "another --run-dir or --out")


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The directory of the last complete checkpoint in run_dir, if any."""
    pointer = run_dir / "latest"
    return run_dir / pointer.read_text().strip() if pointer.is_file() else None


def saved_state(ckpt: Path) -> dict:
    """What a checkpoint keeps besides tensors (`state.json`): the step, the curve, the config, ..."""
    return json.loads((ckpt / "state.json").read_text())


def load_checkpoint(ckpt: Path, model, opt, data_rng, device, read=lambda path: GPT.from_hf(path).state_dict()) -> dict:
    """Restore what `save_checkpoint` wrote; read(path) -> the model's state dict from its file."""
    from safetensors.torch import load_file

    state = saved_state(ckpt)
    model.load_state_dict(read(ckpt / "model.safetensors"))
    moments = load_file(ckpt / "optimizer.safetensors")
    data_rng.set_state(moments.pop("data_rng"))
    opt_state = {}
    for key, t in moments.items():
        i, name = key.split(".", 1)
        opt_state.setdefault(int(i), {})[name] = t if name == "step" else t.to(device)
    opt.load_state_dict({"state": opt_state, "param_groups": opt.state_dict()["param_groups"]})
    return state


class Budget:
    """--max-minutes, counted from the start of the command: a step is begun only if it and the
    validation that must follow it (measured, or estimated at a third of a step per batch, as
    it runs the forward only) still fit."""

    def __init__(self, minutes: float | None, eval_batches: int):
        self.deadline = time.time() + 60 * minutes if minutes else None
        self.eval_batches, self.step_s, self.eval_s = eval_batches, None, None

    def room_for_a_step(self) -> bool:
        if self.deadline is None or self.step_s is None:
            return True  # the first step always runs: it measures the others
        eval_s = self.eval_s if self.eval_s is not None else self.eval_batches * self.step_s / 3
        return time.time() + self.step_s + eval_s <= self.deadline
