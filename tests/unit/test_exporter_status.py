"""make verify's exporter rows (roles/node_metrics/templates/status.json.j2), rendered by Ansible
itself (the tools environment's ansible-playbook, as make verify runs it): a hung node is its own
finding, apart from a node that is down or whose generation fails."""

from __future__ import annotations

import json
from pathlib import Path

from local_play import run_tasks

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "roles" / "node_metrics" / "templates" / "status.json.j2"

PROBER = """# HELP glmdeploy_probe_success 1 when the last probe generated properly
# TYPE glmdeploy_probe_success gauge
glmdeploy_probe_success {success}
# HELP glmdeploy_probe_in_flight_seconds How long the running probe has run (0: none)
# TYPE glmdeploy_probe_in_flight_seconds gauge
glmdeploy_probe_in_flight_seconds {waited}
# HELP glmdeploy_probe_last_result 1: the last probe's result
# TYPE glmdeploy_probe_last_result gauge
glmdeploy_probe_last_result{{result="ok"}} {ok}
glmdeploy_probe_last_result{{result="timeout"}} {timeout}
"""


def rendered(tmp_path: Path, prober_metrics: str) -> dict[str, str]:
    """The rows the template writes for a node whose prober serves these metrics."""
    facts = {
        "glmdeploy_monitor_hosts": ["lb"],
        "glmdeploy_profile": "cpu",
        "node_metrics_hang_s": 6.0,
        "node_metrics_probe_timeout": 30,
        "node_metrics_gpu_absent_reason": "",
        "node_metrics_status": {
            "results": [
                {"item": {"name": "node exporter"}, "status": 200, "content": "up 1\n"},
                {"item": {"name": "prober"}, "status": 200, "content": prober_metrics},
                {"item": {"name": "gpu exporter", "skip": True}, "status": -1},
            ]
        },
    }
    out = tmp_path / "exporters.json"
    task = {"ansible.builtin.template": {"src": str(TEMPLATE), "dest": str(out), "mode": "0644"}}
    proc = run_tasks(tmp_path, [task], facts)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return dict(json.loads(out.read_text()))


def test_a_probe_waiting_past_the_hang_threshold_is_named_hung_not_down(tmp_path):
    rows = rendered(tmp_path, PROBER.format(success=1, waited=9.4, ok=1, timeout=0))
    assert rows["prober"].startswith("up, NOT generating: HUNG"), rows
    assert "9 s" in rows["prober"] and rows["node exporter"] == "up"


def test_a_last_probe_that_timed_out_is_named_hung(tmp_path):
    rows = rendered(tmp_path, PROBER.format(success=0, waited=0, ok=0, timeout=1))
    assert rows["prober"].startswith("up, NOT generating: HUNG") and "30 s" in rows["prober"], rows


def test_a_generating_node_and_a_failing_one_are_told_apart_from_a_hung_one(tmp_path):
    assert rendered(tmp_path, PROBER.format(success=1, waited=0.4, ok=1, timeout=0))["prober"] == "up, generating"
    assert rendered(tmp_path, PROBER.format(success=0, waited=0, ok=0, timeout=0))["prober"] == "up, NOT generating"
