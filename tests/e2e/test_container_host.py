"""A Debian 13 host, whose Python 3.13 no lock supports, served through the container runtime.

One fresh test host from tests/hosts/hostctl.py (`make hosts N=1 DEBIAN13=1`): Debian 13 booting
systemd in its own network namespace; the inventory sets `glmdeploy_runtime=container` for it.
The venv runtime is refused there before anything changes, naming the container runtime; the
container runtime then deploys it with the same `make deploy` (the image built or found on this
machine, sent as an archive through the run's artifact server, loaded and checked by ID), passes
the health gate and the smoke suite, changes nothing on a second run, and `make verify` names its
image. What the harness adds for podman inside nspawn (no keyring, no cgroups, the store bound in)
is the test host's, not the kit's (hostctl's docstring).

A drill (`make drills`), not CI: the first deploy sends and loads a 3 GB image (about four minutes
here, plus the image's build when its inputs changed).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from conftest import REPORTS, ROOT, deploy_failure_summary, make

sys.path.insert(0, str(ROOT / "tests" / "hosts"))
import hostctl

pytestmark = [
    pytest.mark.drill,
    pytest.mark.skipif(not Path("/usr/bin/podman").exists(), reason="podman is not installed: apt install podman runc"),
]

HOST = hostctl.host_names(1)[0]


@pytest.fixture(scope="module")
def debian13_host():
    """One fresh Debian 13 host and its inventory; gone afterwards, whatever happened."""
    created = make("hosts", "N=1", "DEBIAN13=1")
    try:
        assert created.returncode == 0, f"make hosts failed:\n{deploy_failure_summary(created)}"
        hosts = json.loads((hostctl.STATE / "hosts.json").read_text())
        assert hosts["suites"] == {HOST: "trixie"}
        yield {"inventory": hosts["inventory"]}
    finally:
        make("hosts-down")


def _recap_changed(output: str) -> int:
    match = re.search(rf"^{HOST}\s*:.*?changed=(\d+)", output, re.M)
    assert match, f"no play recap for {HOST} in the output"
    return int(match.group(1))


def test_venv_runtime_is_refused_on_debian_13_naming_the_container_runtime(debian13_host: dict) -> None:
    proc = make(
        "deploy",
        f"INVENTORY={debian13_host['inventory']}",
        "ANSIBLE_ARGS=-e glmdeploy_runtime=venv --limit glmdeploy_nodes",
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Debian 13" in out and "glmdeploy_runtime: container" in out
    assert "Nothing was changed" in out and _recap_changed(out) == 0


def test_container_runtime_serves_debian_13_and_a_second_deploy_changes_nothing(debian13_host: dict) -> None:
    inventory = f"INVENTORY={debian13_host['inventory']}"
    first = make("deploy", inventory, "ANSIBLE_ARGS=--limit glmdeploy_nodes", timeout=1800)
    assert first.returncode == 0, deploy_failure_summary(first)
    smoke = json.loads((REPORTS / "smoke" / HOST / "smoke.json").read_text())
    assert smoke["counts"]["failed"] == 0 and smoke["counts"]["passed"] >= 20
    again = make("deploy", inventory, "ANSIBLE_ARGS=--limit glmdeploy_nodes", timeout=900)
    assert again.returncode == 0, deploy_failure_summary(again)
    assert _recap_changed(again.stdout) == 0


def test_verify_names_the_image_the_debian_13_host_runs(debian13_host: dict) -> None:
    proc = make(
        "verify", f"INVENTORY={debian13_host['inventory']}", "ANSIBLE_ARGS=--limit glmdeploy_nodes", timeout=900
    )
    assert proc.returncode == 0, deploy_failure_summary(proc)
    report = json.loads((REPORTS / "verify.json").read_text())
    host = report["hosts"][HOST]
    records = [json.loads(p.read_text()) for p in (ROOT / "artifacts" / "images").glob("*.json")]
    assert host["image"] in {r["id"] for r in records}, f"{host['image']} is not an image this machine archived"
    assert host["os"].startswith("Debian GNU/Linux 13") and host["python"].startswith("3.11")
    assert report["problems"] == []
