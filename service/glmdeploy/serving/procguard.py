"""Run a service's command so that nothing it starts outlives it.

Why this exists: where systemd is not PID 1 the kit's services run under supervisord, which
signals a program's process group only when supervisord itself stops the program. When the
server dies on its own (kill -9, the OOM killer, a crash), vLLM's engine and worker processes
stay behind, reparented to PID 1: they keep their memory (on a GPU node the card's memory, so
the restarted server cannot allocate and crash-loops) and the service user (``userdel`` fails).
systemd's per-unit cgroup does this cleanup; without systemd the cgroup tree is not ours to
write, so the guard does it in user space, with what the kernel offers any process:

- every process of a run carries ``GLMDEPLOY_SERVICE=<name>`` and ``GLMDEPLOY_SERVICE_RUN=<id>``
  in its environment: inherited by every descendant, read back from ``/proc/<pid>/environ``;
- the guard is its descendants' subreaper (``PR_SET_CHILD_SUBREAPER``): processes orphaned
  inside the run are reparented to the guard, not to PID 1, and it reaps them;
- the server gets ``PR_SET_PDEATHSIG`` SIGKILL: if the guard itself is killed, the server dies;
- when the server exits, for whatever reason, every remaining process of the run gets SIGTERM,
  then SIGKILL after a grace period, and the guard exits with the server's status;
- before it starts the server, processes left by an earlier run of the same service (killed
  with its guard: nothing could clean up then) are stopped the same way and named in the log.

Only processes in the guard's own PID namespace are the guard's: a machine that also runs
containers (the kit's test hosts; a node that hosts other systemd containers) shows their
processes in its ``/proc`` too, with the same marks and often the same user ID, and they are
another node's services.

A shell wrapper cannot set the subreaper or death-signal flags, hence a small Python program.
It reads ``/proc`` itself rather than through ``psutil`` (in every node lock as vLLM's dependency:
6.0.0 on gpu-cu121, 7.2.2 on cpu): neither release exposes a process's PID namespace, which the
guard compares first, nor ``prctl``, which it sets; what psutil would replace is three short file
reads (environment, command line, state) and the children lists.

Usage: ``python -m glmdeploy.serving.procguard NAME -- COMMAND [ARG...]``
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

SERVICE_VAR = "GLMDEPLOY_SERVICE"
RUN_VAR = "GLMDEPLOY_SERVICE_RUN"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: Seconds the processes of a run get between SIGTERM and SIGKILL.
GRACE_S = 10.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def log(message: str) -> None:
    print(f"glmdeploy procguard: {message}", file=sys.stderr, flush=True)


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or another user's process
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160] or "?"


def _pid_namespace(pid: int | str) -> str:
    """The process's PID namespace (``pid:[inode]``); empty when it cannot be read (gone, or not ours)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def processes(service: str, run: str | None = None, exclude_run: str | None = None) -> Iterator[int]:
    """PIDs of the service's processes in this PID namespace: of one run, or of every run but one."""
    me, mine = os.getpid(), _pid_namespace("self")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        if _pid_namespace(entry.name) != mine:
            continue
        env = _environ(int(entry.name))
        if env.get(SERVICE_VAR) != service or RUN_VAR not in env:
            continue
        if (run is None or env[RUN_VAR] == run) and (exclude_run is None or env[RUN_VAR] != exclude_run):
            yield int(entry.name)


def _reap() -> None:
    """Collect every exited child (orphans of the run become the guard's children)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def descendants(pid: int) -> list[int]:
    """Every live process below pid (/proc/<pid>/task/*/children, recursively)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found.extend(children)
                todo.extend(children)
    return [p for p in dict.fromkeys(found) if _alive(p)]


def _alive(pid: int) -> bool:
    return _state(pid) not in ("Z", "gone")


def _selected(service: str, run: str | None, exclude_run: str | None, below: int | None) -> list[int]:
    pids = list(processes(service, run, exclude_run))
    if below is not None:
        pids += [p for p in descendants(below) if p not in pids]
    return pids


def stop(
    service: str,
    run: str | None = None,
    exclude_run: str | None = None,
    grace_s: float = GRACE_S,
    below: int | None = None,
) -> list[int]:
    """SIGTERM the selected processes (by mark, and every process below `below`), SIGKILL what is
    left after grace_s; return who was found. A process that outlives SIGKILL (stuck in the
    kernel, as on a wedged GPU driver) is named after another grace_s, not waited for forever."""
    found = _selected(service, run, exclude_run, below)
    if not found:
        return []
    _signal_all(found, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap()
        if not _selected(service, run, exclude_run, below):
            return found
        time.sleep(0.1)
    _signal_all(_selected(service, run, exclude_run, below), signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while (left := _selected(service, run, exclude_run, below)) and time.monotonic() < deadline:
        _reap()
        time.sleep(0.05)
    if left:
        states = {p: _state(p) for p in left}
        log(f"processes of {service} still there after SIGKILL (pid: state): {states}")
    return found


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def stop_leftovers(service: str, run: str) -> None:
    """Processes of an earlier run of this service (named in the log), stopped before the new one starts."""
    leftovers = {pid: _command(pid) for pid in processes(service, exclude_run=run)}
    if not leftovers:
        return
    for pid, command in leftovers.items():
        log(f"stopping pid {pid} left by an earlier run of {service}: {command}")
    stop(service, exclude_run=run)


def _start(argv: list[str], env: dict[str, str]) -> int:
    guard = os.getpid()
    pid = os.fork()
    if pid == 0:  # the server: dies with the guard, whatever kills the guard
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != guard:  # the guard died before the flag was set
                os._exit(1)
            os.execvpe(argv[0], argv, env)
        except OSError as err:
            log(f"cannot start {argv[0]}: {err}")
        finally:
            os._exit(127)
    return pid


def _exit_code(status: int) -> int:
    """The server's exit status; a server killed by signal N gives -N (the guard then dies of it too)."""
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)


def exit_like(code: int) -> int:
    """Exit as the server did: killed by a signal, the guard re-raises it, so systemd and
    supervisord see the same end (a SIGTERM on stop is a clean stop, not exit status 143)."""
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # not reached for signals that end a process
    return code


def run(service: str, argv: list[str]) -> int:
    """Start argv as the service, wait for it, then stop everything it left; its exit status."""
    run_id = f"{os.getpid()}-{time.time_ns()}"
    # SPT_NOENV: vLLM names its processes with setproctitle, which otherwise overwrites the start
    # of /proc/<pid>/environ, marks included.
    env = dict(os.environ, **{SERVICE_VAR: service, RUN_VAR: run_id, "SPT_NOENV": "1"})
    stop_leftovers(service, run_id)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    child = _start(argv, env)
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: _signal_all([child], signum))
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            break
    for sig in FORWARDED:  # the child's pid may be reused from here on
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
    code = _exit_code(status)
    # Marked processes, and any process still below the guard (orphans reparent to it as their
    # subreaper, whatever their environment says).
    left = stop(service, run=run_id, below=os.getpid())
    if left:
        how = f"exit status {code}" if code >= 0 else f"signal {-code}"
        log(f"{service} ended ({how}); stopped {len(left)} process(es) it left behind: {left}")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glmdeploy.serving.procguard",
        description="Run a service's command; when it exits, stop every process it started. "
        "Processes left by an earlier run of the same service are stopped first.",
    )
    parser.add_argument("service", help="the service's name (vllm_server, chat_ui)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command is required after --")
    return exit_like(run(args.service, command))


if __name__ == "__main__":
    sys.exit(main())
