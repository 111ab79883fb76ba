"""The NVIDIA driver's state on a node, read from what its own tools print, and what is wrong with it.

Why: the failures that break GPU nodes between deploys are the driver's, and they show late. A
kernel update whose DKMS build of the module failed is found at the next reboot ("GPU gone"); a
driver package replaced under a loaded module makes NVML fail with "Driver/library version
mismatch" until a reboot; with Secure Boot on, a module not signed by an enrolled key does not
load at all. Each is knowable before it bites, from `dkms status`, the loaded module's version,
the installed libraries' version, `mokutil` and `modinfo`. This module turns those outputs into
findings, each naming the fix; the callers (preflight before a driver change, `make verify`)
gather the outputs. Standard library only, pure functions: the unit tests feed it recorded outputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: `dkms status` lines, dkms 2.8 and 3.x: "nvidia-current/535.261.03, 6.1.0-41-amd64, x86_64: installed"
#: (3.x) or "nvidia-current, 535.261.03, 6.1.0-41-amd64, x86_64: installed" (2.8).
_DKMS_LINE = re.compile(
    r"^(?P<module>[\w.+-]+)[/,]\s*(?P<version>[\w.+~-]+),\s*(?P<kernel>[\w.+~-]+),\s*(?P<arch>\w+):\s*(?P<state>[\w ]+)"
)
_NVRM = re.compile(r"Kernel Module(?: for \S+)?\s+(?P<version>\d+\.\d+(?:\.\d+)?)")
_VERSION = re.compile(r"^(?:\d+:)?(?P<version>\d+\.\d+(?:\.\d+)?)")


def secure_boot(sb_state: str) -> str:
    """`mokutil --sb-state` -> "on", "off", "no-efi" (legacy BIOS boot: nothing is enforced) or "unknown"."""
    text = sb_state.lower()
    if "secureboot enabled" in text:
        return "on"
    if "secureboot disabled" in text:
        return "off"
    if "not supported" in text or "efi variables are not" in text:
        return "no-efi"
    return "unknown"


def key_enrolled(test_key: str) -> bool | None:
    """`mokutil --test-key KEY.der` -> enrolled (True), not (False), or unknown (None). A key that is
    enrolled on the next boot only ("is already in the enrollment request") counts as not yet."""
    text = test_key.lower()
    if "is already enrolled" in text:
        return True
    if "is not enrolled" in text or "enrollment request" in text:
        return False
    return None


def module_signer(modinfo: str) -> str:
    """`modinfo nvidia` -> the signer's name, "" for an unsigned module."""
    for line in modinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "signer":
            return value.strip()
    return ""


def dkms_kernels(dkms_status: str, module_prefix: str = "nvidia") -> dict[str, str]:
    """kernel -> state ("installed", "built", ...) of the driver's DKMS module, from `dkms status`."""
    found = {}
    for line in dkms_status.splitlines():
        match = _DKMS_LINE.match(line.strip())
        if match and match["module"].startswith(module_prefix):
            found[match["kernel"]] = match["state"].split()[0]
    return found


def loaded_version(proc_version: str) -> str:
    """/proc/driver/nvidia/version -> the loaded module's version ("" when none is loaded)."""
    match = _NVRM.search(proc_version)
    return match["version"] if match else ""


def package_version(dpkg_version: str) -> str:
    """A driver package's Debian version ("535.261.03-1", "1:535.261.03-2~deb12u1") -> "535.261.03"."""
    match = _VERSION.match(dpkg_version.strip())
    return match["version"] if match else ""


@dataclass
class DriverState:
    """What a node's tools printed (each "" when not read)."""

    next_kernel: str = ""
    dkms_status: str = ""
    proc_version: str = ""
    library_package_version: str = ""
    sb_state: str = ""
    key_test: str = ""
    modinfo: str = ""
    #: Where the lab's module signing key lives on the control node (named in the fix).
    key_path: str = "artifacts/secrets/mok"
    notes: list[str] = field(default_factory=list)


def findings(state: DriverState) -> list[str]:
    """Each problem, with its fix; empty when the driver will load and match after the next boot."""
    found = []
    kernels = dkms_kernels(state.dkms_status)
    if state.next_kernel and kernels.get(state.next_kernel) != "installed":
        have = ", ".join(f"{k} ({v})" for k, v in sorted(kernels.items())) or "none"
        found.append(
            f"the kernel the node boots next, {state.next_kernel}, has no installed NVIDIA module (DKMS has: {have}); "
            "after a reboot the GPU would be gone. fix: install that kernel's headers from the kit's repository and "
            "rebuild (make driver), or keep the node on its running kernel, before any reboot"
        )
    loaded = loaded_version(state.proc_version)
    libraries = package_version(state.library_package_version)
    if loaded and libraries and loaded != libraries:
        found.append(
            f"the loaded NVIDIA module is {loaded} and the driver libraries are {libraries}: NVML answers "
            "'Driver/library version mismatch'. fix: drain the node (make drain HOST=...) and reboot it, or install "
            f"the libraries of {loaded} back from the kit's repository"
        )
    sb = secure_boot(state.sb_state)
    if sb == "on":
        signer = module_signer(state.modinfo)
        enrolled = key_enrolled(state.key_test)
        if not signer:
            found.append(
                "Secure Boot is on and the NVIDIA module is not signed: it will not load. fix: sign the DKMS "
                f"modules with the lab's machine owner key ({state.key_path}) and enroll it, or turn Secure Boot off "
                "in the firmware"
            )
        elif enrolled is not True:
            found.append(
                f"Secure Boot is on and the module's signing key ({signer}) is "
                f"{'not enrolled' if enrolled is False else 'not known to be enrolled'}: it will not load. fix: "
                "mokutil --import the key, then confirm its enrollment at the console on the next boot (MOK manager: "
                "Enroll MOK, the one-time password)"
            )
    elif sb == "unknown" and state.sb_state:
        found.append(f"Secure Boot's state could not be read ({state.sb_state.strip()[:80]}). fix: install mokutil")
    return found
