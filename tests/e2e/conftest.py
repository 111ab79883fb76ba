"""End-to-end fixtures: a real `make deploy` on this machine, torn down with `make undeploy`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The part of the end-to-end tests this process runs: `node` (this machine's node, make e2e-node)
#: or `hosts` (the test hosts, make e2e-hosts). make test runs the two side by side, so each keeps
#: its own make logs, figures and durations, and its own REPORTS directory for what the make
#: targets it runs write there (smoke results, verify tables, releases).
PART = os.environ.get("GLMDEPLOY_E2E_PART", "all")
REPORTS = ROOT / os.environ.get("REPORTS", "reports")
#: Every make run's output, one directory per part (read by a test that looks for a leaked key).
E2E_LOGS = ROOT / "reports" / "e2e-logs"
NODE_CONFIG = Path("/etc/glmdeploy/node.json")
#: What `make undeploy` must keep on the control node: the staged model and the wheelhouse.
FIXTURE = ROOT / "artifacts" / "models" / "chatglm3-fixture"
WHEELHOUSE = ROOT / "artifacts" / "wheelhouse" / "cpu-py311"
#: Measured figures, printed at the end of the run and saved to reports/e2e-figures-<part>.json.
FIGURES: dict[str, object] = {}
#: Seconds per test, setup (where deploying fixtures run) + call + teardown: reports/e2e-durations-<part>.json,
#: read by tests/ci/phases.py for make test's per-phase table.
DURATIONS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    DURATIONS[report.nodeid] = round(DURATIONS.get(report.nodeid, 0.0) + report.duration, 1)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if DURATIONS:
        out = ROOT / "reports" / f"e2e-durations-{PART}.json"
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
    out = ROOT / "reports" / f"e2e-figures-{PART}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(FIGURES, indent=2) + "\n")


def make(
    *args: str, timeout: int = 1800, env: dict[str, str] | None = None, root: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """Run a make target from the checkout (`root`: another one, a second control node's), echoing its
    output so CI logs show progress (`env`: added variables)."""
    start = time.monotonic()
    cmd = ["make", "-C", str(root), *args]
    # Its own process group: a run that overstays is stopped whole (make, ansible, ssh), not
    # left changing hosts behind the next test; its log says how far it got.
    pipe = subprocess.PIPE
    # This session owns the test hosts it makes: hosts left by a session killed before its
    # teardown are removed by the next `make hosts` (tests/hosts/hostctl.py).
    full_env = {**os.environ, "GLMDEPLOY_HOSTS_OWNER": str(os.getpid()), **(env or {})}
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
    logs = E2E_LOGS / PART
    logs.mkdir(parents=True, exist_ok=True)
    number = len(list(logs.glob("*.log"))) + 1
    name = "-".join(a.split("=")[0].lower() for a in args)[:60]
    proc.log = logs / f"{number:03d}-{name}.log"  # type: ignore[attr-defined]
    proc.log.write_text(  # type: ignore[attr-defined]
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


# Every process of the service user in this PID namespace (the test hosts' processes show in this
# machine's /proc too, often with the same user ID), as JSON: pid, start time, command, RSS and the
# service run it belongs to (glmdeploy.serving.procguard marks each run's processes in their environment;
# the guard itself carries no mark). Run with python3 as root, on this machine or on a test host.
SERVICE_USER_PROCESSES = """
import json, os, pwd
uid = pwd.getpwnam("glmdeploy").pw_uid
mine = os.readlink("/proc/self/ns/pid")
procs = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if os.stat(f"/proc/{pid}").st_uid != uid or os.readlink(f"/proc/{pid}/ns/pid") != mine:
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


#: A PLAY RECAP row of a host that failed or could not be reached.
def recap(output: str) -> dict[str, dict[str, int]]:
    """Each test host's PLAY RECAP row of an ansible-playbook output: {host: {"ok": .., "changed": ..}}."""
    rows = {}
    for host, fields in re.findall(r"^(testhost\d+)\s*:\s*(ok=.*)$", output, re.M):
        rows[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", fields)}
    return rows


RECAP_FAILED = re.compile(r"^\S+\s*:\s*ok=\d+.*\b(?:failed|unreachable)=[1-9]")
#: The keys of a failed task's result that say why, and how many of their lines are shown.
WHY_KEYS, WHY_LINES = ("msg:", "stderr:"), 20


def deploy_failure_summary(proc: subprocess.CompletedProcess[str]) -> str:
    """Why a `make` run of Ansible failed, in a few lines: each failed task's name, its `fatal:` line
    and the msg and stderr of its result, Ansible's own errors, the PLAY RECAP rows of the hosts
    that failed, and where the full output is. A deploying fixture fails with this, once: the
    reason itself, not "make deploy failed" over an output tail the reason has scrolled out of."""
    lines = f"{proc.stdout}\n{proc.stderr}".splitlines()
    said, errors, recap = [], [], []
    task, i = "", 0
    while i < len(lines):
        line, i = lines[i].rstrip(), i + 1
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line.rstrip("* ")
        elif line.startswith(("fatal: [", "failed: [")):
            end = _result_end(lines, i)
            if lines[end : end + 1] != ["...ignoring"]:  # not one the play expected (ignore_errors)
                said += [task] * bool(task and task not in said) + [line, *_why(lines[i:end])]
            i = end
        elif line.startswith(("[ERROR]", "ERROR!")):  # told only when no task failed (a playbook not loaded)
            errors.append(line)
        elif RECAP_FAILED.match(line):
            recap.append(line)
    # Not Ansible's failure (the run lock, make itself): the end of what the run printed.
    tail = [line for line in lines if line.strip()][-15:]
    said = (said or errors) + recap if said or errors else tail
    return "\n".join([*said, f"full output: {getattr(proc, 'log', 'not saved')}"])


def _result_end(lines: list[str], start: int) -> int:
    """Where the task result printed below a `fatal:` line ends (Ansible's yaml result format
    indents it; a blank line can sit inside a multi-line message)."""
    end = start
    while end < len(lines) and (not lines[end].strip() or lines[end][:1].isspace()):
        end += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return end


def _why(result: list[str]) -> list[str]:
    """The msg and stderr of a printed task result: each key's line and the deeper-indented lines below it."""
    depth = min((len(line) - len(line.lstrip()) for line in result if line.strip()), default=0)
    kept, keeping = [], False
    for line in result:
        if line.strip() and len(line) - len(line.lstrip()) == depth:
            keeping = line.lstrip().startswith(WHY_KEYS)
        if keeping:
            kept.append(line.rstrip())
    return kept[:WHY_LINES]


def undeployed(api_url: str) -> None:
    """`make undeploy` removes the services and the node's files and keeps the control node's
    artifacts. Checked by the deploying fixture's teardown, not by a test: undeploying in a test
    takes the node from every test after it."""
    down = make("undeploy")
    assert down.returncode == 0, f"make undeploy failed:\n{deploy_failure_summary(down)}"
    assert not Path("/opt/glmdeploy").exists() and not Path("/etc/glmdeploy").exists()
    assert (FIXTURE / "SHA256SUMS").exists() and any(WHEELHOUSE.glob("*.whl"))
    with pytest.raises(OSError):
        urllib.request.urlopen(api_url + "/models", timeout=5)


@pytest.fixture(scope="module")
def deployed() -> dict:
    """Deploy once for the module's tests; undeploy at its end, whatever happened, and check what
    undeploy removed and kept. Module, not session: the node is gone before the fleet and role tests
    start, as when a test undeployed it, so they do not share the machine with its services."""
    if os.geteuid() != 0:
        pytest.skip("the end-to-end deploy installs services and a system user: run as root")
    cold = make("deploy")
    if cold.returncode != 0 or not all(word in cold.stdout for word in ("UI:", "API:", "smoke:")):
        # The whole run stops here, with this deploy's own reason, once: every test of the node
        # needs it, and the fleet and the role scenarios run the same roles (half an hour to fail
        # the same way). Raising instead would repeat one fixture error for each test.
        said = "failed" if cold.returncode else "printed no UI:, API: and smoke: lines"
        pytest.exit(f"make deploy (the first of this run) {said}:\n{deploy_failure_summary(cold)}", returncode=1)
    node = json.loads(NODE_CONFIG.read_text())
    FIGURES["make deploy, first in this run (s)"] = round(cold.elapsed, 1)  # type: ignore[attr-defined]
    release = Path("/opt/glmdeploy/current").resolve().name
    yield {"node": node, "release": release, "cold_s": cold.elapsed, "cold_out": cold.stdout}  # type: ignore[attr-defined]
    undeployed(node["api_url"])
