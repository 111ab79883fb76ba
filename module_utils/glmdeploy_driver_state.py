"""The NVIDIA driver's state on a node, read from what its own tools print, and what is wrong with it.

Why: the failures that break GPU nodes between deploys are the driver's, and they show late. A
kernel update whose DKMS build of the module failed is found at the next reboot ("GPU gone"); a
driver package replaced under a loaded module makes NVML fail with "Driver/library version
mismatch" until a reboot; with Secure Boot on, a module not signed by an enrolled key does not
load at all. Each is knowable before it bites, from `dkms status`, the loaded module's version,
the installed libraries' version, `mokutil` and `modinfo`. This module turns those outputs into
findings, each naming the fix; the callers (preflight before a driver change, `make verify`)
gather the outputs with `read_state` (the driver_state module, the GPU exporter). Standard library
only; everything but `read_state` is a pure function the unit tests feed recorded outputs.

The next boot's kernel is the newest installed one in Debian's version order (`linux-version
sort`, from linux-base): what GRUB boots by default on Debian and Ubuntu; a node pinned to another
entry (GRUB_DEFAULT=saved) is not read. Secure Boot: `mokutil --sb-state` where mokutil is
installed, else the firmware's own SecureBoot variable under /sys/firmware/efi/efivars (its last
byte: 1 on, 0 off), so that a node without mokutil is still read.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
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
    return [text for _, text in problems(state)]


def problems(state: DriverState) -> list[tuple[str, str]]:
    """Each problem as (kind, sentence with its fix): next_boot_module, version_mismatch, secure_boot."""
    found: list[tuple[str, str]] = []
    kernels = dkms_kernels(state.dkms_status)
    if state.next_kernel and kernels.get(state.next_kernel) != "installed":
        have = ", ".join(f"{k} ({v})" for k, v in sorted(kernels.items())) or "none"
        found.append(
            (
                "next_boot_module",
                f"the kernel the node boots next, {state.next_kernel}, has no installed NVIDIA module "
                f"(DKMS has: {have}); after a reboot the GPU would be gone. fix: install that kernel's headers from "
                "the kit's repository and rebuild (make driver), or keep the node on its running kernel, before any "
                "reboot",
            )
        )
    loaded = loaded_version(state.proc_version)
    libraries = package_version(state.library_package_version)
    if loaded and libraries and loaded != libraries:
        found.append(
            (
                "version_mismatch",
                f"the loaded NVIDIA module is {loaded} and the driver libraries are {libraries}: NVML answers "
                "'Driver/library version mismatch'. fix: drain the node (make drain HOST=...) and reboot it, or "
                f"install the libraries of {loaded} back from the kit's repository",
            )
        )
    sb = secure_boot(state.sb_state)
    if sb == "on":
        signer = module_signer(state.modinfo)
        enrolled = key_enrolled(state.key_test)
        if not signer:
            found.append(
                (
                    "secure_boot",
                    "Secure Boot is on and the NVIDIA module is not signed: it will not load. fix: sign the DKMS "
                    f"modules with the lab's machine owner key ({state.key_path}) and enroll it, or turn Secure Boot "
                    "off in the firmware",
                )
            )
        elif enrolled is not True:
            found.append(
                (
                    "secure_boot",
                    f"Secure Boot is on and the module's signing key ({signer}) is "
                    f"{'not enrolled' if enrolled is False else 'not known to be enrolled'}: it will not load. fix: "
                    "mokutil --import the key, then confirm its enrollment at the console on the next boot "
                    "(MOK manager: Enroll MOK, the one-time password)",
                )
            )
    elif sb == "unknown" and state.sb_state:
        found.append(
            (
                "secure_boot",
                f"Secure Boot's state could not be read ({state.sb_state.strip()[:80]}). fix: install mokutil",
            )
        )
    return found


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


def read_state(
    library_package: str = "", key_der: str = "", key_path: str = "artifacts/secrets/mok"
) -> tuple[DriverState, bool]:
    """The node's driver as its tools print it now, and whether it has a driver at all."""
    proc_path = "/proc/driver/nvidia/version"
    proc_version = ""
    if os.path.exists(proc_path):
        with open(proc_path) as proc:
            proc_version = proc.read()
    dkms = out("dkms", "status")
    library = out("dpkg-query", "-W", "-f", "${Version}", library_package) if library_package else ""
    present = bool(dkms_kernels(dkms) or loaded_version(proc_version) or package_version(library))
    state = DriverState(
        next_kernel=next_kernel() if dkms_kernels(dkms) else "",
        dkms_status=dkms,
        proc_version=proc_version,
        library_package_version=library,
        sb_state=sb_state(),
        key_test=out("mokutil", "--test-key", key_der) if key_der else "",
        modinfo=out("modinfo", "-F", "signer", "nvidia") if present else "",
        key_path=key_path,
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
