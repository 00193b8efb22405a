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

A cache holds one sequence or several (*rows*) that share every forward: the batch is a
dimension, as in gpt-fast. Each row has its own length, so rows that accepted different
numbers of tokens, or started from prompts of different lengths, sit side by side, and
`truncate`, `keep` work on one row (row 0 unless told). Batch 1 is the simplest case, and the
one the first chapters use: `cache.length` is then the length.
"""

from __future__ import annotations

import torch

from .model import causal_mask, prefix_mask


class KVCache:
    """Keys and values of shape (n_layer, rows, n_head, max_len, head_dim); row b's slots
    [0, lengths[b]) are valid.

    A forward feeds the same number T of tokens to every row (a row that has fewer is padded at
    the end, `decoding.feed`). Row b writes its T at its own slots [lengths[b], lengths[b] + T),
    so the new tokens of different rows may sit at different slots; `mask` tells each row's
    tokens which slots are theirs to see. Afterwards `truncate(n, b)` and `keep(slots, b)` work
    on row b alone (padding is dropped like a rejected proposal), and `select(rows)` lets
    finished rows leave: the rows that go on move down to 0, 1, ..., so every later forward
    computes only for them.

    Example, two rows, lengths [3, 5], each fed T = 2 new tokens a, b (row 0) and c, d (row 1):

        slot     0  1  2  3  4  5  6      mask of row 0 (rows: a, b)   mask of row 1 (c, d)
        row 0    x  x  x  a  b  .  .       1 1 1 1 . . .                1 1 1 1 1 1 .
        row 1    y  y  y  y  y  c  d       1 1 1 1 1 . .                1 1 1 1 1 1 1
    """

    def __init__(self, n_layer: int, n_head: int, head_dim: int, max_len: int, batch: int = 1,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        shape = (n_layer, batch, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.lengths = [0] * batch  # one per live row; rows that left the batch are gone from the list
        self._where = (None, None)  # (lengths, T) of the last update of rows at different lengths, and its slots

    @classmethod
    def for_model(cls, model, max_len: int | None = None, batch: int = 1) -> "KVCache":
        """A cache shaped for `model` (a `GPT`), on its device and in its dtype."""
        cfg, w = model.config, model.transformer.wte.weight
        return cls(cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, max_len or cfg.n_ctx, batch, w.device, w.dtype)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def length(self) -> int:
        """The length of every row (one row, or rows that all hold as many tokens)."""
        if len(set(self.lengths)) != 1:
            raise ValueError(f"the rows have different lengths {self.lengths}: read lengths[b]")
        return self.lengths[0]

    @length.setter
    def length(self, n: int) -> None:
        self.lengths = [n] * self.rows

    def reset(self, rows: int = 1) -> None:
        """Empty the cache and make `rows` rows live (at most the batch it was made for)."""
        if rows > self.k.shape[1]:
            raise ValueError(f"this cache holds {self.k.shape[1]} rows, not {rows}")
        self.lengths = [0] * rows

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write each row's T new keys/values (B, H, T, D) at its slots [lengths[b], lengths[b] + T);
        return views of slots [0, max(lengths) + T) of the live rows. The lengths move only in
        `advance`, once all layers wrote."""
        B, T = k.shape[0], k.shape[2]
        end = max(self.lengths) + T
        if end > self.max_len:
            raise ValueError(f"KV cache is full: {end} slots needed, {self.max_len} allocated")
        if min(self.lengths) == end - T:  # every row at one length (batch 1 always): a slice
            self.k[layer, :B, :, end - T:end] = k
            self.v[layer, :B, :, end - T:end] = v
        else:  # each row at its own slots
            if self._where[0] != (self.lengths, T):  # the same for every layer of a forward: made once
                slots = torch.tensor(self.lengths, device=k.device)[:, None] + torch.arange(T, device=k.device)  # (B, T)
                self._where = ((list(self.lengths), T), (torch.arange(B, device=k.device)[:, None], slots))
            rows, slots = self._where[1]
            self.k[layer][rows, :, slots] = k.transpose(1, 2)  # indexed (B, T, H, D): row b's token t at its own slot
            self.v[layer][rows, :, slots] = v.transpose(1, 2)
        return self.k[layer, :B, :, :end], self.v[layer, :B, :, :end]

    def advance(self, n: int) -> None:
        """Commit the n entries that every layer has just written to every row."""
        self.lengths = [length + n for length in self.lengths]

    def truncate(self, n: int, row: int = 0) -> None:
        """Row `row` keeps only its first n slots (everything after them is rolled back); a
        ValueError unless 0 <= n <= its length. Nothing is erased: the next update simply
        writes over them."""
        if not 0 <= n <= self.lengths[row]:
            raise ValueError(f"cannot truncate a cache of length {self.lengths[row]} to {n}")
        self.lengths[row] = n

    def keep(self, slots, row: int = 0) -> None:
        """Row `row` keeps slots [0, s0) and then exactly `slots` (ascending, s0 = slots[0]), moved
        down into slots s0, s0 + 1, ...; its length becomes s0 + len(slots).

        Example: after verifying a tree, slot 10 holds the last accepted token and slots 11..17
        the 7 tree nodes. If nodes 0 and 3 (slots 11 and 14) are the accepted path,
        `keep([10, 11, 14])` leaves slots 0..12 = prefix, root, node 0, node 3; length 13.
        A ValueError unless the slots ascend and lie below the length."""
        slots, length = [int(s) for s in slots], self.lengths[row]
        if slots[-1] >= length or any(b <= a for a, b in zip(slots, slots[1:])):
            raise ValueError(f"keep() needs ascending slots below length {length}, got {slots}")
        start, end = slots[0], slots[0] + len(slots)
        if slots[-1] != end - 1:  # else the slots are start..end-1 already: nothing moves
            index = torch.tensor(slots, device=self.k.device)
            # index_select copies first, so overlapping source and destination slots are safe
            self.k[:, row, :, start:end] = self.k[:, row].index_select(2, index)
            self.v[:, row, :, start:end] = self.v[:, row].index_select(2, index)
        self.lengths[row] = end

    def keep_on_device(self, L: torch.Tensor, path: torch.Tensor) -> None:
        """`keep` with the slots on the device (a recorded step, batch 1): slot L (the root) and the
        accepted path's slots L + path (D+1,) move to L, L + 1, ...; past the path the copies land
        beyond the new length, where nothing looks, and the length stays on the device (L)."""
        to = L + torch.arange(len(path), device=L.device)
        for kv in (self.k, self.v):
            kv[:, 0].index_copy_(2, to, kv[:, 0].index_select(2, L + path))

    def positions(self, offsets: torch.Tensor) -> torch.Tensor:
        """(B, T) positions of the new tokens: each row's length plus offsets (T,) or (B, T) (0, 1, ...
        for a sequence, the depths for a tree)."""
        return torch.tensor(self.lengths, device=self.k.device)[:, None] + offsets

    def mask(self, new_mask: torch.Tensor) -> torch.Tensor:
        """(B, T, keys) bool for `GPT.hidden`: row b's new tokens see the row's own lengths[b]
        cached slots, and among themselves what `new_mask` (T, T), or its row (B, T, T), allows;
        keys = max(lengths) + T. The slots of another row's longer prefix are hidden."""
        B, T = self.rows, new_mask.shape[-1]
        lengths = torch.tensor(self.lengths, device=self.k.device)[:, None]  # (B, 1)
        rel = torch.arange(max(self.lengths) + T, device=self.k.device) - lengths  # (B, keys): key j is new token j - L_b
        among_new = new_mask.expand(B, T, T).gather(2, rel.clamp(0, T - 1)[:, None, :].expand(B, T, -1))  # (B, T, keys)
        return (rel < 0)[:, None, :] | (among_new & (rel < T)[:, None, :])

    def select(self, rows: list[int]) -> None:
        """Only `rows` (ascending indices of live rows) go on; they move down to rows 0, 1, ... in
        that order, so the next forward computes for them alone."""
        if list(rows) != sorted(set(rows)) or (rows and not 0 <= rows[0] <= rows[-1] < self.rows):
            raise ValueError(f"select() needs ascending live rows below {self.rows}, got {list(rows)}")
        for new, old in enumerate(rows):  # in ascending order a row moves down onto one already moved or gone
            if new != old:
                n = self.lengths[old]
                self.k[:, new, :, :n] = self.k[:, old, :, :n]
                self.v[:, new, :, :n] = self.v[:, old, :, :n]
        self.lengths = [self.lengths[r] for r in rows]


def feed(model, cache: KVCache, inputs: list[torch.Tensor], masks: list | None = None,
         offsets: list | None = None) -> list[torch.Tensor]:
    """ONE forward of `model` for all live rows of `cache`: row b feeds inputs[b] (n_b,) after its
    cached tokens, causally at the next positions, or (masks[b] not None) among themselves as
    masks[b] (n_b, n_b) allows, at positions length + offsets[b] (a tree: its mask and depths).
    Rows are padded at the end to the longest; the padding enters the cache like a rejected
    proposal and is dropped again, so each row advances by its own n_b. Returns the final
    hidden states of each row's own tokens, [(n_b, C)]."""
    if len(inputs) == 1:  # one row: nothing to pad, and the mask is the prefix's (or none, causally)
        L, mask = cache.lengths[0], None if masks is None else masks[0]
        if mask is None:
            return [model.hidden(inputs[0][None], cache=cache)[0]]
        return [model.hidden(inputs[0][None], positions=L + offsets[0], cache=cache, attn_mask=prefix_mask(mask, L))[0]]
    device = inputs[0].device
    n = torch.tensor([len(x) for x in inputs], device=device)  # (B,)
    T = int(n.max())
    x = torch.nn.utils.rnn.pad_sequence(inputs, batch_first=True)  # (B, T), padded with token 0
    t = torch.arange(T, device=device)
    pos = torch.where(t < n[:, None], t, 0)  # (B, T); padding at offset 0, the row's root: a position that exists
    new_mask = causal_mask(T, device).repeat(len(inputs), 1, 1)  # (B, T, T); nothing real sees the padding
    for b in range(len(inputs) if masks is not None else 0):
        if masks[b] is not None:
            new_mask[b, :len(inputs[b]), :len(inputs[b])] = masks[b]
            pos[b, :len(inputs[b])] = offsets[b]
    before = list(cache.lengths)
    h = model.hidden(x, positions=cache.positions(pos), cache=cache, attn_mask=cache.mask(new_mask))  # (B, T, C)
    for b, length in enumerate(before):
        cache.truncate(length + len(inputs[b]), b)  # drop the padding
    return [h[b, :len(inputs[b])] for b in range(len(inputs))]


class SlotWriter:
    """Stands in for the cache inside a forward whose shapes must not depend on the cache's length
    (a recorded step, `recorded.py`): `CausalSelfAttention` calls `update`, which writes the
    new keys and values at `slots` (a device tensor) and returns every slot of the layer. Nothing
    advances: whoever owns the step keeps the length."""

    def __init__(self, cache: KVCache, slots: torch.Tensor):
        self.cache, self.slots = cache, slots

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.cache.k[layer].index_copy_(2, self.slots, k)  # (B, H, max_len, D): dim 2 is the slot
        self.cache.v[layer].index_copy_(2, self.slots, v)
        return self.cache.k[layer], self.cache.v[layer]

    def advance(self, n: int) -> None:
        """Nothing: a replayed graph runs no Python, so the step's owner keeps the length."""


def slot_mask(tree_mask: torch.Tensor, length: torch.Tensor, max_len: int) -> torch.Tensor:
    """(n, max_len) bool, for a `SlotWriter`'s forward: every slot below L (a device tensor of one
    element), then `tree_mask` (n, m) at slots L .. L + m - 1 (m = n: the new tokens among
    themselves), and nothing beyond."""
    m = tree_mask.shape[1]
    rel = torch.arange(max_len, device=tree_mask.device) - length  # slot s holds new token s - L
    in_step = (rel >= 0) & (rel < m)
    return (rel < 0) | (tree_mask[:, rel.clamp(0, m - 1)] & in_step)
