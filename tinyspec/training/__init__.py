"""Training (walkthrough chapter 12), one file per idea: the corpus the models learn from and the
benchmark prompts held out of it (`corpus.py`), AdamW and its schedule (`optim.py`), checkpoints
that survive a stop (`checkpoint.py`), the losses and loops of the heads trained on the target's own
text (`distill.py`: Medusa's, EAGLE's and the unrolled one), a GPT's training run (`gpt.py`) and the
heads' runs (`heads.py`), each ending in a model card. `python -m tinyspec train` and `python -m
tinyspec data` (`commands/`) parse the flags and call these; nothing here reads a command line."""
