"""What every command line shares: where the shipped weights are, one-line errors, argument
parsing, output paths checked before the work, the device and dtype, loading a model or a
tokenizer with clean errors, and the attention --attn picks. A method's flags and weights are
`method.py`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open

from ..files import SIZING, WEIGHTS, destination, home, kind, shown, unwritable  # noqa: F401 (shown: for the commands)
from ..methods import METHODS
from ..model import GPT
from ..progress import Progress  # noqa: F401 (for the commands)
from ..tokenizer import load_tokenizer

# The shipped checkpoints and tokenizer (`files.WEIGHTS`: beside the package in a clone)
DEFAULT_MODEL = WEIGHTS / "target.safetensors"
DEFAULT_DRAFT = WEIGHTS / "draft.safetensors"
DEFAULT_HEADS = WEIGHTS / "medusa.safetensors"
DEFAULT_EAGLE = WEIGHTS / "eagle.safetensors"
DEFAULT_TOKENIZER = WEIGHTS / "tokenizer.tiktoken"
DEFAULT_TOKEN_RANKS = WEIGHTS / "token_ranks.json"  # tokens by corpus frequency (`corpus.token_ranks`)


def die(message: str, status: int = 2):
    """A user mistake: one line on stderr naming the fix, exit status 2, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(status)


def warn(message: str) -> None:
    """Something the user may not expect, said in one line on stderr; the command goes on."""
    print(f"warning: {message}", file=sys.stderr)


def check_output(path: str | Path, flag: str, directory: bool = False) -> Path:
    """An output path, checked before any work starts (files.unwritable): one line, exit 2.
    Returns where the output will really go (through a symlink, its target), for messages to name.
    An empty path (`--save ''`, a shell variable that was not set) is refused, not taken for none."""
    if not os.fspath(path):
        die(f"{flag} is empty: give a {'folder' if directory else 'file'} name")
    problem = unwritable(path, directory)
    if problem:
        die(f"{flag} {path}: {problem}; choose another path")
    return destination(path)


def check_input(path: str | Path, flag: str, folder: bool = False) -> Path:
    """An input path that exists but is not a file to read is refused in one line: a FIFO (reading
    it would wait for a writer forever), a device, a socket, or a folder unless `folder` says one
    will do. A file is tried here, as `unwritable` tries an output, by opening it and reading a byte:
    a name too long for the file system, a link loop or a file that fails to read (EIO: /proc/self/mem)
    is one line now rather than a traceback from whichever reader meets it first. A missing path
    passes: each reader says what is missing and how to make it."""
    path = Path(path)
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return path
    except OSError as e:  # ENAMETOOLONG, ELOOP, EACCES (not for root), ...
        die(f"{flag} {path}: {e.strerror}: give another path")
    what = kind(path)
    if what and not (folder and what == "a folder"):
        die(f"{flag} {path} is {what}, not a file: give the path of a file")
    if what is None:
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as e:
            die(f"{flag} {path} cannot be read ({e.strerror}): give a file that can")
    return path


def check_home(why: str) -> None:
    """tinyspec's own folder (`files.home`), tried before work that keeps what it finds there (sizing's
    measurements, minutes of them): a TINYSPEC_HOME that is a file, a device, a FIFO, a dangling link
    or on a read-only mount is one line now, not a traceback after the work."""
    problem = unwritable(SIZING, directory=True)
    if problem:
        where = f"TINYSPEC_HOME={os.environ['TINYSPEC_HOME']}" if os.environ.get("TINYSPEC_HOME") else \
            f"tinyspec's folder {home()}"
        die(f"{why} keeps its measurements in {where}, where nothing can be written ({problem}): set TINYSPEC_HOME "
            "to a folder that can be written")


def check_destination(path: str | Path, force: bool, flag: str = "--out") -> Path:
    """Where a command writes, checked before the work (`check_output`); the shipped weights
    are never replaced by accident. Nothing is created here: an aborted run leaves no empty folders."""
    path = check_output(path, flag)
    if path.exists() and path.resolve().parent == WEIGHTS.resolve() and not force:
        die(f"{path} is a shipped file: pass --force to replace it, or write elsewhere with --out")
    return path


class StdoutError(Exception):
    """Standard output cannot be written (a full disk, `> /dev/full`): not the command's fault."""

    status = 1


class StdoutEncodingError(StdoutError):
    """Standard output's encoding has no character for the text (PYTHONIOENCODING=ascii and a prompt
    with an accent): the user's setting, so status 2, with the setting that fixes it."""

    status = 2


class Stdout:
    """sys.stdout as a command sees it under `run_main`: a write or flush that fails (other than a
    closed pipe) raises StdoutError, so a full stdout is told apart from a file the command writes."""

    def __init__(self, stream):
        self.stream = stream

    def __getattr__(self, name):  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self.stream, name)

    def write(self, text):
        return self._do(self.stream.write, text)

    def flush(self):
        return self._do(self.stream.flush)

    def _do(self, call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StdoutError(e.strerror or str(e)) from None
        except UnicodeEncodeError as e:
            raise StdoutEncodingError(f"its encoding, {e.encoding}, has no {e.object[e.start:e.end]!r}: set "
                                      "PYTHONIOENCODING=utf-8") from None


def run_main(main) -> None:
    """A command's entry point (`if __name__ == "__main__": run_main(main)`): Ctrl-C ends it with
    status 130, a closed pipe (`... | head -1`) ends it quietly with status 0, and a stdout that
    cannot be written (`> /dev/full`) with one line and status 1; never a traceback. Commands save
    their files before they print, so neither a closed pipe nor a full stdout loses one. A closed
    stdout (`>&-`: Python's sys.stdout is None) or one whose encoding cannot hold the text
    (PYTHONIOENCODING=ascii) is the user's setting: one line naming the fix, status 2."""
    stdout = sys.stdout
    if stdout is None:
        die("standard output is closed (>&-): send it to a file, or to /dev/null to discard it")
    try:
        # Python's own Ctrl-C again (a KeyboardInterrupt that decoding catches to return what it has),
        # in place of the one that covered the imports (tinyspec/__init__.py)
        if getattr(signal.getsignal(signal.SIGINT), "__module__", None) == "tinyspec":
            signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.stdout = Stdout(stdout)
        main()
        sys.stdout.flush()  # inside the try: a pipe closed early fails here, not at interpreter exit
    except KeyboardInterrupt:
        print("\n[interrupted]", file=sys.stderr)
        raise SystemExit(130)
    except (BrokenPipeError, StdoutError) as e:
        # send what is still buffered to /dev/null, so the exit's own flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())
        if isinstance(e, BrokenPipeError):  # the reader is gone: nothing to say
            raise SystemExit(0)
        print(f"error: cannot write to standard output: {e}", file=sys.stderr)
        raise SystemExit(getattr(e, "status", 1))
    finally:
        sys.stdout = stdout


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (`error: ... (see --help)`), exit status 2."""

    def error(self, message):
        die(f"{message} (see {self.prog} --help)")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that shows each flag's default (unless it is unset or the help already says it) and
    keeps the examples of the epilog as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS  # 0 is a default
        if not unset and "default" not in text and action.option_strings:
            text += " (default: %(default)s)"
        return text


def examples(*lines: str) -> str:
    """An epilog of example commands for --help."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def seed(text: str) -> int:
    """--seed: an integer torch's generators take, 0..2**63 - 1 (a larger one overflows inside torch)."""
    value = int(text)  # argparse turns a ValueError into its own one line
    if not 0 <= value < 2 ** 63:
        raise argparse.ArgumentTypeError(f"must be in 0..{2 ** 63 - 1}, got {text}")
    return value


def cpus() -> int:
    """The CPUs this process may run on (a container or `taskset` may allow fewer than the machine has)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def set_threads(n: int | None, device: torch.device, default: int | None = 1) -> int:
    """--threads: how many CPU threads torch uses. Decoding's default is 1 on a CPU: a forward of
    these small models is a few small matmuls, which a second thread barely speeds up when the
    machine is idle, and slows down several times over when anything else wants a core (the
    threads then wait for each other). Training passes default=None: torch's own (every core),
    since a training step's matmuls are large enough to share. Returns the count in use.
    More threads than CPUs is refused, for every command alike: each of torch's parallel loops waits
    for every thread to get a core, so at 1000 threads a forward costs tens of times a one-thread one.
    `generate` makes a handful of forwards and finishes; `bench` makes hundreds (a warm-up, ar and each
    method, repeats, the Hugging Face peer) and seemed to hang. (torch cannot even hold 10**20.)"""
    if n is not None and n < 1:
        die(f"--threads must be at least 1, got {n}")
    if n is not None and n > cpus():
        die(f"--threads {n} is more than the {cpus()} CPUs this process may use, where threads only wait for each "
            f"other: use --threads {cpus()} or fewer")
    if n is not None or (device.type == "cpu" and default is not None):
        torch.set_num_threads(n or default)
    return torch.get_num_threads()


def use_colour(choice: str, stream) -> bool:
    """--color auto|always|never: auto colours only a terminal, and never when NO_COLOR is set
    (https://no-color.org)."""
    if choice == "auto":
        return stream.isatty() and not os.environ.get("NO_COLOR")
    return choice == "always"


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


# ---- loading, with one-line errors ----------------------------------------------------------

def holds() -> dict[str, tuple[str, str]]:
    """What a tinyspec weights file holds, told by its first tensor's name: {prefix: (a noun for
    it, its flag)}, from every method's `Weights` (a GPT is also a target: --model)."""
    out = {"transformer.": ("a GPT model", "--model")}
    for m in METHODS.values():
        if m.weights is not None:
            noun, flag = out.get(m.weights.holds, (m.weights.noun, ""))
            out[m.weights.holds] = (noun, " or ".join(filter(None, [flag, m.weights.flag])))
    return out


def refuse_other_kind(path: str | Path, expected: str) -> None:
    """A weights file of another kind than `expected` (a `holds` prefix), a draft given as --heads
    say, is refused in one line naming what it holds and the flag that takes it."""
    try:
        with safe_open(Path(path), framework="pt") as f:
            first = next(iter(f.keys()), "")
    except Exception:  # a directory, or not safetensors at all: the loader says so
        return
    kinds = holds()
    found = next((prefix for prefix in sorted(kinds, key=len, reverse=True) if first.startswith(prefix)), expected)
    if found != expected:
        die(f"{path} holds {kinds[found][0]}, not {kinds[expected][0]}: pass it as {kinds[found][1]}")


def load_model(path: str | Path, device: torch.device, dtype: torch.dtype, what: str = "model") -> GPT:
    path = check_input(path, f"--{what}", folder=True)  # a folder: Hugging Face's layout
    if not path.exists():
        die(f"{what} weights {path} not found: pass --{what} PATH, or train them (see README)")
    refuse_other_kind(path, "transformer.")
    try:
        return GPT.from_hf(path, device=device, dtype=dtype).eval()
    except (ValueError, FileNotFoundError) as e:
        die(f"cannot load {what} weights: {e}")


def load_encoding(path: str | Path):
    path = Path(path)
    if path == DEFAULT_TOKENIZER and not WEIGHTS.is_dir():
        die(f"the shipped weights are not beside this tinyspec ({WEIGHTS} is missing; a non-editable "
            "`pip install .` does not copy them): install with `pip install -e .` in a clone, or pass --tokenizer "
            "and --model paths into the clone's weights/")
    check_input(path, "--tokenizer")
    try:
        return load_tokenizer(path)
    except (FileNotFoundError, ValueError) as e:
        die(f"cannot load the tokenizer: {e}")


def check_tokenizer(model: GPT, enc, what: str = "model") -> None:
    """Refuse a model trained with another tokenizer: same size is not the same tokens."""
    if model.config.vocab_size != enc.n_vocab:
        die(f"the {what}'s vocabulary ({model.config.vocab_size}) differs from the tokenizer's ({enc.n_vocab}): "
            "pass the --tokenizer it was trained with")
    if model.tokenizer_fingerprint and model.tokenizer_fingerprint != getattr(enc, "fingerprint", ""):
        die(f"the {what} was trained with another tokenizer (fingerprint {model.tokenizer_fingerprint}, this one "
            f"{getattr(enc, 'fingerprint', '?')}): pass the --tokenizer it was trained with")


def load_draft_vocab(size: int, vocab_size: int, path: str | Path = DEFAULT_TOKEN_RANKS) -> torch.Tensor:
    """--draft-vocab V': the ids of the V' most frequent tokens (`model.DraftVocab`), sorted."""
    if not 1 <= size <= vocab_size:
        die(f"--draft-vocab must be in 1..{vocab_size} (the vocabulary), got {size}")
    try:
        ranks = json.loads(Path(path).read_text())["ranks"]
    except (OSError, ValueError, KeyError) as e:
        die(f"cannot read the token ranks {path} ({e}): make them with python -m tinyspec data")
    if len(ranks) != vocab_size:
        die(f"{path} ranks {len(ranks)} tokens, the model has {vocab_size}: make them for this tokenizer")
    return torch.tensor(sorted(ranks[:size]))


def most_prompt_bytes(enc, n_ctx: int) -> int:
    """The most UTF-8 bytes a prompt that fits a context of n_ctx tokens can have: a token covers
    at most the longest token's bytes, so a prompt of more than (n_ctx - 1) times that is at least
    n_ctx tokens, and is refused without tokenizing it (`check_prompt_bytes`)."""
    return (n_ctx - 1) * max(map(len, enc.token_byte_values()))


def read_lines(path: Path, flag: str, most: int, fix: str) -> list[tuple[int, str]]:
    """(line number, text) of the non-blank lines of a UTF-8 text file of prompts, numbered as an
    editor numbers them (blank lines counted), read a line at a time: a line longer than
    any JSON line that can hold a prompt of `most` bytes (a byte may be escaped as \\u0000, and other
    fields) is refused unread, so a gigabyte of NUL bytes is one refused line, not a gigabyte in
    memory and an abort inside the tokenizer. `fix`: what to do about a file that is not UTF-8."""
    longest = 6 * most + 4096
    lines, offset = [], 0
    with open(path, "rb") as f:
        for i, line in enumerate(iter(lambda: f.readline(longest + 1), b""), 1):
            if len(line) > longest:
                die(f"{flag} {path}, line {i}: over {longest} bytes, longer than any prompt the model's context "
                    "holds: shorten it")
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                die(f"{flag} {path} is not UTF-8 text ({e.reason} at byte {offset + e.start}): {fix}")
            offset += len(line)
            lines += [(i, part) for part in text.splitlines() if part.strip()]
    return lines


def check_prompt_bytes(prompts: list[str], most: int, n_ctx: int,
                       name: Callable[[int], str] = lambda i: f"prompt {i}") -> None:
    """Before tokenizing: a prompt longer in bytes than any that fits (`most_prompt_bytes`) is refused
    as `check_prompts` would refuse its tokens, without tiktoken's work on all of it (a gigabyte of
    NUL bytes aborts inside it). name(i): how the error names the i-th prompt."""
    for i, prompt in enumerate(prompts, 1):
        if len(prompt) > most or len(prompt.encode("utf-8", "surrogatepass")) > most:
            die(f"{name(i)} is over {most} bytes, more tokens than the model's context of {n_ctx}: shorten it")


def check_prompts(encoded: list[list[int]], n_ctx: int) -> None:
    for i, ids in enumerate(encoded):
        if not ids:
            die(f"prompt {i + 1} is empty: give at least one character")
        if len(ids) >= n_ctx:
            die(f"prompt {i + 1} is {len(ids)} tokens, the model's context is {n_ctx}: shorten the prompt")


def use_attention(model: GPT, name: str, device: torch.device) -> None:
    """--attn: 'torch' (SDPA, the reference) or 'triton' (the tree-attention kernel for tree
    verification; on a CPU only in Triton's interpreter, which must be chosen before triton loads)."""
    if name == "torch":
        return
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        die("--attn triton on a CPU needs Triton's interpreter: run with TRITON_INTERPRET=1 set")
    try:
        from ..kernels.tree_attention import TreeAttention
    except ImportError:
        die("--attn triton needs the triton package: pip install triton")
    model.set_attention(TreeAttention())
