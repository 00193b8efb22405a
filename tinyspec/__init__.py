"""tinyspec: a readable engine for speculative decoding.

Rooms that show the house, read in the order of walkthrough.md's chapters; imports point down:

- the engine, at the top of this folder: files (atomic writes), progress (on stderr, as lines in
  a log), tokenizer, model, kvcache, sampling, tree and verify (token trees and the acceptance
  rules), decoding (plain decoding and THE step loop every method runs, for any number of rows);
- kernels/: the Triton tree-attention kernel and the fixed-shape forward (CUDA graphs);
- methods/: one proposer per paper (draft, medusa, eagle, lookup, lookahead, ...);
- speed/: timing, the size policy, the step ledger, sizing on the device, --size auto;
- training/: the corpus, the optimiser, checkpoints, the heads' losses, training runs;
- commands/: the interface every command shares (cli.py, method.py) and the engine's commands: generate
  (`python -m tinyspec.generate`), train, data;
- bench/: measurement: the benchmark, the GPU report, kernel timings, evaluate, figures;
- course/: assignments, handouts and grading (`python -m tinyspec course`).

`files.home()` is tinyspec's own folder ($TINYSPEC_HOME, else ~/.cache/tinyspec): the sizing cache,
the corpus, figures.
"""

import signal
import sys

__version__ = "0.1.0"


def interrupted_while_starting(signum, frame) -> None:
    """Ctrl-C while a command is still importing (torch takes seconds): end as `cli.run_main` ends
    a command, "[interrupted]" and status 130, instead of a traceback from inside `import torch`.
    Nothing has been written yet, so leaving at once loses nothing."""
    sys.stderr.write("\n[interrupted]\n")
    sys.stderr.flush()
    import os
    os._exit(130)


def running_a_command() -> bool:
    """Whether this process is `python -m tinyspec[.X]`. While `-m` imports the module's package,
    sys.argv[0] is "-m" and sys.orig_argv holds the command line; a program or notebook that
    imports tinyspec keeps Python's own Ctrl-C."""
    if sys.argv[:1] != ["-m"]:
        return False
    args = getattr(sys, "orig_argv", [])[1:]
    for i, arg in enumerate(args):
        if arg.startswith("-m"):  # "-m NAME" or "-mNAME"
            name = arg[2:] or (args[i + 1] if i + 1 < len(args) else "")
            return name == "tinyspec" or name.startswith("tinyspec.")
    return False


# Only where nobody chose otherwise (a job started with SIGINT ignored keeps it ignored); run_main
# puts Python's handler back before the command's main() runs, so decoding can catch Ctrl-C itself.
if running_a_command() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, interrupted_while_starting)
