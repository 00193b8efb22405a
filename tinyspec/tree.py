"""Token trees: which continuations to verify in one target pass, and everything derived from them.

A tree is a list of parent indices: `parents[i]` is the parent of node i, or -1 when node i is a
child of the root. The root is the last accepted token (its token is already chosen); the nodes
are guesses for the tokens after it, node i at depth d guessing the d-th next token. Nodes are
in topological order (a parent before its children), so every path from the root has
increasing node indices.

For verification the target reads the root and all T nodes as one sequence of T + 1 tokens.
Everything that pass needs is derived here, in one place, with the root as index 0 and node i
as index i + 1:

- `tree_mask` (T+1, T+1): token a may attend to token b iff b is a or one of its ancestors;
- `depth` (T+1,): 0 for the root; a token at depth d sits at position L + d (L = cache length);
- `paths` (leaves, max depth + 1): every root-to-leaf path of indices, padded with -1;
- `parent_index` (T,): the index of each node's parent among the T + 1 tokens.

Example: parents [-1, -1, 0, 0, 2] is the tree

    root ─ 0 ─ 2 ─ 4          tree_mask (rows attend to columns):
         │   └ 3                    r 0 1 2 3 4
         └ 1                    r   1 . . . . .
                                0   1 1 . . . .     depth = [0, 1, 1, 2, 2, 3]
    (indices into the T + 1     1   1 . 1 . . .     paths = [[0, 2, -1, -1],   leaf 1
     tokens: root = 0,          2   1 1 . 1 . .              [0, 1, 4, -1],    leaf 3
     node i = i + 1)            3   1 1 . . 1 .              [0, 1, 3, 5]]     leaf 4
                                4   1 1 . 1 . 1

A static tree is also a *choice list* (Cai et al. 2024): node i is described by the path of
candidate ranks that leads to it, e.g. (0, 1) = "the best guess at depth 1, then the
second-best guess at depth 2". `from_choices` turns such a list into parents and ranks;
`from_accuracies` builds the list itself from measured accuracies. Trees grown per step (EAGLE-2)
have no ranks: their tokens are chosen as the tree grows.
"""

from __future__ import annotations

import functools
import heapq
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

MAX_NODES = 127  # the most nodes a step verifies: every tree size stops here (Medusa's, EAGLE's, --tree's)


@dataclass(frozen=True)
class Tree:
    parents: tuple[int, ...]  # parents[i]: parent node of node i, -1 for a child of the root
    ranks: tuple[int, ...] | None = None  # ranks[i]: node i's token is the ranks[i]-th best guess at its depth
    tree_mask: torch.Tensor = field(init=False, repr=False, compare=False)
    depth: torch.Tensor = field(init=False, repr=False, compare=False)
    paths: torch.Tensor = field(init=False, repr=False, compare=False)
    parent_index: torch.Tensor = field(init=False, repr=False, compare=False)  # (T,) parents + 1
    # Python facts, so a decoding loop never reads a device tensor back to learn them
    max_depth: int = field(init=False, repr=False, compare=False)
    child_lists: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        check_parents(self.parents)
        if self.ranks is not None and (len(self.ranks) != len(self.parents) or any(r < 0 for r in self.ranks)):
            raise ValueError("ranks must give one non-negative rank per node")
        for i, at in enumerate(zip(self.parents, self.ranks or ())):  # two siblings would guess one token twice
            if at in zip(self.parents[:i], self.ranks[:i]):
                raise ValueError(f"node {i} repeats a sibling's (parent, rank) {at}: give each child of a node its own rank")
        depth = depths(self.parents)
        kids = [[] for _ in range(len(self.parents) + 1)]
        for i, p in enumerate(self.parents):
            kids[p + 1].append(i + 1)
        for name, value in (("tree_mask", tree_mask(self.parents)), ("depth", depth),
                            ("paths", root_to_leaf_paths(self.parents)),
                            ("parent_index", torch.tensor(self.parents) + 1), ("max_depth", int(depth.max())),
                            ("child_lists", tuple(map(tuple, kids)))):
            object.__setattr__(self, name, value)

    def __len__(self) -> int:
        return len(self.parents)

    def children(self, index: int) -> list[int]:
        """Indices (into the T + 1 tokens) of the children of token `index` (0 = root)."""
        return list(self.child_lists[index])

    def to(self, device) -> "Tree":
        """The same tree with its tensors on `device` (derived tensors are built on the CPU)."""
        moved = Tree(self.parents, self.ranks)
        for name in ("tree_mask", "depth", "paths", "parent_index"):
            object.__setattr__(moved, name, getattr(self, name).to(device))
        return moved


@functools.lru_cache(maxsize=None)
def chain(k: int) -> Tree:
    """The tree of a draft model's k proposals: each node the child of the one before."""
    return Tree(tuple(range(-1, k - 1)))


@functools.lru_cache(maxsize=1024)
def tree_on(parents: tuple[int, ...], device: torch.device) -> Tree:
    """The Tree of `parents`, its tensors on `device`, built once: a loop whose proposals take
    a few recurring shapes (prompt lookup's chains, lookahead's tries) would otherwise run the
    Python loops of building a Tree at every step."""
    return Tree(parents).to(device)


def check_parents(parents) -> None:
    if not parents:
        raise ValueError("a tree needs at least one node")
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: each parent must be -1 (the root) or an earlier node")


def depths(parents) -> torch.Tensor:
    """(T+1,) long: depth 0 for the root, then each node one deeper than its parent."""
    d = [0]
    for p in parents:
        d.append(d[p + 1] + 1)
    return torch.tensor(d)


def tree_mask(parents) -> torch.Tensor:
    """(T+1, T+1) bool: row a is True at a itself and at every ancestor of a, the root included
    (index 0 is the root, node i is index i + 1)."""
    n = len(parents) + 1
    mask = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):  # topological order: the parent's row is already complete
        mask[i + 1] |= mask[p + 1]
    return mask


def tree_tensors(parents: torch.Tensor, D: int):
    """(mask (T+1, T+1), depth (T+1,), parent (T+1,)) of a tree given as parent indices (T,) on the
    device (-1: a child of the root), at most D deep: D rounds of "a node sees itself and what its
    parent sees", the root its own parent: `tree_mask` and `depths` without a read-back, for a
    tree a recorded step grows on the device (they walk the nodes in Python instead)."""
    T = parents.shape[0]
    parent = torch.cat([parents.new_zeros(1), parents + 1])  # index among the T + 1 tokens
    eye = torch.eye(T + 1, dtype=torch.bool, device=parents.device)
    mask, depth = eye, torch.zeros(T + 1, dtype=torch.long, device=parents.device)
    not_root = torch.arange(T + 1, device=parents.device) > 0
    for _ in range(D):
        mask, depth = eye | mask[parent], torch.where(not_root, depth[parent] + 1, 0)
    return mask, depth, parent


def root_to_leaf_paths(parents) -> torch.Tensor:
    """(leaves, max depth + 1) long: one root-to-leaf path of indices per leaf, leaves in node
    order, each path padded with -1 to the longest."""
    has_child = {p for p in parents}
    leaves = [i for i in range(len(parents)) if i not in has_child]
    paths = []
    for leaf in leaves:
        path, node = [], leaf
        while node != -1:
            path.append(node + 1)
            node = parents[node]
        paths.append([0] + path[::-1])
    width = max(map(len, paths))
    return torch.tensor([p + [-1] * (width - len(p)) for p in paths])


def from_choices(choices) -> Tree:
    """A tree from a Medusa choice list: each choice is the tuple of ranks along a node's path
    from the root. Every proper prefix of a choice must be a choice too."""
    choices = sorted({tuple(c) for c in choices}, key=lambda c: (len(c), c))  # parents first
    index = {c: i for i, c in enumerate(choices)}
    parents = []
    for c in choices:
        if not c:
            raise ValueError("the empty choice is the root; list only the nodes below it")
        if len(c) > 1 and c[:-1] not in index:
            raise ValueError(f"choice {list(c)} has no parent {list(c[:-1])} in the list")
        parents.append(index[c[:-1]] if len(c) > 1 else -1)
    return Tree(tuple(parents), tuple(c[-1] for c in choices))


def choices_of(tree: Tree) -> list[tuple[int, ...]]:
    """The inverse of `from_choices`: each node's path of ranks."""
    out = []
    for p, r in zip(tree.parents, tree.ranks):
        out.append((out[p] if p >= 0 else ()) + (r,))
    return out


def from_accuracies(accuracy: torch.Tensor, budget: int) -> Tree:
    """The tree of `budget` nodes with the largest expected number of accepted tokens.

    accuracy[d, r]: how often head d + 1's r-th best guess is the right token (measured on
    held-out data). If heads are right independently, a node is accepted with probability
    prod over its path of accuracy[depth - 1, rank], and the expected accepted length is the sum
    of that over all nodes. A child is never more likely than its parent, so adding the most
    likely node that is not yet in the tree, one at a time, gives the best tree for every
    budget (Cai et al. 2024 build Medusa's optimised trees the same way)."""
    heads, top = accuracy.shape
    frontier = [(-float(accuracy[0, r]), (r,)) for r in range(top)]  # max-heap of candidate nodes
    heapq.heapify(frontier)
    chosen = []
    while frontier and len(chosen) < budget:
        neg_prob, choice = heapq.heappop(frontier)
        chosen.append(choice)
        if len(choice) < heads:  # its children become candidates
            for r in range(top):
                heapq.heappush(frontier, (neg_prob * float(accuracy[len(choice), r]), choice + (r,)))
    return from_choices(chosen)


def expected_accepted(tree: Tree, accuracy: torch.Tensor) -> float:
    """Expected accepted nodes per step under the independence model of `from_accuracies`."""
    prob = []
    for p, r, d in zip(tree.parents, tree.ranks, tree.depth[1:].tolist()):
        prob.append((prob[p] if p >= 0 else 1.0) * float(accuracy[d - 1, r]))
    return sum(prob)


def sibling_ranks(parents) -> tuple[int, ...]:
    """Ranks for a tree given by parents alone: each node's siblings before it, so the children of
    a node guess 0, 1, 2, ... (siblings that guessed one token twice would waste a node)."""
    seen: dict[int, int] = {}
    ranks = []
    for p in parents:
        ranks.append(seen.get(p, 0))
        seen[p] = ranks[-1] + 1
    return tuple(ranks)


def save_tree(tree: Tree, path: str | Path) -> None:
    Path(path).write_text(json.dumps({"choices": [list(c) for c in choices_of(tree)]}) + "\n")


def load_tree(path: str | Path) -> Tree:
    """A tree from JSON: {"choices": [[0], [1], [0, 0], ...]} or {"parents": [...], "ranks": [...]}
    (without ranks, a node's children rank 0, 1, 2, ...: `sibling_ranks`), of at most MAX_NODES
    nodes, as a size's tree is."""
    try:
        spec = json.loads(Path(path).read_text())
        if "choices" in spec:
            tree = from_choices(spec["choices"])
        else:
            parents = tuple(spec["parents"])
            tree = Tree(parents, tuple(spec["ranks"]) if "ranks" in spec else sibling_ranks(parents))
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read tree {path}: {e}; expected {{\"choices\": [[0], [1], [0, 0], ...]}}") from None
    if len(tree) > MAX_NODES:
        raise ValueError(f"the tree {path} has {len(tree)} nodes; a tree has at most {MAX_NODES}, as sizes do: "
                         "use a smaller one")
    return tree
