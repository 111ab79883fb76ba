"""`make sbom`: a CycloneDX inventory of every lock the kit installs from, made by
cyclonedx-python-lib (the CycloneDX project's own library), one file per lock.

Each Python lock (`constraints/<profile>-py<XY>.txt`) and each distribution lock
(`constraints/apt/<release>.lock`) becomes `<out>/<lock file name>.cdx.json`: one component per
locked package with its package URL (purl: `pkg:pypi/...`, `pkg:deb/debian/...`), its version and
the SHA256 digests the lock allows. The same lock gives the same bytes: the serial number is
derived from the lock's digest, and the timestamp is the lock's own date (the resolve's
`exclude_newer`) for a Python lock and absent for an apt lock (it records none), never the clock.

A deployed node's inventory is what `make verify` saw on it (`--nodes <reports>/smoke`): each
host's installed Python packages (its fingerprint) and its kit distribution packages (apt.json),
as `<out>/node-<host>.cdx.json`, dated by the report's own time; no digests (a node reports
versions, not files). A container image's (`--images <reports>`) is its Python environment as
`make image-smoke`'s fingerprint saw it inside the image, as `image-<profile>.cdx.json`.

    python -m glmdeploy_control.sbom [--out artifacts/sbom] [--nodes reports/smoke] [--images reports] [LOCK ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

# How a lock is read: shared with the node-side module_utils (on the path as lock.py says).
import glmdeploy_environment as environment
from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from glmdeploy_control import registry

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints"
DEFAULT_OUT = ROOT / "artifacts" / "sbom"
#: The namespace of the serial numbers (uuid5 of the lock's digest): any fixed UUID would do.
SERIAL_NAMESPACE = uuid.UUID("5b0d1f6e-2c61-4a0e-9d1c-6c6d6d0b8a11")


class SbomError(RuntimeError):
    """A problem the user can fix; printed without a traceback."""


def python_locks(reg: registry.Registry) -> list[Path]:
    """Each node profile's Python lock, per Python, that exists."""
    found = [CONSTRAINTS / reg.lock_name(name, py) for name, profile in reg.profiles.items() for py in profile.python]
    return [p for p in found if p.exists()]


def apt_locks(reg: registry.Registry) -> list[Path]:
    """Each node release's apt lock that exists."""
    return [p for p in (CONSTRAINTS / reg.apt_lock_name(r) for r in reg.kit.apt.releases) if p.exists()]


def default_locks(reg: registry.Registry) -> list[Path]:
    """Every lock a node installs from: each profile's Python lock per Python, each release's apt lock."""
    return [*python_locks(reg), *apt_locks(reg)]


def _bom(lock: Path, text: str, when: datetime | None, components: Iterable[Component]) -> Bom:
    digest = hashlib.sha256(text.encode()).hexdigest()
    bom = Bom(serial_number=uuid.uuid5(SERIAL_NAMESPACE, digest))
    # Optional in the schema; the library takes None (no date) though its setter is typed datetime.
    bom.metadata.timestamp = cast(datetime, when)
    bom.metadata.component = Component(
        name=f"glmdeploy/{lock.name}",
        version=f"sha256:{digest[:16]}",
        type=ComponentType.PLATFORM,
        bom_ref=f"glmdeploy/{lock.name}",
        properties=[Property(name="glmdeploy:lock", value=lock.name)],
    )
    for component in components:
        bom.components.add(component)
        bom.register_dependency(bom.metadata.component, [component])
    return bom


def _pypi(name: str, version: str, hashes: Iterable[str] = ()) -> Component:
    """A Python package as a component: its purl, and the SHA256 digests a lock allows (if any)."""
    return Component(
        name=name,
        version=version,
        type=ComponentType.LIBRARY,
        purl=PackageURL(type="pypi", name=name, version=version),
        bom_ref=f"pkg:pypi/{name}@{version}",
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=h) for h in sorted(hashes)],
    )


def python_bom(lock: Path, exclude_newer: str) -> Bom:
    """A Python lock's SBOM: every pinned package as pkg:pypi, with the wheel digests the lock allows."""
    text = lock.read_text()
    pins = environment.parse_lock_text(text)
    components = [_pypi(name, version, hashes) for name, (version, hashes) in sorted(pins.items())]
    return _bom(lock, text, datetime.fromisoformat(exclude_newer).replace(tzinfo=UTC), components)


def apt_bom(lock: Path) -> Bom:
    """An apt lock's SBOM: every locked .deb as pkg:deb/<vendor>, with its SHA256 from the signed index."""
    text = lock.read_text()
    data = json.loads(text)
    vendor = str(data["distribution"]).lower()
    release = f"{vendor}-{data['version']}"
    components = [
        Component(
            name=name,
            version=str(pkg["version"]),
            type=ComponentType.LIBRARY,
            purl=PackageURL(
                type="deb",
                namespace=vendor,
                name=name,
                version=str(pkg["version"]),
                qualifiers={"arch": str(pkg["architecture"]), "distro": release},
            ),
            bom_ref=f"pkg:deb/{vendor}/{name}@{pkg['version']}",
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=str(pkg["sha256"]))],
        )
        for name, pkg in sorted(data["packages"].items())
    ]
    return _bom(lock, text, None, components)


def render(bom: Bom) -> str:
    """CycloneDX 1.6 JSON, keys in a stable order."""
    text = JsonV1Dot6(bom).output_as_string(indent=1)
    return json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"


def bom_for(lock: Path, reg: registry.Registry) -> Bom:
    """The SBOM of one lock file, by its kind (a Python lock or an apt lock)."""
    apt = {Path(reg.apt_lock_name(r)).name for r in reg.kit.apt.releases}
    if lock.name in apt:
        return apt_bom(lock)
    python = {reg.lock_name(name, py): spec for name, spec in reg.lock_sets().items() for py in spec.python}
    if lock.name in python:
        return python_bom(lock, python[lock.name].exclude_newer)
    raise SbomError(f"{lock}: not a lock the registry names; fix: name one of {', '.join(sorted([*python, *apt]))}")


def write(locks: list[Path], out: Path, reg: registry.Registry) -> list[Path]:
    """Write each lock's SBOM under `out`; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for lock in locks:
        if not lock.exists():
            raise SbomError(f"{lock}: no such lock; fix: run make lock, or name an existing lock")
        bom = bom_for(lock, reg)
        target = out / f"{lock.name}.cdx.json"
        target.write_text(render(bom))
        print(f"==> {target}: {len(bom.components)} components", flush=True)
        written.append(target)
    return written


def node_bom(host_dir: Path) -> Bom:
    """One node's SBOM from what `make verify` recorded for it."""
    return fingerprint_bom(host_dir / "fingerprint.json", host_dir / "apt.json", f"node-{host_dir.name}")


def fingerprint_bom(fp_file: Path, apt_file: Path | None, name: str) -> Bom:
    """The SBOM of an environment as its fingerprint saw it (a node's, or an image's smoke run's)."""
    fingerprint = json.loads(fp_file.read_text())
    python = cast(dict[str, str], fingerprint.get("_package_versions", {}))
    components = [_pypi(name, version) for name, version in sorted(python.items())]
    if apt_file is not None and apt_file.exists():
        installed = cast(dict[str, dict[str, str]], json.loads(apt_file.read_text()).get("packages", {}))
        components += [
            Component(
                name=name,
                version=str(entry.get("installed")),
                type=ComponentType.LIBRARY,
                purl=PackageURL(type="deb", name=name, version=str(entry.get("installed"))),
                bom_ref=f"pkg:deb/{name}@{entry.get('installed')}",
            )
            for name, entry in sorted(installed.items())
        ]
    text = json.dumps([python, sorted(c.bom_ref.value or "" for c in components)], sort_keys=True)
    when = datetime.fromtimestamp(fp_file.stat().st_mtime, UTC).replace(microsecond=0)
    return _bom(Path(name), text, when, components)


def write_nodes(reports: Path, out: Path) -> list[Path]:
    """A node SBOM for every host `make verify` reported under `reports` (its smoke/ directory)."""
    hosts = sorted(p.parent for p in reports.glob("*/fingerprint.json"))
    if not hosts:
        raise SbomError(
            f"{reports}: no host reports (*/fingerprint.json); fix: run make verify first, then --nodes <reports>/smoke"
        )
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for host_dir in hosts:
        bom = node_bom(host_dir)
        target = out / f"node-{host_dir.name}.cdx.json"
        target.write_text(render(bom))
        print(f"==> {target}: {len(bom.components)} components (as make verify saw {host_dir.name})", flush=True)
        written.append(target)
    return written


def write_images(reports: Path, out: Path) -> list[Path]:
    """An image SBOM for every image `make image-smoke` ran (its Python environment as the smoke
    run's fingerprint saw it inside the image; the image's distribution packages are not listed)."""
    written = []
    for fp_file in sorted(reports.glob("image-smoke-*-fingerprint.json")):
        profile = fp_file.name.removeprefix("image-smoke-").removesuffix("-fingerprint.json")
        bom = fingerprint_bom(fp_file, None, f"image-{profile}")
        out.mkdir(parents=True, exist_ok=True)
        target = out / f"image-{profile}.cdx.json"
        target.write_text(render(bom))
        print(
            f"==> {target}: {len(bom.components)} components (the {profile} image, as its smoke run saw it)", flush=True
        )
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glmdeploy-sbom", description=__doc__.split("\n\n")[0])
    parser.add_argument("locks", nargs="*", type=Path, help="lock files (default: every node profile's and release's)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--nodes", type=Path, help="also each node make verify reported here (<reports>/smoke)")
    parser.add_argument("--images", type=Path, help="also each image make image-smoke reported here (<reports>)")
    args = parser.parse_args(argv)
    reg = registry.load()
    try:
        write(args.locks or default_locks(reg), args.out, reg)
        if args.nodes:
            write_nodes(args.nodes, args.out)
        if args.images:
            write_images(args.images, args.out)
    except SbomError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
