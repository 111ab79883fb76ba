#!/usr/bin/python
"""Read the NVIDIA driver's state on a node and say what will break: the next boot's module, a
module/library mismatch, Secure Boot.

Runs on the node, reads only (check mode changes nothing either). The outputs of the node's own
tools (`linux-version`, `dkms status`, /proc/driver/nvidia/version, `dpkg-query`, `mokutil`,
`modinfo`) go to module_utils/glmdeploy_driver_state, whose findings each name their fix; the unit
tests feed that code recorded outputs. Callers: `make verify` (a row of the fleet table), the driver
role before it installs and before it reboots (a node never reboots into a module that cannot load).

How the next boot's kernel and Secure Boot are read: module_utils/glmdeploy_driver_state.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glmdeploy_driver_state import findings, read_state, secure_boot, summary

DOCUMENTATION = r"""
module: glmdeploy_driver_state
short_description: Read the NVIDIA driver's state on a node and name what will break, with the fix
options:
  library_package:
    description: the package whose version is the driver libraries' (libnvidia-ml1 on Debian)
    type: str
    default: ""
  key_der:
    description: the lab's module signing certificate on the node (DER), for mokutil --test-key
    type: str
    default: ""
  key_path:
    description: where the lab keeps that key on the control node (named in fixes)
    type: str
    default: artifacts/secrets/mok
"""

RETURN = r"""
present: {description: whether the node has an NVIDIA driver (module built, loaded or packaged), type: bool}
summary: {description: one line, equal on identical nodes (make verify's driver_state row), type: str}
findings: {description: one sentence per problem, each with its fix (empty when none), type: list}
secure_boot: {description: on, off, no-efi or unknown, type: str}
next_kernel: {description: the kernel the node boots next, type: str}
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "library_package": {"type": "str", "default": ""},
            "key_der": {"type": "str", "default": ""},
            "key_path": {"type": "str", "default": "artifacts/secrets/mok"},
        },
        supports_check_mode=True,
    )
    params = module.params
    state, present = read_state(params["library_package"], params["key_der"], params["key_path"])
    module.exit_json(
        changed=False,
        present=present,
        summary=summary(state, present),
        findings=findings(state) if present else [],
        secure_boot=secure_boot(state.sb_state),
        next_kernel=state.next_kernel,
    )


if __name__ == "__main__":
    main()
