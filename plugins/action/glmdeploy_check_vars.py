"""Refuse a setting that no role of the kit declares: Ansible would ignore it silently.

A mistyped name (``vllm_server_gpu_memory_utilisation=0.8``) in the inventory, host_vars,
group_vars or ``-e`` is otherwise just an unused variable: the deploy is green and the user
believes the setting applied. Every variable visible to the task whose name starts with a kit
role's prefix (``<role>_``) must be declared by some role: an option in a
``meta/argument_specs.yml`` or a key of a ``defaults/main.yml``. The facts the kit sets for itself
before this check are passed in ``internal``. Runs on the control node; changes nothing.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from ansible.plugins.action import ActionBase


def declared_names(roles_dir: Path) -> set[str]:
    names: set[str] = set()
    for spec in roles_dir.glob("*/meta/argument_specs.yml"):
        data = yaml.safe_load(spec.read_text()) or {}
        for entry in (data.get("argument_specs") or {}).values():
            names.update((entry or {}).get("options") or {})
    for defaults in roles_dir.glob("*/defaults/main.yml"):
        names.update(yaml.safe_load(defaults.read_text()) or {})
    return names


def unknown_settings(names: list[str], prefixes: tuple[str, ...], declared: set[str]) -> dict[str, str | None]:
    """Each undeclared kit-prefixed name, with the closest declared name (or None)."""
    unknown = sorted(n for n in names if n.startswith(prefixes) and n not in declared)
    return {n: _closest(n, prefixes, declared) for n in unknown}


def _closest(name: str, prefixes: tuple[str, ...], declared: set[str]) -> str | None:
    """The declared name of the same role whose rest is closest (or the closest of all, for a mistyped prefix)."""
    prefix = max((p for p in prefixes if name.startswith(p)), key=len)
    same_role = {d[len(prefix) :]: d for d in declared if d.startswith(prefix)}
    match = difflib.get_close_matches(name[len(prefix) :], list(same_role), n=1, cutoff=0.7)
    if match:
        return same_role[match[0]]
    anywhere = difflib.get_close_matches(name, sorted(declared), n=1, cutoff=0.85)
    return anywhere[0] if anywhere else None


class ActionModule(ActionBase):
    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        roles_dir = Path(self._task.args["roles_dir"])
        internal = set(self._task.args.get("internal", []))
        prefixes = tuple(f"{d.name}_" for d in sorted(roles_dir.iterdir()) if d.is_dir())
        unknown = unknown_settings(list(task_vars), prefixes, declared_names(roles_dir) | internal)
        result["changed"] = False
        if not unknown:
            result["msg"] = "every kit setting is declared"
            return result
        lines = [
            f"{name}" + (f" (did you mean {hint}?)" if hint else " (no declared setting is close)")
            for name, hint in unknown.items()
        ]
        result["failed"] = True
        result["unknown"] = unknown
        result["msg"] = (
            f"unknown setting(s) for {task_vars.get('inventory_hostname', 'this host')}: {'; '.join(lines)}. "
            "No role of the kit declares them, so Ansible would ignore them. fix: correct the name in the "
            "inventory (host_vars, group_vars) or -e; each role's settings are in "
            "roles/<role>/meta/argument_specs.yml. Nothing was changed."
        )
        return result
