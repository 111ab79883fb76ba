"""glmdeploy_control.weights: a pinned commit staged whole and checked, or nothing changed."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading

import pytest

from glmdeploy import manifest
from glmdeploy_control import weights

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _staged(root, revision=COMMIT):
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"torch_dtype": "float16"}\n')
    (root / "model-00001-of-00001.safetensors").write_bytes(b"\x01" * 4096)
    (root / weights.REVISION_FILE).write_text(f"{weights.DEFAULT_REPO}@{revision}\n")
    manifest.write_manifest(root)
    return root


@pytest.fixture
def mirror(tmp_path):
    """A loopback HTTP server serving a staged directory (a lab mirror)."""
    served = _staged(tmp_path / "mirror")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_branch_name_is_refused_as_a_revision(tmp_path, capsys):
    assert weights.main(["--revision", "main", "--dest", str(tmp_path / "m"), "--from", str(tmp_path)]) == 1
    assert "not a commit" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_mirror_copy_is_staged_with_its_manifest_and_revision(tmp_path, mirror):
    _, url = mirror
    dest = tmp_path / "models" / "chatglm3-6b-32k"
    assert weights.main(["--revision", COMMIT, "--dest", str(dest), "--mirror", url]) == 0
    assert manifest.check_manifest(dest) == []
    assert (dest / weights.REVISION_FILE).read_text().strip().endswith("@" + COMMIT)
    assert not list(dest.parent.glob(".*partial*")), "the side directory was left behind"


def test_damaged_mirror_file_is_named_and_the_staged_copy_is_untouched(tmp_path, mirror, capsys):
    served, url = mirror
    dest = _staged(tmp_path / "models" / "chatglm3-6b-32k")
    before = (dest / "model-00001-of-00001.safetensors").read_bytes()
    (served / "model-00001-of-00001.safetensors").write_bytes(b"\x02" * 4096)
    assert weights.main(["--revision", COMMIT, "--dest", str(dest), "--mirror", url]) == 1
    err = capsys.readouterr().err
    assert "model-00001-of-00001.safetensors" in err and "damaged" in err
    assert (dest / "model-00001-of-00001.safetensors").read_bytes() == before
    assert not (dest.parent / "chatglm3-6b-32k.previous").exists()


def test_source_of_another_revision_is_refused(tmp_path, capsys):
    src = _staged(tmp_path / "elsewhere", revision="f" * 40)
    assert weights.main(["--revision", COMMIT, "--dest", str(tmp_path / "m"), "--from", str(src)]) == 1
    assert f"@{'f' * 40}, not {COMMIT}" in capsys.readouterr().err


def test_restaging_keeps_the_previous_copy_beside_the_new_one(tmp_path):
    src = _staged(tmp_path / "elsewhere")
    dest = tmp_path / "models" / "m"
    shutil.copytree(src, dest)
    assert weights.main(["--revision", COMMIT, "--dest", str(dest), "--from", str(src)]) == 0
    assert (tmp_path / "models" / "m.previous" / manifest.MANIFEST).is_file()
    assert manifest.check_manifest(dest) == []
