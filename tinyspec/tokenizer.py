"""Byte-level BPE: learn merges from text, save them as a tiktoken ranks file, encode with tiktoken.

Byte-pair encoding (Sennrich et al. 2016, arXiv:1508.07909) in the byte-level form of GPT-2
(Radford et al. 2019): start from the 256 byte values, then repeatedly make the most frequent
adjacent pair of tokens into a new token. The rank of a token is the step it was made at, so a
tokenizer is nothing but a map bytes -> rank. That map is exactly what tiktoken's
`mergeable_ranks` takes, so training happens here (in plain Python) and encoding in tiktoken
(in Rust, fast).

Two ideas make training fast enough for tens of MB:
1. Text is first split into chunks by a regex (`PAT_STR`: words, numbers, punctuation,
   whitespace runs); merges never cross a chunk boundary, so only *unique* chunks and their
   counts matter. The 30 MB training split has about 160,000 unique chunks.
2. Pair counts are updated incrementally: a merge only touches the chunks that contain the
   merged pair (`where[pair]`), and a heap finds the next best pair without a full recount.

Ties between equally frequent pairs go to the pair that occurs first in the text, which is the
rule of tiktoken's educational trainer (`tiktoken._educational.bpe_train`), our test oracle.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
from collections import Counter
from pathlib import Path

import regex
import tiktoken

from .files import atomic_write_text
from .progress import progress_bar

# Pre-tokenization pattern, tuned for Python source: contractions; identifiers (letters, digits
# and `_`, with one optional leading space); numbers in groups of up to three digits (same); runs of
# punctuation; newlines with the whitespace before them; and runs of spaces that leave their last
# space to the next word, so `    return` becomes `   ` + ` return`. Punctuation never absorbs the
# newline after it (GPT-4's pattern does): a prompt like "def f(x):" then ends where training text
# has a token boundary too, instead of in the middle of the usual token "):\n", which the model
# would otherwise complete with " pass" (it has only seen "):" followed by more of the line).
PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)"""
    r"""| ?[\p{L}_][\p{L}\p{N}_]*"""
    r"""| ?\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}_]+"""
    r"""|\s*[\r\n]"""
    r"""|\s+(?!\S)"""
    r"""|\s+"""
)
EOT = "<|endoftext|>"  # separates documents; the one special token


def count_chunks(text: str, pat_str: str = PAT_STR, counts: Counter | None = None) -> Counter:
    """Split `text` into regex chunks and count each chunk's UTF-8 bytes.

    A Counter keeps first-seen order, which the trainer uses to break ties like the oracle.
    Pass `counts` to keep counting across several texts."""
    counts = Counter() if counts is None else counts
    counts.update(chunk.encode("utf-8") for chunk in regex.findall(pat_str, text))
    return counts


def train_bpe(chunk_counts: Counter, vocab_size: int, progress: bool = False) -> dict[bytes, int]:
    """Learn `vocab_size - 256` merges; returns mergeable ranks {token bytes: rank}.

    `chunk_counts` comes from `count_chunks`. Example: chunks {b"aaab": 1} with vocab_size 258
    merge (a, a) -> 256 first (count 2 beats (a, b) with count 1), leaving [256, a, b]; then
    the pairs (256, a) and (a, b) tie at count 1 and the earlier one, 256 + a = b"aaa", wins."""
    if vocab_size < 256:
        raise ValueError(f"vocab_size must be at least 256 (one token per byte), got {vocab_size}")
    vocab = [bytes([i]) for i in range(256)]  # token id -> bytes
    ranks = {b: i for i, b in enumerate(vocab)}
    chunks = [list(c) for c in chunk_counts]  # each unique chunk as a list of token ids
    weights = list(chunk_counts.values())  # how often each chunk occurs

    pair_count: Counter = Counter()  # (a, b) -> occurrences in the whole text
    where: dict[tuple[int, int], set[int]] = {}  # (a, b) -> indices of chunks that contain it
    for ci, (ids, w) in enumerate(zip(chunks, weights)):
        for pair in zip(ids, ids[1:]):
            pair_count[pair] += w
            where.setdefault(pair, set()).add(ci)

    def first_occurrence(pair):  # (chunk index, byte offset): the oracle's tie-break order
        ci = min(where[pair])
        ids, offset = chunks[ci], 0
        for a, b in zip(ids, ids[1:]):
            if (a, b) == pair:
                return ci, offset
            offset += len(vocab[a])
        raise AssertionError("pair index out of date")

    # Max-heap of (-count, first occurrence, pair, version). An existing pair only ever loses
    # occurrences (a merge creates pairs that contain the new token only), so an entry's key is
    # never worse than the truth: entries go stale lazily and are refreshed when popped.
    version: Counter = Counter()  # bumped whenever a pair's count changes
    fresh = set()  # pairs that have an entry with their current version in the heap
    heap = [(-n, first_occurrence(p), p, 0) for p, n in pair_count.items()]
    heapq.heapify(heap)
    fresh.update(pair_count)

    bar = progress_bar(total=vocab_size - len(vocab), desc="bpe merges", disable=not progress)
    while len(vocab) < vocab_size and heap:
        _, _, pair, ver = heapq.heappop(heap)
        if ver != version[pair]:  # stale entry: re-push with the true key, once
            if pair not in fresh and pair_count[pair] > 0:
                heapq.heappush(heap, (-pair_count[pair], first_occurrence(pair), pair, version[pair]))
                fresh.add(pair)
            continue
        if pair_count[pair] <= 0:
            continue
        merged = vocab[pair[0]] + vocab[pair[1]]
        new_id = ranks.get(merged)  # the same bytes may already be a token (via another pair)
        if new_id is None:
            new_id = len(vocab)
            vocab.append(merged)
            ranks[merged] = new_id
            bar.update(1)
        born = set()  # pairs containing new_id: they need a first heap entry
        for ci in list(where[pair]):
            ids, w = chunks[ci], weights[ci]
            new_ids, i = [], 0
            while i < len(ids):  # merge left to right, non-overlapping, as the oracle does
                if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
                    new_ids.append(new_id)
                    i += 2
                else:
                    new_ids.append(ids[i])
                    i += 1
            before, after = Counter(zip(ids, ids[1:])), Counter(zip(new_ids, new_ids[1:]))
            for p in before.keys() | after.keys():
                delta = after[p] - before[p]
                if delta == 0:
                    continue
                pair_count[p] += delta * w
                version[p] += 1
                fresh.discard(p)
                if after[p] == 0:
                    where[p].discard(ci)
                else:
                    where.setdefault(p, set()).add(ci)
                if new_id in p:
                    born.add(p)
            chunks[ci] = new_ids
        for p in born:
            if pair_count[p] > 0 and p not in fresh:
                heapq.heappush(heap, (-pair_count[p], first_occurrence(p), p, version[p]))
                fresh.add(p)
    bar.close()
    return ranks


def save_ranks(ranks: dict[bytes, int], path: str | Path) -> None:
    """Write a tiktoken ranks file (`base64(token) rank` per line), atomically."""
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    atomic_write_text(path, "".join(f"{base64.b64encode(tok).decode()} {rank}\n" for tok, rank in by_rank))


def load_ranks(path: str | Path) -> dict[bytes, int]:
    """Read a ranks file. (tiktoken's own `load_tiktoken_bpe` caches by *path* in a temp dir,
    so a retrained file at the same path would silently load the old merges.)"""
    ranks = {}
    try:
        for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
    except (UnicodeDecodeError, ValueError) as e:  # binary junk, wrong field count, bad base64 or rank
        where = f", line {n}" if "n" in locals() else ""
        raise ValueError(f"{path} is not a tiktoken ranks file{where} (expected 'base64-token rank' per line: {e})") from None
    if len(ranks) < 256:
        raise ValueError(f"{path} holds {len(ranks)} tokens; a byte-level BPE ranks file has at least the 256 bytes")
    return ranks


def fingerprint(ranks: dict[bytes, int]) -> str:
    """A short hash of the merges: checkpoints record the tokenizer they were trained with, and a
    retrained tokenizer of the same size is refused instead of silently garbling every token."""
    h = hashlib.sha1()
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        h.update(base64.b64encode(token) + f" {rank}\n".encode())
    return h.hexdigest()[:16]


def make_encoding(ranks: dict[bytes, int], name: str = "tinyspec") -> tiktoken.Encoding:
    """A tiktoken Encoding over our merges; `<|endoftext|>` takes the id after the last rank."""
    return tiktoken.Encoding(
        name=name, pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens={EOT: max(ranks.values()) + 1}
    )


def load_tokenizer(path: str | Path) -> tiktoken.Encoding:
    """Load a ranks file written by `save_ranks` as a tiktoken Encoding; `.fingerprint` names it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} not found: train one with `python -m tinyspec train tokenizer`")
    ranks = load_ranks(path)
    enc = make_encoding(ranks, name=path.stem)
    enc.fingerprint = fingerprint(ranks)
    return enc
