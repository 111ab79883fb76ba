"""What a failed health gate says about the node, in each of its four cases (roles/release, stop.yml).

The message is the admin's only account of what the node serves after a failed deploy, so each
case must say what happened and no other: back on the release before; never switched (the release
was already the node's, so it keeps serving); a first release with nothing to return to; a return
that failed. Rendered by Ansible itself (the role's task, one play over four local hosts), no node.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".venv" / "tools"
FAILURE = "smoke tests failed on h1:\n....F\nE   assert 0.22.1 == 0.23.3\n1 failed, 23 passed in 4.3s"
CASES = {
    "unchanged": {"release_switching": False, "release_serving": False, "release_before": "r1"},
    "repaired": {
        "release_switching": False,
        "release_serving": False,
        "release_before": "r1",
        "release_repaired": True,
    },
    "first": {"release_switching": True, "release_serving": False, "release_before": ""},
    "returned": {"release_switching": True, "release_serving": True, "release_before": "r0"},
    "return_failed": {
        "release_switching": True,
        "release_serving": False,
        "release_before": "r0",
        "release_revert_error": "restart timed out",
    },
}

pytestmark = pytest.mark.skipif(
    not (TOOLS / "bin" / "ansible-playbook").exists(), reason="needs the tool environment (make tools)"
)


@pytest.fixture(scope="module")
def messages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("stop")
    inventory = tmp / "hosts.ini"
    inventory.write_text(
        "".join(
            f"{name} ansible_connection=local " + " ".join(f"{k}={json.dumps(v)}" for k, v in case.items()) + "\n"
            for name, case in CASES.items()
        )
    )
    playbook = tmp / "stop.yml"
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.set_fact: {release_id: r1, release_failure: '{{ failure }}'}\n"
        "    - ansible.builtin.include_role: {name: release, tasks_from: stop}\n"
    )
    extra = {
        "failure": FAILURE,
        "glmdeploy_control_dir": str(ROOT),
        "ansible_python_interpreter": str(TOOLS / "bin" / "python"),
    }
    proc = subprocess.run(
        [str(TOOLS / "bin" / "ansible-playbook"), "-i", str(inventory), str(playbook), "-e", json.dumps(extra)],
        capture_output=True,
        text=True,
        check=False,
        env={
            "PATH": f"{TOOLS / 'bin'}:/usr/bin:/bin",
            "HOME": str(tmp),
            "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
            "ANSIBLE_STDOUT_CALLBACK": "json",
            "ANSIBLE_LIBRARY": str(ROOT / "library"),
        },
    )
    # The JSON report, then the timing callback's table (ansible.cfg enables it).
    result, _ = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("{") :])
    stop = next(
        t
        for t in result["plays"][0]["tasks"]
        if t["task"]["name"].endswith("Stop with what failed and what the node runs now")
    )
    return {host: re.sub(r"\s+", " ", outcome.get("msg", "")) for host, outcome in stop["hosts"].items()}


def test_failure_of_an_unchanged_release_says_it_keeps_serving_in_one_line(messages: dict[str, str]) -> None:
    msg = messages["unchanged"]
    assert "nothing was switched" in msg and "keeps serving it" in msg
    assert "smoke tests failed on h1: 1 failed, 23 passed" in msg and "assert 0.22.1" not in msg
    assert "had none before" not in msg
    assert "its services were not restarted" in msg


def test_failure_after_an_environment_repair_says_the_services_were_restarted(messages: dict[str, str]) -> None:
    msg = messages["repaired"]
    assert "model files were put back in place" in msg and "restarted on them" in msg and "keeps serving" not in msg


def test_only_a_first_release_says_it_had_none_before(messages: dict[str, str]) -> None:
    assert "it had none before" in messages["first"]
    assert [case for case, msg in messages.items() if "had none before" in msg] == ["first"]


def test_a_returned_node_names_its_release_and_a_failed_return_its_error(messages: dict[str, str]) -> None:
    assert "back on release r0 and serving" in messages["returned"]
    assert "could not return to a working release: restart timed out" in messages["return_failed"]
