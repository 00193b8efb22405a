"""What a method declares, beside what the loop calls: `Method`, the base of every method file of
this folder, and the one size format, the weights and settings they declare with.

The loop (`decoding.decode`) needs only a `decoding.Proposer`: `start`, `propose`, `update`, the
room a step takes and the rule it runs. The commands need more, and every method says it here in
the same words: its name and a one-line summary (every command's help), what it proposes (which
acceptance rules keep its output the target's: `rule_problem`), what it loads besides the target
(`Weights`) and its other flags (`Setting`), and its sizes: the size it runs at when named, the
sizes `--size auto` measures, and how a size is spelled (`size_format`, read by `parse_size`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..decoding import Proposer, Row, Step, Verified
from ..sampling import Sampling
from ..tree import Tree
from ..verify import CHAIN_ONLY, SAMPLED


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


class Method(Proposer):
    """A decoding method as the commands see it. This base is plain decoding ("ar"), which
    proposes nothing. A method is a subclass in a file of its own here, which says:

    - name, chapter (of the walkthrough: the order of every command's help), summary, and
      `proposes`: "nothing", "a sampled chain", "a tree" or "fixed tokens" (`rule_problem`);
    - weights (a `Weights`) and settings (its other flags, `Setting`s), reduced_vocab (it
      proposes through an LM head that --draft-vocab may shrink);
    - default_size (what it runs at when named), sizes (what `--size auto` measures), and
      size_format: each number of a size, (name, lowest, highest, what it is), in order, so that
      "2,4,8" reads as TOPK,DEPTH,NODES; `shape(size)` turns a size into what `propose` takes;
    - Part: its proposing with fixed shapes, for the recorded step (`Part`, below), or None."""
    name = "ar"
    chapter = 4
    summary = "plain autoregressive decoding"
    proposes = "nothing"
    weights: Weights | None = None
    settings: dict[str, Setting] = {}
    reduced_vocab = False
    default_size: str | None = None
    sizes: tuple[str, ...] = ()
    size_format: tuple[tuple[str, int, int, str], ...] = ()
    Part: type[Part] | None = None  # its fixed-shape proposing, for a recorded step (`Part`), where it has one

    @classmethod
    def size_help(cls) -> str:
        """How a size is spelled, for --help: "TOPK,DEPTH,NODES: ..." with each number's range."""
        return ",".join(n for n, *_ in cls.size_format) + ": " + "; ".join(
            f"{n} {what} ({lo}-{hi})" for n, lo, hi, what in cls.size_format)

    def parse_size(self, size: str) -> tuple[int, ...]:
        """The numbers of `size`, each checked against its range: a one-line ValueError if not."""
        names = ",".join(n for n, *_ in self.size_format)
        parts = size.split(",")
        if len(parts) != len(self.size_format) or not all(p.isdigit() for p in parts):
            raise ValueError(f"a {self.name} size is {names} (e.g. {self.default_size}), got {size!r}")
        for (n, lo, hi, _), value in zip(self.size_format, map(int, parts)):
            if not lo <= value <= hi:
                raise ValueError(f"{self.name}'s {n} must be in {lo}..{hi}, got {value} in {size!r}")
        return tuple(map(int, parts))

    def shape(self, size: str):
        """The size as `propose` reads it: its number, or its numbers (a method may build more)."""
        if not self.size_format:
            raise ValueError(f"{self.name} has no sizes")
        numbers = self.parse_size(size)
        return numbers[0] if len(numbers) == 1 else numbers

    def batch_sizes(self) -> dict[str, float] | None:
        """For a batch at --size auto (`speed/auto.py`): {size: the tokens a step of it accepts, as
        the method predicts from held-out data}, or None where it does not predict: a batch is then
        sized as one row is, by whole steps measured on the device (`speed/sizing.py`)."""
        return None

    def proposing(self, rows: int):
        """A call that proposes for `rows` rows, to time (for a method whose batch_sizes predicts)."""
        raise NotImplementedError(f"{self.name} predicts no batch sizes")

    def rule_at(self, rule: str | None, temperature: float) -> str:
        """The rule a run judges with (`default_rule`), or a one-line ValueError where `rule` would
        not keep the output the target's (`rule_problem`): what a recorded step asks of its method,
        as `Decoder` asks the two functions."""
        problem = rule_problem(self, rule, temperature)
        if problem:
            raise ValueError(problem)
        return default_rule(self, rule, temperature)

    def identity(self) -> dict:
        """What the method's measured costs and acceptance depend on beyond its weights (modules)
        and settings: a datastore's size, say (`speed/sizing.py` keys its cache by it)."""
        return {}


def rule_problem(method: Method | type[Method], rule: str | None, temperature: float) -> str | None:
    """The one-line reason `rule` cannot judge the method's proposals at `temperature` and keep
    the output the target's own, or None if it can. Exact are: every rule at T = 0 (the greedy
    rule is then used: every exact rule's text is the argmax's, and greedy accepts the most), and
    at T > 0 every rule the proposals suit: the rules of `verify.SAMPLED` need nodes drawn from a
    q, block judges a chain; `typical` is the one rule allowed that is not exact (documented as
    lossy). The greedy rule at T > 0 is refused: its verified steps take the argmax while the
    first token and every plain step are sampled, so the text is neither sampling nor greedy."""
    if rule is None:
        return None
    if method.proposes == "nothing":
        return "plain decoding proposes nothing: no acceptance rule applies"
    if method.proposes == "fixed tokens" and rule in SAMPLED:
        return f"the {rule} rule needs proposals sampled from a draft; {method.name} proposes fixed tokens: use pointmass"
    if method.proposes != "a sampled chain" and rule in CHAIN_ONLY:
        return f"the {rule} rule verifies a chain (the draft method), not a tree"
    if rule == "greedy" and temperature > 0:
        return f"the greedy rule at temperature {temperature:g} is neither sampling nor greedy decoding"
    return None


def default_rule(method: Method, rule: str | None, temperature: float) -> str:
    """The rule a run uses: greedy at temperature 0 whatever was asked (every exact rule's text is
    then the argmax's, and greedy accepts the most), else `rule`, or by default lossless, or
    pointmass for fixed tokens, which were not drawn from a q (verify.py)."""
    if temperature == 0:
        return "greedy"
    return rule or ("pointmass" if method.proposes == "fixed tokens" else "lossless")


# ---- the fixed-shape part of a recorded step (recorded.py) ----------------------------------------

class Part:
    """A method's fixed-shape proposing, its side of a recorded step (`recorded.py`, chapter 11),
    declared in the method's file beside `propose` as the method's `Part`, and made with (method,
    shape, sampling, rule, slots): T nodes at most D deep; `static` the tree when its shape never changes; `begin` (host, once per prompt:
    what the method reads of the prompt), `propose` (device: tokens (T,), parents (T,) or None for
    the static tree, q (T+1, V) or None, valid (T+1,) or None) and `update` (device: what it keeps
    for the next step). `rules`: the rules it runs at T > 0 (at T = 0 every rule is greedy)."""
    rules = ("pointmass",)
    static: Tree | None = None
    sampled = False  # proposals drawn from q (the lossless rule needs them)
    draws = 0  # uniform numbers a proposal uses
    on_host = False  # proposes on the host, between steps (`HostPart`)

    @classmethod
    def problem(cls, method) -> str | None:
        """Why this part cannot run `method` as it is set up, in one line, or None."""
        return None

    def begin(self, text: list[int], hidden: torch.Tensor) -> None:
        pass

    def update(self, hidden, path, n, seq) -> None:
        """hidden (T+1, C) of every token fed; seq (D+2,): the root, then what the step produced."""


class HostPart(Part):
    """Prompt lookup and retrieval propose on the host, from the text the last step read back: the
    readable method proposes (`offer`), and its tree, padded to T nodes that are never accepted
    (`valid`), is copied into the step's inputs."""
    on_host = True

    def __init__(self, method, shape, sampling: Sampling, rule: str, slots: int):
        self.method, self.shape, device = method, shape, method.device
        self.T = self.D = method.room(shape)
        self.x = torch.zeros(self.T, dtype=torch.long, device=device)
        self.parents = torch.full((self.T,), -1, dtype=torch.long, device=device)
        self.valid = torch.zeros(self.T + 1, dtype=torch.bool, device=device)

    def begin(self, text, hidden):
        self.row = Row(0, list(text), None)
        self.method.start([self.row], [hidden], 0)

    def offer(self, room: int) -> bool:
        """The method's proposal copied in; False if it has none (then the step is a plain one)."""
        proposal = self.method.propose([self.row], self.shape, [room], None, False)[0]
        if proposal is None:
            return False
        n = len(proposal.tokens)
        self.x[:n] = proposal.tokens
        self.parents.copy_(torch.tensor(proposal.tree.parents + (-1,) * (self.T - n)))
        self.valid.copy_(torch.arange(self.T + 1) <= n)
        return True

    def heard(self, tokens: list[int]) -> None:
        self.row.text += tokens
        self.method.update([self.row], [None], [Verified(Step(tokens, []), None, None)])

    def propose(self, root, L, u):
        return self.x, self.parents, None, self.valid
