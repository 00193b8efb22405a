"""What prompt lookup, retrieval and lookahead share: an index of the text's n-grams (where each
last occurred), and the trie that merges several continuations into one tree below the root."""

from __future__ import annotations


class NgramIndex:
    """The text so far, and where each of its n-grams (n = 1..max_ngram) last occurred.

    `last[g]` is the index in `text` just after the most recent occurrence of n-gram g that has
    a token after it. Appending a token adds the n-grams that *end just before it*, so the index
    grows by max_ngram entries per token (a dict update, not a rescan of the text), and the
    text's own suffix is never found as its own earlier occurrence.

    Example, max_ngram = 2, text = a b c a b: last = {a: 4, b: 2, c: 3, ab: 2, bc: 3, ca: 4}
    (b at 4 has nothing after it yet). The suffix "a b" last occurred at 0..1, followed by
    text[2:] = "c a b": propose(2) = [c, a]."""

    def __init__(self, max_ngram: int, text=()):
        self.max_ngram = max_ngram
        self.text: list[int] = []
        self.last: dict[tuple[int, ...], int] = {}
        self.extend(text)

    def extend(self, tokens) -> None:
        for token in tokens:
            i = len(self.text)  # token i follows the n-grams that end at i - 1
            for n in range(1, min(self.max_ngram, i) + 1):
                self.last[tuple(self.text[i - n:i])] = i  # newer occurrences overwrite older ones
            self.text.append(int(token))

    def matched(self) -> int:
        """How many of the text's last tokens (up to max_ngram) occurred before: the length of the
        match `propose` follows (0: nothing)."""
        text = self.text
        return next((n for n in range(min(self.max_ngram, len(text)), 0, -1) if tuple(text[-n:]) in self.last), 0)

    def propose(self, k: int) -> list[int]:
        """The k tokens that followed the most recent earlier occurrence of the longest suffix
        (up to max_ngram tokens) seen before; [] if not even the last token was seen before.
        A continuation that runs into the end of the text wraps around: the suffix recurred
        len(text) - start tokens back, so the guess is that the text repeats with that period
        (a loop "x y z x y z" proposes "x y z x ..." rather than stopping after "x y z")."""
        text = self.text
        for n in range(min(self.max_ngram, len(text)), 0, -1):
            start = self.last.get(tuple(text[-n:]))
            if start is not None:
                period = len(text) - start
                return [text[start + i % period] for i in range(k)]
        return []


def trie(continuations) -> tuple[list[int], tuple[int, ...]]:
    """Merge token sequences into one tree below the root: shared prefixes become one path, so
    siblings carry distinct tokens and no node is verified twice. Returns (the nodes' tokens,
    their parents), in topological order.

    Example: (a, b, c), (a, b, d), (e, f, g) -> tokens [a, b, c, d, e, f, g],
    parents (-1, 0, 1, 1, -1, 4, 5):   root ─ a ─ b ─ c
                                            │       └ d
                                            └ e ─ f ─ g"""
    tokens, parents, node = [], [], {}
    for sequence in continuations:
        parent = -1
        for t in sequence:
            if (parent, t) not in node:
                node[parent, t] = len(tokens)
                tokens.append(t)
                parents.append(parent)
            parent = node[parent, t]
    return tokens, tuple(parents)
