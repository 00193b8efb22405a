"""The commands, `python -m tinyspec COMMAND` (`__main__.py` dispatches): generate; bench and its
parts (benchmark, batches, report, peer, plots, specs, kernel_bench); train and its parts (data,
optim, checkpoint, distill, train_heads); evaluate; figures; course. `cli.py` holds what every
command shares. Nothing below this folder imports from it."""
