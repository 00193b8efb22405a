"""Progress on stderr, for a person at a terminal and for a log file alike.

A terminal shows one line, rewritten in place (`\\r`) as the work goes on; a log file or a pipe gets
each message on a line of its own, and a bar at most one line every `EVERY` seconds. Drawn in place,
twenty seconds of training made 15 KB of carriage returns on three lines of a log.

- `progress_bar`: tqdm's progress bar (training, tokenizing, the benchmark), as every command draws it;
- `Progress`: a status line that changes now and then (sizing a method for the device).
"""

from __future__ import annotations

import sys

from tqdm import tqdm

EVERY = 5.0  # seconds between two lines of a bar, when stderr is not a terminal


class Lines:
    """A stream for tqdm that writes each drawing of the bar as a line: tqdm draws in place, a
    `\\r` and the bar, padded with spaces over the last one; a log wants the bar and a newline."""

    def __init__(self, stream):
        self.stream, self.last = stream, None

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line and line != self.last:  # tqdm's closing draw repeats the last one when nothing moved
            self.last = line
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):  # encoding, isatty, fileno: the stream's own
        return getattr(self.stream, name)


def progress_bar(iterable=None, **options) -> tqdm:
    """tqdm(iterable, **options) on stderr (or options' `file`): on a terminal as tqdm draws it, else
    one line per drawing and a drawing at most every EVERY seconds."""
    stream = options.pop("file", None) or sys.stderr
    if not stream.isatty():
        stream = Lines(stream)
        options.update(mininterval=max(options.get("mininterval", 0.1), EVERY), dynamic_ncols=False)
    return tqdm(iterable, file=stream, **options)


class Progress:
    """A status line on stderr for work that takes a while (sizing): on a terminal one line,
    rewritten in place as the work goes on; in a file or a pipe each message once, on a line of
    its own, so that a log reads as lines and not as one line of carriage returns."""

    def __init__(self, quiet: bool = False, stream=None):
        self.quiet, self.stream, self.last = quiet, stream or sys.stderr, None

    def __call__(self, text: str) -> None:
        if self.quiet or text == self.last:
            return
        self.last = text
        self.stream.write(f"\r\033[K{text}" if self.stream.isatty() else f"{text}\n")
        self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        if self.last is not None and self.stream.isatty():  # the line goes: what was found is printed next
            self.stream.write("\r\033[K")
            self.stream.flush()
