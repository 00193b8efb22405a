"""The KV cache: every layer's keys and values for the tokens decoded so far.

Decoding one token needs the keys and values of every earlier token at every layer. Computing
them again each step costs a full forward over the prefix; keeping them costs memory. We keep
them in tensors allocated once for a fixed maximum length (the static cache of gpt-fast), so

- appending is a slice assignment at `length`,
- rolling back rejected speculative tokens is `truncate(n)`: only `length` changes, and
- accepting one path of a token tree is `keep(slots)`: the accepted entries move down into
  contiguous slots, so the cache again holds exactly the accepted tokens, in order.

A *slot* is an index into the cache; a *position* is where a token sits in the text (it picks
the position embedding). For plain and draft-model decoding they are equal. During tree
verification they are not: tree nodes take slots L, L+1, ... in node order but positions
L + depth (see `tree.py`), and `keep` makes slots and positions agree again.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of shape (n_layer, batch, n_head, max_len, head_dim); slots [0, length) are valid."""

    def __init__(self, n_layer: int, n_head: int, head_dim: int, max_len: int, batch: int = 1,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        shape = (n_layer, batch, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = 0

    @classmethod
    def for_model(cls, model, max_len: int | None = None, batch: int = 1) -> "KVCache":
        """A cache shaped for `model` (a `GPT`), on its device and in its dtype."""
        cfg, w = model.config, model.transformer.wte.weight
        return cls(cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, max_len or cfg.n_ctx, batch, w.device, w.dtype)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write T new keys/values (B, H, T, D) at slots [length, length + T) of `layer`; return
        views of slots [0, length + T). `length` moves only in `advance`, once all layers wrote."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache is full: {end} slots needed, {self.max_len} allocated")
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, n: int) -> None:
        """Commit the n entries that every layer has just written."""
        self.length += n

    def truncate(self, n: int) -> None:
        """Keep only the first n slots (roll back everything after them); a ValueError unless
        0 <= n <= length. Nothing is erased: the next update simply writes over them."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {n}")
        self.length = n

    def keep(self, slots) -> None:
        """Keep slots [0, s0) and then exactly `slots` (ascending, s0 = slots[0]), moved down into
        slots s0, s0 + 1, ...; the length becomes s0 + len(slots).

        Example: after verifying a tree, slot 10 holds the last accepted token and slots 11..17
        the 7 tree nodes. If nodes 0 and 3 (slots 11 and 14) are the accepted path,
        `keep([10, 11, 14])` leaves slots 0..12 = prefix, root, node 0, node 3; length 13.
        A ValueError unless the slots ascend and lie below the length."""
        slots = torch.as_tensor(slots, dtype=torch.long)
        start = int(slots[0])
        if slots[-1] >= self.length or (slots.numel() > 1 and bool((slots[1:] <= slots[:-1]).any())):
            raise ValueError(f"keep() needs ascending slots below length {self.length}, got {slots.tolist()}")
        end = start + slots.numel()
        slots = slots.to(self.k.device)
        # index_select copies first, so overlapping source and destination slots are safe
        self.k[:, :, :, start:end] = self.k.index_select(3, slots)
        self.v[:, :, :, start:end] = self.v.index_select(3, slots)
        self.length = end
