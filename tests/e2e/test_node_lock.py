"""The node's deploy lock, through the kit's own lock/unlock task files run by ansible-playbook.

Each test runs a small playbook against this machine that imports `playbooks/tasks/lock.yml`
and `unlock.yml` the way every kit playbook does (lock, work, `always` unlock), with the lock
file in a temporary directory and another run's record planted in it: a live process (its real
PID and start time), a process that is gone, and a run from another control node. The
full-deploy case (two deploys from two inventories at once) is in test_deploy.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = Path(sys.executable).parent
# The action plugin's own record builder (Ansible loads the file by path; so does this test).
_spec = importlib.util.spec_from_file_location("node_lock", ROOT / "plugins" / "action" / "glmdeploy_node_lock.py")
assert _spec and _spec.loader
node_lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(node_lock)


def _record(pid: int, host: str | None = None, command: str = "ansible-playbook other.yml") -> dict:
    """Another run's record, as the plugin writes it (a gone PID keeps the start time it had: none)."""
    return node_lock.record(pid, host or socket.gethostname(), command, "2026-12-02 10:00:00 UTC")


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    return tmp_path / "state" / "deploy.lock"


def _book(tmp_path: Path, lock: Path, wait: int, takeover: str, work: str = "") -> Path:
    """A playbook that takes the lock the kit's way, does `work` (task lines), and releases it in `always`."""
    book = tmp_path / f"book-{wait}.yml"
    book.write_text(
        f"""
- hosts: localhost
  gather_facts: false
  vars:
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
    glmdeploy_node_lock_path: {lock}
    glmdeploy_node_lock_wait: {wait}
    glmdeploy_node_lock_takeover: "{takeover}"
  tasks:
    - block:
        - ansible.builtin.import_tasks: {ROOT}/playbooks/tasks/lock.yml
{work}
      always:
        - ansible.builtin.import_tasks: {ROOT}/playbooks/tasks/unlock.yml
"""
    )
    return book


def _playbook(tmp_path: Path, lock: Path, wait: int = 0, takeover: str = "", check: bool = False):
    """Run lock -> record what the run saw -> unlock; returns (process, the lock file as the work saw it)."""
    seen = tmp_path / "seen.json"
    work = f"""        - name: What the run's work sees
          ansible.builtin.shell: cat {lock} > {seen} 2>/dev/null || echo null > {seen}
          check_mode: false"""
    book = _book(tmp_path, lock, wait, takeover, work)
    cmd = [str(TOOLS_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(book)]
    proc = subprocess.run(
        [*cmd, *(["--check"] if check else [])], capture_output=True, text=True, env=_env(), timeout=300, check=False
    )
    held = json.loads(seen.read_text()) if seen.exists() else None
    return proc, held


def test_a_run_holds_the_lock_for_its_work_and_releases_it(tmp_path: Path, lock: Path) -> None:
    proc, held = _playbook(tmp_path, lock)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert held is not None and str(tmp_path / "book-0.yml") in held["command"], f"not held by this run: {held}"
    assert not lock.exists(), "the run left its lock behind"


def test_a_live_holder_is_named_and_the_second_run_stops(tmp_path: Path, lock: Path) -> None:
    with subprocess.Popen(["sleep", "300"]) as holder:
        try:
            lock.parent.mkdir()
            record = _record(holder.pid, command="ansible-playbook -i lab.ini playbooks/site.yml")
            lock.write_text(json.dumps(record))
            proc, held = _playbook(tmp_path, lock)
        finally:
            holder.kill()
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, "a second run went ahead while another held the node's lock"
    assert held is None, "the second run's work ran"
    assert f"PID {holder.pid} on control node {socket.gethostname()}" in out, out[-3000:]
    assert "playbooks/site.yml" in out and "LOCK_WAIT=<seconds>" in out and "Nothing was changed" in out
    assert json.loads(lock.read_text()) == record, "the refused run touched the holder's lock"


def test_a_waiting_run_goes_ahead_when_the_holder_finishes(tmp_path: Path, lock: Path) -> None:
    holder = subprocess.Popen(["sleep", "300"])
    lock.parent.mkdir()
    lock.write_text(json.dumps(_record(holder.pid)))
    waiter, said = _start_waiting(tmp_path, lock)
    # The holder ends while the second run waits; its record stays, as a killed run's does.
    holder.kill()
    holder.wait()
    rest, _ = waiter.communicate(timeout=300)
    out = said + rest
    assert waiter.returncode == 0, out[-3000:]
    assert "taking over the deploy lock of a run that is gone" in out, out[-3000:]
    assert not lock.exists()


def _start_waiting(tmp_path: Path, lock: Path) -> tuple[subprocess.Popen[str], str]:
    """A run allowed to wait 120 s, returned once it says it is waiting (with what it said)."""
    book = _book(tmp_path, lock, 120, "")
    cmd = [str(TOOLS_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(book)]
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    assert run.stdout is not None
    said = []
    for line in run.stdout:
        said.append(line)
        if "waiting for another run's deploy lock" in line:
            return run, "".join(said)
    run.wait()
    pytest.fail("the second run never said it was waiting: " + "".join(said)[-3000:])


def _env() -> dict[str, str]:
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0"}


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_warning(tmp_path: Path, lock: Path) -> None:
    gone = subprocess.Popen(["true"])
    record = _record(gone.pid)
    gone.wait()
    lock.parent.mkdir()
    lock.write_text(json.dumps(record))
    proc, held = _playbook(tmp_path, lock)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "taking over the deploy lock of a run that is gone" in proc.stdout + proc.stderr
    assert held is not None and held["id"] != record["id"], "the run worked without holding the lock"
    assert not lock.exists()


def test_another_control_nodes_lock_is_refused_until_taken_over_on_purpose(tmp_path: Path, lock: Path) -> None:
    lock.parent.mkdir()
    record = _record(os.getpid(), host="lab-control-2")
    lock.write_text(json.dumps(record))
    refused, held = _playbook(tmp_path, lock)
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0 and held is None, "a lock from another control node was ignored"
    assert f"-e glmdeploy_node_lock_takeover={record['id']}" in out, out[-3000:]
    taken, held = _playbook(tmp_path, lock, takeover=record["id"])
    assert taken.returncode == 0 and held is not None and held["id"] != record["id"], taken.stdout[-3000:]
    assert not lock.exists()


def test_check_mode_takes_no_lock_on_the_node(tmp_path: Path, lock: Path) -> None:
    proc, held = _playbook(tmp_path, lock, check=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert held is None and not lock.parent.exists(), "--check wrote to the node"
