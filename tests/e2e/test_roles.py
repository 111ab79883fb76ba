"""Molecule-style scenarios, one fresh test host each: syntax, create, converge, idempotence, verify, destroy.

The whole site playbook has its own scenario in test_fleet.py; here each role
is converged alone (with only what it needs), so a role that is not
idempotent, renders a bad unit or leaves a service stopped fails on its own.
The hosts are created together, one per scenario, and destroyed together. The
driver scenario (mostly package downloads and unpacking) runs in the background
on its own host while the others run, and is checked last.
"""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from conftest import ROOT, make

sys.path.insert(0, str(ROOT / "tests" / "hosts"))
import hostctl

SCENARIOS = ROOT / "tests" / "scenarios"
KEY = hostctl.STATE / "id_ed25519"
HOSTS = {
    "node_base": "testhost1",
    "model": "testhost2",
    "service_unit": "testhost3",
    "preflight_port": "testhost4",
    "nvidia_driver": "testhost5",
}
OLD_DRIVER, NEW_DRIVER = "535.261.03-1", "535.309.01-0+deb12u1"  # Debian 12 bookworm / bookworm-security


def playbook(scenario: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(ROOT / ".venv/tools/bin/ansible-playbook"),
            "-i",
            str(hostctl.STATE / f"inventory-{scenario}.ini"),
            str(SCENARIOS / scenario / "converge.yml"),
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


def changed(output: str) -> int:
    match = re.search(r"^testhost\d+\s*:\s*ok=\d+\s+changed=(\d+)", output, re.M)
    assert match, output[-2000:]
    return int(match.group(1))


def on_host(scenario: str, command: str) -> str:
    return hostctl.ssh(HOSTS[scenario], KEY, command).stdout


def write_inventories() -> None:
    """One inventory per scenario, each naming only that scenario's host."""
    base = (hostctl.STATE / "inventory.ini").read_text().split("\n[glmdeploy_lb]")[0]
    for scenario, name in HOSTS.items():
        text = re.sub(rf"^(?!{name} )testhost\d+ ansible_host=.*\n", "", base, flags=re.M)
        (hostctl.STATE / f"inventory-{scenario}.ini").write_text(text)


def driver_state() -> tuple[str, list[str]]:
    out = on_host("nvidia_driver", "dpkg-query -W -f '${Version}' nvidia-kernel-dkms; echo; apt-mark showhold").split()
    return out[0], out[1:]


def driver_sequence() -> dict[str, object]:
    """The driver scenario's steps, run in order on its own host; the test checks them afterwards."""
    old = ("-e", "nvidia_driver_gpu_present=false", "-e", f"nvidia_driver_version={OLD_DRIVER}")
    new = ("-e", "nvidia_driver_gpu_present=false", "-e", f"nvidia_driver_version={NEW_DRIVER}")
    steps: dict[str, object] = {"refused": playbook("nvidia_driver")}
    steps["syntax"] = playbook("nvidia_driver", "--syntax-check")
    steps["first"] = playbook("nvidia_driver", *old)
    steps["second"] = playbook("nvidia_driver", *old)
    steps["state_old"] = driver_state()
    steps["config"] = on_host(
        "nvidia_driver",
        "grep -x 'blacklist nouveau' /etc/modprobe.d/glmdeploy-blacklist-nouveau.conf; "
        "systemctl is-enabled nvidia-persistenced; grep '^Pin:' /etc/apt/preferences.d/glmdeploy-nvidia.pref",
    )
    steps["dry"] = playbook("nvidia_driver", *old, "--check")
    steps["silent"] = playbook("nvidia_driver", *new)
    steps["state_after_silent"] = driver_state()
    steps["upgrade"] = playbook("nvidia_driver", *new, "-e", "nvidia_driver_upgrade=true")
    steps["state_new"] = driver_state()
    steps["again"] = playbook("nvidia_driver", *new)
    return steps


@pytest.fixture(scope="module")
def hosts():
    """A fresh host per scenario, created together (create ... destroy)."""
    created = make("hosts", f"N={len(HOSTS)}")
    assert created.returncode == 0
    write_inventories()
    pool = ThreadPoolExecutor(max_workers=1)
    driver = pool.submit(driver_sequence)
    try:
        yield {"driver": driver}
    finally:
        pool.shutdown(wait=True)
        make("hosts-down")


def converge_twice(scenario: str, *extra: str) -> None:
    syntax = playbook(scenario, "--syntax-check")
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr
    first = playbook(scenario, *extra)
    assert first.returncode == 0, first.stdout[-3000:]
    second = playbook(scenario, *extra)
    assert second.returncode == 0 and changed(second.stdout) == 0, (
        f"{scenario} is not idempotent:\n{second.stdout[-3000:]}"
    )


def test_node_base_scenario(hosts):
    converge_twice("node_base")
    home = on_host("node_base", "getent passwd glmdeploy | cut -d: -f6,7").strip()
    assert home == "/var/lib/glmdeploy:/usr/sbin/nologin"
    assert on_host("node_base", "stat -c '%U %a' /var/lib/glmdeploy/cache /opt/glmdeploy").split() == [
        "glmdeploy",
        "750",
        "root",
        "755",
    ]


def test_model_scenario(hosts):
    converge_twice("model")
    out = on_host(
        "model",
        "cd /opt/glmdeploy/models/chatglm3-fixture-* && stat -c '%U:%G %a' * | sort -u; "
        "sha256sum --check --quiet SHA256SUMS && echo OK",
    )
    assert out.split() == ["root:root", "444", "OK"]


def test_service_unit_scenario(hosts):
    converge_twice("service_unit")
    out = on_host(
        "service_unit",
        "systemctl is-active glmdeploy-scenario_http; "
        "ps -o user= -p $(systemctl show -p MainPID --value glmdeploy-scenario_http); "
        "systemd-analyze verify /etc/systemd/system/glmdeploy-scenario_http.service 2>&1; echo rc=$?",
    )
    assert out.split() == ["active", "scenario", "rc=0"], out


def test_preflight_names_an_occupied_port_and_changes_nothing(hosts):
    on_host("preflight_port", "systemd-run --unit squatter python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null")
    listening = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8000), 1)\""
    on_host("preflight_port", f"for _ in $(seq 100); do {listening} 2>/dev/null && break; sleep 0.1; done")
    result = playbook("preflight_port")
    assert result.returncode != 0
    assert "port 8000 is already in use by PID" in result.stdout and "fix:" in result.stdout
    assert on_host("preflight_port", "test -e /opt/glmdeploy && echo touched || echo untouched").strip() == "untouched"


def test_nvidia_driver_scenario(hosts):
    """Debian's 535 driver for real on a GPU-less host: pinned, held, idempotent, upgraded only on request."""
    driver: Future = hosts["driver"]
    steps = driver.result(timeout=1200)
    refused = steps["refused"]
    assert refused.returncode != 0 and "has no NVIDIA PCI device" in refused.stdout, refused.stdout[-2000:]
    assert "nvidia_driver_gpu_present: false" in refused.stdout
    assert steps["syntax"].returncode == 0, steps["syntax"].stdout + steps["syntax"].stderr
    assert steps["first"].returncode == 0, steps["first"].stdout[-3000:]
    second = steps["second"]
    assert second.returncode == 0 and changed(second.stdout) == 0, f"not idempotent:\n{second.stdout[-3000:]}"
    version, held = steps["state_old"]
    assert version == OLD_DRIVER
    assert {"nvidia-kernel-dkms", "nvidia-smi", "libnvidia-ml1", "libcuda1", "firmware-nvidia-gsp"} <= set(held)
    assert steps["config"].split() == ["blacklist", "nouveau", "enabled", "Pin:", "version", OLD_DRIVER]
    dry = steps["dry"]
    assert dry.returncode == 0 and changed(dry.stdout) == 0, dry.stdout[-3000:]

    silent = steps["silent"]
    assert silent.returncode != 0 and "make driver-upgrade" in silent.stdout, silent.stdout[-2000:]
    assert steps["state_after_silent"][0] == OLD_DRIVER, "a held driver changed without the upgrade path"
    upgrade = steps["upgrade"]
    assert upgrade.returncode == 0, upgrade.stdout[-3000:]
    assert "held broken packages" not in upgrade.stdout
    version, held = steps["state_new"]
    assert version == NEW_DRIVER and "nvidia-kernel-dkms" in held
    again = steps["again"]
    assert again.returncode == 0 and changed(again.stdout) == 0, again.stdout[-3000:]
