"""`python -m tinyspec.generate`: generate text with the shipped model, and see what happened.

    python -m tinyspec.generate --prompt "def fibonacci(n):" --max-new-tokens 64
    python -m tinyspec.generate --prompt "def fibonacci(n):" --method draft --show
    python -m tinyspec.generate --prompt "def fibonacci(n):" --method medusa --size 16 --show
    python -m tinyspec.generate --prompt "def fibonacci(n):" --method eagle --size auto
    python -m tinyspec.generate --prompt "class Stack:" --temperature 0.8 --method medusa --accept pointmass
    python -m tinyspec.generate --prompt "def fibonacci(n):" --method lookup --size 4 --show
    python -m tinyspec.generate --prompt "def fibonacci(n):" --method eagle --temperature 1 --seed 3 --trace run.html
    python -m tinyspec.generate --prompt-file docs/example_prompts.txt --json
    python -m tinyspec.generate --prompt-file docs/example_prompts.txt --batch-size 8 --method medusa --size auto

Every method runs through the one loop of `decoding.py`, for any number of rows (--batch-size);
each method is a proposer in a file of its own under `methods/`, with the acceptance rules in
`verify.py`. A method runs at its default size, or at --size; `--size auto` sizes it for this
device on first use (`speed/sizing.py`, seconds, then cached in $TINYSPEC_HOME/sizing) and
chooses its size, or a plain step, step by step (`speed/policy.py`). This file reads prompts and flags, loads the models
(`cli.py`), and streams text or prints JSON.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import shlex
import sys

import torch

from ..decoding import ACCEPTED, BONUS, CORRECTION, NO_OBSERVER, Step

from ..results import run, run_batch
from ..recorded import Recorded
from ..progress import progress_bar
from ..methods import METHODS, Decoder, check_rule
from ..methods.base import default_rule
from ..sampling import Sampling
from ..speed.auto import policy_for
from ..speed.ledger import Ledger
from ..speed.sizing import sizing_prompts
from ..speed.timing import copy_bandwidth, weight_bytes
from ..trace import Trace
from .cli import (DEFAULT_MODEL, DEFAULT_TOKENIZER, DTYPE_HELP, DTYPES, ArgumentParser, HelpFormatter, Progress,
                  check_input, check_output, check_prompt_bytes, check_prompts, check_tokenizer, die, examples,
                  load_encoding, load_model, most_prompt_bytes, pick_device, pick_dtype, read_lines, run_main, seed,
                  set_threads, use_attention, use_colour)
from .method import add_method_flags, check_method_flags, load_method, parse_size, warn_lossy

# --show: ANSI colours by where a token came from; plain text for the target's own tokens
COLOURS = {ACCEPTED: "\033[32m", CORRECTION: "\033[31m", BONUS: "\033[36m"}
LEGEND = "colours: \033[32mproposal accepted\033[0m, \033[31mtarget correction\033[0m, \033[36mtarget bonus\033[0m"
REPRODUCIBLE = ("A prompt's text is the same from run to run, and in a batch as alone, at a fixed size (or none): "
                "greedy token for token, sampled from the same numbers (a batch's padded forward may round a near-tie "
                "differently in the last bit). With --size auto the sizes follow a policy that learns from every "
                "row and, in a batch, from forward costs measured anew on each run: sampled text, exactly distributed "
                "still, can then differ between runs and between a batch and alone; greedy text never does")
SEED_HELP = ("seed of the sampling generators, 0..2**63-1 (default: 0): prompt i of the file (from 0) draws from its "
             "own generator seeded seed + i, whatever --batch-size. " + REPRODUCIBLE)
BATCH_HELP = ("decode the prompts B at a time: the B rows share every forward, each accepts its own proposals; each "
              "prompt's text is printed when its batch is done (see --seed for what a batch keeps the same)")


# ---- command line ---------------------------------------------------------------------------

def read_prompts(args, most: int) -> list[str]:
    """--prompt, or --prompt-file: JSONL with a "prompt" field, or one prompt per line. A prompt of
    more than `most` UTF-8 bytes is longer than the model's context (`cli.most_prompt_bytes`): a line
    far longer than that is refused unread (`cli.read_lines`)."""
    if args.prompt is not None:
        return [args.prompt]
    path = check_input(args.prompt_file, "--prompt-file")
    if not path.is_file():
        die(f"--prompt-file {path}: no such file")
    lines = read_lines(path, "--prompt-file", most, "save it as UTF-8")
    if not lines:
        die(f"--prompt-file {path} holds no prompts")
    if not lines[0][1].lstrip().startswith("{"):
        return [line for _, line in lines]
    prompts = []
    for i, line in lines:
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


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec.generate", description=__doc__.split("\n\n")[0],
                        usage="%(prog)s (--prompt TEXT | --prompt-file FILE) [--method METHOD] [--size SIZE] "
                        "[--show] [--temperature T] [options]",
                        formatter_class=HelpFormatter, epilog=examples(*[
                            line.strip() for line in __doc__.split("\n\n")[1].splitlines()]))
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the text to continue")
    src.add_argument("--prompt-file", help="UTF-8 file: JSONL with a \"prompt\" field per line, or one prompt per line")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="stop after this many new tokens (or at "
                    "<|endoftext|>, or when the context window is full)")
    ap.add_argument("--method", choices=list(METHODS), default="ar",
                    help="; ".join(f"{name}: {m.summary}" for name, m in METHODS.items()))
    ap.add_argument("--show", action="store_true", help="colour tokens by origin: accepted proposals, corrections, "
                    "bonus tokens (see --color)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; else sample (0.001 or more) "
                    "(default: 0, greedy)")
    ap.add_argument("--seed", type=seed, default=0, help=SEED_HELP)
    ap.add_argument("--json", action="store_true", help="print one JSON object per prompt instead of streaming")
    add_method_flags(ap, weights := ap.add_argument_group("weights and each method's settings (default: the shipped "
                                                          "weights in weights/)"))
    weights.add_argument("--model", default=str(DEFAULT_MODEL), help="target weights (.safetensors or HF GPT-2 dir)")
    weights.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="tiktoken ranks file")
    sampling = ap.add_argument_group("sampling, beyond --temperature")
    sampling.add_argument("--top-k", type=int, help="sample from the k most likely tokens only (default: all tokens)")
    sampling.add_argument("--top-p", type=float, help="nucleus sampling: the fewest most likely tokens holding this "
                          "much mass (default: all tokens, as 1.0 would)")
    knobs = ap.add_argument_group("batches, device and measurement")
    knobs.add_argument("--batch-size", type=int, default=1, help=BATCH_HELP)
    knobs.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:N")
    knobs.add_argument("--dtype", choices=["auto", *DTYPES], default="auto", help=DTYPE_HELP)
    knobs.add_argument("--threads", type=int, help="CPU threads for torch (default: 1 on a CPU, see README: a second "
                       "thread gains little on these small models and costs several times over on a busy machine)")
    knobs.add_argument("--cuda-graph", action="store_true", help="run the whole step (proposing, the target's "
                       "forward, the rule, the cache) as one CUDA graph, recorded once and replayed (recorded.py): "
                       "no Python or launch overhead inside a step; every method but lookahead, at a fixed size, batch 1")
    knobs.add_argument("--attn", choices=["torch", "triton"], default="torch",
                       help="tree attention: torch (SDPA with a dense mask) or triton (the hand-written kernel; on a "
                       "CPU it runs in Triton's interpreter when TRITON_INTERPRET=1 is set: slow, for checking)")
    knobs.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                       help="when --show colours: auto = only on a terminal and without NO_COLOR set")
    knobs.add_argument("--remeasure", action="store_true", help="with --size auto: measure the sizes again "
                       "(speed/sizing.py) instead of reading them from $TINYSPEC_HOME/sizing (default "
                       "~/.cache/tinyspec/sizing)")
    knobs.add_argument("--trace", metavar="FILE.html", help="write every step of the run to one self-contained "
                       "page (trace.py): each step's tree, p and q at each node, the rule's coins, the path and "
                       "cache slots kept; open it in a browser. One prompt, batch size 1, not with --cuda-graph")
    knobs.add_argument("--profile", action="store_true", help="split each prompt's time into the target's forward, "
                       "proposing, the acceptance rule, cache work and the rest (speed/ledger.py; stats ledger_s); "
                       "slows CUDA")
    return ap


def heading(i: int, n: int) -> str:
    """The line above prompt i's text when there are several, so outputs read apart."""
    return f"{'' if i == 0 else chr(10)}=== prompt {i + 1} of {n} ===\n" if n > 1 else ""


def summary(stats: dict) -> str:
    line = f"{stats['new_tokens']} tokens in {stats['wall_s']:.2f}s ({stats['tokens_per_s']:.1f} tokens/s), " \
           f"{stats['target_steps']} target forwards"
    if "proposed_tokens" in stats:
        line += f", acceptance {stats['acceptance_rate']:.0%}, tau {stats['tau']:.2f} tokens per target forward " \
                "(correction/bonus token included)"
    line += f"; target weights read at {stats['weights_GBps']:.1f} GB/s"
    if "of_copy_bandwidth" in stats:
        line += f", {stats['of_copy_bandwidth']:.0%} of this GPU's copy bandwidth"
    if "ledger_s" in stats:
        line += "; time: " + ", ".join(f"{part} {s / max(stats['wall_s'], 1e-9):.0%}" for part, s in stats["ledger_s"].items())
    return line


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # for --trace's page: the command that made it
    generate(args)


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
    if args.batch_size < 1:
        die(f"--batch-size must be at least 1, got {args.batch_size}")
    check_method_flags(args, args.method)
    problem = check_rule(args.method, args.accept, args.temperature)
    if problem:
        die(problem)
    warn_lossy(args.method, args.accept, args.temperature)
    if args.size is not None and args.method == "ar":
        die("--size: plain decoding (ar) proposes nothing; name a method with --method")
    if args.trace is not None:
        if args.cuda_graph or args.batch_size > 1:
            die("--trace draws one row's steps as the readable loop takes them: drop --cuda-graph and --batch-size")
        check_output(args.trace, "--trace")
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    threads = set_threads(args.threads, device)
    if args.cuda_graph and (device.type != "cuda" or args.batch_size > 1 or args.size == "auto"):
        die("--cuda-graph needs a CUDA device (--device cuda), batch size 1 and a fixed --size")
    if args.attn == "triton" and args.batch_size > 1:
        die("--attn triton takes one mask for all rows; a batch, whose rows have their own lengths, needs --attn torch")
    if args.prompt_file:  # a path that cannot be read is said before the models load; it is read below
        check_input(args.prompt_file, "--prompt-file")
    enc = load_encoding(args.tokenizer)
    model = load_model(args.model, device, dtype)
    check_tokenizer(model, enc)
    use_attention(model, args.attn, device)
    proposer = load_method(args.method, args, model, enc, device, dtype)
    n_ctx = min(model.config.n_ctx, proposer.n_ctx or model.config.n_ctx)
    size = parse_size(proposer, args.size, n_ctx)
    most = most_prompt_bytes(enc, n_ctx)
    prompts = read_prompts(args, most)
    check_prompt_bytes(prompts, most, n_ctx)
    if args.trace is not None and len(prompts) > 1:
        die(f"--trace draws one prompt's run; {args.prompt_file} holds {len(prompts)}: give one with --prompt")
    if args.prompt_file:
        print(f"{len(prompts)} prompt{'s' * (len(prompts) > 1)} from {args.prompt_file}", file=sys.stderr)
    encoded = [enc.encode_ordinary(p) for p in progress_bar(prompts, desc="encoding", unit="prompt",
                                                            disable=len(prompts) < 1000)]
    check_prompts(encoded, n_ctx)
    policy, sizing = None, None
    if size == "auto":  # measure (or read) what pays on this device, then choose per step
        with Progress(quiet=args.json) as progress:
            progress(f"sizing {args.method} for this device")
            policy, sizing, line = policy_for(model, proposer, args.accept, sampling, sizing_prompts(enc),
                                              rows=args.batch_size, remeasure=args.remeasure, progress=progress)
        print(line, file=sys.stderr)
    try:
        decoder = Recorded(model, proposer, size, rule=args.accept) if args.cuda_graph else \
            Decoder(model, proposer, None if size == "auto" else size, policy=policy, rule=args.accept)
        if args.cuda_graph and decoder.instead(sampling.temperature):  # another rule than the readable loop's
            print(decoder.instead(sampling.temperature), file=sys.stderr)
    except ValueError as e:
        die(str(e))
    colour = args.show and use_colour(args.color, sys.stdout)
    rule = default_rule(proposer, args.accept, args.temperature)  # the rule a trace names
    peak = None  # the device's copy bandwidth, measured once when first needed (CUDA only)

    def report(prompt: str, res, printer: Printer | None, extra: dict, i: int) -> None:
        nonlocal peak
        stats = res.stats() | {"method": args.method, "size": decoder.size or "auto" if proposer.sizes else None} | extra
        # Each target forward reads every weight once, however many tokens it scores: bytes x
        # forwards / s is the memory traffic the step achieves, the bound a small model decodes at.
        weight_traffic = weight_bytes(model) * res.target_steps / max(res.wall_s, 1e-9)  # bytes per second
        stats["weights_GBps"] = round(weight_traffic / 1e9, 3)
        if device.type == "cuda":
            peak = peak or copy_bandwidth(device)
            stats["of_copy_bandwidth"] = round(weight_traffic / peak, 3)
        else:
            stats["threads"] = threads
        if size == "auto":  # what sizing chose; the steps of each size say what the policy did
            chosen = sizing.chosen() if sizing is not None else None
            stats["sized"] = {"chosen": chosen and chosen["size"], "file": sizing.path if sizing is not None else None}
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

    if args.batch_size > 1:  # rows decoded together; each printed when its batch is done
        for first in range(0, len(prompts), args.batch_size):
            rows = encoded[first:first + args.batch_size]
            generators = [torch.Generator(device=device).manual_seed(args.seed + first + i) for i in range(len(rows))]
            results = run_batch(decoder.batch_steps(rows, sampling, generators, args.max_new_tokens, enc.eot_token),
                                len(rows), device=device)
            tokens, wall = sum(len(r.token_ids) for r in results), max(r.wall_s for r in results)
            together = dict(batch_size=len(rows), batch_tokens_per_s=round(tokens / max(wall, 1e-9), 2))
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
        if args.trace is not None:  # the loop's observer, for this run only
            trace = decoder.observer = Trace(rule)
        with ledger.watching(decoder) if args.profile else contextlib.nullcontext():
            steps = decoder.steps(ids, sampling, generator, args.max_new_tokens, enc.eot_token)
            res = run(trace.watch(steps, ids) if args.trace is not None else steps, printer, device)
        extra = {"ledger_s": ledger.split(res.wall_s)} if args.profile else {}
        if args.trace is not None:
            decoder.observer = NO_OBSERVER
            command = shlex.join(["python", "-m", "tinyspec.generate", *getattr(args, "argv", sys.argv[1:])])
            settings = {"method": args.method, "rule": rule if proposer.sizes else None,
                        "temperature": args.temperature, "size": decoder.size or "auto" if proposer.sizes else None}
            written = trace.write(args.trace, enc, res.stats() | {"method": args.method}, command, settings)
        report(prompt, res, printer, extra, i)
        if args.trace is not None:
            print(f"[trace of {res.target_steps} steps written to {args.trace} ({written / 1024:.0f} KiB): open it "
                  "in a browser]", file=sys.stderr)


if __name__ == "__main__":
    run_main(main)  # Ctrl-C while loading (during decoding `run` returns what it has), or a closed pipe
