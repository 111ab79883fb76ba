#!/usr/bin/python
"""The node's releases through Ansible: status, switch, mark and prune, with check mode and diff.

The logic is ``module_utils/glmdeploy_release.py`` (stdlib only, unit-tested), which Ansible ships
with this module and runs under the node's system Python: a rollback works even when a release's
environment is broken. This module only maps Ansible's parameters, check mode and diff onto it,
so ``changed`` is what the node's links and marks really did (or would do).
"""

from __future__ import annotations

from pathlib import Path

from ansible.module_utils import glmdeploy_release as release
from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glmdeploy_release
short_description: Switch, mark, prune or read the node's releases (current/previous links)
options:
  root: {description: the kit root on the node, type: path, required: true}
  action: {description: what to do, type: str, required: true, choices: [status, switch, mark, prune]}
  to: {description: switch - the release id, or C(previous), type: str}
  previous: {description: switch - what C(previous) names afterwards (C(none) for nothing), type: str}
  id: {description: mark - the release id, type: str}
  state: {description: mark - the outcome, type: str, choices: [promoted, failed]}
  keep: {description: prune - the newest promoted releases kept besides current and previous, type: int, default: 2}
"""

RETURN = r"""
current: {description: the release `current` names after the call (status, switch), type: str}
previous: {description: the release `previous` names after the call (status, switch), type: str}
releases: {description: status - every release kept, oldest first, with its state, type: list}
removed: {description: prune - what was (or would be) removed, type: list}
"""


def _links(current: str | None, previous: str | None) -> str:
    return f"current -> {current or '(none)'}\nprevious -> {previous or '(none)'}\n"


def run(module: AnsibleModule) -> dict:
    p, root, dry = module.params, Path(module.params["root"]), module.check_mode
    action = p["action"]
    if action == "status":
        return {"changed": False, **release.status(root)}
    if action == "switch":
        out = release.switch(root, p["to"], p["previous"], dry_run=dry)
        before = _links(out["from"], out["previous_before"])
        after = _links(out["to"], out["previous"])
        return {
            "changed": out["changed"],
            "current": out["to"],
            "previous": out["previous"],
            "diff": {"before_header": f"{root}", "after_header": f"{root}", "before": before, "after": after},
        }
    if action == "mark":
        changed = release.mark(root, p["id"], p["state"], dry_run=dry)
        return {
            "changed": changed,
            "diff": {"before": "", "after": f"releases/{p['id']}/{p['state']}\n" if changed else ""},
        }
    removed = release.prune(root, p["keep"], dry_run=dry)
    return {
        "changed": bool(removed),
        "removed": removed,
        "diff": {"before": "".join(f"{r}\n" for r in removed), "after": ""},
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "action": {"type": "str", "required": True, "choices": ["status", "switch", "mark", "prune"]},
            "to": {"type": "str"},
            "previous": {"type": "str"},
            "id": {"type": "str"},
            "state": {"type": "str", "choices": ["promoted", "failed"]},
            "keep": {"type": "int", "default": 2},
        },
        required_if=[("action", "switch", ["to"]), ("action", "mark", ["id", "state"])],
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except release.ReleaseError as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()
