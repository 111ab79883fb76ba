"""glmdeploy_control.runlock: two runs on one inventory never overlap; the second names the first."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[2] / "service"


def locked(tmp_path: Path, inventory: Path, *command: str, wait: float = 0) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(SERVICE), GLMDEPLOY_LOCK_DIR=str(tmp_path / "locks"))
    argv = [sys.executable, "-m", "glmdeploy_control.runlock", "--inventory", str(inventory), "--wait", str(wait), "--"]
    return subprocess.Popen(
        [*argv, *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.ini"
    path.write_text("[glmdeploy_nodes]\nnode1\n")
    return path


def first_run(tmp_path: Path, inventory: Path) -> tuple[subprocess.Popen[str], Path]:
    started = tmp_path / "started"
    proc = locked(tmp_path, inventory, "sh", "-c", f"touch {started}; exec sleep 60")
    deadline = time.monotonic() + 20
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), "the first run did not start"
    return proc, started


def test_second_run_on_the_same_inventory_stops_naming_the_first(tmp_path, inventory):
    first, _ = first_run(tmp_path, inventory)
    try:
        second = locked(tmp_path, inventory, "true")
        _, err = second.communicate(timeout=30)
        assert second.returncode == 75
        assert f"PID {first.pid}, started " in err and "sleep 60" in err and "Nothing was changed" in err
    finally:
        first.kill()
        first.wait()


def test_a_killed_run_leaves_no_stale_lock(tmp_path, inventory):
    first, _ = first_run(tmp_path, inventory)
    os.killpg(first.pid, signal.SIGKILL)  # the whole run, as a killed terminal or CI job does
    first.wait()
    second = locked(tmp_path, inventory, "true")
    assert second.wait(timeout=30) == 0


def test_the_command_keeps_the_lock_when_the_wrapper_is_killed(tmp_path, inventory):
    first, _ = first_run(tmp_path, inventory)
    try:
        os.kill(first.pid, signal.SIGKILL)  # the wrapper alone: its command (the deploy) runs on
        first.wait()
        second = locked(tmp_path, inventory, "true")
        assert second.wait(timeout=30) == 75, "a second run started while the first one's command still ran"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)


def test_a_waiting_run_starts_when_the_first_ends(tmp_path, inventory):
    first, _ = first_run(tmp_path, inventory)
    second = locked(tmp_path, inventory, "echo", "second ran", wait=60)
    assert "waiting up to 60 s for another run on this inventory: PID" in second.stdout.readline()
    first.send_signal(signal.SIGTERM)  # passed on to the command; the lock goes with the holder
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 0 and "second ran" in out


def test_other_inventories_are_not_blocked(tmp_path, inventory):
    first, _ = first_run(tmp_path, inventory)
    try:
        other = tmp_path / "other.ini"
        other.write_text("[glmdeploy_nodes]\nnode2\n")
        assert locked(tmp_path, other, "true").wait(timeout=30) == 0
    finally:
        first.kill()
        first.wait()


def test_ctrl_c_stops_a_command_that_carries_on_after_sigint(tmp_path, inventory):
    """Ctrl-C (SIGINT to the whole process group) ends the run even when the command takes SIGINT
    and goes on, as ansible-core 2.19 can (ansible/ansible#86078): the wrapper sends it SIGTERM."""
    started = tmp_path / "started"
    stubborn = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *_: None)\n"
        "pathlib.Path(sys.argv[1]).touch()\n"
        "time.sleep(60)\n"
    )
    proc = locked(tmp_path, inventory, sys.executable, "-c", stubborn, str(started))
    deadline = time.monotonic() + 20
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), "the command did not start"
    os.killpg(proc.pid, signal.SIGINT)
    try:
        code = proc.wait(timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 128 + signal.SIGTERM, f"the run went on after Ctrl-C (status {code})"
