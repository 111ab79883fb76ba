"""What the control node's wrappers share: `make deploy` runs ansible-playbook inside the run lock
(glmdeploy_control.runlock) and the artifact server (glmdeploy_control.artifact_server), each of which runs the
rest of its command line as a child and ends with the child's status."""

from __future__ import annotations

import argparse
import signal
import subprocess
from collections.abc import Sequence


def wrapper_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser taking --inventory and the command after `--` (add the wrapper's own options)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--inventory", required=True, help="the Ansible inventory of the run")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    return parser


def command_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The command after `--` (a usage error without one)."""
    command: list[str] = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command is required after --")
    return command


def run_child(command: Sequence[str], env: dict[str, str] | None = None, pass_fds: Sequence[int] = ()) -> int:
    """Run the command to its end; its exit status (killed by signal N: 128 + N, as a shell says).

    Ctrl-C reaches the command from the terminal itself (one process group); this process then
    sends it SIGTERM as well. Why: ansible-core 2.19 can carry on after Ctrl-C's SIGINT (the task
    running stops, the play goes on: ansible/ansible#86078; seen here as an interrupted deploy
    that went on to promote its release), while on SIGTERM it passes the signal to its workers
    and exits. A SIGTERM sent to this process alone is passed on."""
    child = subprocess.Popen(list(command), env=env, pass_fds=tuple(pass_fds))
    signal.signal(signal.SIGINT, lambda _signum, _frame: child.send_signal(signal.SIGTERM))
    signal.signal(signal.SIGTERM, lambda signum, _frame: child.send_signal(signum))
    code = child.wait()
    return 128 - code if code < 0 else code
