"""A Debian 13 host, whose Python 3.13 no lock supports, served through the container runtime,
beside a Debian 12 host running the venv runtime, behind one balancer.

Two fresh test hosts from tests/hosts/hostctl.py (`make hosts N=2 DEBIAN13=1`), booting systemd in
their own network namespaces: testhost1 Debian 12 (venv runtime, and the balancer), testhost2
Debian 13 (the inventory sets `glmdeploy_runtime=container` for it). The venv runtime is refused
on the Debian 13 host before anything changes, naming the container runtime; one `make deploy`
then deploys both (the image built or found on this machine, sent as an archive through the run's
artifact server, loaded and checked by ID), both pass the health gate and the smoke suite, a
second run changes nothing, and `make verify` shows the Debian 13 host's image beside the Debian 12
host's environment. What the harness adds for podman inside nspawn (no keyring, no cgroups, the store bound in)
is the test host's, not the kit's (hostctl's docstring).

A drill (`make drills`), not CI: the first deploy sends and loads a 3 GB image (about three minutes
here, plus the image's build when its inputs changed) beside a venv deploy.
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

VENV_HOST, HOST = hostctl.host_names(2)


@pytest.fixture(scope="module")
def debian13_host():
    """A fresh Debian 12 host and a fresh Debian 13 host and their inventory; gone afterwards."""
    created = make("hosts", "N=2", "DEBIAN13=1")
    try:
        assert created.returncode == 0, f"make hosts failed:\n{deploy_failure_summary(created)}"
        hosts = json.loads((hostctl.STATE / "hosts.json").read_text())
        assert hosts["suites"] == {VENV_HOST: "bookworm", HOST: "trixie"}
        yield {"inventory": hosts["inventory"]}
    finally:
        make("hosts-down")


def _recap_changed(output: str, host: str = HOST) -> int:
    match = re.search(rf"^{host}\s*:.*?changed=(\d+)", output, re.M)
    assert match, f"no play recap for {host} in the output"
    return int(match.group(1))


def test_venv_runtime_is_refused_on_debian_13_naming_the_container_runtime(debian13_host: dict) -> None:
    proc = make(
        "deploy",
        f"INVENTORY={debian13_host['inventory']}",
        f"ANSIBLE_ARGS=-e glmdeploy_runtime=venv --limit {HOST}",
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Debian 13" in out and "glmdeploy_runtime: container" in out
    assert "Nothing was changed" in out and _recap_changed(out) == 0


def test_one_deploy_serves_debian_13_from_the_image_beside_a_venv_host_and_changes_nothing_twice(
    debian13_host: dict,
) -> None:
    inventory = f"INVENTORY={debian13_host['inventory']}"
    first = make("deploy", inventory, timeout=2400)
    assert first.returncode == 0, deploy_failure_summary(first)
    for host in (VENV_HOST, HOST):
        smoke = json.loads((REPORTS / "smoke" / host / "smoke.json").read_text())
        assert smoke["counts"]["failed"] == 0 and smoke["counts"]["passed"] >= 20, host
    again = make("deploy", inventory, timeout=900)
    assert again.returncode == 0, deploy_failure_summary(again)
    assert _recap_changed(again.stdout, VENV_HOST) == 0 and _recap_changed(again.stdout, HOST) == 0


def test_verify_shows_the_debian_13_hosts_image_beside_the_venv_hosts_environment(debian13_host: dict) -> None:
    proc = make("verify", f"INVENTORY={debian13_host['inventory']}", timeout=900)
    assert proc.returncode == 0, deploy_failure_summary(proc)
    report = json.loads((REPORTS / "verify.json").read_text())
    container, venv = report["hosts"][HOST], report["hosts"][VENV_HOST]
    records = [json.loads(p.read_text()) for p in (ROOT / "artifacts" / "images").glob("*.json")]
    assert container["image"] in {r["id"] for r in records}, f"{container['image']} is not an image archived here"
    assert container["os"].startswith("Debian GNU/Linux 13") and container["python"].startswith("3.11")
    assert venv["image"] == "none" and venv["os"].startswith("Debian GNU/Linux 12")
    # The same lock in both runtimes; each host held to its own runtime's group, so no drift.
    assert container["lock"] == venv["lock"]
    assert report["problems"] == []
