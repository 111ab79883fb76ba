"""`make image`: the cpu profile's image, built offline; two builds in two stores give one ID.

A drill (`make drills`), not CI: a cold build takes minutes and ~6 GB of disk per store.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, make

from glmdeploy_control import image

pytestmark = [
    pytest.mark.drill,
    pytest.mark.skipif(
        shutil.which("podman") is None, reason="podman is not installed (apt install podman buildah runc)"
    ),
]
CACHE = Path(os.environ.get("GLMDEPLOY_IMAGE_CACHE", "/var/cache/glmdeploy/images"))


def _podman(cache: Path, *args: str) -> str:
    env = {**os.environ, "CONTAINERS_CONF": str(ROOT / "images" / "containers.conf")}
    cmd = [*image.podman_command(cache), *args]
    return subprocess.run(cmd, env=env, text=True, capture_output=True, check=True).stdout


def test_two_builds_in_two_stores_give_one_image_id_with_the_lock_and_no_weights(tmp_path):
    first = make("image", "PROFILE=cpu", f"REPORTS={tmp_path}/a")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    built = json.loads((tmp_path / "a" / "image-cpu.json").read_text())

    # A second store of its own, from the same base tar: nothing shared but the inputs.
    other = tmp_path / "cache"
    other.mkdir()
    for tar in CACHE.glob("base-*.tar"):
        os.link(tar, other / tar.name)
    try:
        again = make("image", "PROFILE=cpu", f"REPORTS={tmp_path}/b", env={"GLMDEPLOY_IMAGE_CACHE": str(other)})
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        rebuilt = json.loads((tmp_path / "b" / "image-cpu.json").read_text())
        assert "building" in again.stdout, "the second store built nothing"
        assert rebuilt["id"] == built["id"], f"two builds of the same inputs differ: {built['id']} {rebuilt['id']}"

        config = json.loads(_podman(CACHE, "image", "inspect", built["name"]))[0]["Config"]
        assert config["User"] == "990:990"
        lock = (ROOT / "constraints" / "cpu-py311.txt").read_bytes()
        assert config["Labels"]["org.glmdeploy.lock-sha256"] == hashlib.sha256(lock).hexdigest()
        listing = _podman(
            CACHE,
            "run",
            "--rm",
            "--pull=never",
            "--network",
            "none",
            built["name"],
            "sh",
            "-c",
            "ls /wheels; command -v gcc cc || true; ls /opt/glmdeploy; python -c 'import vllm, glmdeploy'",
        )
        assert listing.split() == ["requirements.lock", "smoke_tests", "venv"], listing
    finally:  # only the second store's images, then its files (never `system reset`: it clears networks too)
        subprocess.run(
            [*image.podman_command(other), "image", "rm", "--all", "--force"], capture_output=True, check=False
        )
        shutil.rmtree(other, ignore_errors=True)
