"""The full deploy on three fresh systemd hosts: converge, idempotence, real verification.

Hosts come from tests/hosts/hostctl.py (`make hosts N=3`): Debian 12 booting
systemd in their own network namespaces, reaching only the controller's apt
proxy and artifact server. Runs after test_deploy.py (file order), so the
localhost deployment is gone and the memory is free.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import FIGURES, ROOT, make

sys.path.insert(0, str(ROOT / "tests" / "hosts"))
import hostctl

STATE = hostctl.STATE
KEY = STATE / "id_ed25519"
HOSTS = ["testhost1", "testhost2", "testhost3"]


def on_host(host: str, command: str) -> subprocess.CompletedProcess[str]:
    return hostctl.ssh(host, KEY, command)


def recap(output: str) -> dict[str, dict[str, int]]:
    rows = {}
    for host, fields in re.findall(r"^(testhost\d+)\s*:\s*(ok=.*)$", output, re.M):
        rows[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", fields)}
    return rows


class MemoryPeak(threading.Thread):
    """Samples used memory (MemTotal - MemAvailable) until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_mib = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
            used = (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) / 1024
            self.peak_mib = max(self.peak_mib, used)
            time.sleep(0.5)


@pytest.fixture(scope="module")
def fleet():
    peak = MemoryPeak()
    peak.start()
    created = make("hosts", "N=3")
    assert created.returncode == 0, "make hosts failed"
    inventory = json.loads((STATE / "hosts.json").read_text())["inventory"]
    timings = {"create_s": json.loads((STATE / "hosts.json").read_text())["create_s"]}
    try:
        yield {"inventory": inventory, "timings": timings, "peak": peak}
    finally:
        peak.stop.set()
        FIGURES["3-host fleet (s)"] = timings
        FIGURES["peak memory used during the fleet test (MiB)"] = round(peak.peak_mib)
        make("hosts-down")


def test_full_deploy_converges_on_three_hosts(fleet):
    proc = make("deploy", f"INVENTORY={fleet['inventory']}", timeout=1500)
    fleet["timings"]["converge_s"] = round(proc.elapsed, 1)
    rows = recap(proc.stdout)
    assert proc.returncode == 0 and sorted(rows) == HOSTS
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in rows.values()), rows
    assert proc.stdout.count("smoke:  ") == 3 and " failed" not in re.sub(
        r"failed=0", "", proc.stdout.split("PLAY RECAP")[-1]
    )


def test_second_deploy_reports_no_change_on_any_host(fleet):
    proc = make("deploy", f"INVENTORY={fleet['inventory']}", timeout=900)
    fleet["timings"]["idempotent_rerun_s"] = round(proc.elapsed, 1)
    rows = recap(proc.stdout)
    assert proc.returncode == 0
    assert {h: r["changed"] for h, r in rows.items()} == dict.fromkeys(HOSTS, 0)


def test_verify_prints_one_table_for_the_identical_fleet(fleet):
    proc = make("verify", f"INVENTORY={fleet['inventory']}", timeout=600)
    fleet["timings"]["verify_3_hosts_s"] = round(proc.elapsed, 1)
    assert proc.returncode == 0, "make verify found differences on a freshly deployed fleet"
    assert "| field | testhost1 | testhost2 | testhost3 |" in proc.stdout


@pytest.mark.parametrize("host", HOSTS)
def test_services_run_under_systemd_as_the_service_user(fleet, host):
    out = on_host(
        host,
        "systemctl is-active glmdeploy-vllm_server glmdeploy-chat_ui; "
        "ps -o user= -p $(systemctl show -p MainPID --value glmdeploy-vllm_server)",
    )
    assert out.stdout.split() == ["active", "active", "glmdeploy"], out.stdout + out.stderr


@pytest.mark.parametrize("host", HOSTS)
def test_rendered_units_pass_systemd_analyze_verify(fleet, host):
    out = on_host(host, "systemd-analyze verify /etc/systemd/system/glmdeploy-*.service 2>&1; echo rc=$?")
    assert out.stdout.strip() == "rc=0", f"systemd-analyze verify said: {out.stdout}"


@pytest.mark.parametrize("host", HOSTS)
def test_model_files_are_root_owned_read_only_and_match_the_manifest(fleet, host):
    out = on_host(
        host,
        "cd /opt/glmdeploy/models/chatglm3-fixture && stat -c '%U:%G %a %n' * | sort -u -k1,2 "
        "| cut -d' ' -f1,2 | sort -u && sha256sum --check --quiet SHA256SUMS && echo OK",
    )
    assert out.stdout.split() == ["root:root", "444", "OK"], out.stdout + out.stderr


@pytest.mark.parametrize("host", HOSTS)
def test_a_generation_works_on_the_node(fleet, host):
    out = on_host(
        host,
        "cd /tmp && PYTHONPATH=/opt/glmdeploy/app HF_HUB_OFFLINE=1 "
        "/opt/glmdeploy/current/venv/bin/python -m glmdeploy.chat --max-tokens 16 hello",
    )
    assert out.returncode == 0, out.stderr
    reply = out.stdout.split("assistant> ", 1)[1].strip()
    assert reply, "empty reply"


@pytest.mark.parametrize("host", HOSTS)
def test_hosts_have_no_route_out(fleet, host):
    out = on_host(host, "ip route show default; ip route")
    assert "default" not in out.stdout and "10.77.0.0/24" in out.stdout
