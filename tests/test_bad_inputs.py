"""Bad input, as a new user gives it, across the commands: one line on stderr that starts with
"error:" and names the fix, exit status 2, no traceback, nothing made or replaced, and never a hang.

The table runs each command in this process (its `main(argv)`, which raises SystemExit) against
real files, folders, FIFOs and symlinks made in a temporary folder. Inputs each command's own
tests already refuse (out-of-range flags, corrupt weights, outputs in /proc) are theirs; these are
the paths and numbers that got through before. A few cases need a real process (a full stdout,
`python -m tinyspec.generate`): they run as subprocesses at the end."""
import json
import os
import shlex
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from tinyspec.commands import cli, data, generate, train
from tinyspec.bench import command as bench, evaluate, figures
from tinyspec.course import handouts
from tinyspec.commands.cli import WEIGHTS

from conftest import refused

COMMANDS = {"generate": generate.main, "bench": bench.main, "evaluate": evaluate.main, "train": train.main,
            "data": data.main}
# {tmp}: the test's folder, holding (see `things`): fifo, folder, sock, a link into a folder that is
# not there (dangling), a tree of 128 nodes (big.json), a run folder with an earlier run's checkpoint
# (run/, and eagle-run/checkpoints/ for the heads)
CASES = [
    # a FIFO, a folder or a socket where a file is read: said, never opened (a FIFO blocks a reader forever)
    ("generate", "--prompt x --model {tmp}/fifo", "--model {tmp}/fifo is a FIFO, not a file"),
    ("generate", "--prompt x --model {tmp}/sock", "--model {tmp}/sock is a socket, not a file"),
    ("generate", "--prompt x --method medusa --heads {tmp}/fifo", "--heads {tmp}/fifo is a FIFO, not a file"),
    ("generate", "--prompt x --method medusa --heads {tmp}/folder", "--heads {tmp}/folder is a folder, not a file"),
    ("generate", "--prompt x --method draft --draft {tmp}/fifo", "--draft {tmp}/fifo is a FIFO, not a file"),
    ("generate", "--prompt x --method draft --draft {tmp}/folder", "--draft {tmp}/folder is a folder, not a file"),
    ("generate", "--prompt x --method eagle --eagle {tmp}/fifo", "--eagle {tmp}/fifo is a FIFO, not a file"),
    ("generate", "--prompt x --method parallel --parallel {tmp}/fifo", "--parallel {tmp}/fifo is a FIFO, not a file"),
    ("generate", "--prompt x --method rest --datastore {tmp}/fifo", "--datastore {tmp}/fifo is a FIFO, not a file"),
    ("generate", "--prompt x --method rest --datastore {tmp}/folder", "--datastore {tmp}/folder is a folder"),
    ("generate", "--prompt-file {tmp}/fifo", "--prompt-file {tmp}/fifo is a FIFO, not a file"),
    ("generate", "--prompt-file {tmp}/folder", "--prompt-file {tmp}/folder is a folder, not a file"),
    ("generate", "--prompt x --tokenizer {tmp}/fifo", "--tokenizer {tmp}/fifo is a FIFO, not a file"),
    ("generate", "--prompt x --tokenizer {tmp}/folder", "--tokenizer {tmp}/folder is a folder, not a file"),
    ("generate", "--prompt x --method medusa --tree {tmp}/fifo", "--tree {tmp}/fifo is a FIFO, not a file"),
    ("generate", "--prompt x --method eagle --tree {tmp}/folder", "--tree {tmp}/folder is a folder, not a file"),
    ("bench", "--quick --prompts {tmp}/fifo", "--prompts {tmp}/fifo is a FIFO, not a file"),
    ("bench", "--quick --model {tmp}/fifo", "--model {tmp}/fifo is a FIFO, not a file"),
    ("train", "gpt --preset tiny --tokenizer {tmp}/fifo --run-dir {tmp}/new", "--tokenizer {tmp}/fifo is a FIFO"),
    ("train", "gpt --preset tiny --text {tmp}/fifo --run-dir {tmp}/new", "--text {tmp}/fifo is a FIFO, not a file"),
    ("train", "gpt --preset tiny --init-from {tmp}/fifo --run-dir {tmp}/new --stdlib-only",
     "--init-from {tmp}/fifo is a FIFO"),
    ("train", "medusa --target {tmp}/fifo --run-dir {tmp}/new", "--target {tmp}/fifo is a FIFO, not a file"),
    ("data", "datastore --tokenizer {tmp}/fifo --out {tmp}/d.safetensors", "--tokenizer {tmp}/fifo is a FIFO"),
    # a tree larger than any size
    ("generate", "--prompt x --method medusa --tree {tmp}/big.json", "has 128 nodes; a tree has at most 127"),
    ("generate", "--prompt x --method eagle --tree {tmp}/big.json", "has 128 nodes; a tree has at most 127"),
    # a seed torch cannot take
    ("generate", "--prompt x --seed 99999999999999999999999", "--seed: must be in 0..9223372036854775807"),
    ("generate", "--prompt x --seed -1", "--seed: must be in 0..9223372036854775807, got -1"),
    ("generate", "--prompt x --seed 9223372036854775808", "--seed: must be in 0..9223372036854775807"),
    ("bench", "--quick --seed 99999999999999999999999", "--seed: must be in 0..9223372036854775807"),
    ("evaluate", "--seed 99999999999999999999999", "--seed: must be in 0..9223372036854775807"),
    ("train", "gpt --seed 99999999999999999999999", "--seed: must be in 0..9223372036854775807"),
    ("train", "eagle --seed -5", "--seed: must be in 0..9223372036854775807"),
    # an output through a link into a folder that is not there: nothing made at the far end
    ("bench", "--quick --save {tmp}/dangling", "--save {tmp}/dangling: cannot write through the link"),
    ("evaluate", "--save {tmp}/dangling --stdlib-only", "--save {tmp}/dangling: cannot write through the link"),
    ("data", "datastore --stdlib-only --out {tmp}/dangling", "--out {tmp}/dangling: cannot write through the link"),
    ("train", "gpt --preset tiny --run-dir {tmp}/dangling", "--run-dir {tmp}/dangling: cannot write through"),
    ("train", "gpt --preset tiny --run-dir {tmp}/new --out {tmp}/dangling", "--out {tmp}/dangling: cannot write"),
    ("train", "tokenizer --out {tmp}/dangling", "--out {tmp}/dangling: cannot write through the link"),
    ("bench", "--quick --save {tmp}/dangling/r.json", "{tmp}/dangling is a link to {tmp}/missing/target, which does"),
    # an earlier run's checkpoints, which a run that starts over would remove
    ("train", "gpt --preset tiny --run-dir {tmp}/run", "{tmp}/run holds an earlier run's checkpoints (step-000010): "
              "pass --resume to continue that run, --force to start over"),
    ("train", "eagle --run-dir {tmp}/eagle-run", "eagle-run/checkpoints holds an earlier run's checkpoints"),
    # heads go where --run-dir (or --out) says, and an earlier run's are replaced only with --force
    ("train", "medusa --run-dir {tmp}/medusa-run", "{tmp}/medusa-run/medusa.safetensors already exists (an earlier run"),
    ("train", "eagle --run-dir {tmp}/folder --out {tmp}/medusa-run/medusa.safetensors", "medusa.safetensors already "
              "exists (an earlier run's weights?): pass --force to replace it"),
    ("train", "parallel --run-dir {tmp}/medusa-run --out {tmp}/medusa-run/medusa.safetensors", "already exists"),
    # weights that are not numbers (a run that diverged) are refused where every weights file is read
    ("generate", "--prompt x --model {tmp}/nan-model.safetensors", "holds weights that are not finite numbers (nan "
                 "or inf in 1 of 1 tensors, e.g. transformer.wte.weight)"),
    ("generate", "--prompt x --method medusa --heads {tmp}/nan-heads.safetensors", "not finite numbers"),
    # hyperparameters that make a broken model, or were quietly replaced by the preset's
    ("train", "gpt --preset tiny --lr inf", "--lr must be at most 1.0, got inf"),
    ("train", "gpt --preset tiny --lr 1e9", "--lr must be at most 1.0, got 1000000000.0"),
    ("train", "gpt --preset tiny --lr nan", "--lr must be more than 0, got nan"),
    ("train", "medusa --lr 2", "--lr must be at most 1.0, got 2.0"),
    ("train", "eagle --noise nan", "--noise must be 0 or more (and finite), got nan"),
    ("train", "eagle --noise -1", "--noise must be 0 or more (and finite), got -1.0"),
    ("train", "parallel --noise inf", "--noise must be 0 or more (and finite), got inf"),
    ("train", "eagle --ce-weight -1", "--ce-weight must be 0 or more (and finite), got -1.0"),
    ("train", "gpt --preset tiny --weight-decay -1", "--weight-decay must be 0 or more (and finite), got -1.0"),
    ("train", "gpt --preset tiny --weight-decay 1e4", "--weight-decay 10000.0 x --lr 0.0015 must be less than 1"),
    ("train", "gpt --preset tiny --n-layer 0", "--n-layer must be at least 1, got 0"),
    ("train", "gpt --preset tiny --n-ctx 0", "--n-ctx must be at least 1, got 0"),
    ("train", "gpt --preset tiny --n-head 0", "--n-head must be at least 1, got 0"),
    ("train", "gpt --preset tiny --n-embd -8", "--n-embd must be at least 1, got -8"),
    # more threads than CPUs, one rule for every command (torch overflows at 10**20; bench crawled at 1000)
    ("generate", "--prompt x --threads 99999999999999999999", "--threads 99999999999999999999 is more than the"),
    ("bench", "--quick --threads 99999999999999999999", "--threads 99999999999999999999 is more than the"),
    ("bench", "--quick --threads 1000", "--threads 1000 is more than the"),
    ("train", "gpt --preset tiny --threads 99999999999999999999 --run-dir {tmp}/new", "--threads 99999999999999999999 "
              "is more than the"),
    # a file name longer than the file system's 255 bytes (ENAMETOOLONG), for every path flag that reads
    ("generate", "--prompt-file {tmp}/" + "n" * 300, "--prompt-file {tmp}/nnn"),
    ("generate", "--prompt x --model {tmp}/" + "n" * 300, "nnn: File name too long: give another path"),
    ("generate", "--prompt x --tokenizer {tmp}/" + "n" * 300, "nnn: File name too long: give another path"),
    ("generate", "--prompt x --method rest --datastore {tmp}/" + "n" * 300, "nnn: File name too long: give another"),
    ("generate", "--prompt x --method medusa --heads {tmp}/" + "n" * 300, "nnn: File name too long: give another"),
    ("bench", "--quick --prompts {tmp}/" + "n" * 300, "nnn: File name too long: give another path"),
    ("train", "gpt --preset tiny --run-dir {tmp}/new --text {tmp}/" + "n" * 300, "nnn: File name too long: give"),
    # a file that fails when read (EIO), tried before the work
    ("generate", "--prompt-file /proc/self/mem", "--prompt-file /proc/self/mem cannot be read (Input/output error)"),
    ("generate", "--prompt x --tokenizer /proc/self/mem", "--tokenizer /proc/self/mem cannot be read (Input/output"),
    ("bench", "--quick --prompts /proc/self/mem", "--prompts /proc/self/mem cannot be read (Input/output error)"),
    ("train", "gpt --preset tiny --run-dir {tmp}/new --text /proc/self/mem", "--text /proc/self/mem cannot be read"),
]


def snapshot(folder: Path) -> dict:
    """Everything under `folder`, links not followed: what each entry is and holds (a folder's own
    time changes when an output path is tried in it, by a file made and removed: not counted)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        out[str(path)] = (st.st_mode, None if path.is_dir() else (st.st_size, st.st_mtime_ns),
                          os.readlink(path) if path.is_symlink() else None)
    return out


@pytest.fixture
def things(tmp_path):
    import socket

    import torch
    from safetensors.torch import save_file
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    (tmp_path / "dangling").symlink_to(tmp_path / "missing" / "target")
    (tmp_path / "big.json").write_text(json.dumps({"parents": [-1] * 128}))
    (tmp_path / "run" / "step-000010").mkdir(parents=True)
    (tmp_path / "run" / "latest").write_text("step-000010\n")
    (tmp_path / "eagle-run" / "checkpoints" / "step-000003").mkdir(parents=True)
    # an earlier run's heads; weights of a run that diverged
    (tmp_path / "medusa-run").mkdir()
    (tmp_path / "medusa-run" / "medusa.safetensors").write_bytes(b"an earlier run's heads")
    save_file({"transformer.wte.weight": torch.tensor([[1.0, float("nan")]])}, tmp_path / "nan-model.safetensors")
    save_file({"blocks.0.linear.weight": torch.tensor([[float("inf")]])}, tmp_path / "nan-heads.safetensors")
    yield tmp_path
    sock.close()


@contextmanager
def let_go(fifo: Path):
    """A reader of `fifo` is let go (opening a FIFO to read waits for a writer, forever): a writer in
    another process waits for one and closes at once, so a command that opens the FIFO fails the
    test instead of hanging it (another process: a reader may hold this one's GIL while it waits).
    Yields the writer, which has ended if anyone opened the FIFO to read it."""
    writer = subprocess.Popen(["sh", "-c", ': > "$0"', str(fifo)])
    try:
        yield writer
    finally:
        writer.kill()
        writer.wait()


@pytest.mark.parametrize("command, argv, message", CASES, ids=[f"{c} {a}"[:70] for c, a, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_is_made_or_replaced(command, argv, message, things, capsys):
    before = snapshot(things)
    with let_go(things / "fifo") as writer:
        err = refused(COMMANDS[command], argv.format(tmp=things).split(), capsys)
        assert writer.poll() is None, "the command opened the FIFO to read it"
    assert err.startswith("error: ") and "Traceback" not in err and message.format(tmp=things) in err, err
    assert snapshot(things) == before and not (things / "missing").exists() and not (things / "new").exists()


def test_a_dangling_link_into_a_folder_that_exists_is_written_through_and_named(tmp_path, corpus_dir, capsys):
    """A link to a file not yet made, in a folder that is there: the file is made at the link's
    target, the link stays, and the message names the file really written."""
    (tmp_path / "real").mkdir()
    (tmp_path / "ds.safetensors").symlink_to(tmp_path / "real" / "store.safetensors")
    data.main(["datastore", "--tokens", "2000", "--stdlib-only", "--data-dir", str(corpus_dir), "--out",
               str(tmp_path / "ds.safetensors")])
    assert (tmp_path / "ds.safetensors").is_symlink() and (tmp_path / "real" / "store.safetensors").is_file()
    assert f"saved {tmp_path / 'real' / 'store.safetensors'}" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["store.md", "store.safetensors"]


# What the table above cannot say: an empty argument, TINYSPEC_HOME, more commands, more
# files. (TINYSPEC_HOME, command, argv as a shell splits it, message); {tmp} holds (see `more_things`) a file, a FIFO,
# a link to nothing, an EAGLE head cut short, a prompt file of 1 GB of NUL bytes (sparse: no disk is spent) and a
# JSONL file of one prompt longer in bytes than any the model's context holds
MORE_COMMANDS = {**COMMANDS, "figures": figures.main, "course": handouts.main}
LONG = "n" * 300
MORE_CASES = [
    (None, "bench", "--quick --save ''", "--save is empty: give a file name"),
    (None, "data", "datastore --stdlib-only --out ''", "--out is empty: give a file name"),
    (None, "evaluate", "--stdlib-only --save ''", "--save is empty: give a file name"),
    (None, "figures", "cost --threads 99999999999999999999 --out {tmp}/figs", "--threads 99999999999999999999 is more"),
    (None, "figures", "eagle-tree --eagle {tmp}/cut.safetensors", "{tmp}/cut.safetensors is not a readable"),
    (None, "course", "grade {tmp}/" + LONG, "course grade {tmp}/nnn"),
    (None, "generate", "--prompt-file {tmp}/nul.txt", "line 1: over 200320 bytes, longer than any prompt the model's"),
    (None, "bench", "--quick --no-hf --prompts {tmp}/nul.txt", "--prompts {tmp}/nul.txt, line 1: over 200320 bytes"),
    (None, "bench", "--quick --no-hf --categories code --prompts {tmp}/wide.jsonl", "code prompt 1 of {tmp}/wide.jsonl is "
     "over 32704 bytes, more tokens than the model's context of 512: shorten it"),
    ("{tmp}/file", "generate", "--prompt x --method medusa --size auto", "TINYSPEC_HOME={tmp}/file, where nothing can "
     "be written ({tmp}/file is a file, not a folder): set TINYSPEC_HOME to a folder that can be written"),
    ("/dev/full", "generate", "--prompt x --method medusa --size auto", "(/dev/full is a device, not a folder)"),
    ("/sys/tinyspec", "generate", "--prompt x --method medusa --size auto", "cannot create a file in /sys"),  # ro
    ("{tmp}/dangling", "generate", "--prompt x --method lookup --size auto", "{tmp}/dangling is a link to"),
    ("{tmp}/fifo", "generate", "--prompt x --method draft --size auto", "({tmp}/fifo is a FIFO, not a folder)"),
    ("{tmp}/fifo", "bench", "--quick --methods ar,medusa:auto", "({tmp}/fifo is a FIFO, not a folder)"),
]


@pytest.fixture
def more_things(tmp_path):
    (tmp_path / "file").write_text("a file\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    (tmp_path / "cut.safetensors").write_bytes((WEIGHTS / "eagle.safetensors").read_bytes()[:1000])
    (tmp_path / "wide.jsonl").write_text(json.dumps({"category": "code", "prompt": "x" * 40000}) + "\n")  # < a line's bound
    with open(tmp_path / "nul.txt", "wb") as f:
        f.truncate(10 ** 9)
    return tmp_path


@pytest.mark.parametrize("home, command, argv, message", MORE_CASES,
                         ids=[f"{h or ''} {c} {a}"[:70] for h, c, a, _ in MORE_CASES])
def test_more_bad_input_is_one_line_exit_2_and_nothing_is_made(home, command, argv, message, more_things, capsys,
                                                               monkeypatch):
    if home:
        monkeypatch.setenv("TINYSPEC_HOME", home.format(tmp=more_things))
    before = snapshot(more_things)
    err = refused(MORE_COMMANDS[command], shlex.split(argv.format(tmp=more_things)), capsys)
    assert err.startswith("error: ") and message.format(tmp=more_things) in err, err
    assert snapshot(more_things) == before


def test_start_over_in_a_run_folder_only_with_force(tmp_path, capsys):
    from tinyspec.training.checkpoint import check_fresh_start
    (tmp_path / "step-000010").mkdir()
    check_fresh_start(tmp_path, resume=True, force=False)  # --resume continues it
    check_fresh_start(tmp_path, resume=False, force=True)  # --force starts over
    check_fresh_start(tmp_path / "empty", resume=False, force=False)  # nothing to lose
    with pytest.raises(ValueError, match="--force"):  # the command says it in one line
        check_fresh_start(tmp_path, False, False)


def test_more_threads_than_cpus_is_refused_and_as_many_are_used(monkeypatch, capsys):
    """One rule for every command (they all call set_threads): the CPUs this process may use, and no
    more. At 1000 threads a forward waits for every thread to get a core: generate finished, bench crawled."""
    import torch
    asked = []
    monkeypatch.setattr(cli, "cpus", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: asked[-1])
    err = refused(lambda argv: cli.set_threads(3, torch.device("cpu")), [], capsys)
    assert err == "error: --threads 3 is more than the 2 CPUs this process may use, where threads only wait for " \
        "each other: use --threads 2 or fewer\n" and asked == [], err
    assert cli.set_threads(2, torch.device("cpu")) == 2 and capsys.readouterr().err == ""


@pytest.mark.parametrize("temperature, warned", [("1", True), ("0", False)])
def test_typical_acceptance_when_sampling_says_its_text_is_not_the_targets(temperature, warned, capsys):
    generate.main(["--prompt", "x", "--method", "medusa", "--accept", "typical", "--temperature", temperature,
                   "--max-new-tokens", "2", "--json"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(lines) == warned and (not warned or "does not keep the target's distribution" in lines[0]), err


def test_bench_warns_of_a_lossy_rule_at_a_temperature(monkeypatch, capsys):
    from tinyspec.bench import benchmark
    monkeypatch.setattr(benchmark, "pick_device", lambda name: cli.die("stopped before the work"))
    with pytest.raises(SystemExit):
        bench.main(["--methods", "medusa@typical", "--temperatures", "0,1"])
    assert capsys.readouterr().err.splitlines() == [
        "warning: medusa@typical at temperature 1: the typical rule does not keep the target's distribution at "
        "temperature 1, so the text is not the target's own sample (exact: --accept lossless or pointmass or traversal)",
        "error: stopped before the work"]


def test_datastore_stopped_after_it_is_saved_says_it_was_saved(tmp_path, corpus_dir, capsys, monkeypatch):
    def stopped(path, text):
        raise KeyboardInterrupt
    monkeypatch.setattr(data, "atomic_write_text", stopped)  # Ctrl-C while the card is written
    with pytest.raises(SystemExit) as e:
        cli.run_main(lambda: data.main(["datastore", "--tokens", "2000", "--stdlib-only", "--data-dir", str(corpus_dir),
                                        "--out", str(tmp_path / "ds.safetensors")]))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 130 and err == f"[interrupted] saved {tmp_path / 'ds.safetensors'}; its card " \
        f"{tmp_path / 'ds.md'} was not written", err
    assert (tmp_path / "ds.safetensors").is_file()


def test_a_full_stdout_is_one_line_and_status_1(capsys, full_stdout):
    """What `> /dev/full` does to a print: the write fails with ENOSPC, here or at the exit's flush."""
    full_stdout()
    with pytest.raises(SystemExit) as e:
        cli.run_main(lambda: print("the results"))
    assert e.value.code == 1 and capsys.readouterr().err == "error: cannot write to standard output: No space " \
        "left on device\n"


def test_an_error_writing_a_file_is_not_taken_for_stdouts():
    def full_disk():
        raise OSError(28, "No space left on device", "/tmp/x")
    with pytest.raises(OSError):
        cli.run_main(full_disk)


# ---- as a process --------------------------------------------------------------------------------

def tinyspec(*args, stdout=subprocess.PIPE, **kw):
    return subprocess.run([sys.executable, "-m", *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          cwd=WEIGHTS.parent, timeout=300, **kw)


@pytest.mark.parametrize("args", [["tinyspec", "--help"], ["tinyspec", "course", "list"],
                                  ["tinyspec", "generate", "--prompt", "x", "--max-new-tokens", "2", "--json"]],
                         ids=["overview", "course list", "generate --json"])
def test_a_stdout_that_cannot_be_written_is_one_line_and_status_1(args):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        p = tinyspec(*args, stdout=full)
    assert p.returncode == 1 and p.stderr == "error: cannot write to standard output: No space left on device\n", \
        p.stderr


@pytest.mark.parametrize("how, env, message", [
    ("closed", {}, "error: standard output is closed (>&-): send it to a file, or to /dev/null to discard it\n"),
    ("pipe", {"PYTHONIOENCODING": "ascii"}, "error: cannot write to standard output: its encoding, ascii, has no "
     "'\\xe9': set PYTHONIOENCODING=utf-8\n")], ids=["stdout closed", "PYTHONIOENCODING=ascii"])
def test_a_stdout_the_user_set_up_wrong_is_one_line_and_status_2(how, env, message):
    """`>&-` (Python's sys.stdout is then None) and an encoding without the prompt's
    characters are the user's settings: one line naming the fix, status 2, no traceback."""
    p = tinyspec("tinyspec.generate", "--prompt", "caf\u00e9", "--max-new-tokens", "2",
                 stdout=subprocess.DEVNULL if how == "pipe" else None, env=dict(os.environ, **env),
                 pass_fds=(), **({"preexec_fn": lambda: os.close(1)} if how == "closed" else {}))
    assert p.returncode == 2 and p.stderr == message, p.stderr


def test_python_m_tinyspec_generate_is_the_generate_command():
    p = tinyspec("tinyspec.generate", "--prompt", "def f(x):", "--max-new-tokens", "3", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["stats"]["new_tokens"] == 3, p.stderr
    p = tinyspec("tinyspec.generate", "--help")
    assert p.returncode == 0 and p.stdout.startswith("usage: python -m tinyspec.generate") and "--method" in p.stdout
