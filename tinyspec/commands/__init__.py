"""The command line, `python -m tinyspec COMMAND` (`__main__.py` dispatches; `generate`, the first
command, is `tinyspec/generate.py`): each file parses a command's flags, checks its input and
output paths before the work, loads the models with one-line errors, calls the room that does the
work (`training/` for train and data), and prints. `cli.py` holds what every command shares.
Nothing outside this folder imports from it."""
