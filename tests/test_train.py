"""Data split and training: the loss must fall, and --resume must continue exactly."""
import json

import pytest
import torch

from tinyspec.commands import data, train
from tinyspec.training import checkpoint, corpus, optim
from tinyspec.commands.cli import WEIGHTS
from tinyspec.model import GPT
from tinyspec.tokenizer import load_tokenizer

from conftest import ctrl_c, random_gpt, refused


def test_split_is_by_whole_module_and_stable():
    splits = {s: corpus.stdlib_modules(s) for s in ("train", "val", "bench")}
    names = {s: {p.relative_to(corpus.STDLIB).as_posix() for p in files} for s, files in splits.items()}
    assert not (names["train"] & names["val"]) and not (names["train"] & names["bench"]) and not (names["val"] & names["bench"])
    total = sum(map(len, names.values()))
    assert 0.02 < len(names["val"]) / total < 0.07 and 0.02 < len(names["bench"]) / total < 0.07
    assert corpus.split_of("email/parser.py") == corpus.split_of("email/parser.py")


def test_batches_are_shifted_windows(tmp_path):
    import numpy as np
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "t.bin")
    x, y = corpus.TokenFile(tmp_path / "t.bin").batch(4, 10, torch.Generator().manual_seed(0))
    assert x.shape == (4, 10) and torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(x[:, 0] + 1, y[:, 0])


def tiny_run(data_dir, run_dir, steps, extra=()):
    argv = ["gpt", "--preset", "tiny", "--steps", str(steps), "--batch-size", "8", "--lr", "3e-3", "--warmup", "5",
            "--eval-every", "10", "--eval-batches", "2", "--data-dir", str(data_dir), "--stdlib-only",
            "--run-dir", str(run_dir), "--out", str(run_dir / "out.safetensors"), *extra]
    train.main(argv)
    return json.loads((checkpoint.latest_checkpoint(run_dir) / "state.json").read_text())


@pytest.mark.slow
def test_tiny_training_lowers_validation_loss_and_resume_is_exact(corpus_dir, tmp_path):
    straight = tiny_run(corpus_dir, tmp_path / "a", 40)
    losses = [h["val_loss"] for h in straight["history"]]
    assert losses[-1] < losses[0] - 0.5, losses  # 40 steps take a random model well below ln(8192) = 9.0
    card = (tmp_path / "a" / "out.md").read_text()
    assert "tiny" in card and f"{losses[-1]:.3f}" in card

    tiny_run(corpus_dir, tmp_path / "b", 40, ["--max-minutes", "1e-9"])  # stops after its first step
    resumed = tiny_run(corpus_dir, tmp_path / "b", 40, ["--resume"])
    assert resumed["step"] == 40 and len(list((tmp_path / "b").glob("step-*"))) == 1  # older checkpoints removed
    a, b = (GPT.from_hf(checkpoint.latest_checkpoint(tmp_path / d) / "model.safetensors") for d in "ab")
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), f"resumed run differs from the straight run in {name}"


def test_resume_without_checkpoint_is_a_clean_error(corpus_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        tiny_run(corpus_dir, tmp_path / "none", 5, ["--resume"])
    assert e.value.code == 2 and "no checkpoint" in capsys.readouterr().err


def test_tokenizer_command(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "corpus", lambda split, extra=None: ["def f(x):\n    return x + 1\n"] * 50)
    train.main(["tokenizer", "--vocab-size", "270", "--out", str(tmp_path / "t.tiktoken")])
    enc = load_tokenizer(tmp_path / "t.tiktoken")
    assert enc.n_vocab == 270 and enc.decode(enc.encode_ordinary("return x")) == "return x"


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    lrs = [optim.lr_at(s, 100, 1.0, 10) for s in range(101)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:])) and lrs[100] == pytest.approx(0.1)


@pytest.mark.slow
def test_a_crash_during_a_checkpoint_leaves_the_previous_one(corpus_dir, tmp_path, monkeypatch):
    straight = tiny_run(corpus_dir, tmp_path / "a", 20)
    real_write = checkpoint.atomic_write_json
    calls = []

    class Died(BaseException):
        """The process dying half-way through checkpoint 2 (a kill, a power cut): nothing catches it,
        unlike a Ctrl-C, on which training saves its steps on the way out."""

    def crash_on_second_checkpoint(path, obj):
        calls.append(path)
        if len(calls) == 2:
            raise Died
        real_write(path, obj)

    monkeypatch.setattr(checkpoint, "atomic_write_json", crash_on_second_checkpoint)
    with pytest.raises(Died):
        tiny_run(corpus_dir, tmp_path / "b", 20)
    monkeypatch.setattr(checkpoint, "atomic_write_json", real_write)
    assert json.loads((checkpoint.latest_checkpoint(tmp_path / "b") / "state.json").read_text())["step"] == 10
    resumed = tiny_run(corpus_dir, tmp_path / "b", 20, ["--resume"])
    assert resumed["step"] == straight["step"] == 20
    a, b = (GPT.from_hf(checkpoint.latest_checkpoint(tmp_path / d) / "model.safetensors") for d in "ab")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_the_shipped_files_are_never_replaced_by_accident(tmp_path, capsys):
    before = (WEIGHTS / "tokenizer.tiktoken").read_bytes()
    for argv in (["tokenizer", "--out", str(WEIGHTS / "tokenizer.tiktoken")],
                 ["medusa", "--out", str(WEIGHTS / "medusa.safetensors")],
                 ["gpt", "--preset", "tiny", "--out", str(WEIGHTS / "target.safetensors")]):
        with pytest.raises(SystemExit) as e:
            train.main(argv)
        assert e.value.code == 2 and "--force" in capsys.readouterr().err
    assert (WEIGHTS / "tokenizer.tiktoken").read_bytes() == before
    assert train.build_parser().parse_args(["tokenizer"]).out.startswith("runs/")
    for job in ("medusa", "eagle", "parallel"):  # the heads go into --run-dir, whose default is under runs/
        args = train.build_parser().parse_args([job])
        assert args.out is None and args.run_dir.startswith("runs/")


def test_the_budget_leaves_room_for_the_step_and_the_validation_after_it(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(checkpoint.time, "time", lambda: now[0])
    budget = checkpoint.Budget(minutes=1.0, eval_batches=6)  # deadline at 1060
    assert budget.room_for_a_step()  # nothing measured yet: the first step runs
    budget.step_s = 10.0  # validation estimated at 6 batches x a third of a step = 20 s
    now[0] = 1029.0
    assert budget.room_for_a_step()  # 1029 + 10 + 20 = 1059
    now[0] = 1031.0
    assert not budget.room_for_a_step()
    budget.eval_s = 5.0  # measured: shorter than estimated
    assert budget.room_for_a_step()  # 1031 + 10 + 5 = 1046
    assert checkpoint.Budget(None, 6).room_for_a_step()


def test_a_trained_model_names_its_tokenizer(corpus_dir, tmp_path):
    tiny_run(corpus_dir, tmp_path / "r", 2)
    enc = load_tokenizer(WEIGHTS / "tokenizer.tiktoken")
    assert GPT.from_hf(tmp_path / "r" / "out.safetensors").tokenizer_fingerprint == enc.fingerprint


def test_keep_best_saves_the_weights_of_the_best_validation(corpus_dir, tmp_path):
    state = tiny_run(corpus_dir, tmp_path / "kb", 20, ["--keep-best"])
    best = min(state["history"], key=lambda h: h["val_loss"])
    card = (tmp_path / "kb" / "out.md").read_text()
    assert f"kept: the weights of step {best['step']}" in card
    out, kept = (GPT.from_hf(tmp_path / "kb" / name) for name in ("out.safetensors", "best.safetensors"))
    for a, b in zip(out.state_dict().values(), kept.state_dict().values()):
        torch.testing.assert_close(a.float(), b.float(), atol=1e-2, rtol=1e-2)  # out is stored in bfloat16


@pytest.mark.parametrize("argv, message", [
    (["tokenizer", "--vocab-size", "1"], "--vocab-size must be in 257..65536"),
    (["tokenizer", "--text", "{tmp}/none.txt"], "--text {tmp}/none.txt: no such file"),
    (["gpt", "--preset", "tiny", "--text", "{tmp}/binary.bin"], "is not UTF-8 text"),
    (["gpt", "--preset", "tiny", "--n-ctx", "100000"], "--n-ctx 100000 is more than 8192"),
    (["gpt", "--preset", "tiny", "--run-dir", "{tmp}/afile/run"], "--run-dir {tmp}/afile/run: {tmp}/afile is a file"),
    (["gpt", "--preset", "tiny", "--out", "{tmp}/afile/m.safetensors"], "afile is a file, not a folder"),
    (["tokenizer", "--out", "{tmp}/afile/t.tiktoken"], "afile is a file, not a folder"),
    (["medusa", "--out", "{tmp}/afile/m.safetensors"], "afile is a file, not a folder"),
    (["eagle", "--run-dir", "{tmp}/afile/run"], "afile is a file, not a folder"),
    # as root too (CI's user): /proc and /sys refuse a file whatever the permission bits say
    (["gpt", "--preset", "tiny", "--out", "/proc/x.safetensors"], "--out /proc/x.safetensors: cannot create a file in /proc"),
    (["gpt", "--preset", "tiny", "--run-dir", "/proc/x"], "--run-dir /proc/x: cannot create a file in /proc"),
    (["gpt", "--preset", "tiny", "--data-dir", "/sys/x"], "--data-dir /sys/x: cannot create a file in /sys"),
    (["gpt", "--preset", "tiny", "--data-dir", "{tmp}/afile"], "--data-dir {tmp}/afile: is a file, not a folder"),
    (["tokenizer", "--out", "/proc/x.tiktoken"], "--out /proc/x.tiktoken: cannot create a file in /proc"),
    (["tokenizer", "--out", "{tmp}/fifo"], "is a FIFO, not a file"),
    (["medusa", "--out", "/proc/x.safetensors"], "cannot create a file in /proc"),
    (["eagle", "--data-dir", "/proc/x"], "cannot create a file in /proc"),
    # numbers that cannot train, refused instead of run (or quietly changed)
    (["gpt", "--preset", "tiny", "--max-minutes", "-1"], "--max-minutes must be more than 0, got -1"),
    (["gpt", "--preset", "tiny", "--warmup", "-5"], "--warmup must be 0 or more steps, got -5"),
    (["gpt", "--preset", "tiny", "--block-size", "100000"], "--block-size 100000 is more than the model's context"),
    (["gpt", "--preset", "tiny", "--block-size", "0"], "--block-size must be at least 1, got 0"),
    (["gpt", "--preset", "tiny", "--lr", "0"], "--lr must be more than 0"),
    (["medusa", "--lr", "-1"], "--lr must be more than 0"),
])
def test_bad_training_input_is_one_line_exit_2_before_any_work(tmp_path, argv, message, capsys, monkeypatch):
    """Each is refused before a corpus is read or a tensor allocated, and leaves no folder behind
    (an empty runs/ once appeared after a refused run)."""
    import os
    (tmp_path / "afile").write_text("")
    (tmp_path / "binary.bin").write_bytes(bytes(range(256)))
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train.corpus, "corpus", lambda *a: pytest.fail("the corpus was read before the input was checked"))
    monkeypatch.setattr(train.corpus, "prepare", lambda *a: pytest.fail("the corpus was read before the input was checked"))
    err = refused(train.main, [a.format(tmp=tmp_path) for a in argv], capsys)
    assert message.format(tmp=tmp_path) in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "binary.bin", "fifo"] and (tmp_path / "fifo").is_fifo()
    assert not os.path.exists("/proc/x.safetensors") and not os.path.exists("/proc/x.tiktoken")


@pytest.mark.slow
def test_medusa_training_of_a_few_steps_writes_heads_and_card(tmp_path):
    """Nine steps once crashed after training (the card read each head's loss over the last tenth
    of the steps, and 9 * 0.9 left none)."""
    run = tmp_path / "m"
    argv = ["medusa", "--sequences", "8", "--gen-len", "16", "--gen-batch", "8", "--steps", "9", "--batch-size", "2",
            "--run-dir", str(run), "--data-dir", str(tmp_path / "data"), "--stdlib-only", "--threads", "1"]
    train.main(argv)
    assert (run / "medusa.safetensors").is_file() and "| 1 |" in (run / "medusa.md").read_text()
    # the heads went where --run-dir said; a second run there replaces them only with --force
    before = (run / "medusa.safetensors").read_bytes()
    with pytest.raises(SystemExit) as e:
        train.main(argv + ["--seed", "1"])
    assert e.value.code == 2 and (run / "medusa.safetensors").read_bytes() == before
    train.main(argv + ["--seed", "1", "--force"])
    assert (run / "medusa.safetensors").read_bytes() != before


def test_every_training_job_has_examples_and_documented_flags():
    parser = train.build_parser()
    jobs = next(a for a in parser._actions if a.dest == "what").choices
    for name, sub in jobs.items():
        assert "examples:" in sub.format_help() and f"python -m tinyspec train {name}" in sub.format_help()
        undocumented = [a.dest for a in sub._actions if a.help is None]
        assert not undocumented, f"train {name}: {undocumented}"


def fake_wheel(path, files: dict):
    import zipfile
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_the_corpus_dedupes_skips_vendored_copies_and_splits_each_source_by_module(tmp_path):
    stdlib_text = (corpus.STDLIB / "email" / "parser.py").read_text()
    wheel = fake_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {
        "pkg/core.py": "def f():\n    return 1\n", "pkg/copy.py": "def f():\n    return 1\n",  # same text twice
        "pkg/stolen.py": stdlib_text,  # a copy of a stdlib module
        "pkg/_vendor/six.py": "import sys\n", "pkg/data.txt": "not python", "pkg-1.0.dist-info/METADATA": "x",
        **{f"pkg/m{i}.py": f"x = {i}\n" for i in range(200)}})
    out = corpus.sources({"pkg": wheel})
    paths = [p for p, _ in out["pkg"]]
    assert ("pkg/pkg/copy.py" in paths) != ("pkg/pkg/core.py" in paths)  # one of two equal texts
    assert not any("stolen" in p or "_vendor" in p or "data.txt" in p or "dist-info" in p for p in paths)
    assert len(paths) == 201 and "email/parser.py" in [p for p, _ in out["stdlib"]]
    splits = {corpus.split_of(p) for p in paths}
    assert splits == {"train", "val", "bench"}  # whole modules of each source are held out too


def test_a_package_pip_cannot_fetch_is_left_out_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(corpus, "pip_download", lambda requirement, wheels: ["ERROR: no network"])
    monkeypatch.setattr(corpus, "PACKAGES", {"click": ("8.1.7", "BSD-3-Clause"), "rich": ("13.9.4", "MIT")})
    fake_wheel(tmp_path / "rich-13.9.4-py3-none-any.whl", {"rich/x.py": "x = 1\n"})  # downloaded before
    assert corpus.download(tmp_path) == {"rich": tmp_path / "rich-13.9.4-py3-none-any.whl"}
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "not downloaded" in line] == [
        "click==8.1.7: not downloaded (ERROR: no network); the corpus goes on without it"]


def test_the_download_says_what_it_fetches_where_and_counts(tmp_path, monkeypatch, capsys):
    """A minute or two of pip must not pass in silence: first one line naming every package pip is
    about to download and where, then each one counted as it starts; what is there already is not named."""
    fetched = []

    def fake_pip(requirement, wheels):
        fetched.append(requirement)
        name, version = requirement.split("==")
        fake_wheel(wheels / f"{name}-{version}-py3-none-any.whl", {f"{name}/x.py": "x = 1\n"})
        return []
    monkeypatch.setattr(corpus, "pip_download", fake_pip)
    monkeypatch.setattr(corpus, "PACKAGES", {"click": ("8.1.7", "BSD-3-Clause"), "rich": ("13.9.4", "MIT"),
                                           "attrs": ("24.2.0", "MIT")})
    fake_wheel(tmp_path / "rich-13.9.4-py3-none-any.whl", {"rich/x.py": "x = 1\n"})  # downloaded before
    assert set(corpus.download(tmp_path)) == {"click", "rich", "attrs"} and fetched == ["click==8.1.7", "attrs==24.2.0"]
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"pip downloads the wheels of 2 pinned package(s) into {tmp_path}, once: click==8.1.7, attrs==24.2.0"
    assert [line.strip() for line in lines[1:]] == ["[1/2] click==8.1.7", "[2/2] attrs==24.2.0"]
    corpus.download(tmp_path)
    assert capsys.readouterr().err == ""  # all there: nothing to say


@pytest.mark.parametrize("argv, message", [
    (["--data-dir", "/proc/x"], "--data-dir /proc/x: cannot create a file in /proc"),
    (["--data-dir", "{tmp}/afile"], "--data-dir {tmp}/afile: is a file, not a folder"),
    (["third-party-prompts", "--data-dir", "/sys/x"], "--data-dir /sys/x: cannot create a file in /sys"),
])
def test_the_corpus_refuses_a_data_dir_it_cannot_write_before_any_work(tmp_path, argv, message, capsys, monkeypatch):
    (tmp_path / "afile").write_text("")
    monkeypatch.setattr(corpus, "prepare", lambda *a, **k: pytest.fail("the corpus was built before --data-dir was checked"))
    monkeypatch.setattr(corpus, "download", lambda *a, **k: pytest.fail("pip ran before --data-dir was checked"))
    err = refused(data.main, [a.format(tmp=tmp_path) for a in argv], capsys)
    assert message.format(tmp=tmp_path) in err and "Traceback" not in err
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]


def test_the_corpus_lives_in_tinyspecs_home_whatever_the_directory(tmp_path, monkeypatch):
    """Not data/ in whatever directory a command runs from: $TINYSPEC_HOME/data (conftest sets a
    temporary home), the default of every command that reads the corpus."""
    monkeypatch.setenv("TINYSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    from tinyspec.bench import evaluate
    want = str(tmp_path / "home" / "data")
    assert data.build_parser().parse_args([]).data_dir == want
    assert evaluate.build_parser().parse_args([]).data_dir == want
    for job in ("gpt", "medusa", "eagle"):
        assert train.build_parser().parse_args([job]).data_dir == want


def test_trains_help_names_every_job_it_trains(capsys):
    parser = train.build_parser()
    jobs = next(a for a in parser._actions if a.dest == "what").choices
    assert all(name in parser.description for name in jobs), parser.description


def test_third_party_prompts_come_in_turn_from_packages_no_corpus_holds(tmp_path, monkeypatch):
    assert not set(corpus.HELD_OUT_PACKAGES) & set(corpus.PACKAGES)  # held out of every corpus
    doc = '    """' + "A long docstring line.\n    " * 8 + '"""\n'
    module = f"def f(x):\n{doc}    return x\n\n\nTABLE = {{\n" + "".join(f"    'a_longer_key_{i}': {i},\n" for i in range(8)) + "}\n"
    wheels = {name: fake_wheel(tmp_path / f"{name}.whl", {f"{name}/a.py": module, f"{name}/b.py": module.replace("f(", "g(")})
              for name in ("p1", "p2")}
    monkeypatch.setattr(corpus, "HELD_OUT_PACKAGES", {"p1": ("1", "MIT"), "p2": ("2", "BSD-3-Clause")})
    monkeypatch.setattr(corpus, "download", lambda where, packages: wheels)
    counts = corpus.write_third_party_prompts(tmp_path / "p.jsonl", tmp_path, per_category=3)
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert counts == {"code": 3, "docs": 3, "structured": 3} and len(rows) == 9
    code = [r for r in rows if r["category"] == "code"]
    assert [r["source"].split("/")[0] for r in code] == ["p1", "p2", "p1"]  # in turn
    assert {r["licence"] for r in rows} == {"MIT", "BSD-3-Clause"}


# ---- Ctrl-C, and a run that diverges ----------------------------------------------------

@pytest.mark.parametrize("at", [0, 3])
def test_ctrl_c_before_the_first_checkpoint_keeps_the_steps_taken_and_resume_goes_on_exactly(corpus_dir, tmp_path, at):
    """Ctrl-C (a real SIGINT) between a step's forward and its optimizer step, long before the first
    validation: the steps already taken are checkpointed on the way out, the step under way is not
    (its batch is drawn again), and --resume then ends where a run never stopped ends; before the
    first step, nothing is saved and it says so."""
    run = tmp_path / "stopped"
    argv = ["train", "gpt", "--preset", "tiny", "--steps", "6", "--batch-size", "8", "--lr", "3e-3", "--warmup", "2",
            "--eval-every", "1000", "--eval-batches", "2", "--data-dir", str(corpus_dir), "--stdlib-only",
            "--threads", "1", "--run-dir", str(run), "--out", str(run / "out.safetensors")]
    setup = f"""
from tinyspec.training import gpt
real = gpt.check_finite
def check_finite(loss, step, what="training loss"):
    if step == {at} + 1 and what == "training loss":
        wait_for_ctrl_c()
    real(loss, step, what)
gpt.check_finite = check_finite"""
    status, out, err = ctrl_c("tinyspec.commands.train", argv[1:], setup)
    last = err.strip().splitlines()[-1]
    assert status == 130 and "Traceback" not in err and not (run / "out.safetensors").exists(), err
    if at == 0:
        assert last == "[interrupted] nothing was saved (stopped before the first step)", err
        assert checkpoint.latest_checkpoint(run) is None
        return
    assert last == f"[interrupted] step 3's checkpoint is in {run / 'step-000003'}: --resume continues from it " \
        f"({run / 'out.safetensors'} was not written)", err
    resumed = tiny_run(corpus_dir, run, 6, ["--resume", "--warmup", "2", "--threads", "1"])
    straight = tiny_run(corpus_dir, tmp_path / "straight", 6, ["--warmup", "2", "--threads", "1"])
    assert resumed["step"] == straight["step"] == 6
    a, b = (GPT.from_hf(checkpoint.latest_checkpoint(d) / "model.safetensors") for d in (run, tmp_path / "straight"))
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), f"the run stopped at step 3 and resumed differs from a straight run in {name}"


def test_a_run_whose_loss_stops_being_a_number_stops_and_keeps_the_last_good_checkpoint(corpus_dir, tmp_path, capsys,
                                                                                     monkeypatch):
    """The 15th optimizer step writes nan into the weights (as a learning rate far too high does): the
    16th step's loss is nan, the run stops there in one line, exit 2, naming the checkpoint of step
    10, which is kept and loads; no final weights are written."""
    from tinyspec.training import gpt
    real = gpt.make_optimizer

    def breaking(module, lr, weight_decay):
        opt, steps = real(module, lr, weight_decay), []
        step = opt.step

        def broken_step(*args, **kwargs):
            step(*args, **kwargs)
            steps.append(1)
            if len(steps) == 15:
                with torch.no_grad():
                    module.transformer.wte.weight.fill_(float("nan"))
        opt.step = broken_step
        return opt
    monkeypatch.setattr(gpt, "make_optimizer", breaking)
    run = tmp_path / "diverged"
    with pytest.raises(SystemExit) as e:
        tiny_run(corpus_dir, run, 20)
    err = capsys.readouterr().err.splitlines()[-1]  # (after the progress bar's lines)
    assert e.value.code == 2 and err.startswith("error: the training loss is nan at step 16: the run diverged"), err
    assert f"its last good checkpoint is kept, {run / 'step-000010'} (--resume with a lower --lr" in err, err
    assert not (run / "out.safetensors").exists() and checkpoint.latest_checkpoint(run).name == "step-000010"
    assert all(torch.isfinite(p).all() for p in GPT.from_hf(run / "step-000010" / "model.safetensors").parameters())


def test_heads_whose_loss_is_not_a_number_stop_before_a_step_or_a_checkpoint():
    """Medusa's and EAGLE's training stop at the first loss that is nan, before its optimizer step, and
    an EAGLE checkpoint is never written from weights that are not numbers."""
    import numpy as np
    from tinyspec.methods.eagle import EagleHead
    from tinyspec.methods.medusa import MedusaHeads
    from tinyspec.training import distill
    target = random_gpt()
    sequences = np.random.default_rng(0).integers(0, 64, (4, 24)).astype(np.uint16)
    heads = MedusaHeads(32, 2)
    with torch.no_grad():
        heads.blocks[0].linear.weight.fill_(float("nan"))
    with pytest.raises(optim.Diverged, match="the training loss is nan at step 1: the run diverged"):
        distill.train_heads(target, heads, sequences, 8, steps=3, batch=2, lr=1e-3, progress=False)
    head, saved = EagleHead.for_target(target), []
    features = distill.target_features(target, sequences)
    features[1, 5] = float("inf")  # a feature that is not a number reaches the loss at the first step
    with pytest.raises(optim.Diverged, match="at step 1"):
        distill.train_eagle(target, head, sequences, features, steps=2, batch=4, lr=1e-3, progress=False,
                            checkpoint=lambda *a: saved.append(a), every=1)
    assert not saved
