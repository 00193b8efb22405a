"""The recorded step (walkthrough chapter 11): a method's whole speculative step as fixed-shape
tensor work on the device, recorded once as a CUDA graph and replayed. The readable loop
(`decoding.py`) is its reference; each idea it rewrites for the device lives beside its readable
form: a method's proposing in the method's file (its `Part`), the rules in `verify.py`
(`fixed_match`, `fixed_walk`, `fixed_block`), the tree's tensors in `tree.py` (`tree_tensors`),
the cache's gather in `kvcache.py` (`KVCache.keep_on_device`). Here: the step that ties them
together (`FixedStep`), its recording (`record`) and the driver (`Recorded`).

The readable loop (`decoding.decode`) asks the host a dozen questions a step: how long is the
cache, which path did the rule accept, is this node's child the target's choice, how many
tokens to keep. Each answer is a read-back, and each read-back stops the host until the device
has caught up; on a GPU, where a small model's forward takes less time than Python takes to
launch it, those pauses and the launches between them are most of the step. A CUDA graph
replays recorded launches with one call, but it replays them on the same memory with the same
shapes and cannot ask anything. So here every answer stays on the device as a tensor:

- the cache length L and the root are tensors; the nodes are fed at slots L .. L + T
  (`kvcache.SlotWriter`) and see the slots below L and their ancestors (`kvcache.slot_mask`);
- a tree grown per step (EAGLE-2's) has a fixed number of nodes, and its mask and depths are
  derived from its parent indices on the device (`tree_tensors`), not built in Python;
- acceptance is index arithmetic: the greedy rule and the point-mass rule are one rule
  (`verify.fixed_match`): node a is acceptable when its token is its parent's draw from p (the
  argmax at T = 0) and no earlier sibling's, and the path is the deepest node whose ancestors are
  all acceptable. SpecInfer's rule for sampled proposals (`verify.fixed_walk`) becomes a fixed
  number of masked sibling tests, and block verification of a chain (`verify.fixed_block`) a
  running sum and a running maximum;
- the cache keeps the root and the accepted path by a gather of depth + 1 slots
  (`KVCache.keep_on_device`);
  whatever it copies past the path lies beyond the new length, where nothing looks;
- random numbers come from a device generator, registered with the graph so that each replay
  draws fresh ones.

A step writes `result` = (n, whether the last token is a correction, the deepest proposal,
the D + 1 tokens it produced, n of them valid), and the host reads that one small tensor back:
the only read-back of a step, and what the driver (`Recorded.steps`) yields, as the readable
loop yields its steps. The readable loop is the reference: at T = 0 a recorded step writes its
tokens, token for token, and at T > 0 it has the target's distribution (tests/test_step.py).

Each method's part (`methods/base.py: Part`), declared in the method's file as its `Part`, is how
it proposes with fixed shapes; prompt lookup and retrieval propose on the host from the text
just read back (`HostPart`), padded to their largest tree.
"""

from __future__ import annotations

import torch

from .decoding import ACCEPTED, BONUS, CORRECTION, NO_CLOCK, TARGET, Proposer, Row, Step, ended, prefill
from .kvcache import KVCache, SlotWriter, slot_mask
from .model import GPT
from .sampling import Sampling, draw
from .tree import tree_tensors
from .verify import fixed_block, fixed_match, fixed_walk


def part_of(method: Proposer):
    """The method's fixed-shape part (its `Part`, declared in its own file), or None: plain decoding."""
    return getattr(method, "Part", None)


def refusal(method: Proposer, rule: str | None) -> str | None:
    """Why a recorded step cannot run `method` judged by `rule` (None: the default), or None."""
    part = part_of(method)
    if part is None and method.name != "ar":
        return f"{method.name} has no recorded step: run it without --cuda-graph"
    rules = ("greedy",) + (part.rules if part is not None else ())
    if rule is not None and rule not in rules:
        return f"a recorded step of {method.name} judges with {', '.join(rules)}, not {rule}: pass --accept " + \
            ("pointmass" if "pointmass" in rules else "greedy")
    return part.problem(method) if part is not None else None


# ---- one step, and the loop that replays it ---------------------------------------------------

class FixedStep:
    """One step of `part` (None: a plain step) over the target's cache at the device length L,
    with fixed shapes: propose, ONE target forward over the root and T nodes, the rule, the
    cache's compaction, the part's update; `result` then holds what the host reads back."""

    def __init__(self, target: GPT, cache: KVCache, part, rule: str, sampling: Sampling, state):
        self.target, self.cache, self.part, self.sampling = target, cache, part, sampling
        self.L, self.root, self.generator = state  # shared by every step of a prompt
        device = cache.k.device
        self.T, self.D = (part.T, part.D) if part is not None else (0, 0)
        static = part.static if part is not None else None
        if static is not None:
            self.tree = static.tree_mask, static.depth, torch.cat([static.depth.new_zeros(1), static.parent_index])
            kids = [list(c) for c in static.child_lists]
            width = max(map(len, kids))
            self.kids = torch.tensor([c + [-1] * (width - len(c)) for c in kids], device=device)  # (T+1, S)
        elif part is None:
            self.tree = tree_tensors(torch.zeros(0, dtype=torch.long, device=device), 0)
        self.rule = "greedy" if sampling.temperature == 0 else rule if part is not None else "pointmass"  # (a plain draw)
        self.tests = {"lossless": self.D * self.kids.shape[1] + 1 if static is not None else 0, "block": self.D + 1,
                      "pointmass": self.T + 1}.get(self.rule, 0)
        self.draws = (part.draws if part is not None and part.sampled else 0) + self.tests  # the proposal's, the rule's
        self.offsets = torch.arange(self.T + 1, device=device)
        self.result = torch.zeros(self.D + 4, dtype=torch.long, device=device)

    def __call__(self) -> None:
        L, root, part, D = self.L, self.root, self.part, self.D
        u = torch.rand(self.draws, device=L.device, generator=self.generator) if self.draws else None
        tokens, parents, q, valid = part.propose(root, L, u) if part is not None else (root[:0], None, None, None)
        mask, depth, parent = self.tree if parents is None else tree_tensors(parents, D)
        valid = self.offsets >= 0 if valid is None else valid
        x = torch.cat([root, tokens])  # (T+1,): the root, then the nodes
        hidden = self.target.hidden(x[None], positions=L + depth, cache=SlotWriter(self.cache, L + self.offsets),
                                    attn_mask=slot_mask(mask, L, self.cache.max_len))[0]  # (T+1, C)
        logits = self.target.lm_head(hidden)
        if self.rule in ("lossless", "block"):
            rule = fixed_walk if self.rule == "lossless" else fixed_block
            path, n, nxt, last = rule(x, self.sampling.probs(logits), q, self.kids, u[self.draws - self.tests:], D)
        else:
            y = logits.argmax(-1) if self.rule == "greedy" else draw(self.sampling.probs(logits), u[self.draws - self.tests:])
            path, n, nxt, last = fixed_match(x, y, parent, mask, depth, valid, D)
        self.cache.keep_on_device(L, path)
        seq = torch.cat([x[path], nxt])  # (D+2,): the root, the path's tokens, and one more slot
        seq = torch.where(torch.arange(D + 2, device=L.device) == n, nxt, seq)  # the next token after the path
        correction = ((parent == last) & valid & (depth > 0)).any().view(1)  # the path stopped above a child
        self.result.copy_(torch.cat([n, correction.long(), (depth * valid).max().view(1), seq[1:]]))
        if part is not None:
            part.update(hidden, path, n, seq)
        L.add_(n)
        root.copy_(nxt)


def record(step: FixedStep):
    """`step` recorded once as a CUDA graph (its replay), or `step` itself off CUDA. Recording runs
    it four times on whatever the state holds (a prompt's start overwrites all of it)."""
    device = step.L.device
    if device.type != "cuda":
        return step
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):  # kernels chosen, workspaces allocated, before the capture
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    graph.register_generator_state(step.generator)  # each replay draws fresh numbers from it
    with torch.cuda.graph(graph), torch.no_grad():
        step()
    return graph.replay


class Recorded:
    """A method at one size as a recorded step, ready for prompt after prompt as a `Decoder` is:
    `steps(prompt, sampling, generator)` yields what each step gave (`results.run` drives it).
    Batch 1. Per sampling, on first use, the step and a plain one are recorded (the plain one
    for the end of the context, where the tree would not fit, and where a lookup finds nothing).
    clock: a `speed/ledger.py` Ledger times each step (part "step") and the host's proposing."""

    def __init__(self, target: GPT, proposer: Proposer | None = None, size: str | None = None, *,
                 rule: str | None = None):
        self.target, self.proposer, self.rule = target, proposer or Proposer(), rule
        self.size = size or getattr(self.proposer, "default_size", None)
        self.shape = self.proposer.shape(self.size) if self.size else None
        self.n_ctx = min(target.config.n_ctx, self.proposer.n_ctx or target.config.n_ctx)
        self.slots = self.n_ctx + (self.proposer.room(self.shape) if self.size else 0) + 1
        self.cache = KVCache.for_model(target, self.slots)
        device = self.cache.k.device
        self.state = (torch.ones(1, dtype=torch.long, device=device), torch.zeros(1, dtype=torch.long, device=device),
                      torch.Generator(device=device))  # L (1 while recording: a draft feeds slot L - 1), root
        self.recorded, self.clock = {}, NO_CLOCK
        problem = refusal(self.proposer, rule)
        if problem:
            raise ValueError(problem)

    def recording(self, sampling: Sampling):
        """(part, step, its replay, plain step, its replay) for this sampling, recorded on first use."""
        key = (sampling.temperature, sampling.top_k, sampling.top_p)
        if key not in self.recorded:
            kind, rule = part_of(self.proposer), self.step_rule(sampling.temperature)
            part = kind(self.proposer, self.shape, sampling, rule, self.slots) if kind is not None else None
            step, plain = (FixedStep(self.target, self.cache, p, rule, sampling, self.state) for p in (part, None))
            self.recorded[key] = part, step, record(step), plain, record(plain)
        return self.recorded[key]

    def step_rule(self, temperature: float) -> str:
        """The rule a step runs: the readable loop's (`base.default_rule`), or point-mass where the
        method's part cannot run that (EAGLE's default, lossless, judges a sampled tree; the part
        grows the top-k one): `instead` says so."""
        kind = part_of(self.proposer)
        if kind is None:
            return "greedy" if temperature == 0 else "pointmass"  # (a plain step's own draw)
        rule = self.proposer.rule_at(self.rule, temperature)
        return rule if rule in ("greedy",) + kind.rules else "pointmass"

    def instead(self, temperature: float) -> str | None:
        """One line, where a step runs another rule than the readable loop would at `temperature`."""
        if part_of(self.proposer) is None:
            return None
        rule, readable = self.step_rule(temperature), self.proposer.rule_at(self.rule, temperature)
        return None if rule == readable else f"a recorded step of {self.proposer.name} judges with {rule} (exact for " \
            f"its top-k tree), not its default {readable}: pass --accept {rule} to say so"

    def batch_steps(self, prompts: list[list[int]], sampling: Sampling, generators: list, max_new_tokens: int,
                    stop_id: int | None = None):
        if len(prompts) != 1:
            raise ValueError("a recorded step decodes one prompt at a time (batch size 1)")
        return self.steps(prompts[0], sampling, generators[0], max_new_tokens, stop_id)

    @torch.no_grad()  # as `decoding.decode`: no autograd graph chained through the cache prompt after prompt
    def steps(self, prompt: list[int], sampling: Sampling, generator, max_new_tokens: int, stop_id: int | None = None):
        """The loop for one prompt, as `decoding.decode` yields it: the prefill (the readable one),
        then one replay and one read-back a step, until the row stops (`decoding.ended`). Without
        a generator the step's own is seeded from torch's global one, which the readable loop
        draws from, so each run draws fresh numbers."""
        part, step, replay, plain, plain_replay = self.recording(sampling)
        L, root, device_generator = self.state
        row = Row(0, list(prompt), generator)
        self.cache.reset()
        hidden = prefill(self.target, self.cache, [row], sampling)[0]
        L.fill_(len(prompt))
        root.copy_(row.root.view(1))
        seed = torch.randint(2 ** 62, (1,), generator=generator, device=generator.device if generator else "cpu")
        device_generator.manual_seed(int(seed))  # the step's own generator, registered with its graphs
        if part is not None:
            part.begin(row.text, hidden)
        length, deepest = len(prompt), part.D if part is not None else 0
        produced = ended(Step([row.text[-1]], [TARGET]), row, max_new_tokens, stop_id, length >= self.n_ctx)
        while True:
            yield {0: produced}
            if produced.stop:
                return
            room = self.n_ctx - 1 - length
            with self.clock.part("propose"):
                speculate = part is not None and deepest <= room and (not part.on_host or part.offer(room))
            with self.clock.part("step"):
                (replay if speculate else plain_replay)()
                n, correction, proposed, *out = (step if speculate else plain).result.tolist()  # the one read-back
            tokens, length = out[:n], length + n
            if part is not None and part.on_host:
                with self.clock.part("propose"):
                    part.heard(tokens)
            produced = Step(tokens, [ACCEPTED] * (n - 1) + [CORRECTION if correction else BONUS], proposed, self.size,
                            step.T + 1, n - 1) if speculate else Step(tokens, [TARGET])
            produced = ended(produced, row, max_new_tokens, stop_id, length >= self.n_ctx)
