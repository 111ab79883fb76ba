"""The node firewall's checks (roles/node_firewall), run by the tools environment's
ansible-playbook on this machine: a setting that would lock the control node out, or name a
source that is not one, is refused naming the fix, before nftables is installed or any rule is
written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from local_play import run_tasks

from glmdeploy_control import plan, registry

#: What every playbook has before the role runs: the node's plan (its units among them).
PLAN = plan.plan(
    registry.load(), host="localhost", profile="cpu", python_path="python3", probe={"python": "3.11", "pci_vendors": ""}
)
NODE = {
    "ansible_service_mgr": "systemd",
    "node_firewall_enabled": True,
    "node_firewall_hosts": ["localhost"],
    "glmdeploy_plan": PLAN.to_dict(),
}


def firewall(tmp_path: Path, **settings: object) -> subprocess.CompletedProcess[str]:
    task = {"ansible.builtin.include_role": {"name": "node_firewall"}}
    return run_tasks(tmp_path, [task], NODE | settings)


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"node_firewall_extra_ports": [22]}, "SSH port 22"),
        ({"vllm_server_port": 2222, "ansible_port": 2222}, "SSH port 2222"),
        ({"node_firewall_hosts": ["lb-that-is-not-there"]}, "not in the inventory: lb-that-is-not-there"),
        ({"node_firewall_allow": ["10.0.0.0/8", "lab-jump-host"]}, "not addresses or networks: lab-jump-host"),
        ({"ansible_service_mgr": "sysvinit"}, "needs systemd"),
    ],
    ids=["ssh-port-kept", "ssh-port-is-vllm", "unknown-host", "name-in-allow", "no-systemd"],
)
def test_a_setting_that_would_lock_out_or_is_not_a_source_is_refused_before_any_change(tmp_path, settings, said):
    proc = firewall(tmp_path, **settings)
    assert proc.returncode != 0 and said in proc.stdout and "fix:" in proc.stdout, proc.stdout[-2500:]
    assert "Install nftables" not in proc.stdout, "a bad setting got past the checks"
