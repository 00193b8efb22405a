"""`python -m tinyspec.generate ...`, the command the README and the book lead with: generate text
plainly or speculatively and see what happened. The command itself is `commands/generate.py` (also
`python -m tinyspec generate ...`)."""

from .commands.cli import run_main
from .commands.generate import main

if __name__ == "__main__":
    run_main(main)
