"""The same weights in Hugging Face transformers: the comparison a user makes before choosing us.

`GPT.to_hf` exports the target (and the draft) as GPT-2 checkpoints; `GPT2LMHeadModel.generate`
then decodes the same prompts plainly and with assisted generation (`assistant_model=`, its
draft-model speculative decoding). They run on the same device and dtype as tinyspec, get the
same warm-up and the median of the same number of passes, generate exactly as many tokens (no
stop token), and at temperature 0 must write the same tokens as tinyspec's greedy decoding,
which `same_as_tinyspec` counts (prompts, like the main table's `same`).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from contextlib import contextmanager

import torch

from ..results import run
from ..sampling import Sampling


@contextmanager
def quiet_transformers():
    """transformers' own notices are not ours to show: its assisted generation hands the assistant
    a generation config together with loose arguments, which its newer versions warn is deprecated
    (nothing in our call can change that), and loading weights draws progress bars."""
    from transformers.utils import logging
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        logging.enable_progress_bar()


def export(model, directory: str):
    """`model` as a transformers GPT2LMHeadModel on the same device and dtype, in eval mode."""
    import transformers

    model.to_hf(directory)
    w = model.lm_head.weight
    hf = transformers.GPT2LMHeadModel.from_pretrained(directory, dtype=w.dtype).to(w.device).eval()
    hf.generation_config.eos_token_id = None  # never stop early: every method writes the same count
    hf.generation_config.pad_token_id = model.config.vocab_size - 1
    return hf


@torch.no_grad()
def generate_all(hf, prompts, max_new_tokens: int, temperature: float, seed: int, **options):
    """(token lists, wall seconds) of one pass of `hf.generate` over the prompts; `options` go to
    generate (assistant_model=..., cache_implementation=...)."""
    device = hf.device
    outs, t0 = [], time.perf_counter()
    for i, prompt in enumerate(prompts):
        torch.manual_seed(seed + i)
        x = torch.tensor([prompt], device=device)
        kwargs = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
        y = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, **kwargs, **options)
        outs.append(y[0, len(prompt):].tolist())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return outs, time.perf_counter() - t0


def static_compiled():
    """generate's options for a static cache with the forward compiled ("reduce-overhead": CUDA
    graphs), transformers' own fast path (its generate compiles the step when it sees both)."""
    import transformers
    return dict(cache_implementation="static",
                compile_config=transformers.CompileConfig(fullgraph=True, mode="reduce-overhead"))


MODES = ("hf", "hf-assisted")  # and "hf-static-compiled" where it is asked for (CUDA: it compiles)


def huggingface_rows(target, draft, prompts: dict, temperatures, repeats: int, max_new: int, seed: int,
                     greedy_tokens, modes=MODES, rows: list | None = None) -> list[dict]:
    """Rows per mode, temperature and category: 'hf' (plain generate), 'hf-assisted' (with the
    draft), 'hf-static-compiled', appended to `rows` as each finishes (a Ctrl-C keeps those) and
    returned. greedy_tokens(prompt): tinyspec's greedy output, which HF's must match at temperature 0.
    A mode that fails (e.g. compilation) gives a row with its error."""
    rows = [] if rows is None else rows
    with tempfile.TemporaryDirectory() as tmp, quiet_transformers():
        hf = export(target, f"{tmp}/target")
        assistant = export(draft, f"{tmp}/draft") if draft is not None and "hf-assisted" in modes else None
        options = {"hf": {}, "hf-assisted": dict(assistant_model=assistant)}
        if "hf-static-compiled" in modes:
            options["hf-static-compiled"] = static_compiled()
        options = {m: o for m, o in options.items() if m in modes and (m != "hf-assisted" or assistant is not None)}
        first = next(iter(prompts.values()))[:1]
        broken = {}
        for mode, opts in options.items():  # warm-up (and compilation), once per mode
            try:
                generate_all(hf, first, max_new, temperatures[0], seed, **opts)
            except Exception as e:  # a peer's failure is a finding to report, not a crash of ours
                broken[mode] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append({"method": mode, "error": broken[mode]})
        for temperature in temperatures:
            for category, batch in prompts.items():
                greedy_ours = [greedy_tokens(p) for p in batch] if temperature == 0 else None
                for mode, opts in options.items():
                    if mode in broken:
                        continue
                    passes = [generate_all(hf, batch, max_new, temperature, seed, **opts) for _ in range(repeats)]
                    new_tokens = sum(map(len, passes[0][0]))
                    row = {"method": mode, "temperature": temperature, "category": category,
                           "tokens_per_s": round(statistics.median(new_tokens / s for _, s in passes), 2)}
                    if greedy_ours is not None:
                        row["same_as_tinyspec"] = sum(a == b for a, b in zip(passes[0][0], greedy_ours))
                    rows.append(row)
        return rows


def compare_with_huggingface(runner, prompts, temperatures, repeats, rows, modes=None, peers: list | None = None
                             ) -> list[dict]:
    """HF rows, each with tinyspec's speed over it, like for like (same temperature and category):
    ar over plain generate, and the draft method over assisted generation with the same draft
    (`draft:auto`, sized as assisted generation sizes its own; else the fastest draft row).
    They are appended to `peers` as each finishes: after a Ctrl-C (KeyboardInterrupt, raised on)
    it holds those, with their speedups."""
    peers = [] if peers is None else peers
    try:
        import transformers  # noqa: F401
    except ImportError:
        return peers

    def ours(prompt):  # tinyspec's greedy tokens, to compare with
        res = run(runner.decoder(("ar", "", None), Sampling(0.0)).steps(prompt, Sampling(0.0), None, runner.max_new))
        if res.stop_reason == "interrupted":  # decoding returns what it has on Ctrl-C: here it must stop the run
            raise KeyboardInterrupt
        return res.token_ids

    try:
        huggingface_rows(runner.target, runner.draft, prompts, temperatures, repeats, runner.max_new, runner.seed,
                         ours, modes or MODES, peers)
    finally:
        speedups(peers, rows)
    return peers


def speedups(peers: list[dict], rows: list[dict]) -> None:
    """Each HF row's `tinyspec_speedup`: the like-for-like tinyspec row's tokens/s over its own."""
    for peer in (p for p in peers if "error" not in p):
        same = [r for r in rows if r["temperature"] == peer["temperature"] and r["category"] == peer["category"]]
        if peer["method"] != "hf-assisted":
            ours = [r["tokens_per_s"] for r in same if r["method"] == "ar"]
        else:
            drafts = [r for r in same if r["method"] == "draft:auto"] or \
                [r for r in same if r["method"].split(":")[0] == "draft" and "@" not in r["method"]]
            ours = [r["tokens_per_s"] for r in drafts]
        peer["tinyspec_speedup"] = round(max(ours) / peer["tokens_per_s"], 3) if ours else None
