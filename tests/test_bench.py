"""The benchmark end to end on random models (the numbers are meaningless; the plumbing is not)."""
import json
import sys

import pytest
import torch

from tinyspec.bench import command as bench, benchmark, runner, specs
from tinyspec.methods.medusa import MedusaHeads

from conftest import ctrl_c, random_gpt, refused


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    target = random_gpt(vocab_size=8192, n_ctx=320, scale=3.0)
    target.save(d / "target.safetensors")
    random_gpt(vocab_size=8192, n_ctx=320, n_layer=1, scale=3.0, seed=1).save(d / "draft.safetensors")
    heads = MedusaHeads(32, 3)
    heads.accuracy = torch.tensor([[0.5, 0.2, 0.1], [0.3, 0.2, 0.1], [0.2, 0.1, 0.1]])
    heads.target_fingerprint = target.fingerprint()
    heads.save(d / "heads.safetensors")
    return d


def test_quick_benchmark_reports_every_figure(files, capsys):
    bench.main(["--quick", "--json", "--model", str(files / "target.safetensors"), "--draft", str(files / "draft.safetensors"),
                "--heads", str(files / "heads.safetensors")])
    report = json.loads(capsys.readouterr().out)
    rows = report["rows"]
    assert {r["method"] for r in rows} == {"ar", "draft", "medusa", "lookup"}  # each at its default size
    assert {r["category"] for r in rows} == {"code", "docs", "structured"}
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["tau"] >= 1 and r["new_tokens"] == 2 * 48
        assert r["same_as_ar"] == r["prompts"] == 2  # float32 on a CPU: greedy is plain decoding, token for token
        if r["method"] == "ar":
            assert r["speedup"] == 1 and r["tau"] == 1
        else:
            assert r["acceptance_rate"] is not None and r["predicted_speedup"] > 0
    assert "device" in report and report["dtype"] == "float32"
    peers = report["huggingface"]  # transformers is in the test extra
    assert {p["method"] for p in peers} == {"hf", "hf-assisted"}
    for p in peers:
        assert p["tokens_per_s"] > 0 and p["tinyspec_speedup"] > 0
        assert p["same_as_tinyspec"] == 2  # HF's greedy decoding of our exported weights writes our tokens


def test_table_plots_and_bad_flags(files, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    bench.main(["--methods", "ar,draft:2,draft:3", "--temperatures", "0,1", "--categories", "code", "--prompts-per-category",
                "1", "--max-new-tokens", "8", "--repeats", "1", "--no-hf", "--model", str(files / "target.safetensors"),
                "--draft", str(files / "draft.safetensors"), "--plot", str(tmp_path / "fig"), "--save", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert "draft:2" in out and "speedup" in out and "tau" in out
    saved = json.loads((tmp_path / "r.json").read_text())
    assert len(saved["rows"]) == 3 * 2 and saved["command"].startswith("python -m tinyspec bench --methods")
    sized = {(r["size"], r["temperature"]) for r in saved["sizing"]}  # every k the rows name was measured, at each T
    assert {("2", 0.0), ("3", 0.0), ("2", 1.0), ("3", 1.0)} <= sized and all(r["step_cost"] > 0 for r in saved["sizing"])
    assert all(r["predicted_speedup"] is not None for r in saved["rows"] if r["method"] != "ar")  # every row predicted
    assert sorted(p.name for p in (tmp_path / "fig").glob("*.png")) == ["predicted_vs_measured.png"]
    for bad in (["--methods", "draft:x"], ["--temperatures", "hot"], ["--categories", "poems"], ["--dtype", "fp8"],
                ["--cuda-graph", "--device", "cpu"]):
        with pytest.raises(SystemExit) as e:
            bench.main(bad + ["--model", str(files / "target.safetensors")])
        assert e.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel benchmark really runs")
def test_kernel_benchmark_needs_a_gpu(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["kernels"])
    assert e.value.code == 2 and "CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--methods", "medusa:0"], "--methods medusa:0: medusa's NODES must be in 1..127, got 0"),
    (["--methods", "medusa:1000"], "NODES must be in 1..127"),
    (["--methods", "draft:0"], "1..16"),
    (["--methods", "draft:100"], "1..16"),
    (["--methods", "medusa:8@block"], "verifies a chain"),
    (["--methods", "draft:4@nope"], "unknown acceptance rule"),
    (["--temperatures", "1e-39"], "--temperatures"),
    (["--tokenizer", "{d}/none.tiktoken"], "cannot load the tokenizer"),
    (["--heads", "{d}/none.safetensors", "--methods", "medusa:8"], "not found"),
    (["--heads", "{d}/other.safetensors", "--methods", "medusa:8"], "different target"),
    (["--heads", "{d}/target.safetensors", "--methods", "medusa:8"], "holds a GPT model, not Medusa heads"),
    (["--methods", "medusa:8@greedy", "--temperatures", "0,1"], "medusa:8@greedy at temperature 1: the greedy rule"),
    (["--prompts", "{d}/binary.jsonl"], "not UTF-8 text"),
    (["--prompts", "{d}/nocategory.jsonl"], "nocategory.jsonl, line 3: expected a JSON object with string \"category\""),
    (["--prompts", "{d}/long.jsonl", "--categories", "code"], "shorten it"),
    (["--max-new-tokens", "400", "--categories", "code"], "lower --max-new-tokens to"),
    (["--threads", "0"], "--threads"),
    (["--prompts-per-category", "1000000"], "structured prompts; ask for"),  # not fewer than asked, in silence
    (["--batch-prompts", "0", "--batch-sizes", "1,2"], "--batch-prompts must be at least 1"),
    (["--repeats", "0"], "--repeats must be at least 1"),
])
def test_bad_benchmark_input_is_one_line_exit_2(files, argv, message, capsys):
    random_gpt(vocab_size=8192, n_ctx=320, seed=7).save(files / "other_target.safetensors")
    heads = MedusaHeads(32, 3)
    heads.target_fingerprint = random_gpt(vocab_size=8192, n_ctx=320, seed=7).fingerprint()
    heads.save(files / "other.safetensors")
    (files / "nocategory.jsonl").write_text('\n\n{"prompt": "def f():"}\n')  # line 3, as an editor counts
    (files / "binary.jsonl").write_bytes(bytes(range(256)))
    (files / "long.jsonl").write_text(json.dumps({"category": "code", "prompt": "x = 1\n" * 400}) + "\n")
    argv = [a.format(d=files) for a in argv]
    assert message in refused(bench.main, ["--model", str(files / "target.safetensors"), "--draft",
                                           str(files / "draft.safetensors"), "--heads", str(files / "heads.safetensors"),
                                           "--no-hf", "--quick"] + argv, capsys)


def test_quick_keeps_the_settings_given(files, capsys):
    bench.main(["--quick", "--json", "--no-hf", "--methods", "ar", "--max-new-tokens", "5", "--categories", "docs",
                "--model", str(files / "target.safetensors")])
    report = json.loads(capsys.readouterr().out)
    assert report["max_new_tokens"] == 5 and report["repeats"] == 1 and len(report["rows"]) == 1


@pytest.mark.slow
@pytest.mark.triton
def test_the_gpu_report_runs_its_quick_subset_anywhere(files, tmp_path, capsys):
    """What `bench report` writes on a CPU: every part's code path, the keys the README reads (the
    kernel's table where Triton is installed: its interpreter is on in the tests)."""
    import importlib.util
    bench.main(["report", "--out", str(tmp_path / "r"), "--model", str(files / "target.safetensors"),
                "--draft", str(files / "draft.safetensors"), "--heads", str(files / "heads.safetensors")])
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["quick"] is (not torch.cuda.is_available()) and report["device"]
    md = (tmp_path / "r" / "report.md").read_text()
    assert "tests" in report and md.startswith("# tinyspec on") and "Where a step's time goes" in md
    assert ("rows" in report["kernels"]) == (importlib.util.find_spec("triton") is not None), report["kernels"]
    if "rows" in report["kernels"]:  # the interpreter is on in the tests (conftest.py)
        row = report["kernels"]["rows"][0]
        assert {"L", "T", "triton_us", "sdpa_us", "flex_us", "bandwidth_fraction"} <= set(row)
    runs = {run["run"]: run for run in report["runs"]}
    assert set(runs) == {"eager-float32", "eager-bfloat16", "hf-float32", "ledger-eager-float32"} | (
        {"graph-float32", "graph-bfloat16", "ledger-graph-float32"} if torch.cuda.is_available() else set())
    ledger = {r["method"]: r["ledger"] for r in runs["ledger-eager-float32"]["rows"]}
    assert abs(sum(ledger["medusa:8"].values()) - 1) < 0.01 and ledger["medusa:8"]["target"] > 0
    assert {m["method"] for m in runs["eager-float32"]["rows"]} == {"ar", "draft:2", "medusa:8"}
    assert runs["eager-bfloat16"]["dtype"] == "bfloat16" and runs["eager-float32"]["sizing"]
    for m in runs["eager-float32"]["rows"]:
        assert {"temperature", "category", "tau", "tokens_per_s", "speedup", "same_as_ar", "weights_GBps"} <= set(m)
    hf = runs["hf-float32"]["huggingface"]
    assert {h["method"] for h in hf} == {"hf"} and all(h["tokens_per_s"] > 0 and h["same_as_tinyspec"] == 1 for h in hf)
    assert "--save" not in runs["hf-float32"]["command"] and not report["left_out"]


@pytest.mark.slow
def test_the_gpu_report_keeps_what_it_finished_and_names_what_did_not_fit(files, tmp_path):
    """A budget spent before the benchmarks: what ran is written, the rest is named."""
    bench.main(["report", "--out", str(tmp_path / "r"), "--model", str(files / "target.safetensors"),
                "--skip", "kernels", "--budget", "0.01"])
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["runs"] == [] and report["left_out"] and "budget" in report["left_out"][0]
    assert "Not finished" in (tmp_path / "r" / "report.md").read_text()


@pytest.mark.parametrize("argv", [["--save", "{bad}/r.json"], ["--plot", "{bad}/figures"], ["report", "--out", "{bad}/r"]])
def test_an_output_that_cannot_be_written_fails_before_the_work(files, tmp_path, argv, capsys, monkeypatch):
    """A 67-minute benchmark must not die at its end on a bad path: the path is checked first."""
    (tmp_path / "afile").write_text("")
    argv = [a.format(bad=tmp_path / "afile") for a in argv]
    monkeypatch.setattr(benchmark, "prepare", lambda *a: pytest.fail("the benchmark ran before its output was checked"))
    with pytest.raises(SystemExit) as e:
        bench.main(argv + ["--model", str(files / "target.safetensors")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "afile is a file, not a folder" in err and err.count("\n") == 1, err


def special_paths(tmp_path) -> dict[str, str]:
    """Outputs no command may write, as root too: /proc and /sys refuse new files whatever the
    permission bits say (os.access says yes), a device or a FIFO must not be replaced by a file."""
    import os
    import socket
    os.mkfifo(tmp_path / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    (tmp_path / "folder").mkdir()
    (tmp_path / "to-fifo").symlink_to(tmp_path / "fifo")
    paths = {"proc": "/proc/x.json", "sys": "/sys/x.json", "fifo": str(tmp_path / "fifo"), "socket": str(tmp_path / "sock"),
             "folder": str(tmp_path / "folder"), "link to a fifo": str(tmp_path / "to-fifo")}
    if os.path.exists("/dev/full"):
        paths["device"] = "/dev/full"
    return paths


SPECIAL = ["proc", "sys", "fifo", "socket", "folder", "link to a fifo", "device"]


def unchanged(tmp_path, path: str) -> bool:
    """Nothing was made or replaced: /proc and /sys hold no x.json, the FIFO, socket, folder and
    device are what they were, and no temporary file was left beside them."""
    import stat
    from pathlib import Path
    mode = Path(path).stat().st_mode if Path(path).exists() else None
    kinds = {"fifo": stat.S_ISFIFO, "sock": stat.S_ISSOCK, "folder": stat.S_ISDIR, "to-fifo": stat.S_ISFIFO,
             "full": stat.S_ISCHR}
    name = Path(path).name
    if name in kinds and (mode is None or not kinds[name](mode)):
        return False
    return not Path("/proc/x.json").exists() and not Path("/sys/x.json").exists() and \
        not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("flag, kind", [(flag, kind) for flag in ("--save", "--plot", "report --out") for kind in SPECIAL
                                        if flag == "--save" or kind != "folder"])  # --plot and --out take a folder
def test_outputs_that_cannot_be_written_are_refused_before_the_work(files, tmp_path, flag, kind, capsys, monkeypatch):
    """As root (CI's user) too: the output is tried by creating a file where it will go."""
    paths = special_paths(tmp_path)
    if kind not in paths:
        pytest.skip("no /dev/full here")
    path = paths[kind] if flag == "--save" else paths[kind].removesuffix(".json")
    monkeypatch.setattr(benchmark, "prepare", lambda *a: pytest.fail("the benchmark ran before its output was checked"))
    err = refused(bench.main, flag.split() + [path, "--model", str(files / "target.safetensors")], capsys)
    assert "Traceback" not in err and path in err and unchanged(tmp_path, path), err


def test_evaluate_refuses_an_output_it_cannot_write_before_the_work(files, tmp_path, capsys, monkeypatch):
    from tinyspec.bench import evaluate
    monkeypatch.setattr(evaluate, "prepare", lambda *a: pytest.fail("evaluate ran before its output was checked"))
    for path in ("/proc/x.json", str(tmp_path)):
        assert "--save" in refused(evaluate.main, ["--save", path, "--stdlib-only"], capsys)
    assert "--data-dir" in refused(evaluate.main, ["--data-dir", "/proc/x", "--stdlib-only"], capsys)
    assert not list(tmp_path.iterdir())


def test_a_saved_report_goes_through_a_symlink_to_its_target(files, tmp_path):
    """--save LINK writes the file LINK points at (the temporary file beside it) and keeps the link."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "r.json").write_text("old")
    (tmp_path / "link.json").symlink_to(tmp_path / "real" / "r.json")
    bench.main(["--quick", "--no-hf", "--methods", "ar", "--categories", "code", "--max-new-tokens", "4",
                "--model", str(files / "target.safetensors"), "--save", str(tmp_path / "link.json")])
    assert (tmp_path / "link.json").is_symlink() and json.loads((tmp_path / "real" / "r.json").read_text())["rows"]
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["r.json"]


QUICK = ["--quick", "--no-hf", "--methods", "ar", "--categories", "code", "--max-new-tokens", "4"]


def test_results_are_saved_before_they_are_printed(files, tmp_path, capsys, monkeypatch):
    """Saved first: a closed pipe or a full stdout, met while printing, cannot lose them. A save
    that fails all the same (a disk filled during the run) leaves the table printed, and says so."""
    def saved_first(path, report):
        assert capsys.readouterr().out == "" and report["rows"]  # nothing printed yet
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(bench, "atomic_write_json", saved_first)
    with pytest.raises(SystemExit) as e:
        bench.main(QUICK + ["--model", str(files / "target.safetensors"), "--save", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert e.value.code == 1 and "ar" in out and err.strip().splitlines()[-1] == (
        f"error: --save {tmp_path / 'r.json'}: cannot write it (No space left on device); the results are only in "
        "the output")


def test_a_full_stdout_loses_neither_the_benchmark_nor_the_evaluation(files, tmp_path, capsys, monkeypatch,
                                                                     full_stdout):
    """`> /dev/full`: one line and status 1, with the report saved (evaluate had done 38 s of work)."""
    import numpy as np
    from tinyspec.bench import evaluate
    from tinyspec.commands.cli import run_main
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("val", "val-packages"):
        np.arange(3000, dtype=np.uint16).tofile(corpus / f"{name}.bin")
    monkeypatch.setattr("tinyspec.training.corpus.prepare", lambda *a, **k: corpus)
    random_gpt(vocab_size=8192, n_ctx=96, scale=3.0).save(tmp_path / "target.safetensors")
    full_stdout()
    for main, argv in ((bench.main, QUICK + ["--model", str(files / "target.safetensors")]),
                       (evaluate.main, ["--methods", "ar", "--prompts-per-category", "1", "--max-new-tokens", "4",
                                        "--model", str(tmp_path / "target.safetensors")])):
        with pytest.raises(SystemExit) as e:
            run_main(lambda: main(argv + ["--save", str(tmp_path / "r.json")]))
        assert e.value.code == 1 and capsys.readouterr().err.strip().splitlines()[-1] == \
            "error: cannot write to standard output: No space left on device"
        assert (tmp_path / "r.json").is_file()
        (tmp_path / "r.json").unlink()


def test_ctrl_c_saves_the_rows_that_finished_says_so_and_exits_130(files, tmp_path, capsys, monkeypatch):
    """Ctrl-C while the docs prompt decodes: the code row, finished, is saved and printed, marked as an
    interrupted run; the docs row, cut short (its prompt's tokens half made), is left out, not saved
    as a finished row with a lower tau (decoding catches Ctrl-C to return what it has)."""
    from tinyspec import methods
    real, calls = methods.Decoder.steps, []

    def steps(self, prompt, sampling, generator, max_new_tokens, stop_id=None):
        calls.append(prompt)
        for i, step in enumerate(real(self, prompt, sampling, generator, max_new_tokens, stop_id)):
            if len(calls) == 3 and i == 2:  # the warm-up, the code prompt, then the docs prompt
                raise KeyboardInterrupt
            yield step
    monkeypatch.setattr(methods.Decoder, "steps", steps)
    with pytest.raises(SystemExit) as e:
        bench.main(QUICK[:4] + ["--categories", "code,docs", "--prompts-per-category", "1", "--max-new-tokens", "8",
                                "--model", str(files / "target.safetensors"), "--save", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    saved = json.loads((tmp_path / "r.json").read_text())
    assert e.value.code == 130 and saved["interrupted"] is True and saved["planned_rows"] == 2
    assert [(r["category"], r["new_tokens"]) for r in saved["rows"]] == [("code", 8)]
    assert "code" in out and "docs" not in out.split("-\n", 1)[1]
    assert err.strip().splitlines()[-1] == f"[interrupted] 1 of 2 rows finished; saved in {tmp_path / 'r.json'} (a " \
        "row under way is left out)"


def test_ctrl_c_in_the_hugging_face_phase_stops_it_saves_what_finished_and_exits_130(files, tmp_path):
    """A real Ctrl-C while tinyspec's own greedy tokens for Hugging Face's second category are decoded
    (decoding returns what it has on Ctrl-C, and the comparison once took that for a finished run and
    went on: the benchmark ended with status 0, unmarked): status 130, the report marked interrupted,
    every method row and Hugging Face's finished row saved."""
    pytest.importorskip("transformers")
    setup = """
from tinyspec.bench import peer
real, calls = peer.run, []
def run(steps, *args, **kwargs):
    calls.append(steps)
    def waiting():
        for i, step in enumerate(steps):
            if len(calls) == 2 and i == 1:
                wait_for_ctrl_c()
            yield step
    return real(waiting(), *args, **kwargs)
peer.run = run"""
    argv = ["--methods", "ar", "--temperatures", "0", "--categories", "code,docs", "--prompts-per-category", "1",
            "--max-new-tokens", "8", "--repeats", "1", "--hf-modes", "hf", "--threads", "1", "--model",
            str(files / "target.safetensors"), "--save", str(tmp_path / "r.json")]
    status, out, err = ctrl_c("tinyspec.bench.command", argv, setup)
    assert status == 130 and "Traceback" not in err, err
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["interrupted"] is True and [r["category"] for r in saved["rows"]] == ["code", "docs"]
    assert [(r["method"], r["category"]) for r in saved["huggingface"]] == [("hf", "code")]
    assert saved["huggingface"][0]["tinyspec_speedup"] > 0
    assert err.strip().splitlines()[-1] == f"[interrupted] 2 of 2 rows finished; saved in {tmp_path / 'r.json'} (a " \
        "row under way is left out)"


def test_ctrl_c_during_evaluate_saves_the_figures_that_finished(files, tmp_path):
    """evaluate --save, stopped by a real Ctrl-C as plain decoding starts its second category: status
    130, and the file holds the validation loss and the first category's tau and loops, marked
    interrupted (it once saved nothing, though --save's help promised it)."""
    import numpy as np
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("val", "val-packages"):
        np.arange(3000, dtype=np.uint16).tofile(corpus / f"{name}.bin")
    random_gpt(vocab_size=8192, n_ctx=96, scale=3.0).save(tmp_path / "target.safetensors")
    setup = f"""
from pathlib import Path
from tinyspec.training import corpus
corpus.prepare = lambda *args, **kwargs: Path({str(corpus)!r})
from tinyspec.bench import runner
real, calls = runner.Runner.run, []
def run(self, *args, **kwargs):
    calls.append(args)
    if len(calls) == 2:
        wait_for_ctrl_c()
    return real(self, *args, **kwargs)
runner.Runner.run = run"""
    argv = ["--methods", "ar", "--categories", "code,docs", "--prompts-per-category", "1", "--max-new-tokens", "8",
            "--model", str(tmp_path / "target.safetensors"), "--save", str(tmp_path / "q.json")]
    status, out, err = ctrl_c("tinyspec.bench.evaluate", argv, setup)
    assert status == 130 and "Traceback" not in err, err
    saved = json.loads((tmp_path / "q.json").read_text())
    assert saved["interrupted"] is True and set(saved["validation_loss"]) == {"val", "val-packages"}
    assert list(saved["tau"]) == ["ar"] and list(saved["tau"]["ar"]) == ["code"] and list(saved["loops"]) == ["code"]
    assert "tau ar" in out and err.strip().splitlines()[-1] == f"[interrupted] what finished is above; saved in " \
        f"{tmp_path / 'q.json'} (a figure under way is left out)", err


def test_help_names_every_method_and_the_other_benchmark_commands(capsys):
    from tinyspec.methods import METHODS
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    text = capsys.readouterr().out
    assert "bench report --out" in text and "bench kernels" in text
    assert all(name in text for name in METHODS)


@pytest.mark.parametrize("json_", [[], ["--json"]], ids=["table", "json"])
def test_a_closed_pipe_ends_the_benchmark_quietly_and_keeps_its_report(files, tmp_path, json_):
    """`bench ... --save X | head -1`: the reader is gone before the table comes (head has its line, or
    never waited: `| true`); the command ends quietly, and the report is saved all the same."""
    import subprocess
    p = subprocess.Popen([sys.executable, "-m", "tinyspec", "bench", *QUICK, "--model", str(files / "target.safetensors"),
                          "--save", str(tmp_path / "r.json"), *json_], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
    assert json.loads((tmp_path / "r.json").read_text())["rows"][0]["method"] == "ar"


def test_a_loop_is_a_window_that_comes_back_three_times():
    from tinyspec.bench.evaluate import loops
    assert loops([7] * 10) and loops(list(range(8)) * 3) and loops([1, 2] * 12)
    assert not loops(list(range(64))) and not loops(list(range(8)) * 2 + list(range(8, 40)))
    assert not loops(list(range(8)) * 3, window=9) and loops(list(range(4)) * 3, window=4)


def test_evaluate_reports_validation_loss_loops_and_tau(files, tmp_path, capsys, monkeypatch):
    """On random models (the figures mean nothing): every method's tau per category, the loops of
    plain decoding, and validation loss on the corpus's held-out files, saved as JSON."""
    import numpy as np
    from tinyspec.bench import evaluate
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("val", "val-packages"):
        np.arange(3000, dtype=np.uint16).tofile(corpus / f"{name}.bin")
    monkeypatch.setattr("tinyspec.training.corpus.prepare", lambda *a, **k: corpus)
    # validation reads windows as long as the target's context: a short one (room for each category's first prompt)
    random_gpt(vocab_size=8192, n_ctx=96, scale=3.0).save(tmp_path / "target.safetensors")
    evaluate.main(["--methods", "ar,draft:2,lookup:4", "--prompts-per-category", "1", "--max-new-tokens", "8",
                   "--model", str(tmp_path / "target.safetensors"), "--draft", str(files / "draft.safetensors"),
                   "--save", str(tmp_path / "q.json")])
    report = json.loads((tmp_path / "q.json").read_text())
    assert set(report["validation_loss"]) == {"val", "val-packages"} and report["validation_loss"]["val"] > 0
    assert set(report["tau"]) == {"ar", "draft:2", "lookup:4"} and report["tau"]["ar"] == {"code": 1, "docs": 1, "structured": 1}
    assert report["loops"]["code"][1] == 1 and "tau draft:2" in capsys.readouterr().out


def test_profile_splits_every_row(files, capsys):
    bench.main(["--quick", "--json", "--no-hf", "--methods", "ar,medusa:8", "--categories", "code", "--max-new-tokens",
                "8", "--profile", "--model", str(files / "target.safetensors"), "--heads", str(files / "heads.safetensors")])
    rows = json.loads(capsys.readouterr().out)["rows"]
    for r in rows:
        assert set(r["ledger"]) == {"target", "propose", "rule", "cache", "rest"}
        assert sum(r["ledger"].values()) == pytest.approx(1, abs=0.01) and (r["ledger"]["propose"] > 0) == (r["method"] != "ar")


def test_the_ledger_figure_stacks_each_methods_parts(tmp_path):
    """ledger.png: per method, the time per token over ar's, split into the ledger's parts."""
    pytest.importorskip("matplotlib")
    from tinyspec.bench.plots import write_plots
    ledger = lambda target, propose: {"target": target, "propose": propose, "rule": 0.05, "cache": 0.05,
                                      "rest": 0.9 - target - propose}
    rows = [{"method": m, "temperature": 0.0, "category": c, "tau": tau, "speedup": speedup, "ledger": ledger(*parts)}
            for m, tau, speedup, parts in (("ar", 1.0, 1.0, (0.8, 0.0)), ("medusa:16", 2.5, 0.9, (0.5, 0.3)))
            for c in ("code", "docs")]
    assert tmp_path / "ledger.png" in write_plots(rows, tmp_path)


def test_a_method_named_without_a_size_passes_the_size_checks():
    """`--methods draft,medusa@pointmass` runs each at its default size, `:auto` leaves it to sizing:
    neither is a size to check; a size given is checked by the method itself."""
    from tinyspec.commands.method import parse_size
    from tinyspec.methods.draft import DraftModel
    from tinyspec.methods.lookup import PromptLookup
    target = random_gpt(vocab_size=64, n_ctx=96)
    draft, lookup = DraftModel(target, random_gpt(vocab_size=64, n_ctx=96)), PromptLookup(target)
    for spec in ("draft", "draft:auto", "lookup@pointmass", "lookup:auto@pointmass"):
        name, size, _ = specs.parse_method(spec)
        assert parse_size(draft if name == "draft" else lookup, size or None, 96) == (size or None)
    for proposer, size in ((draft, "100"), (lookup, "0"), (lookup, "2,3")):
        with pytest.raises(SystemExit):
            parse_size(proposer, size, 96)


def test_a_pass_interleaved_prompt_by_prompt_adds_up_its_runs():
    """The benchmark runs every method on prompt 1, then on prompt 2, ...; a method's pass is its
    runs added: counts, seconds and the ledger's parts summed, the outputs in prompt order."""
    from collections import Counter
    one = dict(new_tokens=3, wall_s=1.0, outputs=[[1, 2, 3]], sizes=Counter({0: 2, 4: 1}),
               ledger={"target": 0.6, "rest": 0.4})
    two = dict(new_tokens=2, wall_s=0.5, outputs=[[4, 5]], sizes=Counter({0: 2}), ledger={"target": 0.4, "rest": 0.1})
    both = runner.together([one, two])
    assert both["new_tokens"] == 5 and both["wall_s"] == 1.5 and both["outputs"] == [[1, 2, 3], [4, 5]]
    assert both["sizes"] == {0: 4, 4: 1} and both["ledger"] == pytest.approx({"target": 1.0, "rest": 0.5})
    assert one["outputs"] == [[1, 2, 3]] and one["ledger"]["target"] == 0.6  # the runs themselves unchanged


def test_the_report_sets_each_graph_row_beside_its_eager_one():
    from tinyspec.bench.report import markdown
    row = dict(method="medusa:16", temperature=0.0, category="code", tau=2.3, speedup=1.0, weights_GBps=1.0)
    runs = [{"run": "graph-float32", "dtype": "float32", "rows": [dict(row, tokens_per_s=300.0)],
             "command": "python -m tinyspec bench --cuda-graph"},
            {"run": "eager-float32", "dtype": "float32", "rows": [dict(row, tokens_per_s=100.0)],
             "command": "python -m tinyspec bench"},
            {"run": "ledger-graph-float32", "rows": [dict(row, ledger={"step": 0.9, "propose": 0.05, "rest": 0.05})]}]
    md = markdown({"device": "a GPU", "torch": "2", "note": "", "runs": runs})
    assert "| float32 | medusa:16 | 0 | code | 300.0 | 100.0 | 3.00 |" in md
    assert "| graph | medusa:16 | 2.3 | - | 0% | 5% | 0% | 0% | 90% | 5% |" in md
