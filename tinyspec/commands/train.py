"""Training: `python -m tinyspec train tokenizer|gpt|medusa|eagle|parallel ...`: a BPE tokenizer, a GPT (a
target, or a draft distilled from one), Medusa heads, an EAGLE draft head or a parallel feature head.

    python -m tinyspec train tokenizer                 # BPE merges -> runs/tokenizer/tokenizer.tiktoken
    python -m tinyspec train gpt --preset tiny --steps 50 --run-dir runs/tiny
    python -m tinyspec train gpt --preset small        # the shipped target's recipe -> runs/small/final.safetensors
    python -m tinyspec train gpt --preset draft --distill-from weights/target.safetensors
    python -m tinyspec train medusa                    # heads for the shipped target -> runs/medusa/medusa.safetensors
    python -m tinyspec train eagle                     # an EAGLE draft head -> runs/eagle/eagle.safetensors
    python -m tinyspec train parallel                  # a parallel feature head -> runs/eagle/parallel.safetensors

Nothing is written into weights/ unless you name a file there with --out, and a shipped file, or
an earlier run's weights, is only replaced with --force. How each is trained is `training/` (`gpt.py`, `heads.py`); this file
checks the flags and the paths, loads the models with one-line errors, and calls it.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

import torch

from ..files import read_tensors
from ..methods.eagle import EagleHead
from ..methods.medusa import MedusaHeads
from ..progress import progress_bar
from ..methods.parallel import ParallelHead
from ..model import GPT, PRESETS
from ..tokenizer import count_chunks, save_ranks, train_bpe
from ..training import corpus, gpt, heads
from ..training.checkpoint import Budget, check_fresh_start, latest_checkpoint, saved_state
from ..training.optim import Diverged
from .cli import (WEIGHTS, ArgumentParser, HelpFormatter, check_destination, check_input, check_output, check_tokenizer,
                  die, examples, load_encoding, load_model, pick_device, run_main, seed, set_threads)


# The largest --lr accepted: AdamW moves every weight by about the learning rate each step (its update is
# normalised by the gradient's own size), so above 1 a single step outgrows the weights it changes.
MAX_LR = 1.0


def check_texts(paths: list[str] | None) -> None:
    """--text files: each must exist and be UTF-8 text (a binary file would train on noise)."""
    for f in paths or []:
        path = check_input(f, "--text")
        if not path.is_file():
            die(f"--text {f}: no such file")
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            die(f"--text {f} is not UTF-8 text ({e.reason} at byte {e.start}): give a text file")


# ---- tokenizer ------------------------------------------------------------------------------

def train_tokenizer(args) -> None:
    """BPE merges of the corpus's training split (`tokenizer.train_bpe`), saved as a ranks file."""
    if not 257 <= args.vocab_size <= 2 ** 16:  # 256 byte tokens + <|endoftext|>; token files are uint16
        die(f"--vocab-size must be in 257..65536 (the 256 bytes, merges, and <|endoftext|>), got {args.vocab_size}")
    check_destination(args.out, args.force)
    check_texts(args.text)
    texts = corpus.corpus("train", args.text)
    print(f"counting chunks in {len(texts)} documents ({sum(map(len, texts)) / 1e6:.1f}M characters)")
    counts = None
    for t in progress_bar(texts, desc="pre-tokenizing"):
        counts = count_chunks(t, counts=counts)
    t0 = time.time()
    ranks = train_bpe(counts, args.vocab_size - 1, progress=True)  # the last id is <|endoftext|>
    save_ranks(ranks, args.out)
    print(f"{len(ranks)} tokens + <|endoftext|> learned in {time.time() - t0:.0f}s -> {args.out}")


# ---- GPT ------------------------------------------------------------------------------------

def train_gpt(args) -> None:
    budget = Budget(args.max_minutes, args.eval_batches)  # counted from here: the start of the command
    device = pick_device(args.device)
    set_threads(args.threads, device, default=None)
    enc = load_encoding(args.tokenizer)
    run_dir = check_output(args.run_dir or f"runs/{args.preset}", "--run-dir", directory=True)
    args.run_dir = str(run_dir)  # (for `last_good`)
    out = check_destination(args.out or run_dir / "final.safetensors", args.force)
    check_fresh_start(run_dir, args.resume, args.force, out)
    check_output(args.data_dir, "--data-dir", directory=True)
    check_texts(args.text)
    overrides = {k: getattr(args, k) for k in ("n_layer", "n_head", "n_embd", "n_ctx") if getattr(args, k) is not None}
    config = replace(PRESETS[args.preset], vocab_size=enc.n_vocab, **overrides)
    if config.n_embd % config.n_head:
        die(f"n_embd {config.n_embd} is not divisible by n_head {config.n_head}")
    if config.n_ctx > gpt.MAX_N_CTX:
        die(f"--n-ctx {config.n_ctx} is more than {gpt.MAX_N_CTX}: attention over n_ctx positions costs n_ctx^2 per "
            "layer and the learned position table has n_ctx rows, so this would not train on one machine; use a "
            "smaller one")
    if args.block_size and args.block_size > config.n_ctx:  # a window past the position table cannot train
        die(f"--block-size {args.block_size} is more than the model's context ({config.n_ctx}): use "
            f"--block-size {config.n_ctx} or less, or a larger --n-ctx")
    args.block_size = args.block_size or config.n_ctx
    torch.manual_seed(args.seed)
    model = GPT(config).to(device)
    if args.init_from and not args.resume:  # go on from a trained checkpoint, with a fresh schedule
        start = load_model(args.init_from, torch.device("cpu"), torch.float32, what="init-from")
        if asdict(start.config) != asdict(config):
            die(f"--init-from {args.init_from} is a {start.config} model, not the preset's {config}")
        model.load_state_dict(start.state_dict())
    model.tokenizer_fingerprint = enc.fingerprint
    if args.resume:
        if latest_checkpoint(run_dir) is None:
            die(f"--resume: no checkpoint in {run_dir} (its file 'latest' names the last one)")
        if saved_state(latest_checkpoint(run_dir))["config"] != asdict(config):
            die(f"--resume: the checkpoint in {run_dir} has a different model config; drop --resume or change --run-dir")
    teacher = None
    if args.distill_from:  # knowledge distillation (Hinton et al. 2015): learn the teacher's p, not the corpus
        teacher = load_model(args.distill_from, device, torch.float32, what="distill-from").requires_grad_(False)
        check_tokenizer(teacher, enc, "--distill-from teacher")
    data = corpus.prepare(enc, Path(args.tokenizer), Path(args.data_dir), args.text, packages=not args.stdlib_only)
    settings = gpt.Settings(**{f.name: getattr(args, f.name) for f in fields(gpt.Settings)})
    gpt.train_gpt(model, data, run_dir, out, settings, budget, device, teacher, args.resume)


# ---- heads on a frozen target ---------------------------------------------------------------

def frozen_target(args):
    """(device, tokenizer, the target in float32) for training something on the target's own text.
    The weights go to --out, else into --run-dir (`<what>.safetensors`), and replace an earlier
    run's only with --force (or --resume)."""
    device = pick_device(args.device)
    set_threads(args.threads, device, default=None)
    args.run_dir = str(check_output(args.run_dir, "--run-dir", directory=True))  # through a link: its target
    args.out = str(check_destination(args.out or Path(args.run_dir) / f"{args.what}.safetensors", args.force))
    check_fresh_start(Path(args.run_dir) / "checkpoints", getattr(args, "resume", False), args.force, Path(args.out))
    check_output(args.data_dir, "--data-dir", directory=True)
    enc = load_encoding(args.tokenizer)
    if not check_input(args.target, "--target").is_file():
        die(f"--target {args.target} not found: train the target first (python -m tinyspec train gpt)")
    return device, enc, GPT.from_hf(args.target, device=device, dtype=torch.float32).eval()


def self_distilled(args) -> heads.SelfDistilled:
    return heads.SelfDistilled(**{f.name: getattr(args, f.name) for f in fields(heads.SelfDistilled)})


def train_medusa(args) -> None:
    device, enc, target = frozen_target(args)
    heads.train_medusa(target, enc, self_distilled(args), Path(args.run_dir), Path(args.out), args.heads, args.steps,
                       args.batch_size, args.lr, args.window, args.target, args.argv)


def train_eagle(args) -> None:
    """An EAGLE head or a parallel head (`args.what`), from random weights or a head's (--init-from),
    checked before the target writes a token of its training text."""
    device, enc, target = frozen_target(args)
    run_dir, ckpt_dir = Path(args.run_dir), Path(args.run_dir) / "checkpoints"
    if args.resume and latest_checkpoint(ckpt_dir) is None:
        die(f"--resume: no checkpoint in {ckpt_dir} (its file 'latest' names the last one)")
    kind = ParallelHead if args.what == "parallel" else EagleHead
    if args.init_from == "none":
        args.init_from = None
    if getattr(args, "heads_from", None) == "none":
        args.heads_from = None
    if args.what == "parallel" and args.depth < 2:
        die("--depth: the parallel head drafts at least 2 deep (EAGLE's guess and one Medusa head)")
    torch.manual_seed(args.seed)  # a new head's weights (the target's text is drawn from generators of its own)
    head = kind.for_target(target) if args.init_from is None else start_from(args.init_from, kind, target, device,
                                                                              args.depth, getattr(args, "heads_from", None))
    if getattr(args, "keep_eagle", False):  # depth 1 stays the EAGLE head's: only the Medusa heads learn
        head.fc.requires_grad_(False)
        head.block.requires_grad_(False)
    if kind is ParallelHead and head.block_size != args.depth:
        die(f"--depth {args.depth}: --init-from {args.init_from} drafts {head.block_size} deep; give --depth "
            f"{head.block_size} or start from an EAGLE head")
    settings = heads.FeatureHeadRun(**{f.name: getattr(args, f.name, None) for f in fields(heads.FeatureHeadRun)})
    settings.keep_eagle = bool(settings.keep_eagle)
    caches = [run_dir, Path(args.medusa_run_dir)]  # the sequences `train medusa` made are reused
    heads.train_eagle(target, head, enc, self_distilled(args), run_dir, caches, Path(args.out), settings, args.target,
                      args.argv)


def start_from(path: str, kind: type, target: GPT, device, depth: int, heads_from: str | None) -> EagleHead:
    """A head of `kind` that starts from the head saved at `path`; a parallel head `depth` deep
    from an EAGLE head (its fc and block) and the Medusa heads at `heads_from` (or new ones)."""
    if not check_input(path, "--init-from").is_file():
        die(f"--init-from {path} not found: train an EAGLE head first (python -m tinyspec train eagle), or give "
            "--init-from none")
    parallel = any(name.startswith("ahead.") for name in read_tensors(path)[1])
    loaded = (ParallelHead if parallel else EagleHead).load(path, device)
    if loaded.target_fingerprint and loaded.target_fingerprint != target.fingerprint():
        die(f"--init-from {path} was trained for a different target model")
    if parallel and kind is EagleHead:
        die(f"--init-from {path} holds a parallel head: start an EAGLE head from an EAGLE head")
    head = loaded
    if kind is ParallelHead and not parallel:
        medusa = None
        if heads_from is not None:
            medusa = MedusaHeads.load(heads_from, device, torch.float32)
            if medusa.n_heads < depth - 1:
                die(f"--heads-from {heads_from} has {medusa.n_heads} heads; --depth {depth} needs {depth - 1}")
        head = ParallelHead.from_heads(loaded, medusa, depth)
    head.target_fingerprint = target.fingerprint()
    return head.train()




def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec train", description=__doc__.split("\n\n")[0],
                        formatter_class=HelpFormatter, epilog=examples(*[
                            line.strip() for line in __doc__.split("\n\n")[1].splitlines()]))
    sub = ap.add_subparsers(dest="what", required=True)

    tok = sub.add_parser("tokenizer", help="learn BPE merges from the stdlib train split", formatter_class=HelpFormatter,
                         epilog=examples("python -m tinyspec train tokenizer                       # 8,192 tokens, about 30 s",
                                         "python -m tinyspec train tokenizer --vocab-size 4096 --text notes.txt"))
    tok.add_argument("--vocab-size", type=int, default=8192, help="tokens including <|endoftext|>")
    tok.add_argument("--text", action="append", help="extra text file to learn from (repeatable)")
    tok.add_argument("--out", default="runs/tokenizer/tokenizer.tiktoken", help="ranks file to write")
    tok.add_argument("--force", action="store_true", help="allow replacing a shipped file in weights/")

    g = sub.add_parser("gpt", help="train a GPT from a preset", formatter_class=HelpFormatter, epilog=examples(
        "python -m tinyspec train gpt --preset small                    # the shipped target's recipe",
        "python -m tinyspec train gpt --preset small --max-minutes 60   # stop within an hour; --resume goes on",
        "python -m tinyspec train gpt --preset small --resume",
        "python -m tinyspec train gpt --preset draft --steps 400 --lr 2e-3 --warmup 40 --eval-every 100 "
        "--distill-from weights/target.safetensors"))
    g.add_argument("--preset", choices=sorted(PRESETS), default="small", help="model size (see model.PRESETS)")
    for field in ("n_layer", "n_head", "n_embd", "n_ctx"):
        g.add_argument("--" + field.replace("_", "-"), type=int, dest=field, help=f"override the preset's {field}")
    g.add_argument("--steps", type=int, default=1500, help="optimizer steps (the cosine schedule spans them)")
    g.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    g.add_argument("--block-size", type=int, default=None, help="training window (default: n_ctx)")
    g.add_argument("--lr", type=float, default=1.5e-3, help="peak learning rate")
    g.add_argument("--warmup", type=int, default=100, help="warm-up steps")
    g.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay of matrices and embeddings")
    g.add_argument("--eval-every", type=int, default=200, help="validate and checkpoint every N steps")
    g.add_argument("--eval-batches", type=int, default=10, help="validation batches (the same ones every time)")
    g.add_argument("--tokenizer", default=str(WEIGHTS / "tokenizer.tiktoken"), help="tiktoken ranks file")
    g.add_argument("--text", action="append", help="extra training text file (repeatable)")
    g.add_argument("--distill-from", help="train on this teacher model's next-token distributions instead of "
                   "the corpus tokens (a draft distilled from the target)")
    g.add_argument("--data-dir", default=str(corpus.data_home()), help="where token files are cached "
                   "(set TINYSPEC_HOME to move tinyspec's folder)")
    g.add_argument("--stdlib-only", action="store_true", help="train on the standard library alone (otherwise the "
                   "pinned packages' sources are downloaded once into --data-dir and added: python -m tinyspec data)")
    g.add_argument("--init-from", help="start from these weights (same preset and tokenizer) instead of random ones, "
                   "with a fresh learning-rate schedule; the card records it")
    g.add_argument("--run-dir", help="checkpoints for --resume (default runs/<preset>)")
    g.add_argument("--out", help="final weights (default: <run-dir>/final.safetensors); a .md model card goes beside")
    g.add_argument("--force", action="store_true", help="allow replacing a shipped file in weights/ or an earlier "
                   "run's --out, and starting over in a --run-dir that holds an earlier run's checkpoints (they are "
                   "removed)")
    g.add_argument("--save-dtype", choices=["bfloat16", "float32"], default="bfloat16", help="dtype of the saved "
                   "weights (bfloat16 halves the file; tinyspec loads it in the dtype --dtype asks for)")
    g.add_argument("--resume", action="store_true", help="continue from the checkpoint in --run-dir")
    g.add_argument("--keep-best", action="store_true", help="save the weights of the validation with the lowest "
                   "loss, not the last ones (for many epochs over the corpus)")
    g.add_argument("--max-minutes", type=float, help="stop (validate, checkpoint, save) within this many minutes "
                   "of starting; --resume continues")
    g.add_argument("--bf16", action="store_true", help="bf16 autocast on CPU too (always on for CUDA)")
    g.add_argument("--compile", action="store_true", help="torch.compile the training step")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    g.add_argument("--threads", type=int, help="CPU threads for torch (default: all cores; on a shared machine use 1, see README)")
    g.add_argument("--seed", type=seed, default=0, help="seed of the initial weights and of the data sampler")
    m = sub.add_parser("medusa", help="train Medusa heads on a frozen target (self-distilled data)",
                       formatter_class=HelpFormatter, epilog=examples(
                           "python -m tinyspec train medusa                          # 4 heads for weights/target.safetensors",
                           "python -m tinyspec train medusa --target runs/small/final.safetensors --out runs/medusa/m.safetensors"))
    add_self_distill_args(m, sequences=2048, run_dir="runs/medusa")
    m.add_argument("--heads", type=int, default=4, help="number of heads K")
    m.add_argument("--steps", type=int, default=450, help="optimizer steps")
    m.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    m.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    m.add_argument("--window", type=int, default=64, help="positions per sequence the heads train on each step")
    m.add_argument("--out", help="the heads (default: <run-dir>/medusa.safetensors, never an earlier run's without "
                   "--force); a .md card goes beside")
    e = sub.add_parser("eagle", help="train an EAGLE draft head on a frozen target (self-distilled data)",
                       formatter_class=HelpFormatter, epilog=examples(
                           "python -m tinyspec train eagle                           # reuses train medusa's sequences",
                           "python -m tinyspec train eagle --steps 800 --resume      # continue an interrupted run"))
    add_self_distill_args(e, sequences=1024, run_dir="runs/eagle")
    add_feature_head_args(e, "eagle", depth=1)
    par = sub.add_parser("parallel", help="train a parallel feature head (EAGLE's, drafting a block in one forward)",
                         formatter_class=HelpFormatter, epilog=examples(
                             "python -m tinyspec train parallel      # from the shipped EAGLE head, reusing its sequences",
                             "python -m tinyspec train parallel --init-from none --steps 800   # from random weights"))
    add_self_distill_args(par, sequences=1024, run_dir="runs/eagle")
    add_feature_head_args(par, "parallel", depth=5)
    par.add_argument("--heads-from", default=str(WEIGHTS / "medusa.safetensors"), help="start the depth heads from "
                     "these Medusa heads ('none': new ones), with --init-from an EAGLE head")
    par.add_argument("--keep-eagle", action="store_true", help="train the Medusa heads only: depth 1 stays the "
                     "EAGLE head's own guess")
    par.set_defaults(init_from=str(WEIGHTS / "eagle.safetensors"))
    return ap


def add_feature_head_args(e, what: str, depth: int) -> None:
    """The flags of a head on the target's features (eagle, parallel)."""
    e.add_argument("--steps", type=int, default=800, help="optimizer steps")
    e.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    e.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    e.add_argument("--noise", type=float, default=0.1, help="uniform noise on the input features, U(-x, x)")
    e.add_argument("--ce-weight", type=float, default=0.1, help="w in SmoothL1 + w * cross-entropy")
    e.add_argument("--checkpoint-every", type=int, default=100, help="save a checkpoint (for --resume) every N steps")
    e.add_argument("--resume", action="store_true", help="continue from the checkpoint in --run-dir/checkpoints")
    e.add_argument("--save-dtype", choices=["bfloat16", "float32"], default="bfloat16", help="dtype of the saved head")
    e.add_argument("--medusa-run-dir", default="runs/medusa", help="reuse self-distilled data cached here")
    e.add_argument("--depth", type=int, default=depth, help="train draft depths 1..N, each on what it reads when "
                   "decoding (EAGLE: its own predicted features, training-time test; parallel: its Medusa heads on "
                   "depth 1's feature; the parallel head drafts N deep)")
    e.add_argument("--anchors", type=int, default=64, help="positions per sequence that depths 2..N train at")
    e.add_argument("--init-from", help="start from this head (an EAGLE head for either; 'none': random weights)")
    e.add_argument("--out", help=f"the head (default: <run-dir>/{what}.safetensors, never an earlier run's without "
                   "--force or --resume); a .md card goes beside (copy both to weights/ to ship them)")


def add_self_distill_args(p, sequences: int, run_dir: str) -> None:
    """The flags of a head trained on the frozen target's own text (medusa, eagle)."""
    p.add_argument("--target", default=str(WEIGHTS / "target.safetensors"), help="the frozen target model")
    p.add_argument("--sequences", type=int, default=sequences, help="self-distilled training sequences to generate")
    p.add_argument("--prompt-len", type=int, default=32, help="corpus tokens that start each sequence")
    p.add_argument("--gen-len", type=int, default=224, help="tokens the target generates after each prompt")
    p.add_argument("--gen-batch", type=int, default=64, help="sequences generated at once")
    p.add_argument("--tokenizer", default=str(WEIGHTS / "tokenizer.tiktoken"), help="tiktoken ranks file")
    p.add_argument("--text", action="append", help=argparse.SUPPRESS)
    p.add_argument("--data-dir", default=str(corpus.data_home()), help="where token files are cached "
                   "(set TINYSPEC_HOME to move tinyspec's folder)")
    p.add_argument("--stdlib-only", action="store_true", help="prompts from the standard library alone (otherwise "
                   "the corpus with the pinned packages, downloaded once into --data-dir)")
    p.add_argument("--run-dir", default=run_dir, help="where self-distilled data (and checkpoints) are kept, and "
                   "the weights unless --out says otherwise")
    p.add_argument("--force", action="store_true", help="allow replacing a shipped file in weights/ or an earlier "
                   "run's --out, and (eagle, parallel) starting over where --run-dir holds an earlier run's checkpoints "
                   "(they are removed)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: all cores; on a shared machine use 1, see README)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the data and of the sampler")


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the card's "Reproduce" line: what followed `train`
    for name in ("steps", "batch_size", "block_size", "eval_every", "eval_batches", "vocab_size", "heads", "sequences",
                 "gen_len", "prompt_len", "gen_batch", "window", "checkpoint_every", "depth", "anchors", "n_layer",
                 "n_head", "n_embd", "n_ctx"):
        if getattr(args, name, 1) is not None and getattr(args, name, 1) < 1:
            die(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if getattr(args, "warmup", 0) < 0:
        die(f"--warmup must be 0 or more steps, got {args.warmup}")
    for name in ("max_minutes", "lr"):  # None: not given (no time limit)
        if getattr(args, name, None) is not None and not getattr(args, name) > 0:
            die(f"--{name.replace('_', '-')} must be more than 0, got {getattr(args, name)}")
    if getattr(args, "lr", 0) > MAX_LR:
        die(f"--lr must be at most {MAX_LR}, got {args.lr}: AdamW moves every weight by about the learning rate each "
            "step, and a trained model's weights are well under 1 (the defaults are 1.5e-3 and 2e-3)")
    for name in ("noise", "ce_weight", "weight_decay"):  # nan fails both comparisons
        value = getattr(args, name, 0)
        if not 0 <= value < float("inf"):
            die(f"--{name.replace('_', '-')} must be 0 or more (and finite), got {value}")
    if getattr(args, "weight_decay", 0) * getattr(args, "lr", 0) >= 1:
        die(f"--weight-decay {args.weight_decay} x --lr {args.lr} must be less than 1: AdamW multiplies each weight by "
            "1 - lr x weight_decay every step, and a factor of 0 or less wipes the weights out or flips them")
    try:
        {"tokenizer": train_tokenizer, "gpt": train_gpt, "medusa": train_medusa, "eagle": train_eagle,
         "parallel": train_eagle}[args.what](args)
    except Diverged as e:
        die(f"{e}; {last_good(args)}")
    except (FileNotFoundError, ValueError) as e:
        die(str(e))


def last_good(args) -> str:
    """What a run that diverged leaves: its last checkpoint, saved before the loss went bad, or nothing
    (no checkpoint holds weights that diverged, and neither do the final weights: they are not written)."""
    checkpoints = {"gpt": Path(args.run_dir), "eagle": Path(args.run_dir) / "checkpoints",
                   "parallel": Path(args.run_dir) / "checkpoints"}.get(args.what)
    kept = checkpoints and latest_checkpoint(checkpoints)
    return f"its last good checkpoint is kept, {kept} (--resume with a lower --lr continues from it)" if kept else \
        "nothing was saved"


if __name__ == "__main__":
    run_main(main)
