"""Block verification's correction, held on tables where it matters. After accepting x_1..x_tau
(tau < k) the next token comes from norm(max(0, p_tau p(. | X^tau) - q(. | X^tau))): the target
weighed by p_tau, less the draft's distribution one position on. Two one-line slips there, the
weight p_tau left out or q taken at tau instead of tau + 1, move the chain tables of
test_verify.py by 0.002 and 0.03 in total variation: too little for their 6,000 samples. The
tables below were searched for (by enumerating the draft's choices and tau's probabilities
h_tau prod_{j > tau} (1 - h_j) exactly) to move the output as far as the subtler slip can: by 1/12
without the weight (about the most any table with V <= 4 and k <= 3 allows, 0.09); by 1/8 with q at tau
(3/16 in the recorded form, whose bonus token subtracts a row of zeros that the slip shifts too).
Both forms of the rule run here, the readable `verify.block` and the recorded step's loop-free one."""
import math
import sys

import pytest
import torch

from tinyspec import verify
from tinyspec.verify import fixed_block

from test_verify import mutant


# V = 3 tokens, chains of k = 2. The draft always proposes token 2, which the target writes half
# the time (p_1 = 1/2). After it the target writes 0 or 1 evenly, and the draft proposes 1 (1/4)
# or 2 (3/4), a token the target never writes there. When it proposes 2, tau is 1 with
# h_1 = S_1 / (S_1 + 1 - p_1) = (1/4) / (1/4 + 1/2) = 1/3, and the correction is
# max(0, 1/2 (1/2, 1/2, 0) - (0, 1/4, 3/4)) = (1/4, 0, 0): token 0. Without the weight it is
# (1/2, 1/4, 0), token 1 a third of the time: 3/4 * 1/3 * 1/3 = 1/12 of the mass moves. With q at
# tau, (0, 0, 1), tokens 0 and 1 come evenly: 3/4 * 1/3 * 1/2 = 1/8 moves (and where the bonus
# after (2, 1) subtracts a row, the recorded form's, it subtracts q(. | 2): 1/16 more, net).
K, V = 2, 3
TARGET = {(): (1 / 4, 1 / 4, 1 / 2), (2,): (1 / 2, 1 / 2, 0), (2, 1): (0, 1 / 2, 1 / 2)}  # p(. | context)
DRAFT = {(): (0, 0, 1), (2,): (0, 1 / 4, 3 / 4)}  # q(. | context): the only contexts the draft meets
ELSE = (1, 0, 0)  # the target's distribution after any other context: token 0


def p(context) -> torch.Tensor:
    return torch.tensor(TARGET.get(tuple(context), ELSE), dtype=torch.float64)


def q(context) -> torch.Tensor:
    return torch.tensor(DRAFT[tuple(context)], dtype=torch.float64)


def target_joint() -> torch.Tensor:
    """The target's own distribution of its first K + 1 tokens, which a correct rule reproduces."""
    joint = torch.ones(1, dtype=torch.float64)
    for d in range(K + 1):
        rows = torch.stack([p(tokens_of(i, d)) for i in range(V ** d)])  # (V^d, V)
        joint = (joint[:, None] * rows).flatten()
    return joint


def tokens_of(index: int, d: int) -> list[int]:
    """The d tokens whose base-V number is `index`, the first the most significant."""
    return [index // V ** (d - 1 - i) % V for i in range(d)]


def readable(rule):
    """`verify.block` (or a mutant of it) as (tokens, p, q, generator) -> (accepted, next token)."""
    def judge(tokens, p_rows, q_rows, generator):
        path, token = rule(tokens, p_rows, verify.chain(K), q_rows, generator)
        return len(path) - 1, int(token)
    return judge


def recorded(rule):
    """The loop-free block rule (or a mutant), fed K + 1 uniform numbers per chain."""
    def judge(tokens, p_rows, q_rows, generator):
        u = torch.rand(K + 1, generator=generator, dtype=torch.float64)
        _, n, token, _ = rule(tokens, p_rows, q_rows, None, u, K)
        return int(n) - 1, int(token)
    return judge


def output_counts(judge, n: int, seed: int = 0) -> torch.Tensor:
    """Counts of the first K + 1 tokens over n chains: x_1..x_K drawn from the draft, judged, and
    whatever the step did not write drawn from the target. q's rows follow the loop's layout: node
    i's row is the distribution node i was drawn from, the root's a copy of node 1's."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V ** (K + 1))
    for _ in range(n):
        x = []
        for i in range(K):
            x.append(int(torch.multinomial(q(x), 1, generator=g)))
        p_rows = torch.stack([p(x[:i]) for i in range(K + 1)])
        q_rows = torch.stack([q([])] + [q(x[:i]) for i in range(K)])
        accepted, token = judge(torch.tensor([0] + x), p_rows, q_rows, g)
        out = x[:accepted] + [token]
        while len(out) < K + 1:
            out.append(int(torch.multinomial(p(out), 1, generator=g)))
        counts[sum(t * V ** (K - i) for i, t in enumerate(out))] += 1
    return counts


def total_variation(counts: torch.Tensor, exact: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - exact).abs().sum())


# Whatever the rule, its output falls on the M = 5 outcomes the tables allow, so a sample's total
# variation from the distribution it was drawn from has a mean of at most 0.5 sqrt((M - 1) / N)
# (Cauchy-Schwarz), 0.01 here; one chain moves it by at most 1 / N, so it exceeds that mean by e
# with probability at most exp(-2 N e^2) (McDiarmid). A correct rule passes THRESHOLD, 0.032 and
# 4.5 of the statistic's at most 1 / sqrt(2 N) standard deviations above the mean, with
# probability 2e-9; a slip moves the exact distribution by 1/12 or more, twice THRESHOLD, and its
# sample falls below THRESHOLD as rarely.
N = 10_000
THRESHOLD = 1 / 24


def test_the_tables_bound_the_noise_below_the_threshold():
    """The argument above, computed: the mean plus a deviation reached with probability 1e-8 stays
    below THRESHOLD, and THRESHOLD below the smaller slip's 1/12 by as much."""
    J = target_joint()
    M = int((J > 0).sum())
    assert float(J.sum()) == pytest.approx(1.0) and M == 5
    noise = 0.5 * math.sqrt((M - 1) / N) + math.sqrt(math.log(1e8) / (2 * N))
    assert noise < THRESHOLD < 1 / 12 - noise


def test_block_has_the_target_distribution_where_the_correction_is_weighed():
    tv = total_variation(output_counts(readable(verify.block), N), target_joint())
    assert tv < THRESHOLD, f"total variation {tv:.4f} from the target's own distribution"


def test_the_recorded_block_has_the_target_distribution_where_the_correction_is_weighed():
    tv = total_variation(output_counts(recorded(fixed_block), N), target_joint())
    assert tv < THRESHOLD, f"total variation {tv:.4f} from the target's own distribution"


SLIPS = [  # (form, old, new): the correction without its weight p_tau, or q one position early
    ("readable", "residual(p_tau * p[tau], q[tau + 1])", "residual(p[tau], q[tau + 1])"),
    ("readable", "residual(p_tau * p[tau], q[tau + 1])", "residual(p_tau * p[tau], q[tau])"),
    ("recorded", "residual(weight[:, None] * p[tau], q_after)", "residual(p[tau], q_after)"),
    ("recorded", "torch.zeros_like(q[:1])])[tau + 1]", "torch.zeros_like(q[:1])])[tau]"),
]


@pytest.mark.slow
@pytest.mark.parametrize("form, old, new", SLIPS, ids=["no-weight", "q-at-tau", "recorded-no-weight", "recorded-q-at-tau"])
def test_a_slip_in_the_correction_is_caught(form, old, new):
    if form == "readable":
        judge = readable(mutant(verify, "block", old, new))
    else:
        judge = recorded(mutant(sys.modules[fixed_block.__module__], fixed_block.__name__, old, new))
    tv = total_variation(output_counts(judge, N), target_joint())
    assert tv > THRESHOLD, f"total variation {tv:.4f}: the slip went unnoticed"
