"""The fast path (walkthrough chapter 11), one file per idea.

- `tree_attention`: the Triton kernel: attention of a token tree over a cached prefix, split
  across programs (flash-decoding) and masked by one ancestor bitmask per tree token;
- `fastpath`: the same forward with fixed shapes, recorded once as a CUDA graph and replayed.

Import the modules themselves (`from tinyspec.kernels import tree_attention`); nothing is
imported here, so `import tinyspec.kernels` does not need Triton. To run the kernel on a CPU, set
`TRITON_INTERPRET=1` before `triton` is first imported: Triton decides when a function is
defined with `@triton.jit` (its own helpers included) whether it compiles it for the GPU or
runs it in its interpreter.
"""
