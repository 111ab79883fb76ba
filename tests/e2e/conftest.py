"""End-to-end fixtures: a real `make deploy` on this machine, torn down with `make undeploy`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE_CONFIG = Path("/etc/glmdeploy/node.json")
#: Measured figures, printed at the end of the run and saved to reports/e2e-figures.json.
FIGURES: dict[str, object] = {}
#: Seconds per test, setup (where deploying fixtures run) + call + teardown: reports/e2e-durations.json,
#: read by tests/ci/phases.py for make test's per-phase table.
DURATIONS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    DURATIONS[report.nodeid] = round(DURATIONS.get(report.nodeid, 0.0) + report.duration, 1)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if DURATIONS:
        out = ROOT / "reports" / "e2e-durations.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(DURATIONS, indent=2) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "drill: fault drill under load; `make drills` runs these, `make e2e` (CI) leaves them out"
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FIGURES:
        return
    terminalreporter.section("measured figures (this machine)")
    for key, value in FIGURES.items():
        terminalreporter.write_line(f"{key}: {value}")
    out = ROOT / "reports" / "e2e-figures.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(FIGURES, indent=2) + "\n")


def make(*args: str, timeout: int = 1800, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a make target from the checkout, echoing its output so CI logs show progress (`env`: added variables)."""
    start = time.monotonic()
    cmd = ["make", "-C", str(ROOT), *args]
    # Its own process group: a run that overstays is stopped whole (make, ansible, ssh), not
    # left changing hosts behind the next test; its log says how far it got.
    pipe = subprocess.PIPE
    full_env = {**os.environ, **(env or {})}
    with subprocess.Popen(cmd, stdout=pipe, stderr=pipe, text=True, start_new_session=True, env=full_env) as run:
        try:
            out, err = run.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            out, err = run.communicate()
            err += f"\n[e2e] make cut off after {timeout} s\n"
    proc = subprocess.CompletedProcess(cmd, run.returncode, out, err)
    proc.elapsed = time.monotonic() - start  # type: ignore[attr-defined]
    # Every make run's full output, numbered in order, for reading a CI failure afterwards.
    logs = ROOT / "reports" / "e2e-logs"
    logs.mkdir(parents=True, exist_ok=True)
    number = len(list(logs.glob("*.log"))) + 1
    name = "-".join(a.split("=")[0].lower() for a in args)[:60]
    (logs / f"{number:03d}-{name}.log").write_text(
        f"$ make {' '.join(args)}\nrc={proc.returncode} elapsed={proc.elapsed:.1f}s\n\n{proc.stdout}\n{proc.stderr}"  # type: ignore[attr-defined]
    )
    sys.stdout.write(f"\n$ make {' '.join(args)}  ({proc.elapsed:.1f}s, rc={proc.returncode})\n")  # type: ignore[attr-defined]
    sys.stdout.write(proc.stdout[-3000:] + proc.stderr[-2000:])
    return proc


def http_json(url: str, body: dict | None = None, timeout: float = 60) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def service_pids() -> dict[str, int]:
    """PIDs of the kit's services, from supervisord or systemd."""
    pids = {}
    for name in ("vllm_server", "chat_ui"):
        ctl = "/opt/glmdeploy/current/env/bin/supervisorctl"
        if Path(ctl).exists() and Path("/etc/glmdeploy/supervisord.conf").exists():
            out = subprocess.run(
                [ctl, "-c", "/etc/glmdeploy/supervisord.conf", "pid", name], capture_output=True, text=True, check=False
            ).stdout.strip()
        else:
            out = subprocess.run(
                ["systemctl", "show", "-p", "MainPID", "--value", f"glmdeploy-{name}"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
        pids[name] = int(out) if out.isdigit() else 0
    return pids


# Every process of the service user, as JSON: pid, start time, command, RSS and the service run it
# belongs to (glmdeploy.procguard marks each run's processes in their environment; the guard
# itself carries no mark). Run with python3 as root, on this machine or on a test host.
SERVICE_USER_PROCESSES = """
import json, os, pwd
uid = pwd.getpwnam("glmdeploy").pw_uid
procs = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if os.stat(f"/proc/{pid}").st_uid != uid:
            continue
        stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        env = dict(kv.split("=", 1) for kv in open(f"/proc/{pid}/environ").read().split("\\0") if "=" in kv)
        cmd = open(f"/proc/{pid}/cmdline").read().replace("\\0", " ").strip()
    except OSError:
        continue
    if stat[0] == "Z":
        continue
    procs.append({"pid": int(pid), "ppid": int(stat[1]), "start": int(stat[19]), "cmd": cmd,
                  "comm": open(f"/proc/{pid}/comm").read().strip(), "rss_kb": int(stat[21]) * 4,
                  "service": env.get("GLMDEPLOY_SERVICE"), "run": env.get("GLMDEPLOY_SERVICE_RUN")})
print(json.dumps(procs))
"""


def service_user_processes() -> list[dict]:
    out = subprocess.run(["python3", "-"], input=SERVICE_USER_PROCESSES, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def one_engine_left(before: list[dict], after: list[dict]) -> None:
    """After a restart of the model server: no process of the old run remains, every process of the
    service user belongs to a current run (or is one of the two guards), one engine's memory."""
    old = {(p["pid"], p["start"]) for p in before if p["service"] == "vllm_server"}
    assert len(old) >= 2, f"expected the server and its engine before the kill: {before}"
    left = [p for p in after if (p["pid"], p["start"]) in old]
    assert not left, f"processes of the killed server's run are still running: {left}"
    runs = {p["run"] for p in after if p["service"] == "vllm_server"}
    assert len(runs) == 1, f"more than one run of the model server: {after}"
    unowned = [p for p in after if p["service"] is None and "glmdeploy-procguard" not in p["cmd"]]
    assert not unowned, f"service-user processes outside any service run: {unowned}"
    rss = [sum(p["rss_kb"] for p in procs if p["service"] == "vllm_server") for procs in (before, after)]
    assert rss[1] < 1.5 * rss[0], f"model server RSS {rss[1]} KiB after the restart, {rss[0]} KiB before"


@pytest.fixture(scope="session")
def deployed() -> dict:
    """Deploy once for the whole session; undeploy at the end, whatever happened."""
    if os.geteuid() != 0:
        pytest.skip("the end-to-end deploy installs services and a system user: run as root")
    cold = make("deploy")
    assert cold.returncode == 0, "make deploy failed"
    assert "UI:" in cold.stdout and "API:" in cold.stdout and "smoke:" in cold.stdout
    node = json.loads(NODE_CONFIG.read_text())
    FIGURES["make deploy, first in this run (s)"] = round(cold.elapsed, 1)  # type: ignore[attr-defined]
    yield {"node": node, "cold_s": cold.elapsed, "cold_out": cold.stdout}  # type: ignore[attr-defined]
    down = make("undeploy")
    assert down.returncode == 0, "make undeploy failed"
