"""Tree attention: verify a whole token tree with one attention call per layer.

The problem
-----------
To verify a tree of T drafted tokens, the target model runs one forward pass over all of them.
In every layer, tree token i attends to

- the L tokens of the cached prefix (all of them), and
- the tree tokens that are its ancestors, and itself (nothing else: siblings and cousins are
  other continuations of the text, not part of i's).

So the mask over the (T, L + T) score matrix is all ones over the prefix and a small T x T
ancestor mask over the tree. PyTorch's attention needs it written out densely; here the tree
part travels as one bitmask per tree token (`pack_tree_mask`) and the prefix part not at all.

The design: split the prefix, keep the tree apart, merge by log-sum-exp
-----------------------------------------------------------------------
With T small (1-128) and batch 1, one program per (sequence, head) would leave most of a GPU
idle while it streams a long prefix. Flash-Decoding (Dao, Haziza, Massa, Sizov 2023) splits
the keys instead: program s of a head attends to prefix chunk s only and writes a partial
output o_s, normalised over its own chunk, and the log-sum-exp lse_s of its scores. One more
program per head does the T x T tree tile, the only place where the mask is read. Then a
second, small kernel merges the parts exactly:

    lse = m + log(sum_s exp(lse_s - m))     with m = max_s lse_s (for stability)
    o   = sum_s exp(lse_s - lse) * o_s

Inside a program the softmax is the online one of FlashAttention (Dao et al. 2022): keys come
in blocks, and a running max m, a running sum l and an output accumulator are rescaled whenever
the max grows, in fp32, so no (T, L) score matrix is ever stored.

    grid of the first kernel: (B * H, S + 1)
    program (bh, s < S):  q_bh x prefix chunk s   -> o_part[bh, s], lse_part[bh, s]
    program (bh, S):      q_bh x tree tile + mask -> o_part[bh, S], lse_part[bh, S]
    grid of the second kernel: (B * H, ceil(T / 16)): merge the S + 1 parts of 16 rows

Running on a CPU: Triton's interpreter runs these kernels with NumPy if `TRITON_INTERPRET=1`
is set before `triton` is first imported in the process. Triton reads it whenever `@triton.jit`
runs: for our kernels when this module is imported, for its own helpers (`tl.max`, `tl.sum`)
when `triton` is. `INTERPRETED` records which way our kernels went. The interpreter cannot do
bfloat16.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e)), and exp2 is the cheaper one
MAX_TREE = 128  # largest tree (T) handled by the single tree tile of one program
BLOCK_N = 64  # prefix keys per inner-loop step (a tile dimension: at least 16)
MIN_SPLIT_TOKENS = 256  # a split streams at least this many prefix keys, or merging costs more than it saves
MAX_SPLITS = 64  # cap on prefix splits per head (the merge reads every part)
COMBINE_ROWS = 16  # tree rows merged by one program of the second kernel


# The launcher's arithmetic, in plain Python: `triton.cdiv` and `triton.next_power_of_2` are Triton
# functions that also run inside kernels, and a call from Python costs microseconds, which a launch
# on a GPU cannot afford (at short prefixes the Python of a call costs more than the kernels).
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


# The packed mask
# ---------------
# Row i of the (T, T) tree mask becomes W = ceil(T / 32) int32 words: bit j % 32 of word j // 32
# is set iff tree token i may attend to tree token j (j is an ancestor of i, or i itself). Bit 31
# is the sign bit, so a word with it set is negative; the kernel only shifts and masks, which
# reads it correctly. SpecInfer keeps the same kind of bitset per tree token.

def pack_tree_mask(mask: torch.Tensor) -> torch.Tensor:
    """Pack a (T, T) bool tree mask into (T, ceil(T / 32)) int32 words.

    Bit j % 32 of word j // 32 of row i is set iff mask[i, j]. Every token must see itself
    (mask[i, i] True), or its attention row could be empty.

    Example, the tree  prefix -> 0 -> 1 -> 3,  0 -> 2,  prefix -> 4  (parents [-1, 0, 0, 1, -1]):
        row 0 sees {0}       -> 0b00001 = 1
        row 1 sees {0, 1}    -> 0b00011 = 3
        row 2 sees {0, 2}    -> 0b00101 = 5
        row 3 sees {0, 1, 3} -> 0b01011 = 11
        row 4 sees {4}       -> 0b10000 = 16      so the result is [[1], [3], [5], [11], [16]].
    """
    if mask.dim() != 2 or mask.shape[0] != mask.shape[1] or mask.shape[0] == 0:
        raise ValueError(f"the tree mask must be square (T, T) with T >= 1, got shape {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"the tree mask must be a bool tensor, got {mask.dtype}")
    if not bool(mask.diagonal().all()):
        raise ValueError("every tree token must attend to itself: the mask's diagonal has a False")
    return pack_bits(mask)


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """`pack_tree_mask` without its checks, which read the mask back to the host: for masks made
    on the device, inside a recorded step."""
    T = mask.shape[0]
    W = cdiv(T, 32)
    padded = torch.zeros(T, W * 32, dtype=torch.int64, device=mask.device)
    padded[:, :T] = mask.long()
    bit_values = torch.ones(32, dtype=torch.int64, device=mask.device) << torch.arange(32, device=mask.device)
    words = (padded.view(T, W, 32) * bit_values).sum(-1)  # (T, W), each in [0, 2**32)
    words = torch.where(words >= 2**31, words - 2**32, words)  # the same 32 bits, read as a signed int32
    return words.to(torch.int32)


# One step of the online softmax
# ------------------------------
# Both kinds of program do the same thing with a block of keys: score it, drop the scores the
# mask forbids, and fold the block into the running (max m, sum l, accumulator acc). Scores are
# kept in log2 units (multiplied by scale * log2(e)) so that exp2 can be used throughout; the
# log-sum-exps written out are log2 too, and the merge kernel reads them that way.
# `input_precision="ieee"` keeps fp32 products in fp32 (no TF32) so fp32 inputs give fp32
# results; for fp16/bf16 inputs it changes nothing.

@triton.jit
def _online_softmax_step(acc, m_i, l_i,  # running state: (BLOCK_T, D), (BLOCK_T,), (BLOCK_T,) fp32
                         q,  # (BLOCK_T, D) queries, in the input dtype
                         k, v,  # (BLOCK_KEYS, D) one block of keys and values
                         allowed,  # (BLOCK_T, BLOCK_KEYS) bool: may query i see key j?
                         qk_scale):  # softmax scale * log2(e)
    """Score the block in log2 units (q k^T * qk_scale), set what `allowed` forbids to -inf, and
    fold the block into the running max m_i, sum l_i and accumulator acc; return all three."""
    scores = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # (BLOCK_T, BLOCK_KEYS)
    scores = tl.where(allowed, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))  # (BLOCK_T,)
    alpha = tl.exp2(m_i - m_new)  # what was summed under the old max shrinks by this much
    p = tl.exp2(scores - m_new[:, None])  # (BLOCK_T, BLOCK_KEYS), 0 where not allowed
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return acc, m_new, l_i


# The first kernel: partial attention over one prefix chunk, or over the tree
# ---------------------------------------------------------------------------
# Program (bh, split) loads the queries of head bh once, as a (BLOCK_T, D) tile: BLOCK_T is T
# rounded up to a power of two and to at least 16, because tensor-core dots need every tile
# dimension >= 16; the padding rows are zeros and are never stored. A prefix program then walks
# its chunk in BLOCK_N-key steps; only keys past the chunk's end are masked. The tree program
# loads the T tree keys as one (BLOCK_T, D) tile and unpacks each query's ancestor bits into a
# (BLOCK_T, BLOCK_T) bool tile. The running max starts at -1e30 rather than -inf so that a row
# with nothing allowed (a padding row) never computes -inf - (-inf) = NaN.

# Runtime sizes are not specialised: Triton would otherwise compile a new kernel whenever L crosses
# a multiple of 16 or the split count changes, i.e. inside a timed decoding loop.
@triton.jit(do_not_specialize=["H", "T", "L", "chunk_len", "num_prefix_splits"])
def _tree_attention_partial_kernel(
    q_ptr,  # (B, H, T, D) queries of the tree tokens
    k_ptr, v_ptr,  # (B, H, L + T, D) keys and values: the prefix, then the tree tokens (and any slots after)
    mask_ptr,  # (T, W) int32 packed ancestor bits (see pack_tree_mask)
    length_ptr,  # with L_ON_DEVICE: where L is, one int64 on the device (a recorded step's cache length)
    o_part_ptr,  # (B * H, S + 1, T, D) fp32, contiguous: each part's normalised output
    lse_part_ptr,  # (B * H, S + 1, T) fp32, contiguous: each part's log2-sum-exp2 of scores
    stride_qb, stride_qh, stride_qt, stride_qd,  # strides of q (in elements)
    stride_kb, stride_kh, stride_kn, stride_kd,  # strides of k: a cache view may skip slots
    stride_vb, stride_vh, stride_vn, stride_vd,  # strides of v
    stride_mask_row, stride_mask_word,  # strides of the packed mask
    H, T, L,  # number of heads, tree tokens, prefix keys (at most: with L_ON_DEVICE, L is read there)
    chunk_len,  # prefix keys per split: a multiple of BLOCK_N
    num_prefix_splits,  # S; program S of each head does the tree tile
    qk_scale,  # softmax scale * log2(e)
    D: tl.constexpr,  # head dimension: a power of two, >= 16
    BLOCK_T: tl.constexpr,  # T padded to a power of two >= 16
    BLOCK_N: tl.constexpr,  # prefix keys per step: >= 16
    L_ON_DEVICE: tl.constexpr,  # read L at length_ptr: the grid covers the most it can be, splits past it stay empty
):
    if L_ON_DEVICE:
        L = tl.load(length_ptr).to(tl.int32)
    bh = tl.program_id(0).to(tl.int64)  # int64: batch/head offsets into a large cache can pass 2**31
    split = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_t = tl.arange(0, BLOCK_T)  # query rows, also the tree keys' columns
    offs_d = tl.arange(0, D)
    row_ok = offs_t < T

    q_ptrs = q_ptr + b * stride_qb + h * stride_qh + offs_t[:, None] * stride_qt + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)  # (BLOCK_T, D)
    k_head = k_ptr + b * stride_kb + h * stride_kh
    v_head = v_ptr + b * stride_vb + h * stride_vh

    m_i = tl.full((BLOCK_T,), -1.0e30, dtype=tl.float32)  # running max of scores (log2 units)
    l_i = tl.zeros((BLOCK_T,), dtype=tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros((BLOCK_T, D), dtype=tl.float32)  # running sum of exp2(score - m_i) * v

    if split < num_prefix_splits:
        # a chunk of the prefix: every query may see every key, so the only mask is the end
        start = split * chunk_len
        end = tl.minimum(start + chunk_len, L)
        offs_n = tl.arange(0, BLOCK_N)
        for n0 in range(start, end, BLOCK_N):
            prefix_keys = n0 + offs_n  # (BLOCK_N,) key slots
            prefix_ok = prefix_keys < end
            k_block = tl.load(k_head + prefix_keys[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                              mask=prefix_ok[:, None], other=0.0)  # (BLOCK_N, D)
            v_block = tl.load(v_head + prefix_keys[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                              mask=prefix_ok[:, None], other=0.0)  # (BLOCK_N, D)
            acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, q, k_block, v_block, prefix_ok[None, :], qk_scale)
    else:
        # the tree tile: keys L .. L + T - 1 (tree token j is both key j and query row j, so
        # row_ok masks the keys too), then each query's ancestor bits
        tree_keys = L + offs_t  # (BLOCK_T,) key slots of the tree tokens
        k_tree = tl.load(k_head + tree_keys[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                         mask=row_ok[:, None], other=0.0)  # (BLOCK_T, D)
        v_tree = tl.load(v_head + tree_keys[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                         mask=row_ok[:, None], other=0.0)  # (BLOCK_T, D)
        # word j // 32 of row i, gathered for every (i, j); then bit j % 32 of it
        words = tl.load(mask_ptr + offs_t[:, None] * stride_mask_row + (offs_t[None, :] // 32) * stride_mask_word,
                        mask=row_ok[:, None] & row_ok[None, :], other=0)  # (BLOCK_T, BLOCK_T) int32
        allowed = ((words >> (offs_t[None, :] % 32)) & 1) != 0
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, q, k_tree, v_tree, allowed, qk_scale)

    # normalise this part by its own sum; its lse lets the merge weigh it against the others
    seen = l_i > 0  # False only for padding rows
    l_safe = tl.where(seen, l_i, 1.0)
    o = acc / l_safe[:, None]  # (BLOCK_T, D)
    lse = tl.where(seen, m_i + tl.log2(l_safe), float("-inf"))  # (BLOCK_T,)

    part = bh * (num_prefix_splits + 1) + split  # index of this (head, part) in the partial buffers
    o_ptrs = o_part_ptr + (part * T + offs_t[:, None]) * D + offs_d[None, :]
    tl.store(o_ptrs, o, mask=row_ok[:, None])
    tl.store(lse_part_ptr + part * T + offs_t, lse, mask=row_ok)


# The second kernel: merge the parts
# ----------------------------------
# Each program merges all S + 1 parts for COMBINE_ROWS tree rows of one head. It walks the parts
# with the same running-max trick as the softmax, which computes exactly
# o = sum_s exp(lse_s - lse) * o_s without a second pass over the parts. It has no dot, so its
# tile sizes are free.

@triton.jit(do_not_specialize=["H", "T", "num_parts"])
def _merge_parts_kernel(
    o_part_ptr,  # (B * H, P, T, D) fp32, contiguous: normalised partial outputs
    lse_part_ptr,  # (B * H, P, T) fp32, contiguous: their log2-sum-exp2s
    out_ptr,  # (B, H, T, D) the result, in the dtype of q
    stride_ob, stride_oh, stride_ot, stride_od,  # strides of out
    H, T,  # number of heads, tree tokens
    num_parts,  # P = S + 1
    D: tl.constexpr,  # head dimension
    ROWS: tl.constexpr,  # tree rows per program
):
    bh = tl.program_id(0).to(tl.int64)
    offs_t = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    offs_d = tl.arange(0, D)
    row_ok = offs_t < T

    m = tl.full((ROWS,), -1.0e30, dtype=tl.float32)  # largest lse so far
    weight_sum = tl.zeros((ROWS,), dtype=tl.float32)  # sum_s exp2(lse_s - m)
    acc = tl.zeros((ROWS, D), dtype=tl.float32)  # sum_s exp2(lse_s - m) * o_s
    for s in range(num_parts):
        part = bh * num_parts + s
        lse_s = tl.load(lse_part_ptr + part * T + offs_t, mask=row_ok, other=float("-inf"))  # (ROWS,)
        o_s = tl.load(o_part_ptr + (part * T + offs_t[:, None]) * D + offs_d[None, :],
                      mask=row_ok[:, None], other=0.0)  # (ROWS, D)
        m_new = tl.maximum(m, lse_s)
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(lse_s - m_new)
        weight_sum = weight_sum * alpha + w
        acc = acc * alpha[:, None] + w[:, None] * o_s
        m = m_new

    out = acc / tl.where(weight_sum > 0, weight_sum, 1.0)[:, None]
    b, h = bh // H, bh % H
    out_ptrs = out_ptr + b * stride_ob + h * stride_oh + offs_t[:, None] * stride_ot + offs_d[None, :] * stride_od
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


# Decided once, when the kernels above were defined: compiled for a GPU, or interpreted. The
# interpreter also needs Triton's own helpers interpreted; they were decided when triton was
# first imported, and if that came before the flag, the kernels cannot run on the CPU at all.
INTERPRETED = not isinstance(_tree_attention_partial_kernel, triton.runtime.JITFunction)
_TRITON_IMPORTED_TOO_EARLY = INTERPRETED and isinstance(tl.max, triton.runtime.JITFunction)


# The launcher
# ------------
# It checks the inputs (a wrong shape would otherwise read out of bounds, silently), picks the
# number of prefix splits and launches the two kernels.

def _choose_num_splits(L: int, batch_heads: int, device: torch.device) -> int:
    """Enough programs to give every streaming multiprocessor about two, but no split shorter
    than MIN_SPLIT_TOKENS keys. Untuned: a starting point to measure on a GPU."""
    if device.type != "cuda":
        return 1  # the interpreter runs programs one by one: splitting buys nothing
    programs_wanted = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(cdiv(programs_wanted, batch_heads), cdiv(L, MIN_SPLIT_TOKENS), MAX_SPLITS))


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed_mask: torch.Tensor,
                   scale: float | None = None, num_splits: int | None = None,
                   length: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + tree mask) v for T tree tokens over an L-token prefix.

    q: (B, H, T, D); k, v: (B, H, L + T, D), any strides (views of a KVCache are fine).
    packed_mask: (T, ceil(T / 32)) int32 from `pack_tree_mask`; every query sees the whole
        prefix, and tree key j iff bit j of its row is set.
    scale: defaults to 1 / sqrt(D).
    num_splits: at most this many programs per head share the prefix (default: enough to fill
        the GPU); fewer are used if some would get no keys.
    length: L as a one-element int64 tensor on the device, for a recorded step: k and v then hold
        every slot of the cache, the prefix at 0 .. L - 1 and the tree at L .. L + T - 1; the
        launch is the same whatever L is (splits cover the most slots it can be; those past L
        stay empty and weigh nothing in the merge), so a CUDA graph can replay it.
    Returns (B, H, T, D) in q's dtype. T <= 128; D in {16, 32, 64, 128}; fp16, bf16 or fp32.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (B, H, T, D), got {q.dim()}-D, {k.dim()}-D, {v.dim()}-D")
    B, H, T, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[:2] != (B, H) or k.shape[3] != D:
        raise ValueError(f"k and v {tuple(k.shape)} must be (B, H, L + T, D) = ({B}, {H}, L + {T}, {D})")
    L = k.shape[2] - T
    if L < 0:
        raise ValueError(f"k and v hold {k.shape[2]} positions, fewer than the {T} tree tokens")
    if not 1 <= T <= MAX_TREE:
        raise ValueError(f"the tree must have 1 to {MAX_TREE} tokens, got T = {T}")
    if D not in (16, 32, 64, 128):
        raise ValueError(f"head dimension must be 16, 32, 64 or 128, got {D}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype among fp16, bf16, fp32; got {q.dtype}, {k.dtype}, {v.dtype}")
    if packed_mask.dtype != torch.int32 or packed_mask.shape != (T, cdiv(T, 32)):
        raise ValueError(f"packed_mask must be int32 of shape ({T}, {cdiv(T, 32)}) (see pack_tree_mask), "
                         f"got {packed_mask.dtype} {tuple(packed_mask.shape)}")
    if len({q.device, k.device, v.device, packed_mask.device}) != 1:
        raise ValueError(f"all inputs must be on one device, got {q.device}, {k.device}, {v.device}, {packed_mask.device}")
    if q.device.type != "cuda" and not INTERPRETED:
        raise ValueError(f"inputs are on {q.device} but the kernels were compiled for a GPU: set TRITON_INTERPRET=1 "
                         "before the first import of triton to run them on the CPU")
    if _TRITON_IMPORTED_TOO_EARLY:
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set, so its own helpers were compiled "
                           "for a GPU and the interpreter cannot call them: set the variable before the first import "
                           "of triton (e.g. at the top of conftest.py, or in the shell)")
    if INTERPRETED and q.dtype == torch.bfloat16:
        raise ValueError("Triton's interpreter does not support bfloat16: use fp16 or fp32 on the CPU")
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)

    # Split the prefix into chunks of whole BLOCK_N steps, then drop chunks left empty.
    if L == 0:
        num_splits, chunk_len = 0, BLOCK_N
    else:
        wanted = num_splits if num_splits is not None else _choose_num_splits(L, B * H, q.device)
        chunk_len = cdiv(cdiv(L, wanted), BLOCK_N) * BLOCK_N
        num_splits = cdiv(L, chunk_len)

    num_parts = num_splits + 1  # the prefix chunks, then the tree tile
    o_part = torch.empty(B * H, num_parts, T, D, device=q.device, dtype=torch.float32)
    lse_part = torch.empty(B * H, num_parts, T, device=q.device, dtype=torch.float32)
    block_t = max(16, next_power_of_2(T))
    out = torch.empty(B, H, T, D, device=q.device, dtype=q.dtype)
    with torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext():  # cuda:1 is not the default
        _tree_attention_partial_kernel[(B * H, num_parts)](
            q, k, v, packed_mask, q if length is None else length, o_part, lse_part,
            *q.stride(), *k.stride(), *v.stride(), *packed_mask.stride(),
            H, T, L, chunk_len, num_splits, scale * LOG2E,
            D=D, BLOCK_T=block_t, BLOCK_N=BLOCK_N, L_ON_DEVICE=length is not None,
            num_warps=4 if block_t * D <= 64 * 64 else 8,  # untuned: more warps for big tiles
            # fp32 tiles are twice as large: three pipelined K/V stages can exceed shared memory
            num_stages=2 if q.dtype == torch.float32 else 3,
        )
        _merge_parts_kernel[(B * H, cdiv(T, COMBINE_ROWS))](
            o_part, lse_part, out, *out.stride(), H, T, num_parts, D=D, ROWS=COMBINE_ROWS,
        )
    return out


# The plug-in for the model
# -------------------------
# `GPT.set_attention(TreeAttention())` makes every forward whose attn_mask is a `prefix_mask` (the
# whole cached prefix, then a tree mask) run these kernels; forwards without a mask (training,
# the prefill, one-token steps) keep SDPA, which is already the fast path for them.

class TreeAttention:
    """Attention for `GPT.set_attention`: once per forward, `prepare` finds L and the tree part of
    the mask on the device and packs it, and each layer calls `tree_attention` with them. The
    mask's first row is the root's, which sees the L prefix slots and itself: so L is that row's
    count less one, and the tree's columns are L .. L + T - 1, whether the mask is `prefix_mask`'s
    (L + T keys) or a recorded step's `slot_mask` (every slot of the cache). Nothing is read back,
    so the kernel runs inside a recorded step too."""

    def prepare(self, attn_mask: torch.Tensor | None, T: int):
        if attn_mask is None:
            return None
        if attn_mask.dim() != 2:  # rows of a batch, each with its own cached length
            raise ValueError("the tree-attention kernel takes one prefix mask for all rows; a batch of "
                             "sequences of different lengths attends with SDPA (--attn torch)")
        length = attn_mask[0].sum(-1, keepdim=True) - 1  # (1,)
        columns = length + torch.arange(T, device=attn_mask.device)  # the tree's slots
        return pack_bits(attn_mask[:, columns]), length

    def __call__(self, q, k, v, prepared):
        if prepared is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1)
        packed_mask, length = prepared
        return tree_attention(q, k, v, packed_mask, length=length)


# The specification
# -----------------
# What the kernels must compute, written the obvious way: a dense (T, L + T) mask and an fp32
# softmax. The tests hold the kernels to it.

def tree_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                             scale: float | None = None) -> torch.Tensor:
    """Tree attention in plain PyTorch. q: (B, H, T, D); k, v: (B, H, L + T, D); mask: (T, T) bool,
    True where tree token i may see tree token j. Returns (B, H, T, D) in q's dtype."""
    T, D = q.shape[2], q.shape[3]
    L = k.shape[2] - T
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    allowed = torch.cat([torch.ones(T, L, dtype=torch.bool, device=q.device), mask.to(q.device, torch.bool)], dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale  # (B, H, T, L + T)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(dim=-1) @ v.float()).to(q.dtype)
