"""Fixed-shape decoding steps, so that a whole step can be replayed as one CUDA graph.

A small model decodes slowly on a GPU for a reason that has nothing to do with arithmetic: a
forward launches about a hundred small kernels, and Python takes longer to launch them than the
GPU takes to run them. A CUDA graph records the launches of a step once and replays them all
with one call (what gpt-fast gets from `torch.compile(mode="reduce-overhead")`). A replay runs
the same kernels on the same memory with the same shapes, so the recorded step must not depend
on anything the host decides per step. In `GPT.forward` three things do:

- the cache is written at the Python slice `length:length + n` and read up to `length + n`;
- the attention mask is built with `length` columns of prefix;
- the positions `length + depth` are made on the host.

Here the n = T + 1 tokens of a step (a root and a tree of T nodes; T = 0 for plain decoding)
are written at slots `L + 0..n-1` given as a device tensor (`index_copy_`); attention reads all
`max_len` slots of the cache through a mask that hides the slots not yet written, computed on
the device from L (a 0-d tensor); and the positions are `L + depth` on the device. Only n is
fixed, per step object. The tokens and L are copied into the graph's input tensors before each
replay; nothing is read back to the host inside a step.

`FixedStep` runs this eagerly on any device (the tests compare it with `GPT.forward` on a CPU);
`CUDAGraphStep` captures it once and replays it. Both leave `cache.length` to the caller, who
advances it by n after the step (and then truncates or `keep`s, as the decoding loop decides).
"""

from __future__ import annotations

import weakref

import torch

from .kvcache import KVCache
from .model import GPT
from .tree import Tree


class SlotWriter:
    """Stands in for the KVCache inside a fixed-shape forward (`CausalSelfAttention` calls
    `update`): writes the new keys and values at `slots` and returns every slot of the layer."""

    def __init__(self, cache: KVCache, slots: torch.Tensor):
        self.cache, self.slots = cache, slots

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.cache.k[layer].index_copy_(2, self.slots, k)  # (B, H, max_len, D): dim 2 is the slot
        self.cache.v[layer].index_copy_(2, self.slots, v)
        return self.cache.k[layer], self.cache.v[layer]


class FixedStep:
    """One forward over n = T + 1 tokens at slots L .. L + T, whose shapes do not depend on L.

    ancestors (n, n) bool: token a may see token b (`Tree.ancestor_mask`; [[True]] for plain
    decoding); depth (n,): token a sits at position L + depth[a]."""

    def __init__(self, model: GPT, cache: KVCache, ancestors: torch.Tensor, depth: torch.Tensor):
        device = cache.k.device
        self.model, self.cache = model, cache
        self.ancestors, self.depth = ancestors.to(device), depth.to(device)
        self.n = len(depth)
        self.offsets = torch.arange(self.n, device=device)
        self.slot_ids = torch.arange(cache.max_len, device=device)

    @classmethod
    def plain(cls, model: GPT, cache: KVCache) -> "FixedStep":
        """The plain decoding step: one token, which sees the prefix and itself."""
        return cls(model, cache, torch.ones(1, 1, dtype=torch.bool), torch.zeros(1, dtype=torch.long))

    def mask(self, length: torch.Tensor) -> torch.Tensor:
        """(n, max_len) bool: every slot below L, then the ancestor mask at slots L .. L + T."""
        rel = self.slot_ids - length  # slot s holds tree token s - L
        in_step = (rel >= 0) & (rel < self.n)
        return (rel < 0) | (self.ancestors[:, rel.clamp(0, self.n - 1)] & in_step)

    def forward(self, tokens: torch.Tensor, length: torch.Tensor):
        """tokens (n,) long and length (0-d long), both on the device -> logits (1, n, V), hidden (1, n, C)."""
        wte, wpe = self.model.transformer.wte, self.model.transformer.wpe
        x = (wte(tokens) + wpe(length + self.depth))[None]
        writer, mask = SlotWriter(self.cache, length + self.offsets), self.mask(length)
        for layer, block in enumerate(self.model.transformer.h):
            x = block(x, layer, writer, mask)  # SDPA over all max_len slots, hidden ones masked
        h = self.model.transformer.ln_f(x)
        return self.model.lm_head(h), h

    def __call__(self, tokens: torch.Tensor, length: int):
        """Run the step for `tokens` (n,) after `length` cached tokens; the caller advances the cache."""
        if length + self.n > self.cache.max_len:
            raise ValueError(f"KV cache is full: {length + self.n} slots needed, {self.cache.max_len} allocated")
        return self.run(tokens, length)

    def run(self, tokens: torch.Tensor, length: int):
        return self.forward(tokens, torch.tensor(length, device=tokens.device))


class CUDAGraphStep(FixedStep):
    """A FixedStep recorded once as a CUDA graph and replayed with new inputs.

    Recording runs the step (on a side stream, three times, then once captured), which writes
    n keys and values at slots 0 .. n-1: build it while the cache is still empty, before the
    prefill. The returned logits and hidden states are the graph's own output buffers, which
    the next replay overwrites: use them (or copy them) before calling again."""

    def __init__(self, model: GPT, cache: KVCache, ancestors: torch.Tensor, depth: torch.Tensor):
        super().__init__(model, cache, ancestors, depth)
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


_MADE: "weakref.WeakKeyDictionary[GPT, dict]" = weakref.WeakKeyDictionary()


def fixed_step(model: GPT, max_len: int, tree: Tree | None = None) -> tuple[KVCache, FixedStep]:
    """An empty cache of `max_len` slots and a fixed-shape step over it: plain decoding without
    a tree, verification of `tree` with one. On CUDA the step is a recorded CUDA graph, elsewhere
    it runs eagerly. Both are made once per model, length and tree, and handed out again
    (emptied) on later calls: recording costs several forwards, too much to pay per prompt. So
    one sequence at a time decodes with them."""
    made = _MADE.setdefault(model, {})
    if (max_len, tree) not in made:
        cache = KVCache.for_model(model, max_len)
        kind = CUDAGraphStep if cache.k.device.type == "cuda" else FixedStep
        made[max_len, tree] = kind.plain(model, cache) if tree is None else kind(model, cache, tree.ancestor_mask, tree.depth)
    step = made[max_len, tree]
    step.cache.truncate(0)
    return step.cache, step
