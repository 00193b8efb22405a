"""Training: `python -m tinyspec train tokenizer|gpt|medusa|eagle|parallel ...`: a BPE tokenizer, a GPT (a
target, or a draft distilled from one), Medusa heads, an EAGLE draft head or a parallel feature head.

    python -m tinyspec train tokenizer                 # BPE merges -> runs/tokenizer/tokenizer.tiktoken
    python -m tinyspec train gpt --preset tiny --steps 50 --run-dir runs/tiny
    python -m tinyspec train gpt --preset small        # the shipped target's recipe -> runs/small/final.safetensors
    python -m tinyspec train gpt --preset draft --distill-from weights/target.safetensors
    python -m tinyspec train medusa                    # heads for the shipped target -> runs/medusa/medusa.safetensors
    python -m tinyspec train eagle                     # an EAGLE draft head -> runs/eagle/eagle.safetensors
    python -m tinyspec train parallel                  # a parallel feature head -> runs/parallel/parallel.safetensors

Nothing is written into weights/ unless you name a file there with --out, and a shipped file is
only replaced with --force.

A GPT is trained like nanoGPT: random windows of the token file, AdamW (beta2 0.95, weight
decay on matrices only), linear warm-up then cosine decay to 10% of the peak learning rate,
gradient clipping at 1.0, bf16 autocast on a GPU. Every `--eval-every` steps it measures the
validation loss and saves a checkpoint (model, optimizer, data-sampler state) in `--run-dir`,
from which `--resume` continues exactly. At the end the weights go to `--out` and a model card
(`--out` with .md) records what was trained, on what, for how long, and how well.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm import tqdm

from . import data
from .checkpoint import Budget, check_fresh_start, latest_checkpoint, load_checkpoint, save_checkpoint
from .cli import (WEIGHTS, ArgumentParser, HelpFormatter, check_destination, check_input, check_output, check_tokenizer,
                  die, examples, load_encoding, load_model, pick_device, run_main, seed, set_threads, shown)
from ..files import atomic_write_text
from ..model import GPT, PRESETS
from .optim import lr_at, make_optimizer
from ..tokenizer import count_chunks, save_ranks, train_bpe
from .train_heads import train_eagle, train_medusa


# The longest context `train gpt` accepts: attention costs n_ctx^2 per layer and the learned position
# table has n_ctx rows, and GPT-2 itself stops at 1024; beyond a few thousand nothing trains here.
MAX_N_CTX = 8192


# ---- tokenizer ------------------------------------------------------------------------------

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


def train_tokenizer(args) -> None:
    if not 257 <= args.vocab_size <= 2 ** 16:  # 256 byte tokens + <|endoftext|>; token files are uint16
        die(f"--vocab-size must be in 257..65536 (the 256 bytes, merges, and <|endoftext|>), got {args.vocab_size}")
    check_destination(args.out, args.force)
    check_texts(args.text)
    texts = data.corpus("train", args.text)
    print(f"counting chunks in {len(texts)} documents ({sum(map(len, texts)) / 1e6:.1f}M characters)")
    counts = None
    for t in tqdm(texts, desc="pre-tokenizing"):
        counts = count_chunks(t, counts=counts)
    t0 = time.time()
    ranks = train_bpe(counts, args.vocab_size - 1, progress=True)  # the last id is <|endoftext|>
    save_ranks(ranks, args.out)
    print(f"{len(ranks)} tokens + <|endoftext|> learned in {time.time() - t0:.0f}s -> {args.out}")


# ---- GPT ------------------------------------------------------------------------------------

@torch.no_grad()
def evaluate(model: GPT, tokens: data.TokenFile, args, device, autocast) -> float:
    """Mean validation loss over `args.eval_batches` fixed windows (same windows every time)."""
    model.eval()
    g = torch.Generator().manual_seed(1234)
    losses = []
    for _ in range(args.eval_batches):
        x, y = (t.to(device) for t in tokens.batch(args.batch_size, args.block_size, g))
        with autocast:
            logits, _ = model(x)
        losses.append(torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten()).item())
    model.train()
    return sum(losses) / len(losses)


def train_gpt(args) -> None:
    budget = Budget(args.max_minutes, args.eval_batches)
    device = pick_device(args.device)
    set_threads(args.threads, device, default=None)
    enc = load_encoding(args.tokenizer)
    run_dir = check_output(args.run_dir or f"runs/{args.preset}", "--run-dir", directory=True)
    check_fresh_start(run_dir, args.resume, args.force)
    out = check_destination(args.out or run_dir / "final.safetensors", args.force)
    check_output(args.data_dir, "--data-dir", directory=True)
    check_texts(args.text)
    overrides = {k: getattr(args, k) for k in ("n_layer", "n_head", "n_embd", "n_ctx") if getattr(args, k)}
    config = replace(PRESETS[args.preset], vocab_size=enc.n_vocab, **overrides)
    if config.n_embd % config.n_head:
        die(f"n_embd {config.n_embd} is not divisible by n_head {config.n_head}")
    if config.n_ctx > MAX_N_CTX:
        die(f"--n-ctx {config.n_ctx} is more than {MAX_N_CTX}: attention over n_ctx positions costs n_ctx^2 per layer "
            "and the learned position table has n_ctx rows, so this would not train on one machine; use a smaller one")
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
    opt = make_optimizer(model, args.lr, args.weight_decay)
    data_rng = torch.Generator().manual_seed(args.seed)
    step, tokens_seen, history, seconds_before = 0, 0, [], 0.0
    if args.resume:
        if latest_checkpoint(run_dir) is None:
            die(f"--resume: no checkpoint in {run_dir} (its file 'latest' names the last one)")
        state = load_checkpoint(latest_checkpoint(run_dir), model, opt, data_rng, device)
        if state["config"] != asdict(config):
            die(f"--resume: the checkpoint in {run_dir} has a different model config; drop --resume or change --run-dir")
        step, tokens_seen, history = state["step"], state["tokens_seen"], state["history"]
        seconds_before = state.get("train_seconds", 0.0)
        print(f"resuming from step {step} ({tokens_seen / 1e6:.1f}M tokens seen)")

    teacher = None
    if args.distill_from:  # knowledge distillation (Hinton et al. 2015): learn the teacher's p, not the corpus
        teacher = load_model(args.distill_from, device, torch.float32, what="distill-from").requires_grad_(False)
        check_tokenizer(teacher, enc, "--distill-from teacher")
    data_path = data.prepare(enc, Path(args.tokenizer), Path(args.data_dir), args.text, packages=not args.stdlib_only)
    meta = json.loads((data_path / "meta.json").read_text())
    train_tokens = data.TokenFile(data_path / "train.bin")
    # validation on the standard library's held-out modules (comparable with every earlier target) and,
    # where the corpus has them, the packages'
    val_sets = {name: data.TokenFile(data_path / f"{name}.bin") for name in ("val", "val-packages")
                if meta.get(name, {}).get("tokens", 0) > args.block_size + 1}
    if len(train_tokens) <= args.block_size + 1 or "val" not in val_sets:
        die(f"a training window of {args.block_size} tokens does not fit the corpus splits ({len(train_tokens)} and "
            f"{meta['val']['tokens']} tokens): use a smaller --block-size or --n-ctx")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16 or device.type == "cuda")
    step_fn = torch.compile(model) if args.compile else model  # compile only the step; `model` stays plain
    tokens_per_step = args.batch_size * args.block_size
    print(f"{args.preset}: {model.num_params() / 1e6:.2f}M parameters, {args.steps} steps x {tokens_per_step} tokens "
          f"on {device} (train split: {meta['train']['tokens'] / 1e6:.1f}M tokens)")

    def checkpoint(losses):
        history.append({"step": step, "tokens_seen": tokens_seen} | {k: round(v, 4) for k, v in losses.items()})
        save_checkpoint(run_dir, model, opt, data_rng, {"step": step, "tokens_seen": tokens_seen,
                        "config": asdict(config), "history": history, "args": vars(args),
                        "train_seconds": round(seconds_before + time.time() - t_start, 1)})

    def validate():
        t0 = time.time()
        losses = {"val_loss" if name == "val" else "val_packages": evaluate(model, tokens, args, device, autocast)
                  for name, tokens in val_sets.items()}
        val = losses["val_loss"]
        budget.eval_s = time.time() - t0
        bar.write(f"step {step}: train loss {loss.item():.3f}, val loss {val:.3f}" +
                  (f" (packages {losses['val_packages']:.3f})" if "val_packages" in losses else ""))
        if args.keep_best and val <= min((h["val_loss"] for h in history), default=float("inf")):
            model.save(run_dir / "best.safetensors")  # many epochs over a small corpus overfit: keep the best
        checkpoint(losses)

    t_start = time.time()
    bar = tqdm(total=args.steps, initial=step, desc="training", dynamic_ncols=True)
    model.train()
    out_of_time, loss = False, torch.tensor(float("nan"))
    while step < args.steps:
        if not budget.room_for_a_step():
            out_of_time = True
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        x, y = (t.to(device, non_blocking=True) for t in train_tokens.batch(args.batch_size, args.block_size, data_rng))
        t0 = time.time()
        with autocast:
            logits, _ = step_fn(x)
            if teacher is not None:
                with torch.no_grad():
                    target_probs = torch.softmax(teacher(x)[0].float(), -1)
        if teacher is None:
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        else:  # cross-entropy against the teacher's distribution = KL(p_teacher || q_student) + const
            loss = -(target_probs * torch.log_softmax(logits.float(), -1)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step, tokens_seen = step + 1, tokens_seen + tokens_per_step
        bar.update(1)
        budget.step_s = time.time() - t0
        bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tokens_per_step / budget.step_s:.0f}")
        if step % args.eval_every == 0 or step == args.steps:
            validate()
    if not history or history[-1]["step"] != step:  # stopped between validations: validate and checkpoint here
        validate()
    if out_of_time:
        bar.write(f"--max-minutes {args.max_minutes}: stopped at step {step}, before a step and validation would "
                  f"pass it (a step takes {budget.step_s:.1f}s here); --resume continues")
    bar.close()
    if args.keep_best:
        model.load_state_dict(GPT.from_hf(run_dir / "best.safetensors", device=device).state_dict())
    model.save(out, dtype=torch.bfloat16 if args.save_dtype == "bfloat16" else None)
    write_card(out.with_suffix(".md"), args, config, model, meta, history, device,
               seconds_before + time.time() - t_start)
    print(f"saved {out} and its model card {out.with_suffix('.md')}")


def write_card(path: Path, args, config, model, meta, history, device, seconds: float) -> None:
    """The model card: what this checkpoint is and how to make it again (figures from this run)."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s))"
    last = history[-1] if history else {"tokens_seen": 0, "val_loss": float("nan"), "step": 0}
    best = min(history, key=lambda h: h["val_loss"]) if history else last
    kept = f"- kept: the weights of step {best['step']}, the best validation loss ({best['val_loss']:.3f}; --keep-best)\n" \
        if args.keep_best else ""
    flags = " ".join(a for a in args.argv if a != "--resume")
    curve = "\n".join(f"| {h['step']} | {h['tokens_seen'] / 1e6:.1f}M | {h['val_loss']:.3f} | "
                      f"{h['val_packages']:.3f} |" if "val_packages" in h else
                      f"| {h['step']} | {h['tokens_seen'] / 1e6:.1f}M | {h['val_loss']:.3f} | - |" for h in history)
    atomic_write_text(path, f"""# {path.stem}

- preset: `{args.preset}` {json.dumps(asdict(config))}
- parameters: {model.num_params() / 1e6:.2f}M ({model.num_params():,}; the LM head is tied to the token embedding)
- data: {' and '.join(sorted(meta.get('sources', {'stdlib': 0}), key=lambda n: n != 'stdlib'))}, train split
  ({meta['train']['documents']} modules, {meta['train']['tokens'] / 1e6:.1f}M tokens{', plus --text ' + ', '.join(args.text) if args.text else ''});
  validation: the standard library's {meta['val']['documents']} held-out modules ({meta['val']['tokens'] / 1e6:.2f}M tokens)
  {f"and the packages' {meta['val-packages']['documents']} ({meta['val-packages']['tokens'] / 1e6:.2f}M tokens)" if meta.get('val-packages', {}).get('documents') else ''}
  (`tinyspec/commands/data.py`; every source's version, licence and tokens: `python -m tinyspec data`){f"; started from `{shown(args.init_from)}`" if args.init_from else ''}
- objective: {'distillation from `' + args.distill_from + '`: cross-entropy against its next-token distributions' if args.distill_from else 'next-token cross-entropy on the corpus'}
- trained on: {where}, {seconds / 60:.0f} minutes (resumed runs summed), bf16 autocast: {args.bf16 or device.type == 'cuda'}
- steps: {last['step']} of batch {args.batch_size} x {args.block_size} tokens; tokens seen: {last['tokens_seen'] / 1e6:.1f}M
- final validation loss: {last['val_loss']:.3f} nats/token
{kept}- stored as: {args.save_dtype}, Hugging Face GPT-2 tensor names (`GPT.from_hf`, `model.to_hf`)

Reproduce: `python -m tinyspec train {flags}`

| step | tokens seen | validation loss (stdlib) | validation loss (packages) |
|---|---|---|---|
{curve}
""")


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
    g.add_argument("--data-dir", default=str(data.data_home()), help="where token files are cached "
                   "(set TINYSPEC_HOME to move tinyspec's folder)")
    g.add_argument("--stdlib-only", action="store_true", help="train on the standard library alone (otherwise the "
                   "pinned packages' sources are downloaded once into --data-dir and added: python -m tinyspec data)")
    g.add_argument("--init-from", help="start from these weights (same preset and tokenizer) instead of random ones, "
                   "with a fresh learning-rate schedule; the card records it")
    g.add_argument("--run-dir", help="checkpoints for --resume (default runs/<preset>)")
    g.add_argument("--out", help="final weights (default: <run-dir>/final.safetensors); a .md model card goes beside")
    g.add_argument("--force", action="store_true", help="allow replacing a shipped file in weights/, and starting "
                   "over in a --run-dir that holds an earlier run's checkpoints (they are removed)")
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
    m.add_argument("--out", default="runs/medusa/medusa.safetensors", help="the heads; a .md card goes beside")
    e = sub.add_parser("eagle", help="train an EAGLE draft head on a frozen target (self-distilled data)",
                       formatter_class=HelpFormatter, epilog=examples(
                           "python -m tinyspec train eagle                           # reuses train medusa's sequences",
                           "python -m tinyspec train eagle --steps 800 --resume      # continue an interrupted run"))
    add_self_distill_args(e, sequences=1024, run_dir="runs/eagle")
    add_feature_head_args(e, "runs/eagle/eagle.safetensors", depth=1)
    par = sub.add_parser("parallel", help="train a parallel feature head (EAGLE's, drafting a block in one forward)",
                         formatter_class=HelpFormatter, epilog=examples(
                             "python -m tinyspec train parallel      # from the shipped EAGLE head, reusing its sequences",
                             "python -m tinyspec train parallel --init-from none --steps 800   # from random weights"))
    add_self_distill_args(par, sequences=1024, run_dir="runs/eagle")
    add_feature_head_args(par, "runs/parallel/parallel.safetensors", depth=5)
    par.add_argument("--heads-from", default=str(WEIGHTS / "medusa.safetensors"), help="start the depth heads from "
                     "these Medusa heads ('none': new ones), with --init-from an EAGLE head")
    par.add_argument("--keep-eagle", action="store_true", help="train the Medusa heads only: depth 1 stays the "
                     "EAGLE head's own guess")
    par.set_defaults(init_from=str(WEIGHTS / "eagle.safetensors"))
    return ap


def add_feature_head_args(e, out: str, depth: int) -> None:
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
    e.add_argument("--out", default=out, help="the head; a .md card goes beside (copy both to weights/ to ship them)")


def add_self_distill_args(p, sequences: int, run_dir: str) -> None:
    """The flags of a head trained on the frozen target's own text (medusa, eagle)."""
    p.add_argument("--target", default=str(WEIGHTS / "target.safetensors"), help="the frozen target model")
    p.add_argument("--sequences", type=int, default=sequences, help="self-distilled training sequences to generate")
    p.add_argument("--prompt-len", type=int, default=32, help="corpus tokens that start each sequence")
    p.add_argument("--gen-len", type=int, default=224, help="tokens the target generates after each prompt")
    p.add_argument("--gen-batch", type=int, default=64, help="sequences generated at once")
    p.add_argument("--tokenizer", default=str(WEIGHTS / "tokenizer.tiktoken"), help="tiktoken ranks file")
    p.add_argument("--text", action="append", help=argparse.SUPPRESS)
    p.add_argument("--data-dir", default=str(data.data_home()), help="where token files are cached "
                   "(set TINYSPEC_HOME to move tinyspec's folder)")
    p.add_argument("--stdlib-only", action="store_true", help="prompts from the standard library alone (otherwise "
                   "the corpus with the pinned packages, downloaded once into --data-dir)")
    p.add_argument("--run-dir", default=run_dir, help="where self-distilled data (and checkpoints) are kept")
    p.add_argument("--force", action="store_true", help="allow replacing a shipped file in weights/, and (eagle, "
                   "parallel) starting over where --run-dir holds an earlier run's checkpoints (they are removed)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: all cores; on a shared machine use 1, see README)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the data and of the sampler")


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the card's "Reproduce" line: what followed `train`
    for name in ("steps", "batch_size", "block_size", "eval_every", "eval_batches", "vocab_size", "heads", "sequences",
                 "gen_len", "prompt_len", "gen_batch", "window", "checkpoint_every", "depth", "anchors"):
        if getattr(args, name, 1) is not None and getattr(args, name, 1) < 1:
            die(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if getattr(args, "warmup", 0) < 0:
        die(f"--warmup must be 0 or more steps, got {args.warmup}")
    for name in ("max_minutes", "lr"):  # None: not given (no time limit)
        if getattr(args, name, None) is not None and not getattr(args, name) > 0:
            die(f"--{name.replace('_', '-')} must be more than 0, got {getattr(args, name)}")
    try:
        {"tokenizer": train_tokenizer, "gpt": train_gpt, "medusa": train_medusa, "eagle": train_eagle,
         "parallel": train_eagle}[args.what](args)
    except (FileNotFoundError, ValueError) as e:
        die(str(e))


if __name__ == "__main__":
    run_main(main)
