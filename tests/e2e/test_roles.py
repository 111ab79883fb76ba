"""Molecule-style scenarios, one fresh test host each: syntax, create, converge, idempotence, verify, destroy.

The whole site playbook has its own scenario in test_fleet.py; here each role
is converged alone (with only what it needs), so a role that is not
idempotent, renders a bad unit or leaves a service stopped fails on its own.

A scenario is a directory of tests/scenarios/ with Molecule's playbooks:
converge.yml (the role), verify.yml (asserts the state the role leaves, with
Ansible modules), and where needed prepare.yml (the node the role expects,
run once before the first converge) and side_effect.yml (a change between
two converges). `scenario(name)` runs Molecule's sequence against the
scenario's own host: syntax-check of every playbook, prepare, converge,
idempotence (a second converge reports changed=0), verify; then, with a
side_effect.yml, side effect, converge, idempotence and verify again.
Scenarios whose sequence needs the test's context (the occupied port, the
driver's versions) call the same steps one by one.

The hosts are created together, one per scenario, and destroyed together;
each test uses only its own host, so the tests pass in any order and alone.
The driver scenario (mostly package downloads and unpacking) runs in the
background on its own host while the others run, and is checked last.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from conftest import ROOT, make

sys.path.insert(0, str(ROOT / "tests" / "hosts"))
import hostctl

SCENARIOS = ROOT / "tests" / "scenarios"
KEY = hostctl.STATE / "id_ed25519"
# Each scenario and the test that runs it. The `hosts` fixture gives each scenario whose test runs
# a fresh host of its own (`make hosts N=<count>` names them testhost1..N), in this order, and
# creates none for a deselected one (the drills' scenarios in make test): a host costs a boot.
SCENARIO_TESTS = {
    "node_base": "test_node_base_scenario",
    "model": "test_model_scenario",
    "service_unit": "test_service_unit_scenario",
    # Both preflight tests share one host (space-separated: either selected creates it).
    "preflight_port": "test_preflight_names_an_occupied_port_and_changes_nothing "
    "test_preflight_refuses_a_gpu_node_whose_kernel_headers_the_apt_lock_lacks",
    "nvidia_driver": "test_nvidia_driver_scenario",
    "undeploy": "test_undeploy_scenario",
    "place_bundle": "test_glmdeploy_place_bundle_scenario",
    "release": "test_release_scenario",
}
HOSTS: dict[str, str] = {}  # scenario -> its host, filled by the `hosts` fixture
# Molecule's playbooks, in the order a scenario uses them.
PLAYBOOKS = ("prepare", "converge", "side_effect", "verify")
OLD_DRIVER = "535.261.03-1"  # Debian 12 bookworm's; the lock carries bookworm-security's


def ansible(name: str, playbook: str | list[str], *extra: str) -> subprocess.CompletedProcess[str]:
    """ansible-playbook tests/scenarios/<name>/<playbook>.yml against the scenario's host alone."""
    playbooks = [playbook] if isinstance(playbook, str) else playbook
    # The model role fetches the staged model from the control node's artifact server (its rsync
    # daemon), and node_base and the driver install from the kit's apt repository it serves over
    # HTTP, which make deploy runs for the length of a run: those scenarios run under it too.
    served = (
        [str(ROOT / ".venv/tools/bin/python"), "-m", "glmdeploy_control.artifact_server", "--root",
         str(ROOT / "artifacts"), "--inventory", str(hostctl.STATE / f"inventory-{name}.ini"), "--"]
        if name in ("model", "node_base", "nvidia_driver") else []
    )  # fmt: skip
    return subprocess.run(
        [
            *served,
            str(ROOT / ".venv/tools/bin/ansible-playbook"),
            "-i",
            str(hostctl.STATE / f"inventory-{name}.ini"),
            *(str(SCENARIOS / name / f"{p}.yml") for p in playbooks),
            "-e",
            "glmdeploy_control_dir=" + str(ROOT),
            # The scenarios exercise the roles as the cpu profile uses them (site.yml reads it per node).
            "-e",
            "glmdeploy_profile=cpu",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=ROOT,
        env={
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "PATH": f"{ROOT}/.venv/tools/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        },
    )


def tail(run: subprocess.CompletedProcess[str]) -> str:
    return run.stdout[-3000:] + run.stderr[-2000:]


def changed(output: str) -> int:
    match = re.search(r"^testhost\d+\s*:\s*ok=\d+\s+changed=(\d+)", output, re.M)
    assert match, output[-2000:]
    return int(match.group(1))


def changed_tasks(output: str) -> list[str]:
    """The banners of the tasks that reported a change."""
    tasks, task = [], ""
    for line in output.splitlines():
        if line.startswith("TASK ["):
            task = line.split("]", 1)[0] + "]"
        elif line.startswith("changed: ["):
            tasks.append(task)
    return tasks


def step(name: str, playbook: str | list[str], what: str, *extra: str) -> subprocess.CompletedProcess[str]:
    run = ansible(name, playbook, *extra)
    assert run.returncode == 0, f"{name}: {what} failed (rc={run.returncode}):\n{tail(run)}"
    return run


def syntax(name: str, *extra: str) -> None:
    """Every playbook the scenario has, in one ansible-playbook run."""
    playbooks = [p for p in PLAYBOOKS if (SCENARIOS / name / f"{p}.yml").exists()]
    step(name, playbooks, "syntax check", "--syntax-check", *extra)


def converge(name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return step(name, "converge", "converge", *extra)


def idempotence(name: str, *extra: str) -> None:
    run = step(name, "converge", "second converge", *extra)
    assert changed(run.stdout) == 0, f"{name} is not idempotent: {changed_tasks(run.stdout)}\n{tail(run)}"


def verify(name: str, *extra: str) -> None:
    step(name, "verify", "verify", *extra)


def scenario(name: str, *extra: str) -> None:
    """Molecule's test sequence for one scenario, on its own host (extra: ansible-playbook arguments)."""
    syntax(name, *extra)
    if (SCENARIOS / name / "prepare.yml").exists():
        step(name, "prepare", "prepare", *extra)
    converge(name, *extra)
    idempotence(name, *extra)
    verify(name, *extra)
    if (SCENARIOS / name / "side_effect.yml").exists():
        step(name, "side_effect", "side effect", *extra)
        converge(name, *extra)
        idempotence(name, *extra)
        verify(name, *extra)


def on_host(name: str, command: str) -> str:
    return hostctl.ssh(HOSTS[name], KEY, command).stdout


def write_inventories() -> None:
    """One inventory per scenario, each naming only that scenario's host."""
    base = (hostctl.STATE / "inventory.ini").read_text().split("\n[glmdeploy_lb]")[0]
    for name, host in HOSTS.items():
        text = re.sub(rf"^(?!{host} )testhost\d+ ansible_host=.*\n", "", base, flags=re.M)
        (hostctl.STATE / f"inventory-{name}.ini").write_text(text)


def driver_scenario() -> None:
    """The driver from the kit's repository at the apt lock's version, on its own host; raises at the first
    step that fails. One version only: a lock carries one (the upgrade across two is not run here)."""
    name = "nvidia_driver"
    lock = json.loads((ROOT / "constraints" / "apt" / "debian-12.lock").read_text())
    locked = lock["packages"]["nvidia-kernel-dkms"]["version"]
    base = ()  # the host has no GPU: its plan says so, and the role stages the packages only
    syntax(name)
    refused = ansible(name, "converge", "-e", "glmdeploy_profile=gpu-cu121")
    assert refused.returncode != 0 and "has no NVIDIA PCI device" in refused.stdout, tail(refused)
    assert "PROFILE=cpu to this host" in refused.stdout and changed(refused.stdout) == 0, tail(refused)
    converge(name, *base)
    idempotence(name, *base)
    verify(name, "-e", f"nvidia_driver_expected_version={locked}")
    dry = step(name, "converge", "converge in check mode", *base, "--check")
    assert changed(dry.stdout) == 0, f"check mode reports changes: {changed_tasks(dry.stdout)}\n{tail(dry)}"
    other = ansible(name, "converge", *base, "-e", f"nvidia_driver_version={OLD_DRIVER}")
    assert other.returncode != 0 and f"carries nvidia-kernel-dkms {locked}" in other.stdout, tail(other)
    assert changed(other.stdout) == 0, f"the refused version changed the node: {changed_tasks(other.stdout)}"
    verify(name, "-e", f"nvidia_driver_expected_version={locked}")


@pytest.fixture(scope="module")
def hosts(request: pytest.FixtureRequest):
    """A fresh host per scenario that runs, created together (create ... destroy)."""
    selected = {item.name for item in request.session.items}
    wanted = [name for name, tests in SCENARIO_TESTS.items() if set(tests.split()) & selected]
    HOSTS.clear()
    HOSTS.update({name: f"testhost{number}" for number, name in enumerate(wanted, start=1)})
    created = make("hosts", f"N={len(HOSTS)}")
    assert created.returncode == 0
    write_inventories()
    pool = ThreadPoolExecutor(max_workers=1)
    # The driver's sequence starts at once (it takes longest), unless its test was deselected.
    driver = pool.submit(driver_scenario) if "nvidia_driver" in HOSTS else None
    try:
        yield {"driver": driver}
    finally:
        pool.shutdown(wait=True)
        make("hosts-down")


# node_base, model, service_unit, glmdeploy_place_bundle and release run in every deploy of make test
# (this machine's node and the fleet's, each deploy then re-run for changed=0): their scenarios alone
# (converge, idempotence, verify) are drills, to keep make test within its budget.
@pytest.mark.drill
def test_node_base_scenario(hosts):
    scenario("node_base")


@pytest.mark.drill
def test_model_scenario(hosts):
    # The fixture model the cpu profile places (a no-op when `make unit` or a deploy made it already).
    assert make("fixture").returncode == 0
    scenario("model")


@pytest.mark.drill
def test_service_unit_scenario(hosts):
    scenario("service_unit")


# A drill since make test passed 25 minutes: every make test undeploys this machine's node at the
# end and checks what was removed and kept (tests/e2e/conftest.py).
@pytest.mark.drill
def test_undeploy_scenario(hosts):
    """node_base and a kit service under systemd (prepare.yml), then undeploy: nothing of the kit is left."""
    scenario("undeploy")


@pytest.mark.drill
def test_glmdeploy_place_bundle_scenario(hosts, tmp_path):
    """A small tree placed as one archive; a changed source replaces the placed tree whole."""
    # side_effect.yml changes the source: a copy of the committed tree.
    src = shutil.copytree(SCENARIOS / "place_bundle" / "tree", tmp_path / "tree")
    scenario("place_bundle", "-e", f"scenario_bundle_src={src}")


def test_preflight_names_an_occupied_port_and_changes_nothing(hosts):
    name = "preflight_port"
    syntax(name)
    # Prepare (the test's own): another process holds port 8000 before the kit arrives.
    on_host(name, "systemd-run --unit squatter python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null")
    listening = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8000), 1)\""
    on_host(name, f"for _ in $(seq 100); do {listening} 2>/dev/null && break; sleep 0.1; done")
    result = ansible(name, "converge")
    assert result.returncode != 0, tail(result)
    assert "port 8000 is already in use by PID" in result.stdout and "fix:" in result.stdout, tail(result)
    verify(name)


def test_preflight_refuses_a_gpu_node_whose_kernel_headers_the_apt_lock_lacks(hosts):
    """The host runs this machine's kernel, which no Debian lock carries headers for: as a GPU node
    (preflight_kernel_headers, what a GPU profile with a GPU sets) it is refused before any change."""
    name = "preflight_port"
    kernel = os.uname().release
    # The scenario's state (verify.yml checks the squatter still holds port 8000), whether or not the
    # test above ran; preflight is given ports the squatter does not hold, to get to the kernel's check.
    on_host(
        name,
        "systemctl is-active -q squatter || systemd-run --unit squatter python3 -m http.server 8000 --bind 127.0.0.1",
    )
    result = ansible(name, "converge", "-e", "preflight_kernel_headers=true", "-e", '{"preflight_ports": [8002, 8503]}')
    assert result.returncode != 0, tail(result)
    assert f"runs kernel {kernel}, and the apt lock of debian-12 carries the headers of" in result.stdout, tail(result)
    assert f'fix: add "{kernel}" to kernels in [kit.apt.releases.debian-12]' in result.stdout, tail(result)
    verify(name)


# A drill since make test passed 25 minutes again: mostly the driver packages' downloads and
# unpacking (98 to 241 s of waiting at the end of the role tests); no GPU here loads the module.
@pytest.mark.drill
def test_nvidia_driver_scenario(hosts):
    """Debian's 535 driver for real on a GPU-less host: pinned, held, idempotent, upgraded only on request."""
    driver: Future = hosts["driver"]
    driver.result(timeout=1500)


@pytest.mark.drill
def test_release_scenario(hosts):
    """A release from stand-in stores, switched and promoted; a second one keeps the first as
    `previous`; check mode of a switch back reports it and changes nothing."""
    name = "release"
    syntax(name)
    step(name, "prepare", "prepare")
    converge(name)
    idempotence(name)
    verify(name)
    second = ("-e", "scenario_text=two")
    converge(name, *second)
    back = step(name, "converge", "converge in check mode", "--check", "--diff")
    assert "current -> " in back.stdout and changed(back.stdout) > 0, tail(back)
    # The second release is current, the first previous: after the check run as before it.
    verify(name, *second, "-e", "scenario_previous=one")
