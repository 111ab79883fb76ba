"""The profile registry (constraints/profiles.toml): the one definition of what a node can be.

Every part of the kit that needs a profile fact (the lock tooling, the Makefile, the Ansible
plugins that plan a node, the tests) reads it through `load`, so a profile, a file name pattern,
a port default or the GPU rule is written once. `load` refuses an unknown or missing key by name:
a typo in the registry must stop `make`, not become a silent default on a node.

Standard library only (tomllib, dataclasses): it runs under the system python3 the Makefile
calls, the tool environment (Ansible's plugins) and the reference environment (unit tests).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import types
import typing
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import tomllib

from glmdeploy.serving.sizing import GpuClass, version_tuple

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PATH = ROOT / "constraints" / "profiles.toml"

#: Prints the two facts the GPU rule and the lock choice need from a machine: the Python's minor
#: version (or "missing") and the PCI vendor ids. `{python}` is a shell-quoted interpreter path.
#: One round trip; it only reads, so it runs under --check too.
PROBE = (
    "v=$({python} -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' 2>/dev/null) || v=missing; "
    'echo "python=$v"; echo "pci_vendors=$(cat /sys/bus/pci/devices/*/vendor 2>/dev/null | tr "\\n" " ")"'
)


class RegistryError(ValueError):
    """The registry, or a name asked of it, is wrong; the message names the key and the fix."""


@dataclass(frozen=True)
class Service:
    port: int


@dataclass(frozen=True)
class Auto:
    """The GPU rule's two outcomes."""

    gpu: str
    none: str


@dataclass(frozen=True)
class Image:
    """The container image's base: the Debian suite debootstrapped for it and that suite's Python
    (the image's lock is the profile's for this Python, whatever the host runs)."""

    suite: str
    python: str
    #: Distribution packages a node of the container runtime needs instead of the venv's.
    host_packages: list[str]


@dataclass(frozen=True)
class Balancer:
    """The balancer's own services: glmdeploy-lb-health and glmdeploy-lb-keys (roles/load_balancer)."""

    health_port: int
    #: The API keys service: nginx asks it about every request's key; /keys and /metrics.
    keys_port: int
    #: A generation probe that has waited this long with no reply: the node is hung.
    hang_s: float


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of a node's engine (glmdeploy.serving.request_limits; the balancer's
    nginx holds bodies and headers to the same bytes); max_tokens is the profile's max_model_len."""

    max_body_bytes: int
    max_header_bytes: int
    max_n: int
    max_best_of: int
    max_logprobs: int


@dataclass(frozen=True)
class Share:
    """A node's share of the artifact stores it holds, for the length of a run's fan-out (roles/glmdeploy)."""

    port: int


@dataclass(frozen=True)
class AptRelease:
    """A node OS release the kit locks its distribution packages for (constraints/apt/<name>.lock)."""

    #: Ansible's ansible_distribution for it ("Debian", "Ubuntu").
    distribution: Literal["Debian", "Ubuntu"]
    #: ansible_distribution_major_version (Debian) or ansible_distribution_version (Ubuntu).
    version: str
    codename: str
    #: The archive's suites resolved together, "{codename}" filled in (release, updates, security).
    suites: list[str]
    components: list[str]
    #: The package whose dependency names the release's current kernel ABI (its headers: the
    #: driver's DKMS build); every lock covers that kernel's headers and `kernels`.
    kernel_headers_meta: str
    #: More kernels whose headers the lock carries (a node's running kernel, named by preflight).
    kernels: list[str] = field(default_factory=list)
    #: GPU profiles run on this release: the lock carries the driver and the kernel headers.
    gpu: bool = True
    #: The OpenPGP keyring that signs the release's archive on the control node (make lock).
    keyring: str = "/usr/share/keyrings/debian-archive-keyring.gpg"


@dataclass(frozen=True)
class Apt:
    """The distribution half of a node, locked like the Python half (docs/reference/apt-lock.md)."""

    #: The lock of a release, relative to constraints/.
    lock_file: str
    #: Packages each role installs beyond kit.packages, profile packages and kit.image.host_packages.
    roles: dict[str, list[str]]
    #: The driver's packages per distribution ("{branch}": the GPU profile's driver branch).
    driver: dict[str, list[str]]
    #: Per distribution, the one of those whose version is the driver libraries' (NVML's): held
    #: against the loaded module's version by make verify and the GPU exporter.
    driver_libraries: dict[str, str]
    releases: dict[str, AptRelease]


@dataclass(frozen=True)
class Kit:
    lock_file: str
    wheelhouse: str
    unit: str
    log: str
    #: Units a node runs beside its services, with no port of their own (the firewall's rules).
    node_units: list[str]
    served_model_name: str
    gpu_pci_vendor: str
    auto: Auto
    packages: list[str]
    services: dict[str, Service]
    image: Image
    balancer: Balancer
    request_limits: RequestLimits
    share: Share
    apt: Apt
    gpu_classes: dict[str, GpuClass]


@dataclass(frozen=True)
class Gpu:
    driver_branch: str
    min_driver: str
    min_memory_mib: int


@dataclass(frozen=True)
class Runtime:
    max_model_len: int
    trust_remote_code: bool
    return_token_ids: bool
    extra_args: list[str]
    extra_env: dict[str, str]
    #: The balancer's bound on a node's silence (first byte, or within a stream), in seconds.
    first_byte_timeout_s: int


@dataclass(frozen=True)
class LockSet:
    """A requirement set `make lock` resolves: `<name>.in` -> `<name>-py<XY>.txt` per Python."""

    python: list[str]
    exclude_newer: str
    no_emit: list[str] = field(default_factory=list)
    local_wheels: bool = False
    exclude_newer_package: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Profile(LockSet):
    """A lock set a node runs: its engine, model, packages and runtime options."""

    engine: str = ""
    model: str = ""
    model_source: Literal["fixture", "weights"] = "weights"
    packages: list[str] = field(default_factory=list)
    runtime: Runtime | None = None
    gpu: Gpu | None = None


_PROFILE_REQUIRED = ("engine", "model", "model_source", "packages", "runtime")


@dataclass(frozen=True)
class Registry:
    path: Path
    kit: Kit
    profiles: dict[str, Profile]
    locks: dict[str, LockSet]

    def profile(self, name: str) -> Profile:
        """The named profile, or an error listing the ones there are."""
        if name not in self.profiles:
            raise RegistryError(
                f"unknown profile {name!r}: {self.path.name} defines {', '.join(self.profiles)}; "
                "fix: use one of them, or add [profile." + name + "] there"
            )
        return self.profiles[name]

    def lock_sets(self) -> dict[str, LockSet]:
        """Every requirement set `make lock` resolves: the node profiles, then the others."""
        return {**self.profiles, **self.locks}

    def fixture_model(self) -> str:
        """The model the kit generates (`make fixture`): the one a profile has as `model_source = "fixture"`."""
        return next(p.model for p in self.profiles.values() if p.model_source == "fixture")

    def lock_name(self, name: str, python: str) -> str:
        return self.kit.lock_file.format(profile=name, xy=python.replace(".", ""))

    def wheelhouse_name(self, name: str, python: str) -> str:
        return self.kit.wheelhouse.format(profile=name, xy=python.replace(".", ""))

    def apt_lock_name(self, release: str) -> str:
        """constraints/<this> is the release's apt lock; an unknown release is named with the known ones."""
        if release not in self.kit.apt.releases:
            raise RegistryError(
                f"no apt lock for {release!r}: {self.path.name} [kit.apt.releases] has "
                f"{', '.join(self.kit.apt.releases)}; fix: add the release there, then make lock"
            )
        return self.kit.apt.lock_file.format(release=release)

    def apt_packages(self) -> dict[str, list[str]]:
        """What the kit installs from its apt repository, per installer (a role, or node_base per
        runtime and profile): the lock resolves their union, make verify checks each node's."""
        branch = next((p.gpu.driver_branch for p in self.profiles.values() if p.gpu), "")
        sets = {
            "node_base/container": list(self.kit.image.host_packages),
            **{f"node_base/{name}": [*self.kit.packages, *p.packages] for name, p in self.profiles.items()},
            **{role: list(names) for role, names in self.kit.apt.roles.items()},
        }
        for distribution, names in self.kit.apt.driver.items():
            sets[f"nvidia_driver/{distribution}"] = [n.format(branch=branch) for n in names]
        return sets

    def node_units(self) -> list[str]:
        """Every unit the kit puts on a node: its services in start order, then the portless ones."""
        return [*self.kit.services, *self.kit.node_units]

    def unit_name(self, service: str) -> str:
        return self.kit.unit.format(service=service)

    def log_name(self, service: str) -> str:
        return self.kit.log.format(service=service)

    def has_gpu(self, pci_vendors: list[str]) -> bool:
        """The GPU rule: a PCI device of the kit's GPU vendor makes the node a GPU node."""
        return self.kit.gpu_pci_vendor in pci_vendors

    def auto_profile(self, pci_vendors: list[str]) -> str:
        return self.kit.auto.gpu if self.has_gpu(pci_vendors) else self.kit.auto.none

    def to_dict(self) -> dict[str, Any]:
        """The registry as plain data, for Ansible and JSON."""
        data = dataclasses.asdict(self)
        data["path"] = str(self.path)
        return data


def _build(cls: type[Any], table: object, where: str) -> Any:
    """One dataclass from one TOML table: every key known, every required key there, types checked."""
    if not isinstance(table, dict):
        raise RegistryError(f"{where} must be a table, not {type(table).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise RegistryError(f"{where}: unknown key {unknown[0]!r}; fix: one of {', '.join(known)}")
    values: dict[str, Any] = {}
    for name, spec in known.items():
        if name in table:
            values[name] = _convert(hints[name], table[name], f"{where}.{name}")
        elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            raise RegistryError(f"{where}: missing key {name!r}")
    return cls(**values)


def _convert(hint: Any, value: object, where: str) -> Any:
    """Check (and for nested tables, build) one value against its annotation."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return _convert(next(a for a in args if a is not type(None)), value, where)
    if origin is Literal:
        if value not in args:
            raise RegistryError(f"{where} = {value!r}; fix: one of {', '.join(map(repr, args))}")
        return value
    if dataclasses.is_dataclass(hint):
        return _build(typing.cast(type[Any], hint), value, where)
    if origin is list:
        if not isinstance(value, list):
            raise RegistryError(f"{where} must be a list")
        return [_convert(args[0], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RegistryError(f"{where} must be a table")
        return {k: _convert(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise RegistryError(f"{where} must be {hint.__name__}, not {value!r}")
    return value


def parse(data: dict[str, Any], path: Path) -> Registry:
    """The registry from parsed TOML (the unit tests build variations of it)."""
    unknown = sorted(set(data) - {"kit", "profile", "lock"})
    if unknown:
        raise RegistryError(f"{path}: unknown table [{unknown[0]}]; fix: [kit], [profile.<name>] or [lock.<name>]")
    kit = _build(Kit, data.get("kit"), "[kit]")
    profiles: dict[str, Profile] = {}
    for name, table in data.get("profile", {}).items():
        where = f"[profile.{name}]"
        for key in _PROFILE_REQUIRED:
            if key not in table:
                raise RegistryError(f"{where}: missing key {key!r}")
        profiles[name] = _build(Profile, table, where)
    locks = {name: _build(LockSet, table, f"[lock.{name}]") for name, table in data.get("lock", {}).items()}
    registry = Registry(path=path, kit=kit, profiles=profiles, locks=locks)
    for outcome in (kit.auto.gpu, kit.auto.none):
        registry.profile(outcome)
    for name, gpu_class in kit.gpu_classes.items():
        if gpu_class.api_servers > 1 and version_tuple(gpu_class.api_servers_since) is None:
            raise RegistryError(
                f"[kit.gpu_classes.{name}]: api_servers = {gpu_class.api_servers} needs api_servers_since, the oldest "
                'vLLM that takes --api-server-count (e.g. "0.26.0")'
            )
    return registry


def load(path: Path | str = DEFAULT_PATH) -> Registry:
    """The registry at `path` (default: the checkout's constraints/profiles.toml)."""
    path = Path(path)
    stat = path.stat()
    return _load(path.resolve(), stat.st_mtime_ns, stat.st_size)


@cache
def _load(path: Path, _mtime_ns: int, _size: int) -> Registry:
    """Read once per file version: Ansible asks for the registry on every templated default."""
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{path}: {exc}") from exc
    return parse(data, path)


def probe_here(python: str = sys.executable) -> dict[str, str]:
    """`PROBE` run on this machine (the Makefile's default profile): the same rule as a node's."""
    import shlex

    out = subprocess.run(
        ["sh", "-c", PROBE.format(python=shlex.quote(python))], capture_output=True, text=True, check=False
    ).stdout
    return parse_probe(out)


def detect_here(registry: Registry) -> str:
    """This machine's profile by the nodes' GPU rule (the Makefile's default PROFILE)."""
    return registry.auto_profile(probe_here()["pci_vendors"].split())


def parse_probe(output: str) -> dict[str, str]:
    facts = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    return {"python": facts.get("python", "missing").strip(), "pci_vendors": facts.get("pci_vendors", "").strip()}


def _get(registry: Registry, dotted: str) -> Any:
    value: Any = registry.to_dict()
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise RegistryError(f"no key {dotted!r} in {registry.path.name}")
        value = value[part]
    return value


def _text(value: Any) -> str:
    """A value as the Makefile reads it: lists space-separated, tables as JSON, None as nothing."""
    if value is None:
        return ""
    if isinstance(value, list):
        return " ".join(map(str, value))
    return json.dumps(value) if isinstance(value, dict) else str(value)


def make_vars(registry: Registry, python: str, control_python: str, detect: bool) -> list[str]:
    """What the Makefile reads, in one process: each `make` parses the Makefile, and a registry call
    costs a Python start (about a quarter of a second here), so one call gives every value as a
    `NAME=value` word (values have no spaces; per-profile values are named `NAME.<profile>`)."""
    words = [
        f"REG_PROFILES={','.join(registry.profiles)}",
        f"REG_GPU_PROFILE={registry.kit.auto.gpu}",
        f"REG_SERVED_MODEL={registry.kit.served_model_name}",
        f"REG_FIXTURE_MODEL={registry.fixture_model()}",
        f"REG_TOOLS_LOCK={registry.lock_name('tools', control_python)}",
        f"REG_REFENV_LOCK={registry.lock_name('tokenizer-ref', control_python)}",
        f"REG_REFENV_WHEELHOUSE={registry.wheelhouse_name('tokenizer-ref', control_python)}",
        f"REG_IMAGE_PY={registry.kit.image.python}",
    ]
    for name, profile in registry.profiles.items():
        words += [
            f"REG_MODEL.{name}={profile.model}",
            f"REG_MODEL_SOURCE.{name}={profile.model_source}",
            f"REG_WHEELHOUSE.{name}={registry.wheelhouse_name(name, python)}",
            f"REG_IMAGE_WHEELHOUSE.{name}={registry.wheelhouse_name(name, registry.kit.image.python)}",
        ]
    if detect:
        words.append(f"REG_DETECTED={detect_here(registry)}")
    return words


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glmdeploy_control.registry",
        description="Read the kit's profile registry (constraints/profiles.toml) for the Makefile and scripts.",
    )
    parser.add_argument("--registry", default=str(DEFAULT_PATH), help="registry file (default: %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("get", help="print a value by dotted key (lists space-separated, tables as JSON)")
    p.add_argument("key", help="e.g. profiles.cpu.model, kit.served_model_name")
    p = sub.add_parser("make-vars", help="print the Makefile's values as NAME=value words (one call per make)")
    p.add_argument("--python", required=True, help="the wheelhouses' Python minor version (NODE_PY)")
    p.add_argument("--control-python", required=True, help="the tool environments' Python minor version")
    p.add_argument("--detect", action="store_true", help="also REG_DETECTED: this machine's profile by the GPU rule")
    sub.add_parser("detect", help="print this machine's profile by the nodes' GPU rule")
    p = sub.add_parser("lock-name", help="print a lock file's name (a profile's or another lock set's)")
    p.add_argument("profile")
    p.add_argument("python", help='minor version, e.g. "3.11"')
    args = parser.parse_args(argv)
    try:
        registry = load(args.registry)
        if args.command == "get":
            value = _get(registry, args.key)
            print(_text(value))
        elif args.command == "make-vars":
            print(" ".join(make_vars(registry, args.python, args.control_python, args.detect)))
        elif args.command == "detect":
            print(detect_here(registry))
        else:  # lock-name
            if args.profile not in registry.lock_sets():
                registry.profile(args.profile)  # the error names the profiles
            print(registry.lock_name(args.profile, args.python))
    except (RegistryError, OSError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
