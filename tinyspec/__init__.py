"""tinyspec: a readable engine for speculative decoding.

One file per idea, in the order of walkthrough.md's chapters: tokenizer, model, kvcache,
sampling and decoding, speculative (draft model), tree and verify (trees and acceptance rules),
medusa, kernels/tree_attention (Triton) and fastpath (CUDA graphs), data, train, distill and
optim (training), bench, timing, peer and plots (measurement). On top: cli (shared by the
commands), generate, course; files holds the atomic writes everything uses.
"""

__version__ = "0.1.0"
