"""`python -m tinyspec.generate`: generate text with the shipped model, and see what happened.

    python -m tinyspec.generate --prompt "def fibonacci(n):" --max-new-tokens 64
    python -m tinyspec.generate --prompt "def fibonacci(n):" --method draft --k 4 --show
    python -m tinyspec.generate --prompt "def fibonacci(n):" --method medusa --show
    python -m tinyspec.generate --prompt "def fibonacci(n):" --method medusa --tree-nodes 16
    python -m tinyspec.generate --prompt "class Stack:" --temperature 0.8 --method medusa --accept pointmass
    python -m tinyspec.generate --prompt "def fibonacci(n):" --method eagle --show
    python -m tinyspec.generate --prompt "def fibonacci(n):" --method lookup --k 4 --show
    python -m tinyspec.generate --prompt-file docs/example_prompts.txt --json
    python -m tinyspec.generate --prompt-file docs/example_prompts.txt --batch-size 8 --method auto

The decoding itself lives in `decoding.py` (plain), `speculative.py` (draft model), `medusa.py`
(Medusa trees), `eagle.py` (EAGLE), `lookup.py` and `lookahead.py` (no draft at all), each for
any number of rows (--batch-size), with the acceptance rules in `verify.py`. A method named
without a size (no --k, --tree-nodes, --guesses, ...) is sized for this device on first use
(`sizing.py`, a few seconds, cached under runs/sizing/) and chooses its size, or a plain step,
step by step (`policy.py`). This file reads prompts and flags, loads the models (`cli.py`), and
streams text or prints JSON.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from .cli import (DEFAULT_DRAFT, DEFAULT_EAGLE, DEFAULT_HEADS, DEFAULT_MODEL, DEFAULT_TOKENIZER, DTYPE_HELP, DTYPES,
                  ArgumentParser, HelpFormatter, check_prompts, check_tokenizer, die, examples, load_draft_vocab,
                  load_encoding, load_model, pick_device, pick_dtype, run_main, set_threads, use_colour)
from .methods import (EAGLE_DEPTH, EAGLE_TOPK, METHODS, Decoder, check_draft_free, check_k, check_rule,
                      check_tree_nodes, load_eagle, load_heads, use_attention)
from .decoding import ACCEPTED, BONUS, CORRECTION, Step, run, run_batch
from .ledger import Ledger
from .medusa import MedusaHeads
from .model import GPT
from .sampling import Sampling
from .sizing import shape_of, size, sizing_prompts
from .timing import copy_bandwidth, weight_bytes
from .tree import from_accuracies, load_tree
from .verify import RULES

# --show: ANSI colours by where a token came from; plain text for the target's own tokens
COLOURS = {ACCEPTED: "\033[32m", CORRECTION: "\033[31m", BONUS: "\033[36m"}
K_DEFAULT = "4 for draft, 8 for lookup"  # --k's default depends on the method
LEGEND = "colours: \033[32mproposal accepted\033[0m, \033[31mtarget correction\033[0m, \033[36mtarget bonus\033[0m"


# ---- command line ---------------------------------------------------------------------------

def read_prompts(args) -> list[str]:
    """--prompt, or --prompt-file: JSONL with a "prompt" field, or one prompt per line."""
    if args.prompt is not None:
        return [args.prompt]
    path = Path(args.prompt_file)
    if path.is_dir():
        die(f"--prompt-file {path} is a directory: give a file")
    if not path.is_file():
        die(f"--prompt-file {path}: no such file")
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as e:
        die(f"--prompt-file {path} is not UTF-8 text ({e.reason} at byte {e.start}): save it as UTF-8")
    if not lines:
        die(f"--prompt-file {path} holds no prompts")
    if not lines[0].lstrip().startswith("{"):
        return lines
    prompts = []
    for i, line in enumerate(lines, 1):
        try:
            prompt = json.loads(line)["prompt"]
        except (json.JSONDecodeError, KeyError, TypeError):
            die(f"--prompt-file {path}, line {i}: expected a JSON object with a \"prompt\" field")
        if not isinstance(prompt, str):
            die(f"--prompt-file {path}, line {i}: \"prompt\" must be a string, got {type(prompt).__name__}")
        prompts.append(prompt)
    return prompts


class Printer:
    """Streams tokens to the terminal as UTF-8 text (a character may span tokens); with
    `colour`, each token is coloured by where it came from (see COLOURS)."""

    def __init__(self, enc, stream=None, colour: bool = False):
        self.enc, self.stream, self.colour = enc, stream or sys.stdout, colour
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, step: Step) -> None:
        for t, source in zip(step.tokens, step.sources):
            text = self.decoder.decode(self.enc.decode_single_token_bytes(t))
            colour = COLOURS.get(source) if self.colour else None
            self.stream.write(f"{colour}{text}\033[0m" if colour and text else text)
        self.stream.flush()

    def finish(self) -> None:
        self.stream.write(self.decoder.decode(b"", final=True) + "\n")
        self.stream.flush()  # before the summary goes to stderr


# flags only some methods read, and which (methods.METHODS says)
METHOD_FLAGS = {flag: tuple(name for name, m in METHODS.items() if flag in m.flags)
                for flag in dict.fromkeys(f for m in METHODS.values() for f in m.flags)}


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec.generate", description=__doc__.split("\n\n")[0],
                        formatter_class=HelpFormatter, epilog=examples(*[
                            line.strip() for line in __doc__.split("\n\n")[1].splitlines()]))
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the text to continue")
    src.add_argument("--prompt-file", help="UTF-8 file: JSONL with a \"prompt\" field per line, or one prompt per line")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="stop after this many new tokens (or at "
                    "<|endoftext|>, or when the context window is full)")
    ap.add_argument("--method", choices=list(METHODS), default="ar",
                    help="; ".join(f"{name}: {m.summary}" for name, m in METHODS.items()))
    ap.add_argument("--batch-size", type=int, default=1, help="decode the prompts B at a time: the B rows share "
                    "every forward, each accepts its own proposals, and each row's output is its batch-1 output; each "
                    "prompt's text is printed when its batch is done")
    ap.add_argument("--k", help="draft: tokens proposed per step (1-16); lookup: tokens looked up per step (1-16); "
                    "default (or 'auto'): sized for this device and chosen step by step (sizing.py)")
    ap.add_argument("--max-ngram", type=int, help="lookup: the longest suffix of the text looked up (1-8); shorter "
                    "ones are tried when it has not occurred before (default: 3)")
    ap.add_argument("--window", type=int, help="lookahead: W, positions guessed ahead in parallel (1-32, default: 3)")
    ap.add_argument("--ngram", type=int, help="lookahead: N, the n-gram size: N - 1 Jacobi iterations are kept, and "
                    "each guess verifies N - 1 tokens (2-8, default: 3)")
    ap.add_argument("--guesses", type=int, help="lookahead: G, the most n-grams verified per step (1-32; default: "
                    "sized for this device and chosen step by step)")
    ap.add_argument("--draft", help=f"draft: the draft model's weights (default: {DEFAULT_DRAFT.name} in weights/)")
    ap.add_argument("--heads", help=f"medusa: the heads' weights (default: {DEFAULT_HEADS.name} in weights/)")
    ap.add_argument("--tree", help="medusa: 'default' (built from the heads' measured accuracies) or a JSON file "
                    "{\"choices\": [[0], [1], [0, 0], ...]}; eagle: 'default' (EAGLE-2's dynamic tree) or such a "
                    "file (a static tree) (default: default)")
    ap.add_argument("--tree-nodes", type=int, help="medusa, eagle: nodes in the default tree (default: sized for this "
                    "device and chosen step by step; 16 with --cuda-graph or --eagle-topk/--eagle-depth)")
    ap.add_argument("--eagle", help=f"eagle: the draft head's weights (default: {DEFAULT_EAGLE.name} in weights/)")
    ap.add_argument("--eagle-topk", type=int, help="eagle: children per expanded node, and nodes expanded per "
                    f"depth, of the dynamic tree (default: {EAGLE_TOPK})")
    ap.add_argument("--eagle-depth", type=int, help=f"eagle: depth of the dynamic tree (default: {EAGLE_DEPTH})")
    ap.add_argument("--draft-vocab", type=int, metavar="N", help="draft, medusa, eagle: propose only from the N most "
                    "frequent tokens of the corpus (FR-Spec): the drafter's LM head costs N/8192 of the full one, the "
                    "target still judges over every token, so the output is unchanged in distribution (default: all)")
    ap.add_argument("--accept", choices=list(RULES), default=None,
                    help="acceptance rule (verify.py; default: greedy at temperature 0, else lossless, or pointmass "
                    "for lookup and lookahead). lossless: "
                    "exact sampling, with proposals sampled from the draft/heads; pointmass: exact sampling of "
                    "top-k (deterministic) proposals; block: block verification of a draft's chain (exact, accepts "
                    "at least as much as lossless); traversal: traversal verification of a sampled tree or chain "
                    "from the leaves up (exact, accepts at least as much as lossless); typical: Medusa's fast rule, which does NOT keep the target's "
                    "distribution")
    ap.add_argument("--attn", choices=["torch", "triton"], default="torch",
                    help="tree attention: torch (SDPA with a dense mask) or triton (the hand-written kernel; on a "
                    "CPU it runs in Triton's interpreter when TRITON_INTERPRET=1 is set: slow, for checking)")
    ap.add_argument("--show", action="store_true", help="colour tokens by origin: accepted proposals, corrections, "
                    "bonus tokens (see --color)")
    ap.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                    help="when --show colours: auto = only on a terminal and without NO_COLOR set")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; else sample (0.001 or more) "
                    "(default: 0, greedy)")
    ap.add_argument("--top-k", type=int, help="sample from the k most likely tokens only (default: all tokens)")
    ap.add_argument("--top-p", type=float, help="nucleus sampling: the fewest most likely tokens holding this much "
                    "mass (default: all tokens, as 1.0 would)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sampling generators: prompt i of the file "
                    "(from 0) draws from its own generator seeded seed + i, whatever --batch-size, so identical prompts "
                    "get independent samples and a prompt's text does not depend on the batch it is in (default: 0)")
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="target weights (.safetensors or HF GPT-2 dir)")
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="tiktoken ranks file")
    ap.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:N")
    ap.add_argument("--dtype", choices=["auto", *DTYPES], default="auto", help=DTYPE_HELP)
    ap.add_argument("--threads", type=int, help="CPU threads for torch (default: 1 on a CPU, see README: a second "
                    "thread gains little on these small models and costs several times over on a busy machine)")
    ap.add_argument("--cuda-graph", action="store_true", help="run each decoding step (--method ar) or tree "
                    "verification (--method medusa) as a captured CUDA graph: no Python or launch overhead per step")
    ap.add_argument("--json", action="store_true", help="print one JSON object per prompt instead of streaming")
    ap.add_argument("--remeasure", action="store_true", help="measure the sizes of a method named without one again "
                    "(sizing.py), instead of reading them from $TINYSPEC_HOME/sizing (default ~/.cache/tinyspec/sizing)")
    ap.add_argument("--profile", action="store_true", help="split each prompt's time into the target's forward, "
                    "proposing, the acceptance rule, cache work and the rest (ledger.py; stats ledger_s); slows CUDA")
    return ap


def check_method_flags(args) -> None:
    """A flag the chosen method does not read is a mistake worth saying, not ignoring."""
    for flag, methods in METHOD_FLAGS.items():
        if getattr(args, flag) is not None and args.method not in methods:
            die(f"--{flag.replace('_', '-')} applies to --method {' or '.join(methods)}, not {args.method}")
    problem = check_rule(args.method, args.accept, args.temperature)
    if problem:
        die(problem)


def load_heads_and_tree(args, model: GPT, device, dtype) -> tuple[MedusaHeads, object]:
    """The Medusa heads (checked against the target) and the tree they propose."""
    path = args.heads or DEFAULT_HEADS
    heads = load_heads(path, model, device, dtype)
    if args.tree in (None, "default"):
        if heads.accuracy is None:
            die(f"{path} records no head accuracies to build a default tree from: pass --tree FILE.json")
        if args.tree_nodes is None and not args.cuda_graph:
            return heads, None  # sized for this device (`sizing.py`)
        nodes = 16 if args.tree_nodes is None else args.tree_nodes
        problem = check_tree_nodes(nodes, model.config.n_ctx)
        if problem:
            die(f"--tree-nodes: {problem}")
        tree = from_accuracies(heads.accuracy, nodes)
    else:
        try:
            tree = load_tree(args.tree)
        except ValueError as e:
            die(str(e))
        problem = check_tree_nodes(len(tree), model.config.n_ctx)
        if problem:
            die(f"--tree {args.tree}: {problem}")
    if tree.max_depth > heads.n_heads:
        die(f"the tree is {tree.max_depth} deep but there are only {heads.n_heads} heads: use a shallower tree")
    return heads, tree


def load_eagle_and_tree(args, model: GPT, device, dtype):
    """The EAGLE head (checked against the target) and its static tree, or None for EAGLE-2's."""
    head = load_eagle(args.eagle or DEFAULT_EAGLE, model, device, dtype)
    for name, low, high in (("eagle_topk", 1, 16), ("eagle_depth", 1, 16)):
        if getattr(args, name) is not None and not low <= getattr(args, name) <= high:
            die(f"--{name.replace('_', '-')} must be in {low}..{high}, got {getattr(args, name)}")
    tree = None
    if args.tree not in (None, "default"):
        try:
            tree = load_tree(args.tree)
        except ValueError as e:
            die(str(e))
    nodes = len(tree) if tree is not None else (16 if args.tree_nodes is None else args.tree_nodes)  # when not sized
    problem = check_tree_nodes(nodes, model.config.n_ctx)
    if problem:
        die(f"--tree{'-nodes' if tree is None else ' ' + args.tree}: {problem}")
    return head, tree, nodes


def parse_k(args) -> int | str:
    """--k as an int in 1..16, or 'auto' (also when not given: sized for this device)."""
    k = args.k or "auto"
    k = int(k) if k.isdigit() else k
    problem = check_k(k)
    if problem:
        die(f"--k: {problem}")
    return k


def sized(args) -> bool:
    """Is the method named without a size, so that `sizing.py` chooses it for this device?"""
    return (args.method in ("draft", "lookup") and args.k in (None, "auto")) or \
        (args.method in ("medusa", "eagle") and args.tree in (None, "default") and args.tree_nodes is None and
         args.eagle_topk is None and args.eagle_depth is None and not args.cuda_graph) or \
        (args.method == "lookahead" and args.guesses is None)


def heading(i: int, n: int) -> str:
    """The line above prompt i's text when there are several, so outputs read apart."""
    return f"{'' if i == 0 else chr(10)}=== prompt {i + 1} of {n} ===\n" if n > 1 else ""


def summary(stats: dict) -> str:
    line = f"{stats['new_tokens']} tokens in {stats['wall_s']:.2f}s ({stats['tokens_per_s']:.1f} tokens/s), " \
           f"{stats['target_steps']} target forwards"
    if "tau" in stats:
        line += f", acceptance {stats['acceptance_rate']:.0%}, tau {stats['tau']:.2f} tokens per target forward " \
                "(correction/bonus token included)"
    line += f"; target weights read at {stats['weights_GBps']:.1f} GB/s"
    if "of_copy_bandwidth" in stats:
        line += f", {stats['of_copy_bandwidth']:.0%} of this GPU's copy bandwidth"
    if "ledger_s" in stats:
        line += "; time: " + ", ".join(f"{part} {s / max(stats['wall_s'], 1e-9):.0%}" for part, s in stats["ledger_s"].items())
    return line


def main(argv=None) -> None:
    generate(build_parser().parse_args(argv))


def generate(args) -> None:
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    try:
        sampling.check()
    except ValueError as e:
        die(str(e))
    if args.temperature == 0 and (args.top_k is not None or args.top_p is not None):
        die("--top-k and --top-p shape sampling and have no effect at --temperature 0 (greedy): drop them, or "
            "sample with --temperature T")
    if args.max_new_tokens < 1:
        die(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    check_method_flags(args)
    k = parse_k(args) if args.method in ("draft", "lookup") else None
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    threads = set_threads(args.threads, device)
    if args.cuda_graph and (device.type != "cuda" or args.method not in ("ar", "medusa") or args.attn == "triton"
                            or args.batch_size > 1):
        die("--cuda-graph needs a CUDA device (--device cuda), --method ar or medusa, --attn torch and batch size 1")
    if args.batch_size < 1:
        die(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.attn == "triton" and (args.batch_size > 1 or args.method == "auto"):
        die("--attn triton takes one mask for all rows; a batch, whose rows have their own lengths, needs --attn torch")
    prompts = read_prompts(args)
    enc = load_encoding(args.tokenizer)
    model = load_model(args.model, device, dtype)
    check_tokenizer(model, enc)
    use_attention(model, args.attn, device)
    draft = heads = tree = None
    if args.method == "draft":
        draft = load_model(args.draft or DEFAULT_DRAFT, device, dtype, what="draft")
        check_tokenizer(draft, enc, "draft")
    if args.method == "medusa":
        heads, tree = load_heads_and_tree(args, model, device, dtype)
    if args.method == "auto":
        heads = load_heads(args.heads or DEFAULT_HEADS, model, device, dtype)
        if heads.accuracy is None:
            die(f"{args.heads or DEFAULT_HEADS} records no head accuracies, which --method auto builds its trees from")
    eagle_tree = None
    if args.method == "eagle":
        heads, tree, nodes = load_eagle_and_tree(args, model, device, dtype)
        eagle_tree = (EAGLE_TOPK if args.eagle_topk is None else args.eagle_topk,
                      EAGLE_DEPTH if args.eagle_depth is None else args.eagle_depth, nodes)
    n_ctx = model.config.n_ctx if draft is None else min(model.config.n_ctx, draft.config.n_ctx)
    defaults = dict(max_ngram=3, window=3, ngram=3, guesses=2)
    free = {name: default if getattr(args, name) is None else getattr(args, name) for name, default in defaults.items()}
    if args.method in ("lookup", "lookahead"):
        problem = check_draft_free(args.method, 8 if k == "auto" else k, n_ctx=n_ctx, **free)
        if problem:
            die(problem)
    if args.prompt_file:
        print(f"{len(prompts)} prompt{'s' * (len(prompts) > 1)} from {args.prompt_file}", file=sys.stderr)
    encoded = [enc.encode_ordinary(p) for p in tqdm(prompts, desc="encoding", unit="prompt", file=sys.stderr,
                                                    disable=len(prompts) < 1000)]
    check_prompts(encoded, n_ctx)
    vocab = load_draft_vocab(args.draft_vocab, model.config.vocab_size) if args.draft_vocab is not None else None
    settings = dict(draft_vocab=vocab, batch_size=args.batch_size, **({"eagle_tree": eagle_tree} if eagle_tree else {}),
                    **free)
    sizing = None
    if sized(args):  # measure (or read) what pays on this device, then choose per step
        base = Decoder(model, args.method, draft, 4, heads, tree, args.accept, **settings)
        with tqdm(total=None, desc=f"sizing {args.method} for this device", file=sys.stderr, bar_format="{desc}",
                  disable=args.json) as bar:
            sizing = size(args.method, base, sizing_prompts(enc), sampling, remeasure=args.remeasure,
                          progress=lambda text: bar.set_description_str(text))
        print(sizing.describe(), file=sys.stderr)
        settings["policy"] = sizing.policy(lambda stored: shape_of(args.method, base, stored))
    decoder = Decoder(model, args.method, draft, k, heads, tree, args.accept, cuda_graph=args.cuda_graph, **settings)
    colour = args.show and use_colour(args.color, sys.stdout)
    peak = None  # the device's copy bandwidth, measured once when first needed (CUDA only)

    def report(prompt: str, res, printer: Printer | None, extra: dict, i: int) -> None:
        nonlocal peak
        stats = res.stats() | extra
        # Each target forward reads every weight once, however many tokens it scores: bytes x
        # forwards / s is the memory traffic the step achieves, the bound a small model decodes at.
        weight_traffic = weight_bytes(model) * res.target_steps / max(res.wall_s, 1e-9)  # bytes per second
        stats["weights_GBps"] = round(weight_traffic / 1e9, 3)
        if device.type == "cuda":
            peak = peak or copy_bandwidth(device)
            stats["of_copy_bandwidth"] = round(weight_traffic / peak, 3)
        else:
            stats["threads"] = threads
        if sizing is not None:  # what the policy chose, step by step: steps by the size they verified
            stats["sized"] = {"chosen": sizing.chosen() and sizing.chosen()["shape"], "file": sizing.path}
        if printer:
            printer.finish()
            if res.stop_reason == "context":
                print(f"[stopped: the model's context of {n_ctx} tokens is full]", file=sys.stderr)
            print((f"[prompt {i + 1} of {len(prompts)}] " if len(prompts) > 1 else "") + summary(stats), file=sys.stderr)
            if colour:
                print(LEGEND, file=sys.stderr)
        else:
            print(json.dumps({"prompt": prompt, "text": enc.decode(res.token_ids), "token_ids": res.token_ids,
                              "stats": stats}), flush=True)
        if res.stop_reason == "interrupted":
            print("[interrupted]", file=sys.stderr)
            raise SystemExit(130)

    if args.batch_size > 1 or args.method == "auto":  # rows decoded together; each printed when its batch is done
        for first in range(0, len(prompts), args.batch_size):
            rows = encoded[first:first + args.batch_size]
            generators = [torch.Generator(device=device).manual_seed(args.seed + first + i) for i in range(len(rows))]
            results = run_batch(decoder.batch_steps(rows, sampling, generators, args.max_new_tokens), len(rows),
                                args.max_new_tokens, enc.eot_token)
            tokens, wall = sum(len(r.token_ids) for r in results), max(r.wall_s for r in results)
            together = dict(batch_size=len(rows), latency_s=None, batch_tokens_per_s=round(tokens / max(wall, 1e-9), 2))
            for i, (prompt, res) in enumerate(zip(prompts[first:], results), first):
                printer = None if args.json else Printer(enc, colour=colour)
                if printer:
                    print(heading(i, len(prompts)) + prompt, end="")
                    printer(Step(res.token_ids, res.sources))
                report(prompt, res, printer, together | {"latency_s": round(res.wall_s, 4)}, i)
            if not args.json:
                print(f"[batch of {len(rows)}: {tokens} tokens in {wall:.2f}s, {tokens / max(wall, 1e-9):.1f} tokens/s "
                      "together; each row's time above is its latency]", file=sys.stderr)
        return
    for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
        generator = torch.Generator(device=device).manual_seed(args.seed + i)
        printer = None if args.json else Printer(enc, colour=colour)
        if printer:
            print(heading(i, len(prompts)) + prompt, end="", flush=True)
        ledger = Ledger(device)
        with ledger.watching(decoder) if args.profile else contextlib.nullcontext():
            res = run(decoder.steps(ids, sampling, generator, args.max_new_tokens), args.max_new_tokens, enc.eot_token,
                      printer, device)
        report(prompt, res, printer, {"ledger_s": ledger.split(res.wall_s)} if args.profile else {}, i)

if __name__ == "__main__":
    run_main(main)  # Ctrl-C while loading (during decoding `run` returns what it has), or a closed pipe
