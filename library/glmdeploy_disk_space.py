#!/usr/bin/python
"""Refuse a deploy, before anything changes, when the node's disk cannot hold what it will place.

Runs on the node, reads only. Each need is a directory the deploy would create (an environment,
a model) and its size; a need whose ``present`` file exists is already placed and costs nothing.
Needs on one filesystem add up (statvfs of the nearest existing parent; ``st_dev`` groups them),
plus a headroom for the release, logs and caches. Running out halfway through a 3 GB environment
or a 12 GB model would leave a half-written directory beside the release that serves.
"""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glmdeploy_disk_space
short_description: Check that the node's filesystems can hold what a deploy will place
options:
  needs:
    description: list of {path, present, bytes, what}; a need whose C(present) path exists is already placed
    type: list
    elements: dict
    required: true
  headroom_bytes: {description: free space to keep on each filesystem written to, type: int, default: 0}
"""

RETURN = r"""
filesystems: {description: per filesystem (its nearest existing path), free and needed bytes, type: list}
problems: {description: one sentence per filesystem without room (empty when all fit), type: list}
"""

GIB = 1024**3


def existing_parent(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    return path


def shortfalls(needs: list[dict], headroom: int) -> tuple[list[dict], list[str]]:
    """Each filesystem's free and needed bytes, and a sentence for each that lacks room."""
    by_dev: dict[int, dict] = {}
    for need in needs:
        if need.get("present") and os.path.exists(need["present"]):
            continue
        where = existing_parent(need["path"])
        fs = by_dev.setdefault(os.stat(where).st_dev, {"path": where, "needed": headroom, "what": []})
        fs["needed"] += int(need["bytes"])
        fs["what"].append(f"{need['what']} ({int(need['bytes']) / GIB:.1f} GiB)")
    problems = []
    for fs in by_dev.values():
        stat = os.statvfs(fs["path"])
        fs["free"] = stat.f_bavail * stat.f_frsize
        if fs["free"] < fs["needed"]:
            problems.append(
                f"{fs['path']}: {fs['free'] / GIB:.1f} GiB free, {fs['needed'] / GIB:.1f} GiB needed for "
                f"{', '.join(fs['what'])} and {headroom / GIB:.1f} GiB headroom"
            )
    return list(by_dev.values()), problems


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "needs": {"type": "list", "elements": "dict", "required": True},
            "headroom_bytes": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    filesystems, problems = shortfalls(module.params["needs"], module.params["headroom_bytes"])
    # The caller (roles/preflight) states the refusal with the setting and the fix.
    module.exit_json(changed=False, filesystems=filesystems, problems=problems)


if __name__ == "__main__":
    main()
