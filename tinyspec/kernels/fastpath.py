"""Fixed-shape inputs for the one forward, so that a whole step can be replayed as a CUDA graph.

A small model decodes slowly on a GPU for a reason that has nothing to do with arithmetic: a
forward launches about a hundred small kernels, and Python takes longer to launch them than the
GPU takes to run them. A CUDA graph records the launches of a step once and replays them all
with one call (what gpt-fast gets from `torch.compile(mode="reduce-overhead")`). A replay runs
the same kernels on the same memory with the same shapes, so nothing in the recorded step may
depend on what the host decides per step. `GPT.hidden` is that forward already; only three of
its inputs change here:

- the cache: `KVCache.update` writes at the Python slice `length:length + n` and returns
  `length + n` keys. `kvcache.SlotWriter` writes at slots given as a device tensor (`index_copy_`)
  and returns every slot of the cache, all `max_len` of them;
- the attention mask: `kvcache.slot_mask` hides the slots not yet written, computed on the device from
  L (a 0-d tensor), and applies the tree mask at slots L .. L + n - 1;
- the positions: `L + depth`, added on the device.

Only n, the number of tokens a step feeds (1 for plain decoding, 1 + T to verify a tree of T
nodes), is fixed per `FixedForward`. The tokens and L are copied into the graph's input tensors
before each replay; nothing is read back to the host inside a step.

`FixedForward` runs this eagerly on any device (the tests compare it with the ordinary forward on
a CPU); `CUDAGraphForward` records it once and replays it. Both are called like every forward of
a decoding loop, `forward(tokens, L) -> (logits, hidden)`, and advance the cache by n afterwards,
as `GPT.hidden` does for a `KVCache`. The caller makes them, owns them, and may reuse them for
the next prompt (recording costs several forwards).
"""

from __future__ import annotations

import torch

from ..kvcache import KVCache, SlotWriter, slot_mask
from ..model import GPT, causal_mask


class FixedForward:
    """`model` over n tokens at slots L .. L + n - 1 of `cache`, with shapes that do not depend on L.

    tree_mask (n, n) bool and depth (n,): token a sees token b among the n, and sits at
    position L + depth[a]. The default is plain decoding: one token, depth 0."""

    def __init__(self, model: GPT, cache: KVCache, tree_mask: torch.Tensor | None = None,
                 depth: torch.Tensor | None = None):
        device = cache.k.device
        self.model, self.cache = model, cache
        self.tree_mask = (causal_mask(1) if tree_mask is None else tree_mask).to(device)
        self.depth = (torch.zeros(1, dtype=torch.long) if depth is None else depth).to(device)
        self.n = len(self.depth)
        self.offsets = torch.arange(self.n, device=device)

    def forward(self, tokens: torch.Tensor, length: torch.Tensor):
        """tokens (n,) long and length (0-d long), both on the device -> logits (1, n, V), hidden (1, n, C)."""
        return self.model(tokens[None], positions=length + self.depth, cache=SlotWriter(self.cache, length + self.offsets),
                          attn_mask=slot_mask(self.tree_mask, length, self.cache.max_len))

    def __call__(self, tokens: torch.Tensor, length: int):
        """Feed `tokens` (n,) after `length` cached tokens, then advance the cache by n."""
        if length + self.n > self.cache.max_len:
            raise ValueError(f"KV cache is full: {length + self.n} slots needed, {self.cache.max_len} allocated")
        out = self.run(tokens, length)
        self.cache.advance(self.n)
        return out

    def run(self, tokens: torch.Tensor, length: int):
        return self.forward(tokens, torch.tensor(length, device=tokens.device))


class CUDAGraphForward(FixedForward):
    """A FixedForward recorded once as a CUDA graph and replayed with new inputs.

    Recording runs the forward (on a side stream, three times, then once captured), which writes
    n keys and values at slots 0 .. n-1: make it while the cache is still empty, before the
    prefill. The returned logits and hidden states are the graph's own output buffers, which
    the next replay overwrites: use them (or copy them) before calling again."""

    def __init__(self, model: GPT, cache: KVCache, tree_mask: torch.Tensor | None = None,
                 depth: torch.Tensor | None = None):
        super().__init__(model, cache, tree_mask, depth)
        device = cache.k.device
        self.tokens = torch.zeros(self.n, dtype=torch.long, device=device)  # the graph's inputs
        self.length = torch.zeros((), dtype=torch.long, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), torch.no_grad():  # warm-up: kernels chosen, workspaces allocated
            for _ in range(3):
                self.forward(self.tokens, self.length)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.logits, self.hidden = self.forward(self.tokens, self.length)

    def run(self, tokens: torch.Tensor, length: int):
        self.tokens.copy_(tokens)
        self.length.fill_(length)  # a host scalar written into device memory: no synchronisation
        self.graph.replay()
        return self.logits, self.hidden


def fixed_forward(model: GPT, cache: KVCache, tree=None) -> FixedForward:
    """The fixed-shape forward for plain decoding (no tree) or for verifying `tree` (root + its
    T nodes) over `cache`: recorded as a CUDA graph on CUDA, run eagerly elsewhere."""
    kind = CUDAGraphForward if cache.k.device.type == "cuda" else FixedForward
    return kind(model, cache) if tree is None else kind(model, cache, tree.tree_mask, tree.depth)
