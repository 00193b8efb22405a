"""`python -m tinyspec COMMAND ...`: every command, and with no command an overview written from
what exists: the methods from `methods.METHODS`, the training jobs from `train`'s own subcommands."""

import importlib
import sys

# command -> its module (each has main(argv) and --help with examples): the engine's commands in commands/,
# measurement's in bench/, the course's in course/
COMMANDS = {"generate": "commands.generate", "bench": "bench.command", "train": "commands.train",
            "course": "course.handouts", "data": "commands.data", "evaluate": "bench.evaluate", "figures": "bench.figures"}
# verbs of `bench` that are commands of their own, with parsers of their own: verb -> module
BENCH_VERBS = {"kernels": "bench.kernels", "report": "bench.report"}


def parser_of(argv: list[str]) -> tuple[str, list[str]]:
    """The module under tinyspec/ whose build_parser() reads `python -m tinyspec ARGV`, and the
    arguments it reads (for the tests and tools that check a shown command without running it)."""
    command, args = argv[0], list(argv[1:])
    if command == "bench" and args[:1] and args[0] in BENCH_VERBS:
        return BENCH_VERBS[args[0]], args[1:]
    return COMMANDS[command], args


def overview() -> str:
    from .commands.train import build_parser as train_parser
    from .methods import METHODS
    jobs = next(a.choices for a in train_parser()._actions if a.choices and a.dest == "what")
    return f"""tinyspec: a readable engine for speculative decoding (walkthrough.md is the book).

  python -m tinyspec.generate   generate text, plainly or speculatively, and see what happened
      --prompt "def fibonacci(n):" --method {'|'.join(METHODS)}
      [--size SIZE|auto] [--show] [--temperature T] [--json] [--prompt-file FILE --batch-size B]
  python -m tinyspec bench      every method on the same held-out prompts: tau, tokens/s, speedup
      --quick                   (a minute or two on a CPU); `bench report --out DIR` measures every GPU
                                figure in one command; `bench kernels` times the Triton kernel
  python -m tinyspec train      train {', '.join(jobs)}
      {' | '.join(jobs)}   (outputs go to runs/, never over weights/)
  python -m tinyspec course     hand out chapters as assignments and grade them with the tests
      list | handout DIR --chapters sampling,kvcache | grade DIR
  python -m tinyspec data       build the training corpus (stdlib + pinned packages); `data prompts` makes
                                the benchmark prompts from held-out modules
  python -m tinyspec evaluate   a target's validation loss, loops and every method's tau, without a clock
  python -m tinyspec figures    draw the walkthrough's figures (into --out; docs/figures holds the book's)

Each command has --help with examples. Tests: python -m pytest (the statistical ones: -m slow).
Sizing measurements, the corpus and figures drawn without --out are kept in $TINYSPEC_HOME (~/.cache/tinyspec).
"""


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    overview_asked = not argv or argv[0] in ("-h", "--help")
    if not overview_asked and argv[0] not in COMMANDS:
        print(f"error: unknown command {argv[0]!r}: use one of {', '.join(COMMANDS)} (python -m tinyspec lists them)",
              file=sys.stderr)
        raise SystemExit(2)
    from .commands.cli import run_main  # (a Ctrl-C while torch is imported: tinyspec/__init__.py)
    if overview_asked:  # through run_main too: a closed pipe or a full stdout is one line, not a traceback
        run_main(lambda: print(overview(), end=""))
        return
    module = importlib.import_module(f".{COMMANDS[argv[0]]}", __package__)
    run_main(lambda: module.main(argv[1:]))


if __name__ == "__main__":
    main()
