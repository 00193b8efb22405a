"""tinyspec: a readable engine for speculative decoding.

One file per idea (see walkthrough.md, chapter by chapter): tokenizer, model, kvcache,
sampling, decoding, speculative (draft model), medusa (heads), tree, verify (tree
verification), kernels/tree_attention (Triton), data, train, generate, bench.
"""

__version__ = "0.1.0"
