"""A GPT's training run, as nanoGPT trains one: random windows of the token file, AdamW (beta2 0.95,
weight decay on matrices only, `optim.py`), linear warm-up then cosine decay to 10% of the peak
learning rate, gradient clipping at 1.0, bf16 autocast on a GPU. Every `eval_every` steps it measures
the validation loss and saves a checkpoint (model, optimizer, data-sampler state, `checkpoint.py`)
in the run's folder, from which a resumed run continues exactly. At the end the weights are saved and
a model card beside them (.md) records what was trained, on what, for how long, and how well.

A draft is trained the same way, on the target's next-token distributions instead of the corpus's
tokens (knowledge distillation: `teacher`).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..files import atomic_write_text, shown
from ..model import GPT
from ..progress import progress_bar
from .checkpoint import Budget, latest_checkpoint, load_checkpoint, save_checkpoint, saved_state, uninterrupted
from .corpus import TokenFile
from .optim import Diverged, check_finite, check_weights, lr_at, make_optimizer

# The longest context `train gpt` accepts: attention costs n_ctx^2 per layer and the learned position
# table has n_ctx rows, and GPT-2 itself stops at 1024; beyond a few thousand nothing trains here.
MAX_N_CTX = 8192


@dataclass
class Settings:
    """How a GPT trains (`python -m tinyspec train gpt`'s flags of the same names), and what its card
    says of where it started: `text` (extra training text), `init_from` (the weights it started
    from), `distill_from` (the teacher), `argv` (the command line after `python -m tinyspec train`)."""
    preset: str
    steps: int
    batch_size: int
    block_size: int
    lr: float
    warmup: int
    weight_decay: float
    eval_every: int
    eval_batches: int
    seed: int
    keep_best: bool
    max_minutes: float | None
    bf16: bool
    compile: bool
    save_dtype: str
    text: list[str] | None
    init_from: str | None
    distill_from: str | None
    argv: list[str]


@torch.no_grad()
def evaluate(model: GPT, tokens: TokenFile, batches: int, batch_size: int, block_size: int, device,
             autocast) -> float:
    """Mean validation loss over `batches` fixed windows (same windows every time)."""
    model.eval()
    g = torch.Generator().manual_seed(1234)
    losses = []
    for _ in range(batches):
        x, y = (t.to(device) for t in tokens.batch(batch_size, block_size, g))
        with autocast:
            logits, _ = model(x)
        losses.append(torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten()).item())
    model.train()
    return sum(losses) / len(losses)


def train_gpt(model: GPT, corpus: Path, run_dir: Path, out: Path, settings: Settings, budget: Budget, device,
              teacher: GPT | None = None, resume: bool = False) -> None:
    """Train `model` on the token files in `corpus` (`corpus.prepare`), checkpointing in `run_dir`
    (continuing its last checkpoint, of the same config, with `resume`), on `teacher`'s next-token
    distributions if given; save it to `out` with its model card beside. ValueError: the corpus's
    splits are shorter than a training window (the command says it in one line)."""
    config = model.config
    opt = make_optimizer(model, settings.lr, settings.weight_decay)
    data_rng = torch.Generator().manual_seed(settings.seed)
    step, tokens_seen, history, seconds_before = 0, 0, [], 0.0
    if resume:
        state = load_checkpoint(latest_checkpoint(run_dir), model, opt, data_rng, device)
        step, tokens_seen, history = state["step"], state["tokens_seen"], state["history"]
        seconds_before = state.get("train_seconds", 0.0)
        print(f"resuming from step {step} ({tokens_seen / 1e6:.1f}M tokens seen)")

    meta = json.loads((corpus / "meta.json").read_text())
    train_tokens = TokenFile(corpus / "train.bin")
    # validation on the standard library's held-out modules (comparable with every earlier target) and,
    # where the corpus has them, the packages'
    val_sets = {name: TokenFile(corpus / f"{name}.bin") for name in ("val", "val-packages")
                if meta.get(name, {}).get("tokens", 0) > settings.block_size + 1}
    if len(train_tokens) <= settings.block_size + 1 or "val" not in val_sets:
        raise ValueError(f"a training window of {settings.block_size} tokens does not fit the corpus splits "
                         f"({len(train_tokens)} and {meta['val']['tokens']} tokens): use a smaller --block-size or "
                         "--n-ctx")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=settings.bf16 or device.type == "cuda")
    step_fn = torch.compile(model) if settings.compile else model  # compile only the step; `model` stays plain
    tokens_per_step = settings.batch_size * settings.block_size
    print(f"{settings.preset}: {model.num_params() / 1e6:.2f}M parameters, {settings.steps} steps x {tokens_per_step} "
          f"tokens on {device} (train split: {meta['train']['tokens'] / 1e6:.1f}M tokens)")

    def checkpoint(losses=None):
        """A checkpoint of this step; with `losses`, of its validation too (the curve's next point)."""
        if losses is not None:
            history.append({"step": step, "tokens_seen": tokens_seen} | {k: round(v, 4) for k, v in losses.items()})
        save_checkpoint(run_dir, model, opt, data_rng, {"step": step, "tokens_seen": tokens_seen,
                        "config": asdict(config), "history": history, "args": asdict(settings),
                        "train_seconds": round(seconds_before + time.time() - t_start, 1)})

    def validate():
        t0 = time.time()
        losses = {"val_loss" if name == "val" else "val_packages":
                  evaluate(model, tokens, settings.eval_batches, settings.batch_size, settings.block_size, device, autocast)
                  for name, tokens in val_sets.items()}
        val = losses["val_loss"]
        for value in losses.values():  # a model that diverged is never checkpointed
            check_finite(value, step, "validation loss")
        check_weights(model, step)
        budget.eval_s = time.time() - t0
        bar.write(f"step {step}: train loss {loss.item():.3f}, val loss {val:.3f}" +
                  (f" (packages {losses['val_packages']:.3f})" if "val_packages" in losses else ""))
        if settings.keep_best and val <= min((h["val_loss"] for h in history), default=float("inf")):
            model.save(run_dir / "best.safetensors")  # many epochs over a small corpus overfit: keep the best
        checkpoint(losses)

    t_start = time.time()
    bar = progress_bar(total=settings.steps, initial=step, desc="training", dynamic_ncols=True)
    model.train()
    out_of_time, loss, sampler = False, torch.tensor(float("nan")), None
    try:
        while step < settings.steps:
            if not budget.room_for_a_step():
                out_of_time = True
                break
            for group in opt.param_groups:
                group["lr"] = lr_at(step, settings.steps, settings.lr, settings.warmup)
            sampler = data_rng.get_state()  # put back if Ctrl-C comes before this step is taken
            x, y = (t.to(device, non_blocking=True)
                    for t in train_tokens.batch(settings.batch_size, settings.block_size, data_rng))
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
            check_finite(loss.item(), step + 1)  # before the step: the weights are still the last good ones
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with uninterrupted():  # a step is taken whole or not at all
                opt.step()
                step, tokens_seen, sampler = step + 1, tokens_seen + tokens_per_step, None
            bar.update(1)
            budget.step_s = time.time() - t0
            bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tokens_per_step / budget.step_s:.0f}")
            if step % settings.eval_every == 0 or step == settings.steps:
                validate()
        if not history or history[-1]["step"] != step:  # stopped between validations: validate and checkpoint here
            validate()
    except Diverged:
        bar.close()  # the error that follows gets a line of its own
        raise
    except KeyboardInterrupt:
        bar.close()
        if sampler is not None:  # the step under way was not taken: its batch is drawn again on --resume
            data_rng.set_state(sampler)
        kept = latest_checkpoint(run_dir)
        if step and (kept is None or saved_state(kept)["step"] != step) and all(
                torch.isfinite(p).all() for p in model.parameters()):  # the steps since the last checkpoint are kept
            checkpoint()
            kept = latest_checkpoint(run_dir)
        said = f"step {saved_state(kept)['step']}'s checkpoint is in {kept}: --resume continues from it ({out} " \
            "was not written)" if kept else "nothing was saved (stopped before the first step)"
        print(f"\n[interrupted] {said}", file=sys.stderr)
        raise SystemExit(130) from None
    if out_of_time:
        bar.write(f"--max-minutes {settings.max_minutes}: stopped at step {step}, before a step and validation would "
                  f"pass it (a step takes {budget.step_s:.1f}s here); --resume continues")
    bar.close()
    if settings.keep_best:
        model.load_state_dict(GPT.from_hf(run_dir / "best.safetensors", device=device).state_dict())
    model.save(out, dtype=torch.bfloat16 if settings.save_dtype == "bfloat16" else None)
    write_card(out.with_suffix(".md"), settings, model, meta, history, device, seconds_before + time.time() - t_start)
    print(f"saved {out} and its model card {out.with_suffix('.md')}")


def write_card(path: Path, settings: Settings, model: GPT, meta: dict, history: list[dict], device,
               seconds: float) -> None:
    """The model card: what this checkpoint is and how to make it again (figures from this run)."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s))"
    last = history[-1] if history else {"tokens_seen": 0, "val_loss": float("nan"), "step": 0}
    best = min(history, key=lambda h: h["val_loss"]) if history else last
    kept = f"- kept: the weights of step {best['step']}, the best validation loss ({best['val_loss']:.3f}; --keep-best)\n" \
        if settings.keep_best else ""
    flags = " ".join(a for a in settings.argv if a != "--resume")
    curve = "\n".join(f"| {h['step']} | {h['tokens_seen'] / 1e6:.1f}M | {h['val_loss']:.3f} | "
                      f"{h['val_packages']:.3f} |" if "val_packages" in h else
                      f"| {h['step']} | {h['tokens_seen'] / 1e6:.1f}M | {h['val_loss']:.3f} | - |" for h in history)
    atomic_write_text(path, f"""# {path.stem}

- preset: `{settings.preset}` {json.dumps(asdict(model.config))}
- parameters: {model.num_params() / 1e6:.2f}M ({model.num_params():,}; the LM head is tied to the token embedding)
- data: {' and '.join(sorted(meta.get('sources', {'stdlib': 0}), key=lambda n: n != 'stdlib'))}, train split
  ({meta['train']['documents']} modules, {meta['train']['tokens'] / 1e6:.1f}M tokens{', plus --text ' + ', '.join(settings.text) if settings.text else ''});
  validation: the standard library's {meta['val']['documents']} held-out modules ({meta['val']['tokens'] / 1e6:.2f}M tokens)
  {f"and the packages' {meta['val-packages']['documents']} ({meta['val-packages']['tokens'] / 1e6:.2f}M tokens)" if meta.get('val-packages', {}).get('documents') else ''}
  (`tinyspec/training/corpus.py`; every source's version, licence and tokens: `python -m tinyspec data`){f"; started from `{shown(settings.init_from)}`" if settings.init_from else ''}
- objective: {'distillation from `' + settings.distill_from + '`: cross-entropy against its next-token distributions' if settings.distill_from else 'next-token cross-entropy on the corpus'}
- trained on: {where}, {seconds / 60:.0f} minutes (resumed runs summed), bf16 autocast: {settings.bf16 or device.type == 'cuda'}
- steps: {last['step']} of batch {settings.batch_size} x {settings.block_size} tokens; tokens seen: {last['tokens_seen'] / 1e6:.1f}M
- final validation loss: {last['val_loss']:.3f} nats/token
{kept}- stored as: {settings.save_dtype}, Hugging Face GPT-2 tensor names (`GPT.from_hf`, `model.to_hf`)

Reproduce: `python -m tinyspec train {flags}`

| step | tokens seen | validation loss (stdlib) | validation loss (packages) |
|---|---|---|---|
{curve}
""")
