"""The step ledger: where a step's time goes, without changing what the step does."""
import json

import pytest
import torch

from tinyspec.commands import generate
from tinyspec.decoding import NO_CLOCK
from tinyspec.results import run
from tinyspec.kvcache import KVCache
from tinyspec.methods import Decoder
from tinyspec.methods.draft import DraftModel
from tinyspec.methods.eagle import Eagle
from tinyspec.methods.lookahead import Lookahead
from tinyspec.methods.lookup import PromptLookup
from tinyspec.methods.medusa import Medusa
from tinyspec.sampling import Sampling
from tinyspec.speed.ledger import PARTS, Ledger
from tinyspec.verify import RULES

from conftest import random_heads, random_tree
from test_eagle import random_head
from test_speculative import perturbed


@pytest.mark.parametrize("method", ["ar", "draft", "medusa", "eagle", "lookup", "lookahead"])
def test_the_ledger_splits_a_run_and_changes_nothing(counting_gpt, method):
    """The parts of a step are timed apart (they never overlap: together they fit in the run's
    wall time), and watching a decoder changes none of its draws."""
    t = counting_gpt
    proposer, size = {
        "ar": lambda: (None, None),
        "draft": lambda: (DraftModel(t, perturbed(t, 0.5, 1)), "3"),
        "medusa": lambda: (Medusa(t, random_heads(32, 3, seed=1), tree=random_tree(10, 3, seed=0)), None),
        "eagle": lambda: (Eagle(t, random_head(t, 1, 3.0)), "2,3,6"),
        "lookup": lambda: (PromptLookup(t), "3"),
        "lookahead": lambda: (Lookahead(t), None),
    }[method]()
    d = Decoder(t, proposer, size)
    prompt, rules, truncate = [3, 5, 7, 9, 11], dict(RULES), KVCache.truncate
    plain = run(d.steps(prompt, Sampling(1.0), torch.Generator().manual_seed(0), 40))
    ledger = Ledger(torch.device("cpu"))
    with ledger.watching(d):
        res = run(d.steps(prompt, Sampling(1.0), torch.Generator().manual_seed(0), 40))
    assert res.token_ids == plain.token_ids  # the same draws, in the same order
    split = ledger.split(res.wall_s)
    assert set(split) == {*PARTS, "rest"} and all(s >= 0 for s in split.values())
    assert sum(ledger.seconds.values()) <= res.wall_s and split["target"] > 0
    assert (split["propose"] > 0) == (method != "ar") and (split["rule"] > 0) == (method != "ar")
    # the decoder is as it was: nothing of the ledger stays behind
    assert d.clock is NO_CLOCK and dict(RULES) == rules and KVCache.truncate is truncate


def test_generate_profile_reports_the_split(tmp_path, capsys):
    from conftest import random_gpt
    random_gpt(vocab_size=8192, n_ctx=64, scale=4.0).save(tmp_path / "m.safetensors")
    generate.main(["--prompt", "def f(x):", "--max-new-tokens", "8", "--model", str(tmp_path / "m.safetensors"),
                   "--method", "lookup", "--profile", "--json"])
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert set(stats["ledger_s"]) == {*PARTS, "rest"} and sum(stats["ledger_s"].values()) == pytest.approx(stats["wall_s"], abs=1e-3)
