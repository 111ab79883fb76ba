#!/usr/bin/python
"""Take, take over or release the node's deploy lock: a small JSON file naming the run that holds it.

Runs on the node. The file is created with O_EXCL (one creator wins), so two control nodes
deploying to one node cannot both hold it. Taking over (a holder found stale by the action plugin
of the same name, which runs on the control node) and releasing compare the holder's id first,
under an flock on a guard file, so a run never removes a lock another run took meanwhile.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glmdeploy_node_lock
short_description: The node's deploy lock (one kit run per node at a time)
description:
  - Holds a JSON record (id, control node, PID, start time, command) in O(path).
  - Use it through the action plugin of the same name, which names the holder, waits and
    recognises stale locks; this module only reads and writes the node's file.
options:
  path: {description: the lock file, type: path, required: true}
  state: {description: acquired or released, type: str, choices: [acquired, released], default: acquired}
  owner: {description: this run's record; its C(id) identifies the run, type: dict, required: true}
  takeover: {description: id of a stale holder to replace (nothing else is replaced), type: str, default: ""}
"""

RETURN = r"""
held: {description: this run holds the lock after the call (in check mode, would hold it), type: bool}
holder: {description: the record of the run holding it when another run does, type: dict}
"""


def read(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except FileNotFoundError:
        return None
    except ValueError:
        # A record cut short (a disk full, a crash between create and write): nobody can be named.
        return {"id": "unreadable", "control_host": "?", "pid": 0, "command": "an unreadable lock file"}
    return record if isinstance(record, dict) else {"id": "unreadable"}


@contextmanager
def guarded(path: str) -> Iterator[None]:
    """Serialise read-compare-write between runs on this node (the guard file is never removed)."""
    with open(path + ".guard", "a", encoding="utf-8") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        yield


def create(path: str, owner: dict) -> bool:
    """True when this call created the lock; False when a holder exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(owner, handle)
        handle.flush()
        os.fsync(handle.fileno())
    return True


def acquire(path: str, owner: dict, takeover: str, check: bool) -> dict:
    holder = read(path)
    if holder is not None and holder.get("id") == owner["id"]:
        return {"held": True}
    if holder is not None and not (takeover and holder.get("id") == takeover):
        return {"held": False, "holder": holder}
    if check:
        return {"held": True}
    if holder is not None:
        os.unlink(path)
    if not create(path, owner):
        return {"held": False, "holder": read(path) or {}}
    return {"held": True}


def release(path: str, owner: dict, check: bool) -> dict:
    holder = read(path)
    if holder is None or holder.get("id") != owner["id"]:
        return {"held": False}
    if not check:
        os.unlink(path)
    return {"held": False}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["acquired", "released"], "default": "acquired"},
            "owner": {"type": "dict", "required": True},
            "takeover": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    path, owner = module.params["path"], module.params["owner"]
    if not owner.get("id"):
        module.fail_json(msg="owner.id is required")
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        # No lock can exist yet (a fresh node), or none is left (undeploy removed the directory).
        if module.params["state"] == "released" or module.check_mode:
            module.exit_json(changed=False, held=module.params["state"] == "acquired")
        os.makedirs(parent, mode=0o755)
    with guarded(path):
        if module.params["state"] == "acquired":
            result = acquire(path, owner, module.params["takeover"], module.check_mode)
        else:
            result = release(path, owner, module.check_mode)
    # Holding the lock is not a change to the deployment: a re-run still reports changed=0.
    result["changed"] = False
    module.exit_json(**result)


if __name__ == "__main__":
    main()
