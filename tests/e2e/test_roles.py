"""Molecule-style scenarios, one fresh test host each: syntax, create, converge, idempotence, verify, destroy.

The whole site playbook has its own scenario in test_fleet.py; here each role
is converged alone (with only what it needs), so a role that is not
idempotent, renders a bad unit or leaves a service stopped fails on its own.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import ROOT, make

sys.path.insert(0, str(ROOT / "tests" / "hosts"))
import hostctl

SCENARIOS = ROOT / "tests" / "scenarios"
KEY = hostctl.STATE / "id_ed25519"


def playbook(scenario: str, inventory: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(ROOT / ".venv/tools/bin/ansible-playbook"),
            "-i",
            inventory,
            str(SCENARIOS / scenario / "converge.yml"),
            "-e",
            "glmdeploy_control_dir=" + str(ROOT),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=ROOT,
        env={
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "PATH": f"{ROOT}/.venv/tools/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        },
    )


def changed(output: str) -> int:
    match = re.search(r"^testhost1\s*:\s*ok=\d+\s+changed=(\d+)", output, re.M)
    assert match, output[-2000:]
    return int(match.group(1))


@pytest.fixture
def host():
    """A fresh host per scenario (create ... destroy)."""
    created = make("hosts", "N=1")
    assert created.returncode == 0
    try:
        yield str(hostctl.STATE / "inventory.ini")
    finally:
        make("hosts-down")


def converge_twice(scenario: str, inventory: str, *extra: str) -> None:
    syntax = playbook(scenario, inventory, "--syntax-check")
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr
    first = playbook(scenario, inventory, *extra)
    assert first.returncode == 0, first.stdout[-3000:]
    second = playbook(scenario, inventory, *extra)
    assert second.returncode == 0 and changed(second.stdout) == 0, (
        f"{scenario} is not idempotent:\n{second.stdout[-3000:]}"
    )


def on_host(command: str) -> str:
    return hostctl.ssh("testhost1", KEY, command).stdout


def test_node_base_scenario(host):
    converge_twice("node_base", host)
    assert on_host("getent passwd glmdeploy | cut -d: -f6,7").strip() == "/var/lib/glmdeploy:/usr/sbin/nologin"
    assert on_host("stat -c '%U %a' /var/lib/glmdeploy/cache /opt/glmdeploy").split() == [
        "glmdeploy",
        "750",
        "root",
        "755",
    ]


def test_model_scenario(host):
    converge_twice("model", host)
    out = on_host(
        "cd /opt/glmdeploy/models/chatglm3-fixture && stat -c '%U:%G %a' * | sort -u; "
        "sha256sum --check --quiet SHA256SUMS && echo OK"
    )
    assert out.split() == ["root:root", "444", "OK"]


def test_service_unit_scenario(host):
    converge_twice("service_unit", host)
    out = on_host(
        "systemctl is-active glmdeploy-scenario_http; "
        "ps -o user= -p $(systemctl show -p MainPID --value glmdeploy-scenario_http); "
        "systemd-analyze verify /etc/systemd/system/glmdeploy-scenario_http.service 2>&1; echo rc=$?"
    )
    assert out.split() == ["active", "scenario", "rc=0"], out


def test_preflight_names_an_occupied_port_and_changes_nothing(host):
    on_host("systemd-run --unit squatter python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null; sleep 1")
    result = playbook("preflight_port", host)
    assert result.returncode != 0
    assert "port 8000 is already in use by PID" in result.stdout and "fix:" in result.stdout
    assert on_host("test -e /opt/glmdeploy && echo touched || echo untouched").strip() == "untouched"


OLD_DRIVER, NEW_DRIVER = "535.261.03-1", "535.309.01-0+deb12u1"  # Debian 12 bookworm / bookworm-security


def driver_state() -> tuple[str, list[str]]:
    out = on_host("dpkg-query -W -f '${Version}' nvidia-kernel-dkms; echo; apt-mark showhold").split()
    return out[0], out[1:]


def test_nvidia_driver_scenario(host):
    """Debian's 535 driver for real on a GPU-less host: pinned, held, idempotent, upgraded only on request."""
    refused = playbook("nvidia_driver", host)
    assert refused.returncode != 0 and "has no NVIDIA PCI device" in refused.stdout, refused.stdout[-2000:]
    assert "nvidia_driver_gpu_present: false" in refused.stdout

    old = ("-e", "nvidia_driver_gpu_present=false", "-e", f"nvidia_driver_version={OLD_DRIVER}")
    converge_twice("nvidia_driver", host, *old)
    version, held = driver_state()
    assert version == OLD_DRIVER
    assert {"nvidia-kernel-dkms", "nvidia-smi", "libnvidia-ml1", "libcuda1", "firmware-nvidia-gsp"} <= set(held)
    out = on_host(
        "grep -x 'blacklist nouveau' /etc/modprobe.d/glmdeploy-blacklist-nouveau.conf; "
        "systemctl is-enabled nvidia-persistenced; grep '^Pin:' /etc/apt/preferences.d/glmdeploy-nvidia.pref"
    )
    assert out.split() == ["blacklist", "nouveau", "enabled", "Pin:", "version", OLD_DRIVER], out
    dry = playbook("nvidia_driver", host, *old, "--check")
    assert dry.returncode == 0 and changed(dry.stdout) == 0, dry.stdout[-3000:]

    new = ("-e", "nvidia_driver_gpu_present=false", "-e", f"nvidia_driver_version={NEW_DRIVER}")
    silent = playbook("nvidia_driver", host, *new)
    assert silent.returncode != 0 and "make driver-upgrade" in silent.stdout, silent.stdout[-2000:]
    assert driver_state()[0] == OLD_DRIVER, "a held driver changed without the upgrade path"

    upgrade = playbook("nvidia_driver", host, *new, "-e", "nvidia_driver_upgrade=true")
    assert upgrade.returncode == 0, upgrade.stdout[-3000:]
    assert "held broken packages" not in upgrade.stdout
    version, held = driver_state()
    assert version == NEW_DRIVER and "nvidia-kernel-dkms" in held
    again = playbook("nvidia_driver", host, *new)
    assert again.returncode == 0 and changed(again.stdout) == 0, again.stdout[-3000:]
