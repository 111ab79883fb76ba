#!/usr/bin/python
"""Read the NVIDIA driver's state on a node and say what will break: the next boot's module, a
module/library mismatch, Secure Boot.

Runs on the node, reads only (check mode changes nothing either). The outputs of the node's own
tools (`linux-version`, `dkms status`, /proc/driver/nvidia/version, `dpkg-query`, `mokutil`,
`modinfo`) go to module_utils/glmdeploy_driver_state, whose findings each name their fix; the unit
tests feed that code recorded outputs. Callers: `make verify` (a row of the fleet table), the driver
role before it installs and before it reboots (a node never reboots into a module that cannot load).

The next boot's kernel is the newest installed one in Debian's version order (`linux-version
sort`, from linux-base): what GRUB boots by default on Debian and Ubuntu. A node pinned to another
entry (GRUB_DEFAULT=saved) is not read; the docstring says so rather than guessing.
Secure Boot: `mokutil --sb-state` where mokutil is installed, else the firmware's own SecureBoot
variable under /sys/firmware/efi/efivars (its last byte: 1 on, 0 off), so that a node without
mokutil is still read.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glmdeploy_driver_state import (
    DriverState,
    dkms_kernels,
    findings,
    loaded_version,
    package_version,
    secure_boot,
)

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

SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def out(*argv: str) -> str:
    """A tool's standard output, "" when the tool is missing or fails (each is optional on a node)."""
    if shutil.which(argv[0]) is None:
        return ""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.stdout if proc.returncode == 0 else proc.stdout + proc.stderr


def next_kernel() -> str:
    """The newest installed kernel (Debian's default boot entry); the running one without linux-base."""
    listed = out("linux-version", "list").split()
    if not listed:
        return platform.release()
    proc = subprocess.run(
        ["linux-version", "sort", "--reverse"], input="\n".join(listed), capture_output=True, text=True, check=False
    )
    return (proc.stdout.split() or [platform.release()])[0]


def sb_state() -> str:
    """mokutil's words, or the same words from the firmware variable where mokutil is missing."""
    if shutil.which("mokutil"):
        return out("mokutil", "--sb-state")
    if not os.path.isdir("/sys/firmware/efi"):
        return "EFI variables are not supported on this system"
    try:
        with open(SECURE_BOOT_VAR, "rb") as var:
            value = var.read()[-1:]
    except OSError:
        return ""
    return "SecureBoot enabled" if value == b"\x01" else "SecureBoot disabled"


def read_state(params: dict) -> tuple[DriverState, bool]:
    proc_path = "/proc/driver/nvidia/version"
    proc_version = ""
    if os.path.exists(proc_path):
        with open(proc_path) as proc:
            proc_version = proc.read()
    dkms = out("dkms", "status")
    library = (
        out("dpkg-query", "-W", "-f", "${Version}", params["library_package"]) if params["library_package"] else ""
    )
    present = bool(dkms_kernels(dkms) or loaded_version(proc_version) or package_version(library))
    state = DriverState(
        next_kernel=next_kernel() if dkms_kernels(dkms) else "",
        dkms_status=dkms,
        proc_version=proc_version,
        library_package_version=library,
        sb_state=sb_state(),
        key_test=out("mokutil", "--test-key", params["key_der"]) if params["key_der"] else "",
        modinfo=out("modinfo", "-F", "signer", "nvidia") if present else "",
        key_path=params["key_path"],
    )
    return state, present


def summary(state: DriverState, present: bool) -> str:
    """What identical nodes share: the module for the next boot, the loaded and library versions, Secure Boot."""
    sb = secure_boot(state.sb_state)
    if not present:
        return f"no NVIDIA driver; Secure Boot {sb}"
    built = dkms_kernels(state.dkms_status)
    boot = (
        f"next boot {state.next_kernel} module {built.get(state.next_kernel, 'none')}" if built else "no module built"
    )
    loaded = loaded_version(state.proc_version) or "none"
    libraries = package_version(state.library_package_version) or "none"
    return f"loaded {loaded}, libraries {libraries}, {boot}; Secure Boot {sb}"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "library_package": {"type": "str", "default": ""},
            "key_der": {"type": "str", "default": ""},
            "key_path": {"type": "str", "default": "artifacts/secrets/mok"},
        },
        supports_check_mode=True,
    )
    state, present = read_state(module.params)
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
