"""replacing_dir: a directory is replaced whole or left as it was."""

import pytest

from trt_spec.records.atomic import replacing_dir


def test_success_replaces_and_failure_leaves_the_old_directory(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    with pytest.raises(RuntimeError, match="midway"):
        with replacing_dir(dest) as tmp:
            tmp.mkdir()
            (tmp / "new.txt").write_text("half")
            raise RuntimeError("midway")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary left behind
    assert [p.name for p in dest.iterdir()] == ["old.txt"]
    with replacing_dir(dest) as tmp:
        tmp.mkdir()
        (tmp / "new.txt").write_text("whole")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in dest.iterdir()] == ["new.txt"]


def test_a_crashed_attempts_leftover_is_removed(tmp_path):
    import os

    leftover = tmp_path / f".out.tmp-{os.getpid()}"
    leftover.mkdir()
    (leftover / "junk").write_text("x")
    with replacing_dir(tmp_path / "out") as tmp:
        tmp.mkdir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert list((tmp_path / "out").iterdir()) == []
