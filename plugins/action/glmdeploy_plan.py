"""Plan a node once: its profile (the GPU rule), Python, lock and wheelhouse (glmdeploy_control.plan).

Why an action plugin and not a module: the plan needs the registry on the control node and two
facts from the node (its Python version and PCI vendor ids). One read-only shell command
(`registry.PROBE`) brings both back in one round trip, with no module to copy; the plan is then
computed here, where the registry is. It only reads, so it runs the same under --check.
"""

from __future__ import annotations

import shlex
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

# The kit's control package: the tool environment (make tools) has it on its path.
from glmdeploy_control import plan, registry


class ActionModule(ActionBase):
    _supports_check_mode = True
    _requires_connection = True

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        for key in ("registry", "profile", "python"):
            if not args.get(key):
                raise AnsibleActionFail(f"glmdeploy_plan needs `{key}`")
        try:
            kit = registry.load(args["registry"])
        except (OSError, registry.RegistryError) as exc:
            raise AnsibleActionFail(f"the profile registry cannot be read: {exc}") from exc
        command = registry.PROBE.format(python=shlex.quote(str(args["python"])))
        probed = self._low_level_execute_command(command, executable="/bin/sh")
        if probed.get("rc", 1) != 0 and not probed.get("stdout"):
            raise AnsibleActionFail(f"could not read the node's Python and PCI devices: {probed.get('stderr', '')}")
        host = str(task_vars.get("inventory_hostname", "this node"))
        try:
            node = plan.plan(
                kit,
                host=host,
                profile=str(args["profile"]),
                python_path=str(args["python"]),
                probe=registry.parse_probe(probed.get("stdout", "")),
                runtime=str(args.get("runtime") or "venv"),
                require_gpu=boolean(args.get("require_gpu", True)),
            )
        except registry.RegistryError as exc:
            raise AnsibleActionFail(
                f"{exc} (glmdeploy_profile for {host}, or make ... PROFILE=). Nothing was changed."
            ) from exc
        result.update(changed=False, plan=node.to_dict())
        result["msg"] = (
            f"{node.profile} ({node.profile_source}), {node.runtime} runtime, Python {node.python}, "
            f"{node.lock_name or 'no lock'}"
        )
        return result
