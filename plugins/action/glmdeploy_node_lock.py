"""One kit run per node at a time: take the node's deploy lock, wait for it, or name who holds it.

The control node's lock (``glmdeploy_control.runlock``) keeps two runs of one inventory apart; two
control nodes, or two inventories naming the same server, would still switch ``current`` under
each other. This lock lives on the node (module ``glmdeploy_node_lock``) and names its holder:
the control node, the PID and start time of its ``ansible-playbook`` process, and its command.

A run that dies (Ctrl-C, kill -9, a crash) cannot release it. The holder's record says which
process held it, so a run from the same control node sees that the process is gone (the PID no
longer exists, or belongs to a newer process, or the machine restarted) and takes the lock over
with a warning. A holder on another control node cannot be checked from here: the run stops,
naming it, and ``glmdeploy_node_lock_takeover=<its id>`` takes it over on purpose.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()
POLL_S = 2.0


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (None: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def this_run() -> dict[str, Any]:
    """The record of this run: the ansible-playbook process, which forked the worker running this plugin."""
    pid = os.getppid()
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = "ansible-playbook"
    return record(pid, socket.gethostname(), command, time.strftime("%Y-%m-%d %H:%M:%S %Z"))


def record(pid: int, host: str, command: str, since: str) -> dict[str, Any]:
    """A holder's record: the process (PID and start time, this boot) on a control node, and its command."""
    boot, ticks = _boot_id(), _start_ticks(pid)
    return {
        "id": f"{host}:{boot[:8]}:{pid}:{ticks}",
        "control_host": host,
        "boot_id": boot,
        "pid": pid,
        "start_ticks": ticks,
        "since": since,
        "command": command,
    }


def is_gone(holder: dict[str, Any], me: dict[str, Any]) -> bool:
    """True when the holder ran on this control node and its process no longer exists."""
    if holder.get("control_host") != me["control_host"]:
        return False
    if holder.get("boot_id") != me["boot_id"]:
        return True
    return _start_ticks(int(holder.get("pid") or 0)) != holder.get("start_ticks")


def describe(holder: dict[str, Any]) -> str:
    return (
        f"PID {holder.get('pid', '?')} on control node {holder.get('control_host', '?')}, "
        f"since {holder.get('since', '?')}: {holder.get('command', '?')}"
    )


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = self._task.args
        me = this_run()
        module_args = {"path": args["path"], "owner": me, "state": args.get("state", "acquired")}
        if module_args["state"] == "released":
            result.update(self._execute_module("glmdeploy_node_lock", module_args=module_args, task_vars=task_vars))
            return result
        host = (task_vars or {}).get("inventory_hostname", "this node")
        deadline = time.monotonic() + float(args.get("wait") or 0)
        takeover, announced = str(args.get("takeover") or ""), False
        while True:
            reply = self._execute_module(
                "glmdeploy_node_lock", module_args={**module_args, "takeover": takeover}, task_vars=task_vars
            )
            if reply.get("failed") or reply.get("held"):
                result.update(reply)
                return result
            holder = reply.get("holder") or {}
            if is_gone(holder, me):
                display.warning(f"{host}: taking over the deploy lock of a run that is gone: {describe(holder)}")
                takeover = str(holder.get("id"))
                continue
            if time.monotonic() >= deadline:
                raise AnsibleActionFail(self._busy(host, args["path"], holder, me))
            if not announced:
                display.display(f"{host}: waiting for another run's deploy lock: {describe(holder)}")
                announced = True
            time.sleep(POLL_S)

    @staticmethod
    def _busy(host: str, path: str, holder: dict[str, Any], me: dict[str, Any]) -> str:
        message = (
            f"{host}: another run holds this node's deploy lock ({path}): {describe(holder)}. "
            "fix: wait for it to finish (or make ... LOCK_WAIT=<seconds> to wait here), or stop it if it is stuck."
        )
        if holder.get("control_host") != me["control_host"]:
            message += (
                " It ran from another control node, whose processes this one cannot see: if that run is gone,"
                f" take its lock over with -e glmdeploy_node_lock_takeover={holder.get('id')}."
            )
        return message + " Nothing was changed."
