"""Coursework: a handout's graded tests fail with the stubs and pass with the solutions back."""
import shutil

import pytest

from tinyspec import course


def test_stub_out_replaces_only_the_chosen_chapters():
    src = ("def f(x):\n    y = 1\n    # BEGIN SOLUTION a: add one\n    y = x + 1\n    # END SOLUTION\n    return y\n\n"
           "def g():\n    # BEGIN SOLUTION b: nothing\n    return 2\n    # END SOLUTION\n")
    text, n = course.stub_out(src, {"a"})
    assert n == 1 and 'raise NotImplementedError("a: add one")' in text and "y = x + 1" not in text
    assert "return 2" in text and "BEGIN SOLUTION b" in text
    compile(text, "<stub>", "exec")  # still valid Python
    with pytest.raises(ValueError, match="no END"):
        course.stub_out("# BEGIN SOLUTION a: x\npass\n", {"a"})


def test_every_chapter_has_marked_regions_and_existing_tests():
    text = "".join(p.read_text() for p in (course.ROOT / "tinyspec").rglob("*.py") if p.name != "course.py")
    for chapter, (_, tests) in course.CHAPTERS.items():
        assert f"# BEGIN SOLUTION {chapter}:" in text, chapter
        for t in tests:
            file, name = t.split("::")
            assert f"def {name}(" in (course.ROOT / file).read_text(), t


@pytest.mark.slow
def test_handout_fails_with_stubs_and_passes_with_solutions(tmp_path, capsys):
    out = tmp_path / "hw"
    course.main(["handout", str(out), "--chapters", "sampling"])
    assert "NotImplementedError" in (out / "tinyspec" / "sampling.py").read_text()
    assert "sampling" in (out / "GRADING.md").read_text()
    passed, total = course.grade(out, ["sampling"])["sampling"]
    assert total >= 3 and passed == 0  # every graded test fails on the stub
    shutil.copy(course.ROOT / "tinyspec" / "sampling.py", out / "tinyspec" / "sampling.py")  # the solution back
    assert course.grade(out, ["sampling"])["sampling"] == (total, total)
    course.main(["grade", str(out), "--chapters", "sampling"])
    assert f"{total}/{total}" in capsys.readouterr().out


def test_bad_course_commands(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        course.main(["handout", str(tmp_path / "x"), "--chapters", "poetry"])
    assert e.value.code == 2 and "unknown chapter" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        course.main(["grade", str(tmp_path)])
    assert "does not look like" in capsys.readouterr().err
