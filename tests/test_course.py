"""Coursework: a handout's graded tests fail with the stubs and pass with the solutions back."""
import ast
import importlib
import json
import re
import shlex
import shutil
import subprocess

import pytest

from tinyspec.__main__ import parser_of
from tinyspec.course import handouts as course


def test_stub_out_replaces_whole_bodies_and_keeps_docstrings():
    src = ('def f(x):\n    """Add one."""\n    y = x + 1  # the answer\n    return y\n\n'
           'class C:\n    def g(self):\n        return 2\n\n\ndef h():\n    return 3\n')
    text = course.stub_out(src, "a", ["f", "C.g"])
    assert 'def f(x):\n    """Add one."""\n    raise NotImplementedError("a: write f (see its docstring)")\n' in text
    assert "x + 1" not in text and "the answer" not in text and "return 2" not in text
    assert '        raise NotImplementedError("a: write C.g' in text and "return 3" in text
    compile(text, "<stub>", "exec")  # still valid Python


def test_every_chapter_names_existing_functions_and_tests():
    for chapter, ch in course.CHAPTERS.items():
        for f in ch.functions:
            file, qualname = f.split(":")
            fn = course.find_function(ast.parse((course.ROOT / "tinyspec" / file).read_text()), qualname)
            assert ast.get_docstring(fn), f"{f} needs a docstring: it is the student's task"
        for t in ch.tests:
            file, name = t.split("::")
            assert f"def {name}(" in (course.ROOT / file).read_text(), t
        assert set(ch.needs) <= set(course.CHAPTERS)


def deliverable_commands(text: str) -> list[list[str]]:
    """The `python -m tinyspec ...` commands a deliverable quotes, as argument lists after the module."""
    return [shlex.split(c.replace("tinyspec.generate", "tinyspec generate", 1))[3:]
            for c in re.findall(r"`(?:time )?(python -m tinyspec[ .][^`]+)`", text)]


def test_every_chapter_is_a_handout_with_hours_and_a_deliverable_made_by_existing_commands():
    """Each chapter names its walkthrough chapter as the book titles it, an estimate of its hours,
    and a written deliverable whose commands parse with tinyspec's own parsers (a method spec as the
    benchmark checks it): a student can run every command the handout asks for."""
    from tinyspec.bench.specs import parse_method
    from tinyspec.methods import check_rule
    titles = re.findall(r"^## (\d+ .+)$", (course.ROOT / "walkthrough.md").read_text(), re.M)
    for chapter, ch in course.CHAPTERS.items():
        assert ch.walkthrough in titles, f"{chapter}: {ch.walkthrough!r} is no chapter of walkthrough.md"
        assert 0 < ch.hours <= 20, chapter
        commands = deliverable_commands(ch.deliverable)
        assert commands, f"{chapter}: the deliverable names no command to measure with"
        for argv in commands:
            name = argv[0]
            module, rest = parser_of(argv)
            args = importlib.import_module(f"tinyspec.{module}").build_parser().parse_args(rest)
            if name == "bench" and getattr(args, "methods", None):
                temperatures = [float(t) for t in (args.temperatures or "0").split(",")]
                for spec in re.split(r",(?=[a-zA-Z])", args.methods):
                    method, _, rule = parse_method(spec)
                    for t in temperatures:
                        assert check_rule(method, rule, t) is None, f"{chapter}: {spec} at T={t}"


def test_grading_names_each_chapters_functions_tests_deliverable_and_hours():
    """GRADING.md, section by section: what to build (every function with its signature, and the
    chapter's notes), how it is graded (every test, the statistical ones said so, with how often a
    correct solution fails them), the deliverable, how a deliverable is graded, and the hours."""
    text = course.grading_md(list(course.CHAPTERS))
    assert "The written deliverable is graded by hand" in text and "noise" in text
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert [s.split()[0] for s in sections] == list(course.CHAPTERS)
    for section, (chapter, ch) in zip(sections, course.CHAPTERS.items()):
        assert f"walkthrough chapter {ch.walkthrough}; about {ch.hours} hours" in section.splitlines()[0]
        assert "### What to build" in section and "### How it is graded" in section
        assert f"### Written deliverable\n\n{ch.deliverable}\n" in section, chapter
        for f in ch.functions:
            file, qualname = f.split(":")
            assert f"`tinyspec/{file}`: `def {qualname}(" in section, f
        assert ch.notes in section, chapter
        for t in ch.tests:
            line = next(line for line in section.splitlines() if f"`{t}`" in line)
            kind = course.statistical(course.ROOT, t)
            assert ("statistical" in line) == (kind is not None) and ("chi-square" in line) == (kind == "chi-square"), t
            assert kind is None or "100,000 runs" in line, t  # fails a correct solution at most ~1e-5 of the time
    assert "chi-square" in text.split("## rules")[1].split("\n## ")[0]  # the exact-distribution tests are


def test_every_graded_test_of_random_draws_says_how_often_it_fails_a_correct_solution():
    """The graded tests that hold a mean or a frequency of random draws, not a chi-square, are flagged
    too: a correct solution drawing its numbers in another order sees other draws, and fails them at
    most about once in 100,000 runs (their bounds are 4.5 standard deviations or more wide)."""
    kinds = {t: course.statistical(course.ROOT, t) for ch in course.CHAPTERS.values() for t in ch.tests}
    assert {t for t, kind in kinds.items() if kind == "mean"} == {
        "tests/test_verify.py::test_block_verification_accepts_more_on_the_papers_example",
        "tests/test_verify.py::test_traversal_is_block_verification_on_a_chain",
        "tests/test_sampling.py::test_seeded_sampling_is_reproducible_and_follows_p",
        "tests/test_sampling.py::test_zero_probability_tokens_are_never_drawn_and_one_hot_gives_its_token"}
    assert {t for t, kind in kinds.items() if kind == "total variation"} == {
        "tests/test_block_correction.py::test_block_has_the_target_distribution_where_the_correction_is_weighed"}


def test_the_rules_handout_says_what_the_tests_hold_beyond_the_docstrings():
    """The types a rule returns, block's refusal of a tree, and traversal where a rejected child
    leaves its parent nothing (S = 0), where dividing by S gives a NaN that min(1.0, nan) hides."""
    notes = course.CHAPTERS["rules"].notes
    for said in ("1-D long tensor", "0-d tensor", "ValueError", '"chain"', "S = 0", "min(1.0, nan) is 1.0"):
        assert said in notes, said


@pytest.mark.slow
def test_handout_fails_with_stubs_and_passes_with_solutions(tmp_path, capsys):
    out = tmp_path / "hw"
    course.main(["handout", str(out), "--chapters", "sampling"])
    assert "NotImplementedError" in (out / "tinyspec" / "sampling.py").read_text()
    assert (out / "GRADING.md").read_text() == course.grading_md(["sampling"])
    shown = []
    passed, total = course.grade(out, ["sampling"], show=shown.append)["sampling"]
    assert total == len(course.CHAPTERS["sampling"].tests) and passed == 0  # every graded test fails on the stub
    assert "NotImplementedError" in shown[0]  # the student sees why
    with pytest.raises(SystemExit) as e:  # grades the handed-out chapters only, and fails loudly
        course.main(["grade", str(out)])
    assert e.value.code == 1 and f"0/{total}" in capsys.readouterr().out
    shutil.copy(course.ROOT / "tinyspec" / "sampling.py", out / "tinyspec" / "sampling.py")  # the solution back
    assert course.grade(out, ["sampling"])["sampling"] == (total, total)
    course.main(["grade", str(out)])
    captured = capsys.readouterr().out
    assert f"{total}/{total}" in captured and "kvcache" not in captured
    course.main(["list"])
    assert f"sampling     walkthrough 4 Sampling: write sampling.py:probs, sampling.py:sample; {total} tests" in \
        capsys.readouterr().out


def test_bad_course_commands(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        course.main(["handout", str(tmp_path / "x"), "--chapters", "poetry"])
    assert e.value.code == 2 and "unknown chapter" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        course.main(["grade", str(tmp_path)])
    assert "does not look like" in capsys.readouterr().err


@pytest.mark.slow
def test_every_chapter_grades_zero_as_handed_out_and_full_marks_with_the_solutions(tmp_path, capsys):
    """All chapters handed out: every graded test fails on the stubs; with the project's own files
    copied back, every chapter grades full marks and `grade` exits 0 (slow-marked tests included:
    a test the project's pytest configuration deselects must still run when grading). Without
    Triton (the README's CPU install) the kernel's chapter is left out, and said to be; the others
    grade as they do with it."""
    out = tmp_path / "hw"
    course.main(["handout", str(out)])
    gradable = [c for c in course.CHAPTERS if course.ungradable(c) is None]
    scores = course.grade(out, list(course.CHAPTERS))
    assert list(scores) == gradable and all(passed == 0 for passed, _ in scores.values()), scores
    shutil.rmtree(out / "tinyspec")
    shutil.copytree(course.ROOT / "tinyspec", out / "tinyspec")
    capsys.readouterr()
    course.main(["grade", str(out)])  # raises SystemExit(1) unless every test passed
    total = sum(len(course.CHAPTERS[c].tests) for c in gradable)
    out, err = capsys.readouterr()
    assert f"total        {total}/{total}" in out
    assert ("kernel       not graded: its tests need triton" in err) == ("kernel" not in gradable), err


@pytest.mark.slow
@pytest.mark.triton
def test_the_kernel_chapter_grades_where_triton_is_installed(tmp_path):
    """The chapter the slow suite leaves out without Triton: zero as handed out, full marks with the
    solution back, its tests run in Triton's interpreter."""
    pytest.importorskip("triton")
    out = tmp_path / "hw"
    course.main(["handout", str(out), "--chapters", "kernel"])
    total = len(course.CHAPTERS["kernel"].tests)
    assert course.grade(out, ["kernel"]) == {"kernel": (0, total)}
    solution = "tinyspec/kernels/tree_attention.py"
    shutil.copy(course.ROOT / solution, out / solution)
    assert course.grade(out, ["kernel"]) == {"kernel": (total, total)}


def test_grading_without_triton_leaves_the_kernel_out_and_refuses_it_by_name(tmp_path, capsys, monkeypatch):
    """The README's CPU install has no Triton: the kernel chapter's test module skips itself, and
    pytest, asked for its tests by name, then ran no test at all: every chapter graded 0. A handout's
    kernel chapter is left out, in a line naming the extra; asked for by name, it is refused."""
    import importlib.util
    from conftest import refused
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    graded = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: graded.append(argv) or
                        subprocess.CompletedProcess(argv, 0, "", ""))
    (tmp_path / "tinyspec").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / course.MANIFEST).write_text(json.dumps({"chapters": ["sampling", "kernel"]}))
    with pytest.raises(SystemExit):  # nothing passed: pytest was not really run
        course.main(["grade", str(tmp_path)])
    out, err = capsys.readouterr()
    assert 'kernel       not graded: its tests need triton, which is not installed: pip install -e ".[triton]"' in err
    assert "sampling" in out and "kernel" not in out
    assert not any("test_tree_attention" in arg for arg in graded[0])
    message = refused(course.main, ["grade", str(tmp_path), "--chapters", "kernel"], capsys)
    assert message.startswith("error: --chapters kernel: its tests need triton") and '.[triton]"' in message


def test_a_handout_with_nothing_gradable_here_is_refused_not_graded_0_of_0(tmp_path, capsys, monkeypatch):
    """A kernel-only handout graded without Triton printed "total 0/0" and exited 0, which reads as a
    pass: one line saying nothing could be graded and why, status 2, and pytest never started."""
    import importlib.util
    from conftest import refused
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: pytest.fail("pytest ran with nothing to grade"))
    (tmp_path / "tinyspec").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / course.MANIFEST).write_text(json.dumps({"chapters": ["kernel"]}))
    message = refused(course.main, ["grade", str(tmp_path)], capsys)
    assert message == 'error: nothing could be graded here: kernel: its tests need triton, which is not installed: ' \
        'pip install -e ".[triton]"\n', message


def test_a_graded_test_that_did_not_run_is_said(tmp_path, monkeypatch):
    monkeypatch.setitem(course.CHAPTERS, "ghost", course.Chapter("0", (), ("tests/test_course.py::test_no_such_test",)))
    shown = []
    assert course.grade(course.ROOT, ["ghost"], show=shown.append) == {"ghost": (0, 1)}
    assert "test_no_such_test not run" in shown[0]


def test_handout_into_a_place_that_cannot_be_written_fails_before_copying(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit) as e:
        course.main(["handout", str(tmp_path / "afile" / "hw")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "afile is a file" in err


@pytest.mark.parametrize("where", ["/proc/hw", "/sys/hw", "{tmp}/fifo"])
def test_handout_where_no_file_can_be_made_is_one_line_exit_2(where, tmp_path, capsys, monkeypatch):
    """As root too (CI's user), where os.access says yes to everything: the place is tried first."""
    import os
    from conftest import refused
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.setattr(course, "handout", lambda *a: pytest.fail("the project was copied before the place was tried"))
    err = refused(course.main, ["handout", where.format(tmp=tmp_path), "--chapters", "sampling"], capsys)
    assert "Traceback" not in err and "handout" in err and not os.path.exists("/proc/hw")
    assert [p.name for p in tmp_path.iterdir()] == ["fifo"] and (tmp_path / "fifo").is_fifo()


def test_every_course_command_has_examples_in_its_help():
    parser = course.build_parser()
    verbs = next(a for a in parser._actions if a.dest == "verb").choices
    assert set(verbs) == {"list", "handout", "grade"}
    for verb, sub in verbs.items():
        assert f"examples:\n  python -m tinyspec course {verb}" in sub.format_help(), verb
