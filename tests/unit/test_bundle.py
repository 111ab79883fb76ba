"""glmdeploy_control.bundle: one reproducible archive per tree, rewritten only when content changes."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from glmdeploy_control import bundle


def _tree(root):
    (root / "golden").mkdir(parents=True)
    (root / "a.py").write_text("A = 1\n")
    (root / "golden" / "m.json").write_text("{}\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (root / "notes.txt").write_text("left out\n")


def test_same_content_gives_identical_bytes_whatever_the_file_times(tmp_path):
    _tree(tmp_path / "src")
    first = bundle.pack(tmp_path / "src", ["*.py", "golden/*.json"])
    os.utime(tmp_path / "src" / "a.py", (1, 1))
    assert bundle.pack(tmp_path / "src", ["*.py", "golden/*.json"]) == first


def test_archive_holds_only_matching_files_root_owned_with_fixed_modes(tmp_path):
    _tree(tmp_path / "src")
    data = bundle.pack(tmp_path / "src", ["*.py", "golden/*.json"])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        entries = {m.name: (m.uid, m.gid, m.mode, m.mtime, m.isdir()) for m in tar.getmembers()}
    assert entries == {
        "golden": (0, 0, 0o755, 0, True),
        "a.py": (0, 0, 0o644, 0, False),
        "golden/m.json": (0, 0, 0o644, 0, False),
    }


def test_archive_is_rewritten_only_when_a_file_changed(tmp_path, capsys):
    _tree(tmp_path / "src")
    out = tmp_path / "out" / "t.tar"
    argv = [str(tmp_path / "src"), str(out), "--include=*.py"]
    assert bundle.main(argv) == 0 and "wrote" in capsys.readouterr().out
    assert bundle.main(argv) == 0 and "unchanged" in capsys.readouterr().out
    (tmp_path / "src" / "a.py").write_text("A = 2\n")
    assert bundle.main(argv) == 0 and "wrote" in capsys.readouterr().out
    assert [p.name for p in out.parent.iterdir()] == ["t.tar"], "a temporary file was left behind"


def test_no_matching_file_is_an_error_not_an_empty_archive(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    assert bundle.main([str(tmp_path / "src"), str(tmp_path / "t.tar"), "--include=*.py"]) == 2
    assert "no files under" in capsys.readouterr().err
    assert not (tmp_path / "t.tar").exists()


@pytest.mark.parametrize("missing", ["nowhere"])
def test_missing_source_is_named(tmp_path, capsys, missing):
    assert bundle.main([str(tmp_path / missing), str(tmp_path / "t.tar"), "--include=*.py"]) == 2
    assert missing in capsys.readouterr().err
