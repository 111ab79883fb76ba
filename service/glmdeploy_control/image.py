"""`make image`: a profile's pinned stack as a container image, built offline and reproducibly.

Why a script of its own and not a bare `podman build` in the Makefile: no image registry is
reachable, so the base is made here from a debootstrapped rootfs; the image must come out with
the same ID from the same inputs (fixed timestamps, a deterministic base tar, no build-time
randomness), and a rebuild costs minutes, so the result is kept by the digest of its inputs in a
store outside any checkout and reused while they do not change.

The image ID (the digest of its configuration, which names every layer's digest) is the identity
the kit checks: it survives `podman save`/`load` in either archive format, where the manifest
digest does not. Podman runs with the kit's own configuration (images/containers.conf) and
store (`--root` under the cache), never the machine's defaults.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from glmdeploy.manifest import file_sha256
from glmdeploy_control import apt_sources, registry

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
CACHE = Path(os.environ.get("GLMDEPLOY_IMAGE_CACHE", "/var/cache/glmdeploy/images"))
#: Every file time in the base tar and the image's layers, and the image's creation time: a
#: constant, so a build next year gives the same ID (2024-07-01, the gpu-cu121 lock's date).
EPOCH = 1719792000
SUITE = "bookworm"
#: Packages of every image's base besides the registry's (the kit's and the profile's).
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
#: Bump to rebuild every base (a change in how it is made that its package list does not show).
BASE_REVISION = "1"


class ImageError(RuntimeError):
    """A problem the user can fix; printed without a traceback."""


def log(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def podman(*args: str, capture: bool = True, check: bool = True) -> subprocess.CompletedProcess[str]:
    """podman on the kit's store and configuration (never a pull: nothing is reachable)."""
    if not shutil.which("podman"):
        raise ImageError("podman is not installed: apt install podman buildah runc (as root)")
    store = CACHE / "store"
    cmd = [*podman_command(CACHE), *args]
    env = {**os.environ, "CONTAINERS_CONF": str(IMAGES / "containers.conf"), "TMPDIR": str(store / "tmp")}
    (store / "tmp").mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(cmd, env=env, text=True, capture_output=capture, check=False)
    if check and proc.returncode != 0:
        raise ImageError(f"podman {' '.join(args[:2])} failed:\n{(proc.stderr or '')[-3000:]}")
    return proc


def podman_command(cache: Path) -> list[str]:
    """podman on the store kept in `cache`; its run-time state lives under /run (podman refuses a
    runroot path longer than 50 characters)."""
    runroot = Path("/run/glmdeploy-images") / digest_of(str(cache.resolve()))[:12]
    store = cache / "store"
    return [
        "podman",
        "--root",
        str(store / "root"),
        "--runroot",
        str(runroot),
        "--tmpdir",
        str(store / "tmp"),
        "--storage-driver",
        "overlay",
    ]


def digest_of(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def image_id(name: str) -> str | None:
    proc = podman("image", "inspect", "--format", "{{.Id}}", name, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


# ---------------------------------------------------------------- base
def base_packages(reg: registry.Registry, profile: str) -> list[str]:
    return sorted({*BASE_PACKAGES, *reg.kit.packages, *reg.profile(profile).packages})


def ensure_base(reg: registry.Registry, profile: str) -> str:
    """The base image for `profile` (debootstrap minbase + its packages), made once; its name."""
    packages = base_packages(reg, profile)
    key = digest_of(BASE_REVISION, SUITE, *packages)[:12]
    name = f"localhost/glmdeploy-base:{key}"
    if image_id(name):
        return name
    tar = CACHE / f"base-{key}.tar"
    if not tar.exists():
        _debootstrap(packages, tar)
    log(f"importing the base {tar.name} ({tar.stat().st_size >> 20} MiB, sha256 {file_sha256(tar)[:12]})")
    podman("import", "--change", 'CMD ["/bin/bash"]', str(tar), name)
    return name


def _debootstrap(packages: list[str], tar: Path) -> None:
    if not shutil.which("debootstrap"):
        raise ImageError("debootstrap is not installed: apt install debootstrap (as root)")
    mirror = apt_sources.debian_mirror(SUITE)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=".base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"debootstrapping the base ({SUITE} minbase + {', '.join(packages)}; about two minutes, kept)")
        proc = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", SUITE, str(rootfs), mirror],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise ImageError(f"debootstrap failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        _strip(rootfs)
        part = tar.with_suffix(".tar.partial")
        # Sorted names, one time for every file, numeric owners, no atime/ctime: the same rootfs
        # gives the same bytes, and podman import takes the tar's own time as the image's.
        subprocess.run(
            [
                "tar",
                "--sort=name",
                f"--mtime=@{EPOCH}",
                "--clamp-mtime",
                "--numeric-owner",
                "--xattrs",
                "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
                "-C",
                str(rootfs),
                "-cf",
                str(part),
                ".",
            ],
            check=True,
        )
        os.utime(part, (EPOCH, EPOCH))
        part.rename(tar)


def _strip(rootfs: Path) -> None:
    """What differs between two debootstraps and no container needs: logs, caches, the machine id."""
    for rel in ("var/cache/apt", "var/lib/apt/lists", "var/log", "var/cache/debconf"):
        path = rootfs / rel
        if path.is_dir():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    (rootfs / "etc/machine-id").write_text("")
    for rel in ("var/lib/dbus/machine-id", "etc/hostname", "etc/resolv.conf"):
        (rootfs / rel).unlink(missing_ok=True)


# ---------------------------------------------------------------- image
def kit_wheel(out: Path) -> Path:
    """The kit's wheel built from this checkout (uv's build backend: same sources, same bytes)."""
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    subprocess.run(
        [uv, "build", "--wheel", "--offline", "--quiet", "--out-dir", str(out), str(ROOT / "service")], check=True
    )
    wheels = sorted(out.glob("glmdeploy-*.whl"))
    if len(wheels) != 1:
        raise ImageError(f"expected one kit wheel in {out}, found {[w.name for w in wheels]}")
    return wheels[0]


def build(profile: str, python: str, wheelhouse: Path, force: bool = False) -> dict[str, str]:
    """Build (or find) the image of `profile` for `python`; returns its name, ID and labels."""
    reg = registry.load()
    reg.profile(profile)
    if python not in reg.profile(profile).python:
        raise ImageError(f"profile {profile} has no lock for Python {python} (it has {reg.profile(profile).python})")
    lock = ROOT / "constraints" / reg.lock_name(profile, python)
    if not any(wheelhouse.glob("*.whl")):
        raise ImageError(f"no wheelhouse at {wheelhouse}: run `make wheelhouse PROFILE={profile}` first")
    CACHE.mkdir(parents=True, exist_ok=True)
    base = ensure_base(reg, profile)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=".ctx-") as tmp:
        ctx = Path(tmp)
        wheel = kit_wheel(ctx)
        shutil.copy2(lock, ctx / lock.name)
        shutil.copytree(ROOT / "smoke_tests", ctx / "smoke_tests", ignore=shutil.ignore_patterns("__pycache__"))
        inputs = {
            "containerfile": file_sha256(IMAGES / "Containerfile"),
            "lock": file_sha256(lock),
            "kit_wheel": file_sha256(wheel),
            "smoke_tests": _tree_digest(ctx / "smoke_tests"),
            "base": image_id(base) or "",
            "epoch": str(EPOCH),
            "podman": podman("--version").stdout.strip(),
        }
        key = digest_of(*(f"{k}={v}" for k, v in sorted(inputs.items())))[:16]
        name = f"localhost/glmdeploy-{reg.wheelhouse_name(profile, python)}:{key}"
        labels = {
            "org.glmdeploy.profile": profile,
            "org.glmdeploy.lock": lock.name,
            "org.glmdeploy.lock-sha256": inputs["lock"],
            "org.glmdeploy.kit-wheel": wheel.name,
            "org.glmdeploy.kit-wheel-sha256": inputs["kit_wheel"],
            "org.glmdeploy.base": inputs["base"],
            "org.glmdeploy.inputs": key,
        }
        found = image_id(name)
        if found and not force:
            log(f"{name} is built already ({found[:12]}): its inputs have not changed")
            return {"name": name, "id": found, **labels}
        log(f"building {name} from {lock.name} and {wheelhouse} (offline; a few minutes)")
        start = time.monotonic()
        args = [
            "build",
            "--pull=never",
            "--network",
            "none",
            "--timestamp",
            str(EPOCH),
            "--layers=false",
            "--identity-label=false",
            "--volume",
            f"{wheelhouse.resolve()}:/wheels:ro",
            "--build-arg",
            f"BASE={base}",
            "--build-arg",
            f"LOCK={lock.name}",
            "--build-arg",
            f"KIT_WHEEL={wheel.name}",
            "--build-arg",
            f"EPOCH={EPOCH}",
            *(arg for k, v in labels.items() for arg in ("--label", f"{k}={v}")),
            "--file",
            str(IMAGES / "Containerfile"),
            "--tag",
            name,
            str(ctx),
        ]
        podman(*args, capture=False)
    built = image_id(name) or ""
    log(f"built {name}: ID {built[:12]} in {time.monotonic() - start:.0f} s")
    return {"name": name, "id": built, **labels}


def _tree_digest(path: Path) -> str:
    parts = [f"{p.relative_to(path)}:{file_sha256(p)}" for p in sorted(path.rglob("*")) if p.is_file()]
    return digest_of(*parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy_control.image", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="build (or find, by its inputs' digest) a profile's image")
    p.add_argument("--profile", required=True)
    p.add_argument("--python", default="3.11", help="the image's Python minor version (the base's: %(default)s)")
    p.add_argument("--wheelhouse", type=Path, required=True, help="the profile's wheelhouse (make wheelhouse)")
    p.add_argument("--force", action="store_true", help="build again although an image of these inputs exists")
    p.add_argument("--json", type=Path, help="write the image's name, ID and labels here")
    args = parser.parse_args(argv)
    try:
        result = build(args.profile, args.python, args.wheelhouse, args.force)
    except (ImageError, registry.RegistryError, apt_sources.NoMirror) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
