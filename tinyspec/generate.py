"""`python -m tinyspec.generate`: generate text with the shipped model, and see what happened.

    python -m tinyspec.generate --prompt "def fibonacci(n):" --max-new-tokens 64
    python -m tinyspec.generate --prompt "def fibonacci(n):" --method draft --k 4 --show
    python -m tinyspec.generate --prompt "def fibonacci(n):" --method medusa --show
    python -m tinyspec.generate --prompt "def fibonacci(n):" --method lookup --k 4 --show
    python -m tinyspec.generate --prompt-file prompts.jsonl --json --temperature 0

The decoding itself lives in `decoding.py` (plain), `speculative.py` (draft model),
`medusa.py` (Medusa trees), `lookup.py` and `lookahead.py` (no draft at all), with the
acceptance rules in `verify.py`; this file reads prompts and flags, loads the models
(`cli.py`), and streams text or prints JSON.
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import sys
from pathlib import Path

import torch

from .cli import (DEFAULT_DRAFT, DEFAULT_HEADS, DEFAULT_MODEL, DEFAULT_TOKENIZER, DTYPE_HELP, DTYPES, ArgumentParser,
                  Decoder, check_draft_free, check_rule, die, load_encoding, load_heads, load_model, pick_device,
                  pick_dtype)
from .decoding import ACCEPTED, BONUS, CORRECTION, Step, run
from .medusa import MedusaHeads
from .model import GPT
from .sampling import Sampling
from .timing import copy_bandwidth, cost_ratio, weight_bytes
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
    if not path.is_file():
        die(f"--prompt-file {path}: no such file")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        die(f"--prompt-file {path} holds no prompts")
    if not lines[0].lstrip().startswith("{"):
        return lines
    prompts = []
    for i, line in enumerate(lines, 1):
        try:
            prompts.append(json.loads(line)["prompt"])
        except (json.JSONDecodeError, KeyError, TypeError):
            die(f"--prompt-file {path}, line {i}: expected a JSON object with a \"prompt\" field")
    return prompts


class Printer:
    """Streams tokens to the terminal as UTF-8 text (a character may span tokens); with
    `show`, each token is coloured by where it came from (see COLOURS)."""

    def __init__(self, enc, stream=None, show: bool = False):
        self.enc, self.stream, self.show = enc, stream or sys.stdout, show
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, step: Step) -> None:
        for t, source in zip(step.tokens, step.sources):
            text = self.decoder.decode(self.enc.decode_single_token_bytes(t))
            colour = COLOURS.get(source) if self.show else None
            self.stream.write(f"{colour}{text}\033[0m" if colour and text else text)
        self.stream.flush()

    def finish(self) -> None:
        self.stream.write(self.decoder.decode(b"", final=True) + "\n")
        self.stream.flush()  # before the summary goes to stderr


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec.generate", description=__doc__.split("\n\n")[0],
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the text to continue")
    src.add_argument("--prompt-file", help="JSONL with a \"prompt\" field per line, or one prompt per line")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--method", choices=["ar", "draft", "medusa", "lookup", "lookahead"], default="ar",
                    help="ar: plain autoregressive decoding; draft: speculative decoding with a draft model; "
                    "medusa: Medusa heads propose a tree, verified in one target pass; lookup: prompt lookup, the "
                    "text's own earlier continuation of its last tokens is the proposal; lookahead: n-grams from the "
                    "target's own Jacobi iterations, made and verified in the same pass")
    ap.add_argument("--k", default=K_DEFAULT, help="draft: tokens proposed per step (1-16), or 'auto' to adapt k to "
                    "the running acceptance rate and the measured draft/target cost; lookup: tokens looked up per step "
                    "(1-16)")
    ap.add_argument("--max-ngram", type=int, default=3, help="lookup: the longest suffix of the text looked up "
                    "(1-8); shorter ones are tried when it has not occurred before")
    ap.add_argument("--window", type=int, default=3, help="lookahead: W, positions guessed ahead in parallel (1-32)")
    ap.add_argument("--ngram", type=int, default=3, help="lookahead: N, the n-gram size: N - 1 Jacobi iterations "
                    "are kept, and each guess verifies N - 1 tokens (2-8)")
    ap.add_argument("--guesses", type=int, default=2, help="lookahead: G, the most n-grams verified per step (1-32)")
    ap.add_argument("--k-max", type=int, default=8, help="draft with --k auto: the largest k to try")
    ap.add_argument("--draft", default=str(DEFAULT_DRAFT), help="draft model weights")
    ap.add_argument("--heads", default=str(DEFAULT_HEADS), help="medusa: the heads' weights")
    ap.add_argument("--tree", default="default", help="medusa: 'default' (built from the heads' measured accuracies) "
                    "or a JSON file {\"choices\": [[0], [1], [0, 0], ...]}")
    ap.add_argument("--tree-nodes", type=int, default=16, help="medusa: nodes in the default tree")
    ap.add_argument("--accept", choices=list(RULES), default=None,
                    help="acceptance rule (verify.py; default: greedy at temperature 0, else lossless, or pointmass "
                    "for lookup and lookahead). lossless: "
                    "exact sampling, with proposals sampled from the draft/heads; pointmass: exact sampling of "
                    "top-k (deterministic) proposals; block: block verification of a draft's chain (exact, accepts "
                    "at least as much as lossless); typical: Medusa's fast rule, which does NOT keep the target's "
                    "distribution")
    ap.add_argument("--attn", choices=["torch", "triton"], default="torch",
                    help="tree attention: torch (SDPA with a dense mask) or triton (the hand-written kernel; on a "
                    "CPU it runs in Triton's interpreter when TRITON_INTERPRET=1 is set: slow, for checking)")
    ap.add_argument("--show", action="store_true", help="colour tokens by origin: accepted proposals, corrections, bonus")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    ap.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="target weights (.safetensors or HF GPT-2 dir)")
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="tiktoken ranks file")
    ap.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:N")
    ap.add_argument("--dtype", choices=["auto", *DTYPES], default="auto", help=DTYPE_HELP)
    ap.add_argument("--cuda-graph", action="store_true", help="run each decoding step (--method ar) or tree "
                    "verification (--method medusa) as a captured CUDA graph: no Python or launch overhead per step")
    ap.add_argument("--json", action="store_true", help="print one JSON object per prompt instead of streaming")
    return ap


def load_heads_and_tree(args, model: GPT, device, dtype) -> tuple[MedusaHeads, object]:
    """The Medusa heads (checked against the target) and the tree they propose."""
    heads = load_heads(args.heads, model, device, dtype)
    if args.tree == "default":
        if heads.accuracy is None:
            die(f"{args.heads} records no head accuracies to build a default tree from: pass --tree FILE.json")
        if args.tree_nodes < 1:
            die(f"--tree-nodes must be at least 1, got {args.tree_nodes}")
        tree = from_accuracies(heads.accuracy, args.tree_nodes)
    else:
        try:
            tree = load_tree(args.tree)
        except ValueError as e:
            die(str(e))
    if tree.max_depth > heads.n_heads:
        die(f"the tree is {tree.max_depth} deep but there are only {heads.n_heads} heads: use a shallower tree")
    if args.attn == "triton" and len(tree) + 1 > 128:
        die(f"--attn triton verifies at most 128 tokens (the root and 127 nodes); the tree has {len(tree)} nodes")
    if len(tree) + 2 >= model.config.n_ctx:
        die(f"a tree of {len(tree)} nodes does not fit the model's context of {model.config.n_ctx}: use a smaller tree")
    return heads, tree


def parse_k(args) -> int | None:
    """--k as an int in 1..16, or None for 'auto'."""
    if args.k == "auto":
        if not 1 <= args.k_max <= 16:
            die(f"--k-max must be in 1..16, got {args.k_max}")
        return None
    try:
        k = int(args.k)
    except ValueError:
        k = 0
    if not 1 <= k <= 16:
        die(f"--k must be an integer in 1..16 or 'auto', got {args.k!r}")
    return k


def summary(stats: dict) -> str:
    line = f"{stats['new_tokens']} tokens in {stats['wall_s']:.2f}s ({stats['tokens_per_s']:.1f} tokens/s), " \
           f"{stats['target_steps']} target forwards"
    if "tau" in stats:
        line += f", acceptance {stats['acceptance_rate']:.0%}, tau {stats['tau']:.2f} tokens per target forward " \
                "(correction/bonus token included)"
    line += f"; target weights read at {stats['weights_GBps']:.1f} GB/s"
    if "of_copy_bandwidth" in stats:
        line += f", {stats['of_copy_bandwidth']:.0%} of this GPU's copy bandwidth"
    return line


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    try:
        sampling.check()
    except ValueError as e:
        die(str(e))
    if args.max_new_tokens < 1:
        die(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.k == K_DEFAULT:
        args.k = "8" if args.method == "lookup" else "4"
    k = parse_k(args) if args.method in ("draft", "lookup") else None
    if args.method == "lookup" and k is None:
        die("--k auto adapts a draft model's k; --method lookup needs an integer in 1..16")
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    if args.cuda_graph and (device.type != "cuda" or args.method not in ("ar", "medusa") or args.attn == "triton"):
        die("--cuda-graph needs a CUDA device (--device cuda), --method ar or medusa, and --attn torch")
    problem = check_rule(args.method, args.accept)
    if problem:
        die(problem)
    enc = load_encoding(args.tokenizer)
    model = load_model(args.model, device, dtype)
    if args.attn == "triton":
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            die("--attn triton on a CPU needs Triton's interpreter: run with TRITON_INTERPRET=1 set")
        try:
            model.set_attention("triton")
        except ImportError:
            die("--attn triton needs the triton package: pip install triton")
    if model.config.vocab_size != enc.n_vocab:
        die(f"the model's vocabulary ({model.config.vocab_size}) differs from the tokenizer's ({enc.n_vocab}): "
            "pass the --tokenizer it was trained with")
    draft = heads = tree = None
    if args.method == "draft":
        draft = load_model(args.draft, device, dtype, what="draft")
        if draft.config.vocab_size != model.config.vocab_size:
            die(f"the draft's vocabulary ({draft.config.vocab_size}) differs from the target's "
                f"({model.config.vocab_size}): a draft must share the target's tokenizer")
    if args.method == "medusa":
        heads, tree = load_heads_and_tree(args, model, device, dtype)
    prompts = read_prompts(args)
    n_ctx = model.config.n_ctx if draft is None else min(model.config.n_ctx, draft.config.n_ctx)
    if args.method in ("lookup", "lookahead"):
        problem = check_draft_free(args.method, k, args.max_ngram, args.window, args.ngram, args.guesses, n_ctx)
        if problem:
            die(problem)
    encoded = [enc.encode_ordinary(p) for p in prompts]
    for i, ids in enumerate(encoded):
        if not ids:
            die(f"prompt {i + 1} is empty: give at least one character")
        if len(ids) >= n_ctx:
            die(f"prompt {i + 1} is {len(ids)} tokens, the model's context is {n_ctx}: shorten the prompt")
    c = cost_ratio(model, draft) if draft is not None and k is None else None
    decoder = Decoder(model, args.method, draft, "auto" if k is None else k, heads, tree, args.accept,
                      cuda_graph=args.cuda_graph, cost=c, k_max=args.k_max, max_ngram=args.max_ngram,
                      window=args.window, ngram=args.ngram, guesses=args.guesses)
    peak = None  # the device's copy bandwidth, measured once when first needed (CUDA only)
    for prompt, ids in zip(prompts, encoded):
        generator = torch.Generator(device=device).manual_seed(args.seed)
        steps = decoder.steps(ids, sampling, generator, args.max_new_tokens)
        printer = None if args.json else Printer(enc, show=args.show)
        if printer:
            print(prompt, end="", flush=True)
        res = run(steps, args.max_new_tokens, enc.eot_token, printer, device)
        stats = res.stats()
        # Each target forward reads every weight once, however many tokens it scores: bytes x
        # forwards / s is the memory traffic the step achieves, the bound a small model decodes at.
        weight_traffic = weight_bytes(model) * res.target_steps / max(res.wall_s, 1e-9)  # bytes per second
        stats["weights_GBps"] = round(weight_traffic / 1e9, 3)
        if device.type == "cuda":
            peak = peak or copy_bandwidth(device)
            stats["of_copy_bandwidth"] = round(weight_traffic / peak, 3)
        if c is not None:
            stats["cost_ratio"] = round(c, 4)
        if printer:
            printer.finish()
            if res.stop_reason == "context":
                print(f"[stopped: the model's context of {n_ctx} tokens is full]", file=sys.stderr)
            print(summary(stats), file=sys.stderr)
            if args.show:
                print(LEGEND, file=sys.stderr)
        else:
            print(json.dumps({"prompt": prompt, "text": enc.decode(res.token_ids), "token_ids": res.token_ids,
                              "stats": stats}), flush=True)


if __name__ == "__main__":
    main()
