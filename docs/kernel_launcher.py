"""The tree-attention launcher's own Python, on the CPU: a call of `tree_attention` with both kernel
launches replaced by no-ops, and the six calls of Triton's `cdiv` / `next_power_of_2` it made
before its arithmetic became plain Python (`kernels/tree_attention.py: cdiv, next_power_of_2`),
timed interleaved, one thread, at a decoding shape (H = 4, L = 479, T = 17, D = 64).
Writes docs/kernel_launcher.json.

    TRITON_INTERPRET=1 PYTHONPATH=. python docs/kernel_launcher.py
"""
import json
import statistics
import time
from pathlib import Path

import torch
import triton

import tinyspec.kernels.tree_attention as ta
from tinyspec.speed.sizing import device_name

torch.set_num_threads(1)


class NoLaunch:  # `kernel[grid](...)` that launches nothing
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


ta._tree_attention_partial_kernel = ta._merge_parts_kernel = NoLaunch()
q, k = torch.randn(1, 4, 17, 64), torch.randn(1, 4, 479 + 17, 64)
bits = ta.pack_tree_mask(torch.ones(17, 17, dtype=torch.bool).tril())


def launcher():
    ta.tree_attention(q, k, k, bits)


def helpers(cdiv, next_power_of_2):  # the calls the launcher makes at this shape (cdiv five times)
    return lambda: (cdiv(17, 32), cdiv(264, 4), cdiv(479, 256), cdiv(cdiv(479, 2), 64), cdiv(479, 256),
                    next_power_of_2(17))


timed = {"launcher": launcher, "triton_helpers": helpers(triton.cdiv, triton.next_power_of_2),
         "python_helpers": helpers(ta.cdiv, ta.next_power_of_2)}


def us_per_call(fn, n=2000):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


for fn in timed.values():
    us_per_call(fn, 200)
runs = {name: [] for name in timed}
for _ in range(15):  # interleaved: a slow spell of the machine hits each alike
    for name, fn in timed.items():
        runs[name].append(us_per_call(fn))
result = {name: round(statistics.median(v), 2) for name, v in runs.items()}
result |= {"device": device_name(torch.device("cpu")), "threads": 1, "triton": triton.__version__,
           "torch": torch.__version__, "command": "TRITON_INTERPRET=1 PYTHONPATH=. python docs/kernel_launcher.py",
           "unit": "microseconds per call, median of 15 interleaved rounds of 2,000 calls"}
Path(__file__).with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
print(json.dumps(result, indent=1))
