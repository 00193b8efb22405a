"""`python -m tinyspec data`: the training corpus, the benchmark prompts and --method rest's datastore
(`training/corpus.py` makes each; this file checks the flags and the paths first, and prints).

    python -m tinyspec data                  # download, tokenize, print the data card
    python -m tinyspec data --stdlib-only    # the standard library alone (nothing downloaded)
    python -m tinyspec data prompts --force  # regenerate tinyspec/prompts.jsonl (a shipped file)
    python -m tinyspec data third-party-prompts --force   # prompts of code no model has read
    python -m tinyspec data datastore --stdlib-only   # --method rest's datastore, a million tokens
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..files import atomic_write_text, home
from ..training import corpus
from .cli import (WEIGHTS, ArgumentParser, HelpFormatter, check_destination, check_output, die, examples, load_encoding,
                  run_main, shown)


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec data", description="build the training corpus: the standard library "
                        "and the pinned packages' sources, downloaded once with pip, deduplicated, split by whole modules "
                        "and tokenized; or regenerate the benchmark prompts", formatter_class=HelpFormatter,
                        epilog=examples(*[line.strip() for line in __doc__.split("\n\n")[1].splitlines()]))
    ap.add_argument("what", nargs="?", choices=["corpus", "prompts", "third-party-prompts", "datastore"],
                    default="corpus", help="what to build: the corpus, the standard library's benchmark prompts, "
                    "prompts of held-out third-party packages (HELD_OUT_PACKAGES, downloaded with pip), or the "
                    "datastore --method rest retrieves from (whole modules of the corpus's training split, with a "
                    "card beside it)")
    ap.add_argument("--data-dir", default=str(corpus.data_home()), help="where the wheels and token files are kept "
                    "(set TINYSPEC_HOME to move tinyspec's folder)")
    ap.add_argument("--tokenizer", default=str(WEIGHTS / "tokenizer.tiktoken"),
                    help="tiktoken ranks file the tokens are made with")
    ap.add_argument("--stdlib-only", action="store_true", help="leave the packages out (nothing is downloaded)")
    ap.add_argument("--tokens", type=int, default=1_000_000, help="datastore: about this many tokens of whole "
                    "training modules, drawn at random with a fixed seed")
    ap.add_argument("--out", help="datastore: where to write it (default: datastore.safetensors in tinyspec's "
                    "folder, $TINYSPEC_HOME; weights/datastore.safetensors is the shipped one: --force to replace it)")
    ap.add_argument("--force", action="store_true", help="replace a shipped file: the benchmark prompts "
                    "(prompts, third-party-prompts rewrite tinyspec/prompts*.jsonl, which a clone tracks), or "
                    "weights/datastore.safetensors")
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.what != "prompts":  # the wheels and token files go there: tried before any download
        check_output(args.data_dir, "--data-dir", directory=True)
    if args.what in ("prompts", "third-party-prompts") and not args.force:  # a clone's tracked file, in place
        shipped = corpus.PROMPTS if args.what == "prompts" else corpus.THIRD_PARTY_PROMPTS
        die(f"data {args.what} rewrites {shown(shipped)}, the benchmark prompts tinyspec ships: pass --force to "
            "replace it")
    if args.what == "third-party-prompts":
        counts = corpus.write_third_party_prompts(corpus.THIRD_PARTY_PROMPTS, Path(args.data_dir) / "wheels")
        print(f"{counts} prompts from {', '.join(corpus.HELD_OUT_PACKAGES)} -> {corpus.THIRD_PARTY_PROMPTS}")
        return
    if args.what == "prompts":
        counts = corpus.write_prompts(corpus.PROMPTS)
        print(f"{counts} prompts from {len(corpus.stdlib_modules('bench'))} held-out modules -> {corpus.PROMPTS}")
        return
    enc = load_encoding(args.tokenizer)
    if args.what == "datastore":
        if args.tokens < 1000:
            die(f"--tokens must be at least 1000, got {args.tokens}")
        destination = check_destination(home() / "datastore.safetensors" if args.out is None else args.out, args.force)
    out = corpus.prepare(enc, Path(args.tokenizer), Path(args.data_dir), packages=not args.stdlib_only)
    if args.what == "datastore":
        store = corpus.make_datastore(out, args.tokens, enc.eot_token)
        store.card["lookup_us"] = corpus.lookup_time(store, enc)
        store.save(destination, with_order=store.card["tokens"] > 2_000_000)  # a small one sorts again at load
        card, carded = destination.with_suffix(".md"), False
        command = f"python -m tinyspec data datastore --tokens {args.tokens}" + " --stdlib-only" * args.stdlib_only + \
            (f" --out {shown(destination)}" if args.out is not None else "")
        try:
            atomic_write_text(card, corpus.datastore_card(store, destination, command))
            carded = True
            print(card.read_text() + f"\nsaved {destination}")
        except KeyboardInterrupt:  # the datastore is whole and in place: say so
            print(f"\n[interrupted] saved {destination}" + ("" if carded else f"; its card {card} was not written"),
                  file=sys.stderr)
            raise SystemExit(130)
        return
    print((out / "CORPUS.md").read_text() + f"\ntoken files and meta.json in {out}")


if __name__ == "__main__":
    run_main(main)
