"""The step ledger: where a step's time goes, without changing what the step does."""
import json

import pytest
import torch

from tinyspec import generate, medusa
from tinyspec.decoding import run
from tinyspec.kvcache import KVCache
from tinyspec.ledger import PARTS, Ledger
from tinyspec.methods import Decoder
from tinyspec.sampling import Sampling
from tinyspec.verify import RULES

from conftest import random_heads, random_tree
from test_eagle import random_head
from test_speculative import perturbed


@pytest.mark.parametrize("method", ["ar", "draft", "medusa", "eagle", "lookup", "lookahead"])
def test_the_ledger_splits_a_run_and_changes_nothing(counting_gpt, method):
    heads = random_head(counting_gpt, 1, 3.0) if method == "eagle" else random_heads(32, 3, seed=1)
    d = Decoder(counting_gpt, method, perturbed(counting_gpt, 0.5, 1) if method == "draft" else None, 3, heads,
                random_tree(10, 3, seed=0) if method == "medusa" else None, eagle_tree=(2, 3, 6))
    prompt, rules, truncate = [3, 5, 7, 9, 11], dict(RULES), KVCache.truncate
    plain = run(d.steps(prompt, Sampling(1.0), torch.Generator().manual_seed(0), 40), 40)
    ledger = Ledger(torch.device("cpu"))
    with ledger.watching(d):
        res = run(d.steps(prompt, Sampling(1.0), torch.Generator().manual_seed(0), 40), 40)
    assert res.token_ids == plain.token_ids  # the same draws, in the same order
    split = ledger.split(res.wall_s)
    assert set(split) == {*PARTS, "rest"} and all(s >= 0 for s in split.values())
    assert sum(ledger.seconds.values()) <= res.wall_s and split["target"] > 0
    assert (split["propose"] > 0) == (method != "ar") and (split["rule"] > 0) == (method != "ar")
    # everything wrapped is unwrapped again
    assert "hidden" not in vars(counting_gpt) and "forward" not in vars(heads) and dict(RULES) == rules
    assert KVCache.truncate is truncate and medusa.propose.__name__ == "propose" and not hasattr(medusa.propose, "__wrapped__")


def test_a_nested_call_counts_once_towards_the_outer_part():
    ledger = Ledger(torch.device("cpu"))
    inner = ledger.timed("target", lambda: sum(range(10000)))
    outer = ledger.timed("propose", lambda: inner() + inner())
    outer()
    assert ledger.seconds["propose"] > 0 and ledger.seconds["target"] == 0


def test_generate_profile_reports_the_split(tmp_path, capsys):
    from conftest import random_gpt
    random_gpt(vocab_size=8192, n_ctx=64, scale=4.0).save(tmp_path / "m.safetensors")
    generate.main(["--prompt", "def f(x):", "--max-new-tokens", "8", "--model", str(tmp_path / "m.safetensors"),
                   "--method", "lookup", "--profile", "--json"])
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert set(stats["ledger_s"]) == {*PARTS, "rest"} and sum(stats["ledger_s"].values()) == pytest.approx(stats["wall_s"], abs=1e-3)
