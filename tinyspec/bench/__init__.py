"""Measurement (walkthrough chapters 13 and 14), one file per idea: method specs as `--methods` names
them (`specs.py`), the same weights in Hugging Face (`peer.py`), a method's passes over prompts
(`runner.py`), the benchmark itself, every method on the same held-out prompts (`benchmark.py`, the
batch curve in `batches.py`), the kernel's timings (`kernels.py`), the GPU report (`report.py`), a
target's loss and every method's tau without a clock (`evaluate.py`), the book's figures
(`figures.py`, drawn by `plots.py`), and the `bench` command that dispatches to them (`command.py`).
They read their flags with `commands/cli.py` and `commands/method.py`."""
