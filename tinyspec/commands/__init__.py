"""The engine's commands and what every command shares: `cli.py` (one-line errors, paths checked
before the work, models loaded, the help's layout), `method.py` (a method's flags and weights),
`generate.py` (the brief's `python -m tinyspec.generate`, `tinyspec/generate.py`), `train.py` and
`data.py`, which parse flags, check paths and call `training/`. Measurement's commands live in
`bench/`, the course's in `course/`; `__main__.py` dispatches `python -m tinyspec COMMAND` to each."""
