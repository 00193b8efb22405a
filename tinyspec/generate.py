"""`python -m tinyspec.generate ...`: the same command as `python -m tinyspec generate ...`
(`commands/generate.py`), under the name the project was first described with."""

from .commands.cli import run_main
from .commands.generate import main

if __name__ == "__main__":
    run_main(main)
