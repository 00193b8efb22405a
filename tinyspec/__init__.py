"""tinyspec: a readable engine for speculative decoding.

Rooms that show the house, read in the order of walkthrough.md's chapters; imports point down:

- the engine, at the top of this folder: files (atomic writes), tokenizer, model, kvcache,
  sampling, tree and verify (token trees and the acceptance rules), decoding (plain decoding
  and THE step loop every method runs, for any number of rows);
- kernels/: the Triton tree-attention kernel and the fixed-shape forward (CUDA graphs);
- methods/: one proposer per paper (draft, medusa, eagle, lookup, lookahead, ...);
- speed/: timing, the size policy, the step ledger, sizing on the device, --size auto;
- commands/: generate, bench, train, evaluate, figures, course (`python -m tinyspec COMMAND`).
"""

__version__ = "0.1.0"
