"""Training heads on a frozen target (`python -m tinyspec train medusa|eagle|parallel`): the target writes
its own text (self-distillation, `distill.self_distill`), cached once per target and shape, the
heads learn from it (`distill.train_heads`, `distill.train_eagle`), and a model card beside the
weights records the data, the curve and the held-out accuracy.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..files import atomic_write_text, shown
from ..methods import Decoder
from ..methods.eagle import Eagle, EagleHead
from ..methods.medusa import MedusaHeads
from ..methods.parallel import Parallel, ParallelHead
from ..model import GPT
from ..results import run
from ..sampling import Sampling
from ..tree import expected_accepted, from_accuracies
from . import corpus, distill
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .optim import check_weights


@dataclass
class SelfDistilled:
    """The target's own text that heads learn from (the flags of `train medusa|eagle|parallel` of the same
    names): `sequences` sequences, each a `prompt_len`-token window of the corpus's training split
    (`corpus.prepare` with these `tokenizer`, `data_dir`, `text`, `stdlib_only`) and `gen_len` tokens
    the target writes after it, `gen_batch` at a time."""
    sequences: int
    prompt_len: int
    gen_len: int
    gen_batch: int
    seed: int
    tokenizer: str
    data_dir: str
    text: list[str] | None
    stdlib_only: bool


@dataclass
class FeatureHeadRun:
    """How a head on the target's features learns (`train eagle|parallel`'s flags of the same names),
    and where it started, for its card: `init_from` (a head's file, or None: random weights),
    `heads_from` (the Medusa heads a parallel head's depths started from), `keep_eagle`."""
    steps: int
    batch_size: int
    lr: float
    noise: float
    ce_weight: float
    checkpoint_every: int
    depth: int
    anchors: int
    save_dtype: str
    resume: bool
    init_from: str | None
    heads_from: str | None
    keep_eagle: bool


# ---- Medusa heads ---------------------------------------------------------------------------

def distilled(target: GPT, enc, data: SelfDistilled, run_dirs: list[Path], split: str, n: int,
              temperatures: list[float]) -> np.ndarray:
    """Self-distilled sequences (`distill.self_distill`), generated once and cached: read from the
    first of `run_dirs` that holds them for this target and shape, else made and written to the first."""
    width = data.prompt_len + data.gen_len
    name = f"selfdistill-{split}-{target.fingerprint()}-{n}x{width}.bin"
    for d in run_dirs:
        if (d / name).is_file():
            return np.fromfile(d / name, dtype=np.uint16).reshape(-1, width)
    tokens = corpus.TokenFile(corpus.prepare(enc, Path(data.tokenizer), Path(data.data_dir), data.text,
                                             packages=not data.stdlib_only) / f"{split}.bin")
    parts = [distill.self_distill(target, tokens, n // len(temperatures), data.prompt_len, data.gen_len,
                                  data.gen_batch, t, seed=data.seed + i) for i, t in enumerate(temperatures)]
    seqs = np.concatenate(parts)
    path = run_dirs[0] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    seqs.tofile(path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
    return seqs


def train_medusa(target: GPT, enc, data: SelfDistilled, run_dir: Path, out: Path, n_heads: int, steps: int,
                 batch_size: int, lr: float, window: int, target_path: str, argv: list[str]) -> None:
    """`n_heads` Medusa heads for the frozen `target`, trained on its own text (cached in `run_dir`),
    saved to `out` with a card beside them. target_path and argv (the command line after `python -m
    tinyspec train`) are for the card."""
    train_seqs = distilled(target, enc, data, [run_dir], "train", data.sequences, [0.0, 1.0])  # greedy and sampled
    heldout = distilled(target, enc, data, [run_dir], "val", max(16, data.sequences // 32), [0.0])
    heads = MedusaHeads(target.config.n_embd, n_heads).to(target.lm_head.weight.device)
    losses = distill.train_heads(target, heads, train_seqs, data.prompt_len, steps, batch_size, lr, data.seed,
                                 window=window)
    check_weights(heads, steps)
    heads.accuracy = distill.head_accuracy(target, heads, heldout, data.prompt_len)
    heads.target_fingerprint = target.fingerprint()
    heads.save(out)
    acc = heads.accuracy
    rows = "\n".join(f"| {i + 1} | {losses[i]:.3f} | {acc[i, 0]:.3f} | {acc[i, :5].sum():.3f} |" for i in range(heads.n_heads))
    sizes = "\n".join(f"| {n} | {from_accuracies(acc, n).max_depth} | {1 + expected_accepted(from_accuracies(acc, n), acc):.2f} |"
                      for n in (8, 16, 32, 64))
    atomic_write_text(out.with_suffix(".md"), f"""# {out.stem}

- {heads.n_heads} Medusa heads (ResBlock + the target's shared, frozen LM head) for `{shown(target_path)}`
  (fingerprint {heads.target_fingerprint}; loading them on another target is refused)
- data: {len(train_seqs)} self-distilled sequences ({data.prompt_len}-token prompts from the stdlib train split, {data.gen_len}
  tokens generated by the target, half greedy, half at temperature 1): {train_seqs.size / 1e6:.2f}M tokens
- training: {steps} steps of {batch_size} sequences ({window}-position windows), AdamW lr {lr}, loss weights 0.8^i,
  soft labels (the target's own next-token distributions)
- held-out: {len(heldout)} greedy continuations of validation-split prompts

| head (guesses x_t+1+i) | final train loss | top-1 accuracy | top-5 accuracy |
|---|---|---|---|
{rows}

Accuracy = how often the head's guess is the target's greedy token, measured on held-out text.
Trees built from these accuracies (`tree.from_accuracies`) and the tokens per target forward
they promise if heads were right independently (1 + expected accepted nodes):

| nodes | depth | predicted tau |
|---|---|---|
{sizes}

Reproduce: `python -m tinyspec train {' '.join(argv)}`
""")
    print(f"saved {out} and its card {out.with_suffix('.md')}; top-1 accuracy per head: {[round(a, 3) for a in acc[:, 0].tolist()]}")


# ---- EAGLE head -----------------------------------------------------------------------------

def train_eagle(target: GPT, head, enc, data: SelfDistilled, run_dir: Path, caches: list[Path], out: Path,
                settings: FeatureHeadRun, target_path: str, argv: list[str]) -> None:
    """Train `head` (an EAGLE head or a parallel head, on the frozen `target`'s device) on the
    target's own text (read from the first of `caches` that holds it, else made and kept in the
    first), checkpointing in `run_dir`/checkpoints (continuing the last with `settings.resume`); save it
    to `out` with a card beside it. target_path and argv are for the card. ValueError: the
    checkpoint is of another run's shape (the command says it in one line)."""
    device, kind, ckpt_dir = target.lm_head.weight.device, type(head), run_dir / "checkpoints"
    t0 = time.time()
    train_seqs = distilled(target, enc, data, caches, "train", data.sequences, [0.0, 1.0])  # greedy and sampled
    heldout = distilled(target, enc, data, caches, "val", max(16, data.sequences // 32), [0.0])
    features = distill.target_features(target, train_seqs)
    data_minutes = (time.time() - t0) / 60
    seconds = {"before": 0.0, "start": time.time()}

    def resume(opt, g):
        state = load_checkpoint(latest_checkpoint(ckpt_dir), head, opt, g, device, read=lambda p: kind.load(p).state_dict())
        if state["args"]["steps"] != settings.steps or state["args"]["batch_size"] != settings.batch_size:
            raise ValueError(f"--resume: the checkpoint in {ckpt_dir} is of another --steps/--batch-size; drop --resume "
                             "or change --run-dir")
        seconds["before"] = state["train_seconds"]
        print(f"resuming from step {state['step']}")
        return state["step"], state["curve"]

    def checkpoint(step, opt, g, curve):
        check_weights(head, step)  # a checkpoint holds the last good weights, never a diverged run's
        save_checkpoint(ckpt_dir, head, opt, g, {"step": step, "curve": curve, "args": asdict(settings),
                        "train_seconds": round(seconds["before"] + time.time() - seconds["start"], 1)})

    curve = distill.train_eagle(target, head, train_seqs, features, settings.steps, settings.batch_size, settings.lr, settings.noise,
                                settings.ce_weight, data.seed, resume=resume if settings.resume else None, checkpoint=checkpoint,
                                every=settings.checkpoint_every, depth=settings.depth, anchors=settings.anchors)
    train_minutes = (seconds["before"] + time.time() - seconds["start"]) / 60
    head.save(out, torch.bfloat16 if settings.save_dtype == "bfloat16" else None)
    head = kind.load(out, device)  # measured as shipped (rounded to --save-dtype)
    print(f"measuring the saved head's top-1 accuracy per depth on {len(heldout)} held-out sequences ...", flush=True)
    head.accuracy = distill.eagle_accuracy(target, head, heldout, data.prompt_len,
                                           head.block_size if kind is ParallelHead else 5)
    head.save(out, torch.bfloat16 if settings.save_dtype == "bfloat16" else None)
    method, size = (Parallel, f"1,{head.block_size},{head.block_size}") if kind is ParallelHead else (Eagle, CARD_SIZE)
    print(f"decoding {min(16, len(heldout))} held-out prompts with {method.name} at size {size} for the card's tau ...",
          flush=True)
    tau = held_out_tau(target, method(target, head), size, heldout, data.prompt_len)
    where = f"CPU ({platform.machine()}, {torch.get_num_threads()} thread(s))" if device.type == "cpu" else torch.cuda.get_device_name(device)
    acc = head.accuracy
    chain = [1.0]
    for a in acc:
        chain.append(chain[-1] * a)
    rows = "\n".join(f"| {c['step']} | {c['smooth_l1']:.4f} | {c['ce']:.3f} | "
                     f"{' / '.join(f'{x:.2f}' for x in c.get('ce_per_depth', [c['ce']]))} |" for c in curve)
    what = (f"parallel feature head (EAGLE's fc 2C -> C and one GPT-2 block, {head.block_size - 1} Medusa heads on its "
            f"predicted feature: one forward drafts {head.block_size} tokens" if kind is ParallelHead else
            "EAGLE draft head (fc 2C -> C, one GPT-2 block")
    started = f"started from `{shown(settings.init_from)}`" if settings.init_from else "started from random weights"
    if kind is ParallelHead and settings.init_from:
        started += f" and `{shown(settings.heads_from)}`" if settings.heads_from else " and new Medusa heads"
    if settings.keep_eagle:
        started += " (the EAGLE head kept as it was: only the Medusa heads trained)"
    parallel = kind is ParallelHead  # its heads do not read the tokens above them: a chain's chance is no product
    chain_text = "" if parallel else ", and the chance that a chain of top-1 guesses is\naccepted that far (their product)"
    chain_row = "" if parallel else f"| chain accepted | {' | '.join(f'{c:.3f}' for c in chain[1:])} |\n"
    depth_reads = ("Medusa head d - 1 on depth 1's predicted feature" if kind is ParallelHead else
                   "d - 1 of the head's own predicted features")
    reads = "depth 1's predicted feature" if kind is ParallelHead else "the head's own predicted features"
    where_trained = "every position" if kind is ParallelHead else f"{settings.anchors} positions per sequence"
    unrolled = (f"; depths 2..{settings.depth} trained on what they read when decoding ({reads}) at {where_trained}"
                if settings.depth > 1 else "")
    atomic_write_text(out.with_suffix(".md"), f"""# {out.stem}

- {what}; the target's frozen embedding and LM head) for
  `{shown(target_path)}` (fingerprint {head.target_fingerprint}; loading it on another target is refused);
  {sum(p.numel() for p in head.parameters()):,} parameters, stored as {settings.save_dtype}
- data: {len(train_seqs)} self-distilled sequences ({data.prompt_len}-token prompts from the stdlib train split, {data.gen_len}
  tokens generated by the target, half greedy, half at temperature 1): {train_seqs.size / 1e6:.2f}M tokens; generating
  them and the target's features took {data_minutes:.1f} minutes (less when cached)
- training: {settings.steps} steps of {settings.batch_size} sequences (every pair), AdamW lr {settings.lr}, loss SmoothL1(features)
  + {settings.ce_weight} x CE(target's distribution) per depth, input noise U(-{settings.noise}, {settings.noise}){unrolled}; {started};
  {train_minutes:.1f} minutes on {where}
- held-out: {len(heldout)} greedy continuations of validation-split prompts

| step | SmoothL1 (mean since last row) | cross-entropy | cross-entropy per depth |
|---|---|---|---|
{rows}

Held-out top-1 accuracy per draft depth (depth d reads {depth_reads}; the tokens before it are the target's){chain_text}:

| depth | {' | '.join(str(d + 1) for d in range(len(acc)))} |
|---|{'---|' * len(acc)}
| top-1 accuracy | {' | '.join(f'{a:.3f}' for a in acc)} |
{chain_row}
Greedy decoding of the held-out prompts (first {data.prompt_len} tokens of each, 64 new tokens, EAGLE-2's
tree of size {size} (TOPK,DEPTH,NODES)): tau = {tau:.2f} tokens per target forward (bonus token included).

Reproduce: `python -m tinyspec train {' '.join(a for a in argv if a != '--resume')}`
""")
    print(f"saved {out} and its card {out.with_suffix('.md')}; accuracy per depth {[round(a, 3) for a in acc]}, tau {tau:.2f}")


CARD_SIZE = "2,6,16"  # the tree the card's tau is measured with (the same for every head, so cards compare)


@torch.no_grad()
def held_out_tau(target: GPT, method, size: str, sequences: np.ndarray, prompt_len: int, n: int = 16) -> float:
    """Tokens per target forward of greedy decoding with `method` (an EAGLE-like head) at `size` on held-out prompts."""
    tokens = steps = 0
    decoder = Decoder(target, method, size)
    for seq in sequences[:n]:
        res = run(decoder.steps(seq[:prompt_len].tolist(), Sampling(0.0), None, 64))
        tokens, steps = tokens + len(res.token_ids), steps + res.target_steps
    return tokens / steps
