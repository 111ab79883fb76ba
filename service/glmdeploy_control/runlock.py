"""One run at a time per inventory on this control node: a second `make deploy` waits or stops, naming the first.

Two runs against the same nodes interleave their switches of `current` and restart each other's
services; both can report success. The lock is an exclusive ``flock`` on a file named for the
inventory's real path, held by this process for the whole command: the kernel releases it when the
holder exits however it exits (Ctrl-C, kill -9, a crash), so a lock is never left stale. The file
also records who holds it (PID, start time, command) so the second run can name the first.

Usage: ``python -m glmdeploy_control.runlock --inventory INV [--wait SECONDS] -- COMMAND [ARG...]``
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import IO

from glmdeploy_control.wrapped import command_of, run_child, wrapper_parser

LOCK_DIR = Path(os.environ.get("GLMDEPLOY_LOCK_DIR", "/run/lock" if os.access("/run/lock", os.W_OK) else "/tmp"))


class Busy(Exception):
    """Another run holds the lock (its record in the message)."""


def lock_path(inventory: str) -> Path:
    key = hashlib.sha256(str(Path(inventory).resolve()).encode()).hexdigest()[:16]
    return LOCK_DIR / f"glmdeploy-{key}.lock"


def _holder(handle: IO[str]) -> str:
    handle.seek(0)
    try:
        record = json.loads(handle.read() or "{}")
    except ValueError:
        return "an unknown process"
    return (
        f"PID {record.get('pid', '?')}, started {record.get('started', '?')}: {record.get('command', '?')}"
        f" (inventory {record.get('inventory', '?')})"
    )


def acquire(inventory: str, command: list[str], wait_s: float) -> IO[str]:
    """The open, locked file (keep it open to hold the lock); Busy after wait_s seconds."""
    path = lock_path(inventory)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        handle = path.open("a+")
    except PermissionError as err:
        raise Busy(
            f"its lock file {path} belongs to another user ({err.strerror}); fix: run as that user, or remove the file"
        ) from err
    deadline = time.monotonic() + wait_s
    announced = False
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = _holder(handle)
            if time.monotonic() >= deadline:
                handle.close()
                raise Busy(holder) from None
            if not announced:
                print(f"==> waiting up to {wait_s:.0f} s for another run on this inventory: {holder}", flush=True)
                announced = True
            time.sleep(1)
    record = {
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(command),
        "inventory": str(Path(inventory).resolve()),
    }
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps(record))
    handle.flush()
    return handle


def main(argv: list[str] | None = None) -> int:
    parser = wrapper_parser(
        "python -m glmdeploy_control.runlock",
        "Run COMMAND holding this control node's lock for INVENTORY: one deploy, rollout or "
        "rollback per inventory at a time.",
    )
    parser.add_argument("--wait", type=float, default=0, help="seconds to wait for another run (default 0: stop)")
    args = parser.parse_args(argv)
    command = command_of(parser, args)
    try:
        handle = acquire(args.inventory, command, args.wait)
    except Busy as holder:
        print(
            f"ERROR: another run is using the inventory {args.inventory}: {holder}. "
            "fix: wait for it to finish (or make ... LOCK_WAIT=<seconds> to wait here), "
            "or stop it if it is stuck. Nothing was changed.",
            file=sys.stderr,
        )
        return 75  # EX_TEMPFAIL
    # The command holds the lock too (an inherited descriptor): if this process is killed, the
    # lock stays until the command itself ends.
    try:
        return run_child(command, pass_fds=(handle.fileno(),))
    finally:
        handle.close()


if __name__ == "__main__":
    sys.exit(main())
