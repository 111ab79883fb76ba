"""The driver's state (module_utils/glmdeploy_driver_state.py) on recorded outputs of dkms, the
kernel's /proc file, dpkg, mokutil and modinfo (tests/unit/data/driver/: written in the tools'
own formats, dkms 3.x of Debian 12 and 2.8 of Ubuntu 22.04; not read from a GPU server here)."""

from __future__ import annotations

from pathlib import Path

import glmdeploy_driver_state as driver
import pytest

DATA = Path(__file__).with_name("data") / "driver"


def read(name: str) -> str:
    return (DATA / name).read_text()


def healthy(**changes: str) -> driver.DriverState:
    state = driver.DriverState(
        next_kernel="6.1.0-41-amd64",
        dkms_status=read("dkms-3-installed.txt"),
        proc_version=read("proc-version-535.261.txt"),
        library_package_version="535.261.03-1",
        sb_state=read("mokutil-sb-disabled.txt"),
        modinfo=read("modinfo-signed.txt"),
    )
    for key, value in changes.items():
        setattr(state, key, value)
    return state


def test_a_node_whose_next_kernel_has_its_module_and_matching_libraries_has_no_finding():
    assert driver.findings(healthy()) == []


def test_next_boot_kernel_without_an_installed_module_is_named_with_the_fix():
    found = driver.findings(healthy(next_kernel="6.1.0-42-amd64", dkms_status=read("dkms-3-next-kernel-failed.txt")))
    assert len(found) == 1
    assert "6.1.0-42-amd64, has no installed NVIDIA module" in found[0] and "6.1.0-42-amd64 (built)" in found[0]
    assert "fix:" in found[0] and "before any reboot" in found[0]


def test_dkms_28_lines_are_read_as_well():
    assert driver.dkms_kernels(read("dkms-2.8.txt")) == {"5.15.0-113-generic": "installed"}


def test_loaded_module_and_libraries_of_different_versions_name_the_nvml_mismatch():
    found = driver.findings(healthy(library_package_version="1:535.274.02-1~deb12u1"))
    assert len(found) == 1 and "loaded NVIDIA module is 535.261.03 and the driver libraries are 535.274.02" in found[0]
    assert "Driver/library version mismatch" in found[0] and "make drain" in found[0]


def test_the_open_kernel_modules_version_line_is_read():
    assert driver.loaded_version(read("proc-version-open-535.183.txt")) == "535.183.01"
    assert driver.loaded_version("") == ""


@pytest.mark.parametrize(
    ("sb_file", "expected"),
    [("mokutil-sb-enabled.txt", "on"), ("mokutil-sb-disabled.txt", "off"), ("mokutil-sb-no-efi.txt", "no-efi")],
)
def test_secure_boot_state_is_read(sb_file, expected):
    assert driver.secure_boot(read(sb_file)) == expected


@pytest.mark.parametrize(
    ("modinfo", "key", "problem"),
    [
        ("modinfo-signed.txt", "mokutil-test-key-enrolled.txt", None),
        ("modinfo-unsigned.txt", "mokutil-test-key-enrolled.txt", "not signed: it will not load"),
        ("modinfo-signed.txt", "mokutil-test-key-not-enrolled.txt", "(DKMS module signing key) is not enrolled"),
        ("modinfo-signed.txt", "mokutil-test-key-pending.txt", "is not enrolled: it will not load"),
    ],
    ids=["signed-enrolled", "unsigned", "signed-key-not-enrolled", "signed-key-pending"],
)
def test_secure_boot_on_needs_a_module_signed_by_an_enrolled_key(modinfo, key, problem):
    found = driver.findings(healthy(sb_state=read("mokutil-sb-enabled.txt"), modinfo=read(modinfo), key_test=read(key)))
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0] and "fix:" in found[0]


@pytest.mark.parametrize("sb_file", ["mokutil-sb-disabled.txt", "mokutil-sb-no-efi.txt"])
def test_an_unsigned_module_is_fine_where_secure_boot_is_not_enforced(sb_file):
    assert driver.findings(healthy(sb_state=read(sb_file), modinfo=read("modinfo-unsigned.txt"))) == []


def test_the_module_reads_a_node_without_a_driver_as_no_driver_with_no_finding():
    """The gathering half (library/glmdeploy_driver_state.py) run as Ansible runs it, on this machine:
    no NVIDIA driver here, so the row says so and names nothing (a cpu node's row in make verify)."""
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "support"))
    from local_play import ROOT, run_module

    proc = run_module(ROOT / "library" / "glmdeploy_driver_state.py", {"library_package": "libnvidia-ml1"}, check=True)
    result = json.loads(proc.stdout)
    assert result["present"] is False and result["findings"] == [] and result["changed"] is False, result
    assert result["summary"].startswith("no NVIDIA driver; Secure Boot "), result
