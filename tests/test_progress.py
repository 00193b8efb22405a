"""Progress on stderr (`progress.py`): drawn in place on a terminal, as lines in a log. Twenty seconds
of training wrote 15 KB of carriage returns on three lines of a log file."""
import io
import itertools

import tqdm.std

from tinyspec.progress import EVERY, Progress, progress_bar


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_in_a_log_is_a_line_every_few_seconds_and_no_carriage_return(monkeypatch):
    clock = itertools.count(0.0, 0.5)  # each look at tqdm's clock: half a second later
    monkeypatch.setattr(tqdm.std, "time", lambda: next(clock))
    log = io.StringIO()
    for _ in progress_bar(range(100), desc="training", file=log):
        pass
    lines = log.getvalue().splitlines(keepends=True)
    assert "\r" not in log.getvalue() and all(line.endswith("\n") and line.startswith("training") for line in lines)
    elapsed = next(clock)  # the clock's last reading: every look at it cost 0.5 s
    assert 3 <= len(lines) <= elapsed / EVERY + 2, (len(lines), elapsed, lines)  # a start, an end, one per EVERY s
    assert "100/100" in lines[-1] and len(set(lines)) == len(lines)


def test_a_bar_on_a_terminal_is_drawn_in_place():
    screen = Terminal()
    for _ in progress_bar(range(10), desc="training", file=screen):
        pass
    assert screen.getvalue().count("\r") >= 2 and "10/10" in screen.getvalue()


def test_a_status_line_in_a_log_is_each_message_once_on_a_line():
    log, screen = io.StringIO(), Terminal()
    for stream in (log, screen):
        with Progress(stream=stream) as progress:
            for text in ("sizing medusa", "sizing medusa", "size 4"):
                progress(text)
    assert log.getvalue() == "sizing medusa\nsize 4\n"
    assert screen.getvalue() == "\r\033[Ksizing medusa\r\033[Ksize 4\r\033[K"
