import shutil

import pytest

from glmdeploy.manifest import check_manifest, main


@pytest.fixture
def model_copy(tmp_path, fixture_dir):
    dest = tmp_path / "model"
    shutil.copytree(fixture_dir, dest)
    return dest


def test_intact_model_passes(model_copy):
    assert check_manifest(model_copy) == []


def test_tampered_file_is_named(model_copy):
    with (model_copy / "tokenizer.model").open("r+b") as fh:
        fh.seek(100)
        fh.write(b"X")
    assert check_manifest(model_copy) == ["model file changed: tokenizer.model does not match its SHA256 in SHA256SUMS"]


def test_missing_and_unexpected_files_are_named(model_copy):
    (model_copy / "config.json").unlink()
    (model_copy / "extra.bin").write_bytes(b"x")
    problems = check_manifest(model_copy)
    assert "missing model file: config.json" in problems
    assert "unexpected model file: extra.bin is not in SHA256SUMS" in problems


def test_missing_directory_and_manifest_are_reported(tmp_path, model_copy, capsys):
    assert check_manifest(tmp_path / "nope") == [f"model directory {tmp_path / 'nope'} does not exist"]
    (model_copy / "SHA256SUMS").unlink()
    assert main(["check", str(model_copy)]) == 1
    assert "SHA256SUMS is missing" in capsys.readouterr().err
