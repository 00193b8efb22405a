"""Where files go and how they are written (files.py): atomic, through symlinks, never over a
device, a FIFO or a folder, and output paths tried for real (os.access says yes to root)."""
import os
from pathlib import Path

import pytest

from tinyspec import files


def test_home_is_tinyspec_home_or_the_users_cache_read_at_each_use(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYSPEC_HOME", str(tmp_path / "h"))
    assert files.home() == tmp_path / "h" and Path(files.SIZING) == tmp_path / "h" / "sizing"
    assert files.SIZING / "x.json" == tmp_path / "h" / "sizing" / "x.json"
    monkeypatch.delenv("TINYSPEC_HOME")
    assert files.home() == Path.home() / ".cache" / "tinyspec"
    assert Path(files.SIZING) == Path.home() / ".cache" / "tinyspec" / "sizing"


def test_the_sizing_cache_follows_tinyspec_home(tmp_path, monkeypatch):
    """Not runs/sizing/ in whatever directory a command runs from (each directory re-sized every method)."""
    from tinyspec.speed import sizing
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TINYSPEC_HOME", str(tmp_path / "h"))
    assert Path(sizing.DIRECTORY) == tmp_path / "h" / "sizing"


@pytest.mark.parametrize("path, problem", [
    ("/proc/x.json", "cannot create a file in /proc"), ("/proc/a/b/x.json", "cannot create a file in /proc"),
    ("/sys/x.json", "cannot create a file in /sys"), ("/dev/full", "is a device, not a file"),
    ("{tmp}/fifo", "is a FIFO, not a file"), ("{tmp}/to-fifo", "is a FIFO, not a file"),
    ("{tmp}", "is a folder: give a file name"), ("{tmp}/afile/x.json", "afile is a file, not a folder"),
])
def test_an_output_is_tried_for_real(path, problem, tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "to-fifo").symlink_to(tmp_path / "fifo")
    (tmp_path / "afile").write_text("")
    if path == "/dev/full" and not os.path.exists(path):
        pytest.skip("no /dev/full here")
    assert problem in files.unwritable(path.format(tmp=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "fifo", "to-fifo"]  # the probe is gone


def test_a_writable_output_passes_and_nothing_is_left_or_made(tmp_path):
    (tmp_path / "old.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "old.json")
    for path in ("new.json", "old.json", "link.json", "a/b/c.json", "dangling.json"):
        assert files.unwritable(tmp_path / path) is None, path
    assert files.unwritable(tmp_path / "a" / "b", directory=True) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "old.json"]


def test_a_write_through_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "r.json").write_text("old")
    (tmp_path / "link.json").symlink_to(tmp_path / "real" / "r.json")
    files.atomic_write_json(tmp_path / "link.json", {"a": 1})
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "real" / "r.json").read_text() == '{\n  "a": 1\n}\n'
    assert [p.name for p in (tmp_path / "real").iterdir()] == ["r.json"]
    (tmp_path / "dangling").symlink_to(tmp_path / "real" / "new.txt")
    files.atomic_write_text(tmp_path / "dangling", "made")
    assert (tmp_path / "dangling").is_symlink() and (tmp_path / "real" / "new.txt").read_text() == "made"


def test_a_device_a_fifo_or_a_folder_is_never_replaced_by_a_file(tmp_path):
    import stat
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    targets = [tmp_path / "fifo", tmp_path / "folder"] + ([Path("/dev/full")] if os.path.exists("/dev/full") else [])
    for target in targets:
        with pytest.raises(IsADirectoryError, match="it is not replaced"):
            files.atomic_write_text(target, "x")
    assert stat.S_ISFIFO((tmp_path / "fifo").stat().st_mode) and (tmp_path / "folder").is_dir()
    assert not os.path.exists("/dev/full") or stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "folder"]


def test_a_write_that_fails_leaves_neither_half_a_file_nor_its_temporary(tmp_path, monkeypatch):
    (tmp_path / "r.json").write_text("old")

    def half_then_fail(self, text):
        Path.write_bytes(self, text[:3].encode())
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Path, "write_text", half_then_fail)
    with pytest.raises(OSError):
        files.atomic_write_text(tmp_path / "r.json", "new text")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"] and (tmp_path / "r.json").read_text() == "old"


def test_no_folder_is_made_at_the_far_end_of_a_link(tmp_path):
    """A link to /nonexistent/target, written through, made /nonexistent at the root: a link whose
    target's folder is not there is refused, by the check before the work and by the write itself,
    and so is a path whose folders would be made through a dangling link."""
    (tmp_path / "out.json").symlink_to(tmp_path / "missing" / "target.json")
    (tmp_path / "dir").symlink_to(tmp_path / "missing" / "dir")
    assert "is a link to" in files.unwritable(tmp_path / "out.json")
    assert "is a link to" in files.unwritable(tmp_path / "dir", directory=True)
    assert f"{tmp_path / 'dir'} is a link to {tmp_path / 'missing' / 'dir'}, which does not exist" == \
        files.unwritable(tmp_path / "dir" / "a" / "b.json")
    with pytest.raises(FileNotFoundError, match="in a folder that does not exist"):
        files.atomic_write_text(tmp_path / "out.json", "x")
    assert not (tmp_path / "missing").exists() and (tmp_path / "out.json").is_symlink()
