"""glmdeploy.serving.procguard: whatever ends a service's server, nothing it started is left running."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[2] / "service"
# A server that starts a helper in its own session (like an engine process), writes both PIDs, waits.
SERVER = """
import os, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
open(sys.argv[1], "w").write(f"{os.getpid()} {helper.pid}")
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def guard(name: str, *argv: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(SERVICE))
    command = [sys.executable, "-m", "glmdeploy.serving.procguard", name, "--", *argv]
    return subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)


def started(tmp_path: Path, name: str) -> tuple[subprocess.Popen[str], int, int]:
    pids = tmp_path / "pids"
    proc = guard(name, sys.executable, "-c", SERVER, str(pids))
    assert wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2), "the server did not start"
    server, helper = map(int, pids.read_text().split())
    return proc, server, helper


@pytest.fixture
def name() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def test_kill_9_of_the_server_stops_the_processes_it_started(tmp_path, name):
    proc, server, helper = started(tmp_path, name)
    os.kill(server, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL, "the guard does not end the way its server did"
    assert not alive(helper), "the server's helper outlived it"
    assert f"ended (signal 9); stopped 1 process(es) it left behind: [{helper}]" in proc.stderr.read()


def test_kill_9_of_the_guard_takes_the_server_with_it(tmp_path, name):
    proc, server, helper = started(tmp_path, name)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert wait_for(lambda: not alive(server)), "the server outlived its guard"
    assert alive(helper), "expected: the helper (own session) survives a killed guard until the next start"
    os.kill(helper, signal.SIGKILL)


def test_next_start_stops_and_names_what_an_earlier_run_left(tmp_path, name):
    proc, _, helper = started(tmp_path, name)
    os.kill(proc.pid, signal.SIGKILL)  # nothing could clean up: the helper is left running
    proc.wait(timeout=10)
    assert alive(helper)
    again = guard(name, "true")
    assert again.wait(timeout=30) == 0
    assert wait_for(lambda: not alive(helper)), "the leftover of the earlier run is still running"
    assert f"stopping pid {helper} left by an earlier run of {name}" in again.stderr.read()


def test_sigterm_reaches_the_server_and_its_exit_status_is_kept(tmp_path, name):
    armed = tmp_path / "armed"
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); "
        f"open({str(armed)!r}, 'w').close(); time.sleep(60)"
    )
    proc = guard(name, sys.executable, "-c", code)
    assert wait_for(armed.exists), "the server did not start"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7


def test_other_services_are_left_alone(tmp_path, name):
    proc, _, helper = started(tmp_path, name)
    other = guard(f"{name}-other", "true")
    assert other.wait(timeout=30) == 0
    assert alive(helper), "a different service's guard stopped this one's processes"
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    assert not alive(helper)


def test_a_helper_that_drops_the_marks_is_still_stopped(tmp_path, name):
    """setproctitle can overwrite a process's environment, marks included: orphans are stopped
    because they are below the guard (its subreaper), not only because of their marks."""
    pids = tmp_path / "pids"
    server = (
        "import os, subprocess, sys, time\n"
        "helper = subprocess.Popen(['sleep', '300'], env={}, start_new_session=True)\n"
        "open(sys.argv[1], 'w').write(f'{os.getpid()} {helper.pid}')\n"
        "time.sleep(300)\n"
    )
    proc = guard(name, sys.executable, "-c", server, str(pids))
    assert wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2), "the server did not start"
    server_pid, helper = map(int, pids.read_text().split())
    os.kill(server_pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not alive(helper), "an unmarked orphan of the server outlived it"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_next_start_leaves_a_container_s_processes_alone(tmp_path, name):
    """A machine that runs containers (the kit's test hosts, beside this machine's node in make
    test) shows their processes in its /proc, marks and user ID included: they are another
    node's services. Only a leftover in the guard's own PID namespace is stopped."""
    env = dict(os.environ, GLMDEPLOY_SERVICE=name, GLMDEPLOY_SERVICE_RUN="an-earlier-run")
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    here = subprocess.Popen(sleeper, env=env)
    unshare = subprocess.Popen(["unshare", "--pid", "--fork", *sleeper], env=env)
    children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children")
    assert wait_for(lambda: children.read_text().split() != []), "unshare started no process"
    there = int(children.read_text().split()[0])
    try:
        assert os.readlink(f"/proc/{there}/ns/pid") != os.readlink("/proc/self/ns/pid")
        again = guard(name, "true")
        assert again.wait(timeout=30) == 0
        assert wait_for(lambda: not alive(here.pid)), "the leftover in this PID namespace is still running"
        assert alive(there), "the guard stopped a process of another PID namespace"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(there, signal.SIGKILL)
        for proc in (here, unshare):
            proc.kill()
            proc.wait(timeout=10)
