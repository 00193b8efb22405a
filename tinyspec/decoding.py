"""Decoding: plain decoding, and the ONE step loop that every speculative method runs, for one
sequence or for several at once (rows of a batch).

Every method is the same loop. A step of it:

1. choose the step's size (a draft's k, a tree's nodes, ...): the fixed one, or a policy's
   choice (`speed/policy.py`); no size is a plain step. This is the only place a size is chosen;
2. propose: the method's `Proposer` gives each row a tree of tokens below its root (the last
   token chosen, not yet in the cache), or nothing (a plain step for that row);
3. verify: ONE target forward over every row's root and tree, each node at position L + depth,
   seeing only its ancestors (`Tree.tree_mask`);
4. accept: each row's rule (`verify.py`) keeps a path of the tree and gives the target's own next
   token; the row's cache keeps the root and that path, compacted (`KVCache.keep`);
5. the proposer updates what it keeps between steps (a draft's cache, EAGLE's features, a
   lookup's index); rows that are done leave; what each row got is yielded.

Plain decoding is the loop with a proposer that proposes nothing: every step is step 3 over the
root alone. A speculative method's plain steps are exactly those steps, so a method never pays
for machinery it did not use in a step.

The batch is a dimension, as in gpt-fast: several rows share each forward, and each row is judged
alone, by the very rule it would meet alone, on its own slice of the logits, its own row of the
cache and its own random generator, so a row's output does not depend on the rows beside it
(greedy: token for token; sampled: exactly the target's distribution).

The loop yields {row id: Step} for the rows that took part in a forward, and is sent the ids of
the rows that are done; `results.py` drives it (`run_batch` for every row, `run` for one) and
counts what each row got.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Generator

import torch

from .kvcache import KVCache
from .model import GPT, causal_mask, prefix_mask
from .sampling import Sampling, sample
from .tree import Tree
from .verify import CHAIN_ONLY, RULES, SAMPLED

# Where each produced token came from (Step.sources):
TARGET = "target"  # chosen by the target itself (plain decoding)
ACCEPTED = "accepted"  # proposed (by a draft model, heads, a lookup) and accepted by the target
CORRECTION = "correction"  # sampled by the target after it rejected a proposal
BONUS = "bonus"  # sampled by the target after it accepted every proposal on its path
PLAIN = "0"  # the size of a plain step


@dataclass
class Step:
    """What one target forward produced for a row: tokens, where each came from, how many tokens
    the proposal could add (0 for a plain step, k for a chain, a tree's depth: accepted / proposed
    is the fraction of proposed positions filled), the size the step verified, and how many
    tokens the row fed the forward (1 for a plain step: the root; a step's cost grows with it)."""
    tokens: list[int]
    sources: list[str]
    proposed: int = 0
    size: str = PLAIN
    fed: int = 1


Produced = dict[int, Step]  # what one forward gave each row that took part, by row id
Steps = Generator[Produced, list[int] | None, None]  # yields Produced; is sent the ids of the rows that are done


@dataclass
class Row:
    """One sequence of a batch: which prompt it is, its text, its own random generator (so it draws
    the numbers it would draw alone), and whatever its method carries from step to step."""
    id: int
    text: list[int]  # the prompt and every token chosen since; the last, the root, is not in the cache yet
    generator: torch.Generator | None
    root: torch.Tensor | None = None  # text[-1], on the device
    state: object = None  # the proposer's (EAGLE's pending features, a lookup's index, ...)


@dataclass
class Proposal:
    """What a proposer offers one row for one step: the T tokens of a tree below the row's root,
    and q (T+1, V), the distribution each node was drawn from (row a: node a's; row 0 unused), for
    the rules that need it; None for tokens that were chosen, not drawn.

    fed: for a method that feeds more than the root and the tree in the same forward (lookahead's
    window): (x (n,), mask (n, n), offsets (n,), at (T+1,)), where at[0] is the root's index in x
    and at[1:] the nodes'. tree None (no tokens to judge): the row's next token is taken as plain
    decoding takes it, from the target's distribution after the root."""
    tokens: torch.Tensor
    tree: Tree | None
    q: torch.Tensor | None = None
    fed: tuple | None = None


@dataclass
class Verified:
    """A row's step once verified: the Step, the target's hidden states of every token fed
    (n, C), and `kept`, the indices (into what was fed) of the root and of the accepted tokens."""
    step: Step
    hidden: torch.Tensor
    kept: torch.Tensor


@dataclass(frozen=True)
class Weights:
    """What a method loads besides the target: the flag that names the file, the shipped file's
    name in weights/, the class whose `load(path, device, dtype)` reads it, a noun for messages,
    the command that trains it, and how the names of its tensors begin (so that a file of
    another kind, given to the wrong flag, is told apart)."""
    flag: str
    file: str
    kind: type
    noun: str
    train: str
    holds: str


@dataclass(frozen=True)
class Setting:
    """A setting of a method that is not its size, as a command-line flag: its default (written
    here once), its type, its range and its help."""
    default: object
    type: type
    help: str
    low: int | None = None
    high: int | None = None


# the setting of every method that proposes a tree (Medusa, EAGLE): a fixed shape instead of its size's
STATIC_TREE = Setting(None, str, "a static tree, a JSON file {\"choices\": [[0], [1], [0, 0], ...]} "
                      "(Cai et al.'s choice list), instead of the size's tree")


class Proposer:
    """A decoding method, as the loop and the commands see it. This base proposes nothing: it is
    plain decoding. A method is a subclass in a file of its own under `methods/`, which says:

    - name, summary (one line for every command's help), and `proposes`: "nothing", "a sampled
      chain", "a tree" or "fixed tokens", which decides the acceptance rules exact for it
      (`methods.check_rule`);
    - weights: what it loads besides the target (a `Weights`), and settings: its other flags;
    - its sizes: `default_size` (what it runs at when named), `sizes` (what `--size auto`
      measures on the device), `shape(size)` (a size as the method reads it: a k, a Tree, ...),
      `room(shape)` (the most tokens a step of that shape feeds beyond the root);
    - `start` (a batch's rows begin, with the target's hidden states of each prompt), `propose`
      (a `Proposal` or None per row) and `update` (what it keeps, once the target has judged).
    `caches` are KVCaches with a row per live row; the loop narrows them as rows leave."""
    name = "ar"
    chapter = 4  # of the walkthrough, which orders the methods in every command's help
    summary = "plain autoregressive decoding"
    proposes = "nothing"
    weights: Weights | None = None
    settings: dict[str, Setting] = {}
    reduced_vocab = False  # proposes through an LM head that --draft-vocab may shrink
    default_size: str | None = None
    sizes: tuple[str, ...] = ()
    size_help = ""
    n_ctx: int | None = None  # a context limit of the proposer's own (a draft model's), if any
    caches: tuple[KVCache, ...] = ()

    def shape(self, size: str):
        raise ValueError(f"{self.name} has no sizes")

    def room(self, shape) -> int:
        return 0

    def rule(self, name: str):
        """The acceptance rule `name` for this method's proposals (`verify.RULES`)."""
        return RULES[name]

    def identity(self) -> dict:
        """What the method's measured costs and acceptance depend on beyond its weights (modules)
        and settings: a datastore's size, say (`speed/sizing.py` keys its cache by it)."""
        return {}

    def start(self, rows: list[Row], hidden: list[torch.Tensor], slots: int) -> None:
        """New rows (a new batch of prompts): hidden[b] (P_b, C) are the target's hidden states of
        row b's prompt; slots: the cache slots a row may use (its context plus one step's room)."""

    def propose(self, rows: list[Row], shape, room: list[int], sampling: Sampling, sampled: bool) -> list:
        """Each row's Proposal for a step of `shape`, or None; room[b]: the deepest position
        offset row b may feed (the context's end). sampled: the rule needs nodes drawn from q."""
        return [None] * len(rows)

    def update(self, rows: list[Row], proposals: list, verified: list[Verified]) -> None:
        """After the target judged: row b's text already holds what it accepted (verified[b].step)."""


class Clock:
    """Where the loop's time goes, by part (`speed/ledger.py` keeps one); this one keeps nothing."""

    def part(self, name: str):
        return NOTHING


NOTHING = contextlib.nullcontext()  # one, reused: a plain step should not pay for a clock nobody reads

NO_CLOCK = Clock()


# ---- the parts of a step ----------------------------------------------------------------------

def leave(rows: list[Row], done, caches, max_len: int) -> list[Row]:
    """The rows that go on: not done, and with room left in the context (the target's cache,
    caches[0], below max_len); every cache keeps just theirs."""
    done = done or ()
    go_on = [b for b, r in enumerate(rows) if r.id not in done and caches[0].lengths[b] < max_len]
    if len(go_on) < len(rows):
        for cache in caches:
            cache.select(go_on)
    return [rows[b] for b in go_on]


def feed(model: GPT, cache: KVCache, inputs: list[torch.Tensor], masks: list | None = None,
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


def last(h: list[torch.Tensor]) -> torch.Tensor:
    """(B, C): each row's hidden state at its last fed token."""
    return torch.stack([x[-1] for x in h])


def sample_rows(p: torch.Tensor, rows: list[Row], sampling: Sampling) -> list[torch.Tensor]:
    """One token per row from p (B, V), each drawn with the row's own generator. Greedy (p one-hot):
    every row's argmax at once, which is what `sample` would return."""
    if sampling.temperature == 0:
        return list(p.argmax(-1))
    return [sample(p[b], r.generator) for b, r in enumerate(rows)]


def prefill(target: GPT, cache: KVCache, rows: list[Row], sampling: Sampling) -> list[torch.Tensor]:
    """The prompts enter the cache, and each row's first token (plain decoding) becomes its root.
    Returns each row's hidden states of its prompt [(P_b, C)]."""
    device = target.lm_head.weight.device
    h = feed(target, cache, [torch.tensor(r.text, device=device) for r in rows])
    for r, root in zip(rows, sample_rows(sampling.probs(target.lm_head(last(h))), rows, sampling)):
        r.root = root
        r.text.append(int(root))
    return h


def layout(root: torch.Tensor, proposal: Proposal | None):
    """What a row feeds: (x (n,), mask (n, n) or None for a lone token, offsets (n,), at (T+1,) or
    None when x is the root and the tree's nodes in order)."""
    if proposal is None:
        return root.view(1), None, None, None
    if proposal.fed is not None:
        return proposal.fed
    return torch.cat([root.view(1), proposal.tokens]), proposal.tree.tree_mask, proposal.tree.depth, None


def verify(target: GPT, cache: KVCache, rows: list[Row], proposals: list, rule, sampling: Sampling, size: str,
           clock: Clock = NO_CLOCK) -> list[Verified]:
    """Steps 3-4 for every row at once: ONE target forward over each row's root and proposal, then
    each row's rule and cache compaction. A row without a proposal takes a plain step: its token
    comes from the target's distribution after its root, as plain decoding takes it (all such rows
    in one draw). Sets each row's next root."""
    if all(prop is None for prop in proposals):  # every row a plain step: plain decoding's step, nothing more
        with clock.part("target"):
            h = feed(target, cache, [r.root.view(1) for r in rows])
            tokens = sample_rows(sampling.probs(target.lm_head(last(h))), rows, sampling)
        kept = torch.zeros(1, dtype=torch.long, device=h[0].device)
        for r, token in zip(rows, tokens):
            r.root = token
        return [Verified(Step([int(token)], [TARGET]), x, kept) for x, token in zip(h, tokens)]
    before = list(cache.lengths)
    fed = [layout(r.root, prop) for r, prop in zip(rows, proposals)]
    with clock.part("target"):
        h = feed(target, cache, [f[0] for f in fed], [f[1] for f in fed], [f[2] for f in fed])
        wanted = [x if f[3] is None else x[f[3]] for x, f in zip(h, fed)]  # the root's and the nodes' only
        judged = target.lm_head(torch.cat(wanted)).split([len(x) for x in wanted])  # one LM-head product
    out: list[Verified | None] = [None] * len(rows)
    plain = [b for b, prop in enumerate(proposals) if prop is None or prop.tree is None]
    if plain:  # the plain steps' tokens all at once, as plain decoding takes them
        tokens = sample_rows(sampling.probs(torch.stack([judged[b][0] for b in plain])), [rows[b] for b in plain],
                             sampling)
        for b, token in zip(plain, tokens):
            rows[b].root = token
            if len(fed[b][0]) > 1:  # it fed more than its root (lookahead's window): the cache keeps the root
                with clock.part("cache"):
                    cache.truncate(before[b] + 1, b)
            out[b] = Verified(Step([int(token)], [TARGET], size=PLAIN if proposals[b] is None else size,
                                   fed=len(fed[b][0])), h[b], torch.zeros(1, dtype=torch.long, device=h[b].device))
    for b, (r, prop) in enumerate(zip(rows, proposals)):
        if out[b] is not None:
            continue
        x, at = fed[b][0], fed[b][3]
        with clock.part("rule"):
            path, r.root = rule(x if at is None else x[at], sampling.probs(judged[b]), prop.tree, prop.q, r.generator)
        kept = path if at is None else at[path]
        with clock.part("cache"):
            cache.keep((before[b] + kept).tolist(), b)  # the root (slot L) and the accepted nodes, compacted
        accepted = x[kept[1:]].tolist()
        kind = CORRECTION if prop.tree.children(int(path[-1])) else BONUS
        out[b] = Verified(Step(accepted + [int(r.root)], [ACCEPTED] * len(accepted) + [kind], prop.tree.max_depth, size,
                               len(x)), h[b], kept)
    return out


# ---- THE loop ---------------------------------------------------------------------------------

@torch.no_grad()
def decode(target: GPT, proposer: Proposer, prompts: list[list[int]], sampling: Sampling, generators: list,
           shapes: dict | None = None, policy=None, rule: str = "greedy", cache: KVCache | None = None,
           clock: Clock = NO_CLOCK) -> Steps:
    """Decode every row (prompt i is row i, sampling with generators[i]) with `proposer`; yields
    what each target forward gave each row.

    shapes: {size: shape} the steps may take: without a policy, the one entry is every step's
    size (none: plain decoding); policy: chooses a size of `shapes` (or a plain step) every step
    and hears what was accepted (`speed/policy.py`). rule: the acceptance rule's name
    (`verify.RULES`, as the proposer reads it: `Proposer.rule`). cache: the target's, reused if given (emptied first), with room for
    the context and one step. clock: times the parts of each step (`speed/ledger.py`). (The same
    step written for the device, recorded once as a CUDA graph: `kernels/step.py`.)"""
    shapes = shapes or {}
    fixed = next(iter(shapes), None) if policy is None else None
    n_ctx = min(target.config.n_ctx, proposer.n_ctx or target.config.n_ctx)
    slots = n_ctx + max((proposer.room(s) for s in shapes.values()), default=0) + 1
    if cache is None:  # a prompt may be as long as the target's context, where the proposer's is shorter
        cache = KVCache.for_model(target, slots + target.config.n_ctx - n_ctx, len(prompts))
    cache.reset(len(prompts))
    rows = [Row(i, list(p), g) for i, (p, g) in enumerate(zip(prompts, generators))]
    hidden = prefill(target, cache, rows, sampling)
    if shapes:  # (a loop that never proposes never starts its proposer: plain decoding pays for nothing more)
        with clock.part("propose"):
            proposer.start(rows, hidden, slots)
    accept, sampled = proposer.rule(rule), rule in SAMPLED  # sampled: the rule needs nodes drawn from q
    done = yield {r.id: Step([int(r.root)], [TARGET]) for r in rows}
    while rows := leave(rows, done, (cache, *proposer.caches), n_ctx):
        size = policy.choose(len(rows)) if policy is not None else fixed  # 1. the only place a size is chosen
        proposals = [None] * len(rows)
        if size is not None:  # 2. propose, each row within its own room (positions up to the context's end)
            with clock.part("propose"):
                proposals = proposer.propose(rows, shapes[size], [n_ctx - 1 - L for L in cache.lengths], sampling,
                                             sampled)
        verified = verify(target, cache, rows, proposals, accept, sampling, size, clock)  # 3-4
        for r, v in zip(rows, verified):
            r.text += v.step.tokens
        if shapes:  # 5. what the proposer keeps between steps (a plain step's tokens too: its index, its features)
            with clock.part("propose"):
                proposer.update(rows, proposals, verified)
        if policy is not None:  # what every row that proposed accepted; the policy keeps its own clock
            policy.update([len(v.step.tokens) - 1 for v, prop in zip(verified, proposals) if prop is not None], size,
                          len(rows))
        done = yield {r.id: v.step for r, v in zip(rows, verified)}


def autoregressive(target: GPT, prompts: list[list[int]], sampling: Sampling, generators: list,
                   cache: KVCache | None = None) -> Steps:
    """Plain decoding: one target forward per token, for every row at once; the baseline every
    speedup is against. The loop with a proposer that proposes nothing."""
    return decode(target, Proposer(), prompts, sampling, generators, cache=cache)


# ---- a method ready for prompt after prompt ------------------------------------------------------

def rule_problem(proposer: Proposer | type[Proposer], rule: str | None, temperature: float) -> str | None:
    """The one-line reason `rule` cannot judge the proposer's proposals at `temperature` and keep
    the output the target's own, or None if it can. Exact are: every rule at T = 0 (the greedy
    rule is then used: every exact rule's text is the argmax's, and greedy accepts the most), and
    at T > 0 every rule the proposals suit: the rules of `verify.SAMPLED` need nodes drawn from a
    q, block judges a chain; `typical` is the one rule allowed that is not exact (documented as
    lossy). The greedy rule at T > 0 is refused: its verified steps take the argmax while the
    first token and every plain step are sampled, so the text is neither sampling nor greedy."""
    if rule is None:
        return None
    if proposer.proposes == "nothing":
        return f"plain decoding proposes nothing: no acceptance rule applies"
    if proposer.proposes == "fixed tokens" and rule in SAMPLED:
        return f"the {rule} rule needs proposals sampled from a draft; {proposer.name} proposes fixed tokens: use pointmass"
    if proposer.proposes != "a sampled chain" and rule in CHAIN_ONLY:
        return f"the {rule} rule verifies a chain (the draft method), not a tree"
    if rule == "greedy" and temperature > 0:
        return f"the greedy rule at temperature {temperature:g} is neither sampling nor greedy decoding"
    return None


def default_rule(proposer: Proposer, rule: str | None, temperature: float) -> str:
    """The rule a run uses: greedy at temperature 0 whatever was asked (every exact rule's text is
    then the argmax's, and greedy accepts the most), else `rule`, or by default lossless, or
    pointmass for fixed tokens, which were not drawn from a q (verify.py)."""
    if temperature == 0:
        return "greedy"
    return rule or ("pointmass" if proposer.proposes == "fixed tokens" else "lossless")


class Decoder:
    """A method over loaded models, ready for prompt after prompt: `batch_steps(prompts, ...)` is
    its loop for several prompts at once (`decode`), `steps(prompt, ...)` for one.

    proposer: the method (default: plain decoding); size: the size every step takes (default:
    the method's default size), or policy: a `speed/policy.Policy` that chooses each step's size,
    or a plain step, from the sizes it knows; rule: the acceptance rule's name (default: see
    `default_rule`). The target's cache at batch 1 is made once, here, and every prompt reuses it;
    a batch makes its own. (`kernels/step.Recorded` runs a method at one size the same way, its
    whole step recorded as one CUDA graph.)"""

    def __init__(self, target: GPT, proposer: Proposer | None = None, size: str | None = None, policy=None,
                 rule: str | None = None):
        self.target, self.proposer, self.policy, self.rule = target, proposer or Proposer(), policy, rule
        if policy is not None:
            self.shapes = {s: self.proposer.shape(s) for s in policy.promise}
        else:
            size = size or self.proposer.default_size
            self.shapes = {size: self.proposer.shape(size)} if size else {}
        self.size = None if policy is not None else next(iter(self.shapes), None)
        room = max((self.proposer.room(s) for s in self.shapes.values()), default=0)
        self.cache = KVCache.for_model(target, target.config.n_ctx + room + 1)
        self.clock = NO_CLOCK

    def steps(self, prompt: list[int], sampling: Sampling, generator) -> Steps:
        """The loop for one prompt (drive it with `results.run`)."""
        return self.batch_steps([prompt], sampling, [generator])

    def batch_steps(self, prompts: list[list[int]], sampling: Sampling, generators: list) -> Steps:
        """The loop for these prompts, prompt i row i, generators[i] its own (drive it with
        `results.run_batch`). Batch 1 reuses the cache made here."""
        problem = rule_problem(self.proposer, self.rule, sampling.temperature)
        if problem:
            raise ValueError(problem)
        proposer, shapes, policy = self.proposer, self.shapes, self.policy
        if policy is not None:
            policy.reset()  # a new text: the policy's acceptance starts from its promise again
            if not policy.may_speculate(len(prompts)):
                # no size pays on this device even on held-out text, so every step would be a plain step:
                # the method is plain decoding here, and runs as plain decoding, without its bookkeeping
                proposer, shapes, policy = Proposer(), {}, None
        own = self.cache if len(prompts) == 1 else None
        return decode(self.target, proposer, prompts, sampling, generators, shapes, policy,
                      default_rule(self.proposer, self.rule, sampling.temperature), own, self.clock)
