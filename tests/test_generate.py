"""Plain decoding and the generate command line."""
import json
import subprocess
import sys

import pytest
import torch

from tinyspec.commands import generate
from tinyspec.decoding import Row, Step, autoregressive, ended
from tinyspec.results import run
from tinyspec.commands.generate import Printer
from tinyspec.sampling import Sampling

from conftest import random_gpt, refused
from tinyspec.commands.cli import WEIGHTS
from tinyspec.model import GPT


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """A random model over the shipped tokenizer's 8192 tokens, saved like the shipped one."""
    path = tmp_path_factory.mktemp("m") / "model.safetensors"
    random_gpt(vocab_size=8192, n_ctx=64, scale=4.0).save(path)
    return path


def naive_greedy(model, prompt, n):
    """Reference: no cache, the whole sequence through the model for every token."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq]))[0][0, -1].argmax()))
    return seq[len(prompt):]


def test_greedy_with_cache_equals_recomputing_everything():
    model = random_gpt(scale=4.0)
    for prompt in ([1], [5, 9, 2, 33], list(range(20))):
        res = run(autoregressive(model, [prompt], Sampling(0.0), [None], 30))
        assert res.token_ids == naive_greedy(model, prompt, 30)
        assert res.target_steps == 30 and res.stop_reason == "length"


def test_seeded_sampling_is_reproducible():
    model = random_gpt(scale=2.0)
    draw = lambda seed: run(autoregressive(model, [[1, 2]], Sampling(1.0, top_k=20), [torch.Generator().manual_seed(seed)], 25)).token_ids
    assert draw(7) == draw(7) != draw(8)


def fake_method(steps, max_new_tokens, stop_id=None):
    """A loop of one row (row 0) whose forwards give `steps`, each cut as `decoding.decode` cuts
    it (`ended`); the context is full after the last."""
    row = Row(0, [], None)
    for i, tokens in enumerate(steps):
        step = ended(Step(tokens, ["target"] * len(tokens)), row, max_new_tokens, stop_id, i == len(steps) - 1)
        yield {0: step}
        if step.stop:
            return


def test_a_row_stops_at_eot_length_and_context():
    res = run(fake_method([[1, 2], [3, 99, 4]], 10, 99))
    assert (res.token_ids, res.stop_reason, res.target_steps) == ([1, 2, 3], "eot", 2)
    res = run(fake_method([[1, 2], [3, 4, 5]], 4, 99))
    assert (res.token_ids, res.stop_reason) == ([1, 2, 3, 4], "length")
    res = run(fake_method([[1], [2]], 10))
    assert (res.token_ids, res.stop_reason) == ([1, 2], "context")


def test_context_window_ends_generation(model_file, enc, capsys):
    prompt = " ".join(["word"] * 50)
    generate.main(["--prompt", prompt, "--max-new-tokens", "500", "--model", str(model_file), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["stop_reason"] == "context"
    # 64 positions (n_ctx) are fed through the model; the token predicted at the last one is the 65th
    assert len(enc.encode_ordinary(prompt)) + len(out["token_ids"]) == 65


def test_streaming_decodes_characters_split_across_tokens(enc):
    import io
    text = "naïve 日本語 ok"
    buf = io.StringIO()
    printer = Printer(enc, buf)
    for t in [t for t in enc.encode_ordinary(text)]:
        printer(Step([t], ["target"]))
    printer.finish()
    assert buf.getvalue() == text + "\n"


def test_json_output(model_file, capsys):
    generate.main(["--prompt", "def f(x):", "--max-new-tokens", "12", "--model", str(model_file), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"prompt", "text", "token_ids", "stats"} and out["prompt"] == "def f(x):"
    assert {"new_tokens", "target_steps", "wall_s", "tokens_per_s"} <= set(out["stats"])
    assert out["stats"]["new_tokens"] == len(out["token_ids"]) <= 12
    stats, n_bytes = out["stats"], sum(p.numel() * 4 for p in random_gpt(vocab_size=8192, n_ctx=64).parameters())
    expected = n_bytes * stats["target_steps"] / stats["wall_s"] / 1e9  # float32 weights, read once per forward
    assert stats["weights_GBps"] == pytest.approx(expected, rel=0.05)  # wall_s is rounded in stats


def test_prompt_files_jsonl_and_plain(model_file, tmp_path, capsys):
    (tmp_path / "p.jsonl").write_text('{"prompt": "import os\\n"}\n{"prompt": "class A:"}\n')
    (tmp_path / "p.txt").write_text("import os\n\nclass A:\n")
    for f in ("p.jsonl", "p.txt"):
        generate.main(["--prompt-file", str(tmp_path / f), "--max-new-tokens", "4", "--model", str(model_file), "--json"])
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [r["prompt"] for r in rows] == (["import os\n", "class A:"] if f == "p.jsonl" else ["import os", "class A:"])


@pytest.mark.parametrize("argv, message", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "2"], "top-p"),
    (["--max-new-tokens", "0"], "max-new-tokens"),
    (["--model", "/nonexistent/model.safetensors"], "not found"),
    (["--device", "cuda:7"], "device"),
    (["--method", "nope"], "--help"),
    (["--prompt-file", "/nonexistent.jsonl"], "no such file"),
])
def test_bad_input_is_one_line_exit_2(model_file, argv, message, capsys):
    base = ["--model", str(model_file)] + (["--prompt", "x"] if "--prompt-file" not in argv else [])
    assert message in refused(generate.main, base + argv, capsys)


def test_too_long_prompt_and_vocab_mismatch(model_file, tmp_path, capsys):
    with pytest.raises(SystemExit):
        generate.main(["--prompt", "word " * 100, "--model", str(model_file)])
    assert "context is 64" in capsys.readouterr().err
    random_gpt(vocab_size=100).save(tmp_path / "v100.safetensors")
    with pytest.raises(SystemExit):
        generate.main(["--prompt", "x", "--model", str(tmp_path / "v100.safetensors")])
    assert "vocabulary" in capsys.readouterr().err


def test_command_line_process_exits_2_without_traceback(tmp_path):
    (tmp_path / "broken.safetensors").write_bytes(b"\x00" * 10)
    p = subprocess.run([sys.executable, "-m", "tinyspec", "generate", "--prompt", "x", "--model", str(tmp_path / "broken.safetensors")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.startswith("error:"), p.stderr


@pytest.mark.parametrize("argv, message", [
    (["--temperature", "inf"], "temperature"),
    (["--temperature", "1e-39"], "temperature"),
    (["--max-ngram", "3"], "--max-ngram applies to --method lookup or rest"),
    (["--tree", "t.json"], "--tree applies to --method medusa or eagle"),
    (["--method", "lookup", "--max-ngram", "9"], "--max-ngram must be in 1..8"),
    (["--accept", "block"], "plain decoding"),
    (["--method", "medusa", "--accept", "block"], "verifies a chain"),
    (["--method", "draft", "--size", "0"], "--size"),
    (["--method", "draft", "--size", "17"], "--size"),
    (["--method", "lookahead", "--size", "3"], "W,N,G"),
    (["--size", "4"], "plain decoding (ar) proposes nothing"),
    (["--threads", "0"], "--threads"),
    (["--prompt-file", "{tmp}"], "is a folder, not a file"),
    (["--prompt-file", "{tmp}/latin1.txt"], "not UTF-8"),
    (["--prompt-file", "{tmp}/number.jsonl"], "must be a string"),
    (["--tokenizer", "{tmp}/garbage.tiktoken"], "not a tiktoken ranks file"),
    (["--top-k", "5"], "no effect at --temperature 0"),
    (["--top-p", "0.9"], "no effect at --temperature 0"),
    (["--method", "medusa", "--heads", "{weights}/draft.safetensors"], "holds a GPT model, not Medusa heads: pass it as"),
    (["--method", "medusa", "--heads", "{weights}/eagle.safetensors"], "holds an EAGLE head, not Medusa heads: pass it as --eagle"),
    (["--method", "eagle", "--eagle", "{weights}/medusa.safetensors"], "holds Medusa heads, not an EAGLE head: pass it as --heads"),
    (["--method", "draft", "--draft", "{weights}/medusa.safetensors"], "holds Medusa heads, not a GPT model: pass it as --heads"),
    (["--model", "{weights}/eagle.safetensors"], "holds an EAGLE head, not a GPT model: pass it as --eagle"),
])
def test_more_bad_input_is_one_line_exit_2(model_file, tmp_path, argv, message, capsys):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 = 1\n".encode("latin-1"))
    (tmp_path / "number.jsonl").write_text('{"prompt": 5}\n')
    (tmp_path / "garbage.tiktoken").write_text("this is not\na ranks file at all\n")
    argv = [a.format(tmp=tmp_path, weights=WEIGHTS) for a in argv]
    base = ["--model", str(model_file)] + (["--prompt", "x"] if "--prompt-file" not in argv else [])
    assert message in refused(generate.main, base + argv, capsys)


def test_several_prompts_print_apart_with_their_own_seeds(model_file, tmp_path, capsys, enc):
    """Each prompt's text under a heading, its stats line naming it; prompt i samples from seed + i
    whatever the batch size, so identical prompts get independent samples, and a prompt's text
    is the same alone as in a batch."""
    (tmp_path / "p.txt").write_text("def f(x):\n" * 6)
    base = ["--prompt-file", str(tmp_path / "p.txt"), "--model", str(model_file), "--max-new-tokens", "8",
            "--temperature", "1", "--seed", "5"]
    texts = {}
    for b in ("1", "3"):
        generate.main(base + ["--batch-size", b])
        out, err = capsys.readouterr()
        assert [line for line in out.splitlines() if line.startswith("===")] == [f"=== prompt {i} of 6 ===" for i in range(1, 7)]
        assert "6 prompts from" in err and all(f"[prompt {i} of 6]" in err for i in range(1, 7))
        texts[b] = [chunk.split("\n", 1)[1] for chunk in out.split("=== prompt ")[1:]]
    assert texts["1"] == texts["3"]
    assert len(set(texts["1"])) > 1  # six draws, not one draw six times
    generate.main(base + ["--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    model, prompt = GPT.from_hf(model_file), enc.encode_ordinary("def f(x):")
    alone = lambda seed: run(autoregressive(model, [prompt], Sampling(1.0), [torch.Generator().manual_seed(seed)], 8))
    assert [r["token_ids"] for r in rows[:2]] == [alone(5).token_ids, alone(6).token_ids]  # prompt i: seed + i


def test_a_closed_pipe_ends_generate_quietly():
    """`generate ... | head -1`: the reader goes after one line; the command ends with status 0 and
    no traceback (Python's default is BrokenPipeError and status 1)."""
    p = subprocess.Popen([sys.executable, "-m", "tinyspec", "generate", "--prompt-file", "docs/example_prompts.txt", "--json",
                          "--max-new-tokens", "16"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=WEIGHTS.parent)
    first = p.stdout.readline()
    p.stdout.close()  # as head does after its line
    err = p.stderr.read().decode()
    assert json.loads(first)["prompt"] and p.wait(timeout=120) == 0 and "Traceback" not in err and "Error" not in err, err


def test_a_model_trained_with_another_tokenizer_is_refused(tmp_path, capsys):
    model = random_gpt(vocab_size=8192, n_ctx=64)
    model.tokenizer_fingerprint = "0123456789abcdef"  # a retrained tokenizer of the same size
    model.save(tmp_path / "m.safetensors")
    with pytest.raises(SystemExit) as e:
        generate.main(["--prompt", "x", "--model", str(tmp_path / "m.safetensors")])
    assert e.value.code == 2 and "another tokenizer" in capsys.readouterr().err


def test_the_shipped_models_name_the_shipped_tokenizer(enc):
    from tinyspec.commands.cli import DEFAULT_DRAFT, DEFAULT_MODEL
    from tinyspec.model import GPT
    for path in (DEFAULT_MODEL, DEFAULT_DRAFT):
        assert GPT.from_hf(path).tokenizer_fingerprint == enc.fingerprint


def test_colour_only_on_a_terminal_or_when_asked(model_file, capsys, monkeypatch):
    base = ["--prompt", "x", "--max-new-tokens", "4", "--model", str(model_file), "--show"]
    monkeypatch.delenv("NO_COLOR", raising=False)
    coloured = lambda captured: "\033[" in captured.out + captured.err  # tokens, and the legend of colours
    generate.main(base)  # captured output is not a terminal
    assert not coloured(capsys.readouterr())
    generate.main(base + ["--color", "always"])
    assert coloured(capsys.readouterr())
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    generate.main(base)
    assert coloured(capsys.readouterr())
    monkeypatch.setenv("NO_COLOR", "1")
    generate.main(base)
    assert not coloured(capsys.readouterr())


def test_ctrl_c_prints_what_was_generated_and_exits_130(model_file, capsys, monkeypatch):
    from tinyspec import methods

    def interrupted(self, prompt, sampling, generator, max_new_tokens, stop_id=None):
        yield {0: Step([72], ["target"])}
        raise KeyboardInterrupt
    monkeypatch.setattr(methods.Decoder, "steps", interrupted)
    with pytest.raises(SystemExit) as e:
        generate.main(["--prompt", "x", "--model", str(model_file)])
    out, err = capsys.readouterr()
    assert e.value.code == 130 and out.startswith("x") and len(out.strip()) > 1 and "interrupted" in err
    assert "Traceback" not in err


def test_end_of_text_just_past_the_budget_stops_for_length_in_every_method():
    for steps in ([[1], [2], [99]], [[1, 2, 99]]):  # plain decoding, and one speculative step
        res = run(fake_method(steps, 2, 99))
        assert (res.token_ids, res.stop_reason) == ([1, 2], "length")


def test_the_overview_and_help_name_every_method_and_training_job(capsys):
    """Written from what exists (methods.METHODS, train's subcommands), so they cannot fall behind."""
    from tinyspec import __main__ as overview
    from tinyspec.methods import METHODS
    from tinyspec.commands.train import build_parser
    overview.main([])
    text = capsys.readouterr().out
    jobs = next(a.choices for a in build_parser()._actions if a.dest == "what")
    assert "|".join(METHODS) in text and all(job in text for job in jobs) and {"eagle", "lookup", "rest"} <= set(METHODS)
    with pytest.raises(SystemExit):
        generate.main(["--help"])
    help_text = capsys.readouterr().out
    assert all(f"{name}: " in help_text for name in METHODS)
    assert "docs/example_prompts.txt" in help_text and "prompts.jsonl" not in help_text


def python_ctrl_c():
    """In the child, before Python starts: Ctrl-C as a terminal gives it, whatever this process was
    started with (a job started in the background by a shell ignores SIGINT, and its children inherit
    that; tinyspec rightly keeps an ignored SIGINT ignored)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("command", [["generate"], ["bench"], []])
def test_ctrl_c_while_the_command_is_still_importing_is_one_line_and_130(command):
    """Ctrl-C in the first seconds, while `import torch` runs: "[interrupted]" and status 130, as
    later, not a traceback from inside torch. Sent 0.2 s after the start, well inside the imports."""
    import signal
    import time
    p = subprocess.Popen([sys.executable, "-m", "tinyspec", *command, "--help"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=python_ctrl_c)
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "Traceback" not in err and err.strip() == "[interrupted]", (p.returncode, err)


def test_a_program_that_imports_tinyspec_keeps_pythons_ctrl_c():
    """Only `python -m tinyspec...` changes Ctrl-C while it starts; a program, a notebook or the
    tests that import tinyspec get Python's KeyboardInterrupt as always."""
    code = "import signal, tinyspec; assert signal.getsignal(signal.SIGINT) is signal.default_int_handler; print('ok')"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=python_ctrl_c)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
    import signal
    import tinyspec
    assert signal.getsignal(signal.SIGINT) is not tinyspec.interrupted_while_starting  # pytest's own process neither


def test_run_main_gives_the_command_pythons_ctrl_c_back(monkeypatch):
    """The early handler covers the imports only: a command's main() runs with Python's own, so that
    decoding can catch KeyboardInterrupt and print what it has (the test above this one's)."""
    import signal
    import tinyspec
    from tinyspec.commands.cli import run_main
    seen = []
    monkeypatch.setattr(signal, "signal", lambda sig, handler: seen.append(handler))
    monkeypatch.setattr(signal, "getsignal", lambda sig: tinyspec.interrupted_while_starting)
    run_main(lambda: None)
    assert seen == [signal.default_int_handler]


def test_sampling_flags_show_their_defaults_in_help(capsys):
    with pytest.raises(SystemExit):
        generate.main(["--help"])
    text = " ".join(capsys.readouterr().out.split()).split("options:")[1]
    for flag, default in (("--temperature", "(default: 0, greedy)"), ("--top-k", "(default: all tokens)"),
                          ("--top-p", "(default: all tokens"), ("--seed", "(default: 0)")):
        assert default in text[text.index(f"{flag} {flag[2:].upper().replace('-', '_')}"):][:400], flag


def test_the_seeds_help_and_the_readme_say_what_a_seed_repeats(capsys):
    """Where a user looks for reproducibility (--seed's help, the README's sampling paragraph): at a
    fixed size a prompt's text repeats, alone or in a batch; at --size auto sampled text may not, its
    sizes following costs measured from the clock; greedy text always does."""
    import re
    with pytest.raises(SystemExit):
        generate.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    seed = text[text.index("--seed SEED seed of"):]
    seed = seed[:seed.index("--model MODEL")]
    for words in ("0..2**63-1", "at a fixed size", "--size auto", "from forward costs measured anew on each run",
                  "differ between runs and between a batch and alone; greedy text never does"):
        assert words in seed, words
    readme = " ".join(re.sub(r"^# ", "", (WEIGHTS.parent / "README.md").read_text(), flags=re.M).split())
    assert "--seed repeats a run: at a fixed size a prompt's sampled text is the same every run, and in a batch as " \
           "alone; with --size auto" in readme and "can differ between runs and between a batch and alone" in readme
