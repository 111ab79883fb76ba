"""An environment held to its lock: what is installed, what the lock pins, and how they differ.

One reading of a lock and one comparison, used in three places: the lock tooling on the control
node (``glmdeploy_control.lock``), the fleet report of ``make verify`` (from a node's fingerprint),
and the ``glmdeploy_environment`` module, which checks an environment on the node before a deploy
trusts it. Why a module_utils: the module runs under the node's system Python with nothing but the
standard library, and Ansible ships this file with it; the control node imports the same file.

What is installed is read from the ``*.dist-info`` directories of a site-packages directory
(``importlib.metadata`` with an explicit path), not by running the environment's interpreter: an
environment changed in place may no longer start, and it must still be named and repaired.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

_REQ = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")

# What `python -m venv` puts into every environment besides the lock: not drift.
VENV_SEED_PACKAGES = frozenset({"pip", "setuptools", "wheel"})


def normalise(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): `Foo_Bar.baz` is `foo-bar-baz`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock_text(text: str) -> dict[str, tuple[str, set[str]]]:
    """Map normalised name -> (version, allowed sha256 set) of a hash-locked requirements file."""
    entries: dict[str, tuple[str, set[str]]] = {}
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        m = _REQ.match(line)
        if m:
            current = normalise(m.group(1))
            entries[current] = (m.group(2), set())
        if current:
            entries[current][1].update(_HASH.findall(line))
        if not line.endswith("\\"):
            current = None
    return entries


def lock_requirements(entries: dict[str, tuple[str, set[str]]], names: set[str]) -> str:
    """The lock's pins and hashes for `names` (parsed by parse_lock_text), as a requirements file pip
    installs with --require-hashes: a repair takes exactly the wheels the lock allows."""
    return "".join(
        f"{name}=={entries[name][0]}" + "".join(f" --hash=sha256:{h}" for h in sorted(entries[name][1])) + "\n"
        for name in sorted(names)
    )


def installed_in(site_packages: Path) -> dict[str, str]:
    """Normalised name -> version of every distribution installed in one site-packages directory."""
    return {
        normalise(dist.metadata["Name"]): dist.version
        for dist in metadata.distributions(path=[str(site_packages)])
        if dist.metadata["Name"]
    }


def site_packages(venv: Path) -> Path | None:
    """The venv's site-packages directory (lib/python3.X/site-packages), or None when it has none."""
    found = sorted(venv.glob("lib/python3*/site-packages"))
    return found[0] if found else None


def drift(pinned: dict[str, str], installed: dict[str, str], allowed: frozenset[str] = VENV_SEED_PACKAGES) -> list[str]:
    """Every way `installed` is not `pinned`, one phrase each, pinned names first:
    `tokenizers 0.19.1 (lock 0.23.3)`, `torch missing (lock 2.13.0+cpu)`, `foo 1.0 (not in lock)`.
    `allowed` names what may be there besides the lock, at any version."""
    installed = {normalise(n): v for n, v in installed.items()}
    found = [f"{n} {installed.get(n, 'missing')} (lock {pinned[n]})" for n in sorted(to_reinstall(pinned, installed))]
    return found + [f"{n} {installed[n]} (not in lock)" for n in sorted(intruders(pinned, installed, allowed))]


def to_reinstall(pinned: dict[str, str], installed: dict[str, str]) -> set[str]:
    """The pinned names whose installed version is wrong or missing: what a repair installs again."""
    return {n for n, v in pinned.items() if installed.get(n) != v}


def intruders(
    pinned: dict[str, str], installed: dict[str, str], allowed: frozenset[str] = VENV_SEED_PACKAGES
) -> set[str]:
    """Installed names the lock does not pin and that are not allowed: what a repair removes."""
    return {n for n in installed if n not in pinned and n not in allowed}
