"""Tree derivations on hand-drawn trees, written out by hand."""
import pytest
import torch

from tinyspec.tree import Tree, choices_of, expected_accepted, from_accuracies, from_choices, load_tree, save_tree

# The tree of tree.py's docstring:   root ─ 0 ─ 2 ─ 4
#                                         │   └ 3
#                                         └ 1
PARENTS = (-1, -1, 0, 0, 2)


def test_hand_drawn_tree():
    t = Tree(PARENTS, (0, 1, 0, 1, 0))
    #                     r  0  1  2  3  4      (indices: root 0, node i -> i + 1)
    expected_mask = [[1, 0, 0, 0, 0, 0],  # root sees itself
                     [1, 1, 0, 0, 0, 0],  # 0: root, 0
                     [1, 0, 1, 0, 0, 0],  # 1: root, 1
                     [1, 1, 0, 1, 0, 0],  # 2: root, 0, 2
                     [1, 1, 0, 0, 1, 0],  # 3: root, 0, 3
                     [1, 1, 0, 1, 0, 1]]  # 4: root, 0, 2, 4
    assert t.tree_mask.int().tolist() == expected_mask
    assert t.depth.tolist() == [0, 1, 1, 2, 2, 3]  # positions are L + depth
    assert t.paths.tolist() == [[0, 2, -1, -1], [0, 1, 4, -1], [0, 1, 3, 5]]  # leaves 1, 3, 4
    assert t.parent_index.tolist() == [0, 0, 1, 1, 3]
    assert t.children(0) == [1, 2] and t.children(1) == [3, 4] and t.children(5) == []


def test_chain_and_star():
    chain = Tree((-1, 0, 1), (0, 0, 0))
    assert chain.tree_mask.int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert chain.depth.tolist() == [0, 1, 2, 3] and chain.paths.tolist() == [[0, 1, 2, 3]]
    star = Tree((-1, -1, -1), (0, 1, 2))
    assert star.tree_mask.int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]]
    assert star.depth.tolist() == [0, 1, 1, 1] and star.paths.tolist() == [[0, 1], [0, 2], [0, 3]]


def test_choice_lists_round_trip():
    choices = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
    t = from_choices(list(reversed(choices)))  # any order in, topological order out
    assert t.parents == (-1, -1, 0, 0, 2) and t.ranks == (0, 1, 0, 1, 0)
    assert choices_of(t) == choices
    with pytest.raises(ValueError, match="no parent"):
        from_choices([(0,), (1, 0)])


def test_tree_from_accuracies_takes_the_most_likely_nodes():
    acc = torch.tensor([[0.6, 0.2], [0.5, 0.1]])  # head 1: ranks 0, 1; head 2: ranks 0, 1
    # node probabilities: (0) .6, (1) .2, (0,0) .3, (0,1) .06, (1,0) .1, (1,1) .02
    assert choices_of(from_accuracies(acc, 1)) == [(0,)]
    assert choices_of(from_accuracies(acc, 3)) == [(0,), (1,), (0, 0)]
    t = from_accuracies(acc, 4)
    assert choices_of(t) == [(0,), (1,), (0, 0), (1, 0)]
    assert expected_accepted(t, acc) == pytest.approx(0.6 + 0.2 + 0.3 + 0.1)


def test_greedy_tree_is_optimal_against_brute_force():
    """Every connected tree of 4 nodes over 2 heads x 3 ranks: none beats the greedy one."""
    import itertools
    acc = torch.tensor([[0.5, 0.2, 0.1], [0.6, 0.3, 0.05]])
    nodes = [(a,) for a in range(3)] + [(a, b) for a in range(3) for b in range(3)]
    best = max(expected_accepted(from_choices(c), acc) for c in itertools.combinations(nodes, 4)
               if all(len(n) == 1 or n[:1] in c for n in c))
    assert expected_accepted(from_accuracies(acc, 4), acc) == pytest.approx(best)


def test_bad_trees_and_files(tmp_path):
    with pytest.raises(ValueError):
        Tree((0,), (0,))  # a node cannot be its own parent
    with pytest.raises(ValueError):
        Tree((), ())
    t = Tree(PARENTS, (0, 1, 0, 1, 0))
    save_tree(t, tmp_path / "t.json")
    assert load_tree(tmp_path / "t.json") == t
    (tmp_path / "parents.json").write_text('{"parents": [-1, -1, 0, 1, -1]}')  # no ranks: siblings 0, 1, 2, ...
    assert load_tree(tmp_path / "parents.json").ranks == (0, 1, 0, 0, 2)
    with pytest.raises(ValueError, match=r"node 3 repeats a sibling's \(parent, rank\) \(0, 1\)") as e:
        Tree(PARENTS, (0, 1, 0, 1, 0)[:2] + (1, 1, 0))  # nodes 2 and 3, both children of node 0, rank 1
    assert "\n" not in str(e.value)
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ValueError, match="choices"):
        load_tree(tmp_path / "bad.json")
