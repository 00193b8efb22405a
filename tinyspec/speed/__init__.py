"""Speed, honestly (walkthrough chapters 13-14): the one way to time a forward (`timing.py`), the
policy that chooses each step's size from measured costs and the running acceptance
(`policy.py`), where a step's time goes (`ledger.py`), every size measured on the device
(`sizing.py`), and `--size auto`, batches included (`auto.py`)."""
