"""Fingerprint of a deployed node: what is really installed and running, as comparable hashes.

Why: "identical nodes" is a claim that must be checked field by field after
every upgrade. Each field here is read from the node itself (not from what
the deploy intended), so `make verify` can put the fleet side by side and
name the host and the field that differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

from glmdeploy.config import NodeConfig
from glmdeploy.manifest import check_manifest, file_sha256

UNIT_GLOBS = ("/etc/systemd/system/glmdeploy-*.service", "/etc/glmdeploy/supervisor.d/*.conf")
#: Units of the balancer a node may also be (roles/load_balancer: glmdeploy-lb-health, -lb-keys): the
#: host's other role, not the node's; with them a node that is also the balancer differed from the
#: other nodes of its profile in make verify's units row.
BALANCER_UNITS = "glmdeploy-lb-"


def _os_release() -> str:
    """The host's OS: in a container the host's os-release is mounted where containers look for
    it (/run/host/os-release), /etc/os-release being the image's."""
    path = next((p for p in (Path("/run/host/os-release"), Path("/etc/os-release")) if p.exists()), None)
    if path is None:
        return "unknown"
    fields = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return fields.get("PRETTY_NAME", "unknown").strip('"')


def _driver() -> str:
    path = Path("/proc/driver/nvidia/version")
    if not path.exists():
        return "none"
    first = path.read_text().splitlines()[0]
    return next((w for w in first.split() if w.count(".") >= 1 and w.replace(".", "").isdigit()), first)


def _cuda() -> str:
    """CUDA runtime the environment ships (from the installed wheels' metadata; no torch import)."""
    for dist in ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "none"


# The kit's own wheel, installed in every release's environment: not a package of the lock. Its
# version and digest are in the release field (`kit ...`), which the fleet compares too.
KIT_DISTRIBUTION = "glmdeploy"


def installed_packages() -> dict[str, str]:
    """Every distribution this interpreter sees (the lock's and any intruder), the kit's own aside."""
    found = {
        (dist.metadata["Name"] or "").lower().replace("_", "-"): dist.version
        for dist in metadata.distributions()
        if dist.metadata["Name"]
    }
    found.pop(KIT_DISTRIBUTION, None)
    return found


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _file_digest(path: Path) -> str:
    return file_sha256(path)[:16] if path.exists() else "missing"


def units_digest(units: list[Path], own_addresses: set[str]) -> str:
    """Unit files compared as templates: the node's own listen address (behind a balancer every
    node has its own) is replaced by a placeholder, so identical nodes get identical digests."""
    lines = []
    for path in units:
        text = path.read_text(errors="replace")
        for address in sorted(own_addresses, key=len, reverse=True):
            text = text.replace(address, "<node-address>")
        lines.append(f"{path.name} {_digest(text)}")
    return _digest("\n".join(lines))


def _own_addresses(node: NodeConfig) -> set[str]:
    return {host for url in (node.api_url, node.ui_url) if url and (host := urlsplit(url).hostname)}


def _release_name(release: Path) -> str:
    """What a fleet must share: kit version, lock, model and kit code. The release id's last part
    also digests the rendered config, which names each node's own address, so it differs per node."""
    meta = release / "release.json"
    if not meta.is_file():
        return release.resolve().name
    info = json.loads(meta.read_text())
    return f"{release.resolve().name.rsplit('-', 1)[0]} kit {info.get('kit', '?')}"


def _environment(release: Path) -> Path:
    """The lock's environment: the release's `env` link (its `venv` is the kit's wheel over it),
    `venv` itself in a release made before the kit was a wheel, or, in the container runtime (a
    release without either), the running environment: the image keeps its lock beside it."""
    for name in ("env", "venv"):
        if (release / name).is_symlink():
            return release / name
    return Path(sys.prefix)


def _image() -> str:
    """The image a container runtime's release runs (its ID, which the launcher passes in); none
    for a release in a virtual environment of the host's own Python."""
    return os.environ.get("GLMDEPLOY_IMAGE", "") or "none"


def node_units(root: Path = Path("/")) -> list[Path]:
    """The node's own unit (or supervisor program) files under `root`, the balancer's left out."""
    return sorted(
        p for pattern in UNIT_GLOBS for p in root.glob(pattern.lstrip("/")) if not p.name.startswith(BALANCER_UNITS)
    )


def collect(node: NodeConfig, release: Path, golden_dir: Path) -> dict[str, object]:
    packages = installed_packages()
    units = node_units()
    model = Path(node.model_dir)
    return {
        "os": _os_release(),
        "kernel": platform.release(),
        "driver": _driver(),
        "cuda": _cuda(),
        "python": platform.python_version(),
        "profile": node.profile,
        "release": _release_name(release),
        # The environment's directory holds the lock it was installed from.
        "lock": _file_digest(_environment(release).resolve().parent / "requirements.lock"),
        "image": _image(),
        "packages": _digest("\n".join(f"{k}=={v}" for k, v in sorted(packages.items()))),
        "model": node.model_name,
        "model_manifest": _file_digest(model / "SHA256SUMS"),
        # The files themselves, re-hashed now: a file edited in place leaves the manifest unchanged.
        "model_files": "; ".join(check_manifest(model)) or "match manifest",
        "tokenizer_golden": _file_digest(golden_dir / f"{node.model_name}.json"),
        "units": units_digest(units, _own_addresses(node)),
        "dtype": json.loads((model / "config.json").read_text()).get("torch_dtype", "unknown"),
        "_package_versions": packages,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glmdeploy.serving.fingerprint", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", help="node config (default: /etc/glmdeploy/node.json)")
    parser.add_argument(
        "--release", type=Path, default=Path(os.environ.get("GLMDEPLOY_RELEASE", "/opt/glmdeploy/current"))
    )
    parser.add_argument("--golden-dir", type=Path, default=Path("/opt/glmdeploy/smoke_tests/golden"))
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    text = json.dumps(collect(NodeConfig.load(args.config), args.release, args.golden_dir), indent=2, sort_keys=True)
    if args.output:
        args.output.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
