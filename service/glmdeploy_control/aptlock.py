"""The distribution half of a node, locked and served offline: `make lock`, `make lock-check`, the kit's apt repository.

Why: the Python half of a node is hash-locked and installed offline; the distribution packages
(nginx, nftables, the exporters, Prometheus, the driver and its DKMS build) used to come from
whatever apt source a node reached at deploy time, so two nodes deployed a month apart differed
and a node without internet could not be deployed at all. Here:

- ``lock`` resolves, for one node OS release, every package the kit installs (the registry's
  ``[kit.apt]``, ``[kit].packages``, the profiles' packages, the image host's packages, the
  driver's and the headers of the release's kernel) with **apt's own resolver**, against that
  release's signed indexes from the mirror this machine's apt configuration names, into
  constraints/apt/<release>.lock: exact versions, each with the SHA256 the signed ``Packages``
  index gives. The resolve starts from an empty system, so the lock also carries the base
  packages the kit's packages depend on (a node with an older base can still install from the
  repository alone; docs/decisions.md, "The apt lock"). The same indexes give the same bytes.
- ``check`` resolves again and names every package whose locked version is no longer what the
  mirror gives (``make lock-check``).
- ``repo`` builds the kit's repository of a lock under artifacts/apt/<release>-<lock digest>/:
  the .debs fetched by ``apt-get download`` (apt checks them against the signed index), each
  checked again against the lock, indexed by ``apt-ftparchive`` and signed (``InRelease``) by the
  kit's own key in artifacts/secrets/apt/ (created on first use). Nodes trust only that key, for
  that repository only (library/glmdeploy_apt.py).

Each resolve runs apt with a private configuration (its own sources, lists, cache and an empty
dpkg status): nothing of this machine's apt state is read or changed, and no root is needed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from glmdeploy.manifest import file_sha256
from glmdeploy_control import apt_sources, registry

ROOT = Path(__file__).resolve().parents[2]
ARCH = "amd64"
#: Where downloaded .debs are kept across checkouts (checked against the lock on every use).
DEFAULT_CACHE = Path(os.environ.get("GLMDEPLOY_APT_CACHE", "/var/cache/glmdeploy/apt"))
KEY_NAME = "glmdeploy apt repository"


class AptLockError(RuntimeError):
    """A problem the user fixes; the message names it and the fix."""


def log(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- apt with a private configuration
@dataclass
class PrivateApt:
    """apt-get/apt-cache on one release's indexes, in a directory of their own."""

    workdir: Path
    sources: list[str]

    def options(self) -> list[str]:
        w = self.workdir
        return [
            "-o", f"Dir::Etc::SourceList={w / 'sources.list'}",
            "-o", f"Dir::Etc::SourceParts={w / 'sources.list.d'}",
            "-o", f"Dir::Etc::Preferences={w / 'preferences'}",
            "-o", f"Dir::Etc::PreferencesParts={w / 'preferences.d'}",
            "-o", f"Dir::State={w / 'state'}",
            "-o", f"Dir::State::status={w / 'status'}",
            "-o", f"Dir::Cache={w / 'cache'}",
            "-o", "Debug::NoLocking=1",
            "-o", f"APT::Architecture={ARCH}",
            "-o", f"APT::Architectures::={ARCH}",
            "-o", "Acquire::Languages=none",
            "-o", "Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false",
            "-o", "APT::Install-Recommends=false",
            "-o", "APT::Sandbox::User=root" if os.getuid() == 0 else "APT::Sandbox::User=",
            "-o", "Acquire::ForceHash=SHA256",
        ]  # fmt: skip

    def prepare(self) -> None:
        for sub in ("sources.list.d", "preferences.d", "state/lists/partial", "cache/archives/partial"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        (self.workdir / "sources.list").write_text("".join(line + "\n" for line in self.sources))
        (self.workdir / "status").touch()

    def run(self, tool: str, *args: str) -> str:
        proc = subprocess.run(
            [tool, *self.options(), *args], capture_output=True, text=True, check=False, env=_apt_env()
        )
        if proc.returncode != 0:
            raise AptLockError(
                f"{tool} {' '.join(args[:3])}... failed:\n{(proc.stderr or proc.stdout).strip()[-2000:]}"
            )
        return proc.stdout


def _apt_env() -> dict[str, str]:
    return {**os.environ, "LC_ALL": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}


def mirror_sources(release: registry.AptRelease, mirror: str | None, codenames: set[str] | None = None) -> list[str]:
    """The one-line sources of a release: each suite from the archive this machine's apt sources
    use for it, or for the same suite of another release of the distribution (`codenames`: the
    codename swapped, as the test hosts' Debian 13 sources are made), or from `mirror`."""
    suites = [s.format(codename=release.codename) for s in release.suites]
    known = [
        (uri, name)
        for uri, name in apt_sources.apt_mirrors()
        if name.split("-")[0] in (codenames or {release.codename})
    ]
    archives = {}
    for suite in suites:
        suffix = suite[len(release.codename) :]
        match = [uri for uri, name in known if name == suite] or [
            uri for uri, name in known if name[len(name.split("-")[0]) :] == suffix
        ]
        if mirror:
            archives[suite] = mirror
        elif match:
            archives[suite] = match[0]
        else:
            raise AptLockError(
                f"no archive for {suite} in this machine's apt sources; fix: add the {release.distribution} "
                "archive there, or name its mirror (make lock APT_MIRROR=<uri>)"
            )
    if not Path(release.keyring).exists():
        raise AptLockError(
            f"{release.keyring} (the archive's signing keys) is missing; "
            "fix: apt install the distribution's keyring package"
        )
    components = " ".join(release.components)
    return [f"deb [signed-by={release.keyring}] {uri} {suite} {components}" for suite, uri in archives.items()]


def _codenames(reg: registry.Registry, release: registry.AptRelease) -> set[str]:
    return {r.codename for r in reg.kit.apt.releases.values() if r.distribution == release.distribution}


# ---------------------------------------------------------------- resolve
def wanted(reg: registry.Registry, release: registry.AptRelease) -> dict[str, list[str]]:
    """The registry's package sets that apply to a release (the driver's only where GPU profiles run)."""
    sets = reg.apt_packages()
    return {
        name: names
        for name, names in sets.items()
        if not name.startswith("nvidia_driver/") or (release.gpu and name == f"nvidia_driver/{release.distribution}")
    }


def resolve(reg: registry.Registry, name: str, mirror: str | None = None) -> dict[str, object]:
    """The lock of one release, as data (written by `write_lock`)."""
    release = reg.kit.apt.releases[name]
    with tempfile.TemporaryDirectory(prefix="glmdeploy-aptlock-") as tmp:
        apt = PrivateApt(Path(tmp), mirror_sources(release, mirror, _codenames(reg, release)))
        apt.prepare()
        log(f"{name}: reading the {release.codename} indexes ({', '.join(apt.sources)})")
        apt.run("apt-get", "update", "-q")
        sets = wanted(reg, release)
        kernels: list[str] = []
        if release.gpu:
            kernels = sorted({_current_kernel(apt, release), *release.kernels})
            sets["kernel_headers"] = [f"linux-headers-{k}" for k in kernels]
        # Each installer's own resolve as well as the union's: apt may pick another alternative
        # (`gcc | c-compiler`) for one role alone than for all together, and a node installs one
        # role at a time; the repository carries both.
        names = sorted({n for group in sets.values() for n in group})
        packages = _closure(apt, names)
        per_set = {}
        for group, names_ in sets.items():
            own = _closure(apt, names_)
            per_set[group] = sorted(own)
            packages.update(own)
        packages = dict(sorted(packages.items()))
    return {
        "release": name,
        "distribution": release.distribution,
        "version": release.version,
        "architecture": ARCH,
        "kernels": kernels,
        "installs": {group: sorted(names_) for group, names_ in sets.items()},
        "closure": per_set,
        "packages": packages,
    }


def _current_kernel(apt: PrivateApt, release: registry.AptRelease) -> str:
    """The kernel ABI the release's headers meta-package names now ("6.1.0-41-amd64")."""
    out = apt.run("apt-cache", "depends", "--important", release.kernel_headers_meta)
    for line in out.splitlines():
        match = re.match(r"\s*Depends:\s+linux-headers-(\S+)$", line)
        if match and not match.group(1).startswith("common"):
            return match.group(1)
    raise AptLockError(f"{release.kernel_headers_meta} names no kernel headers in {release.codename}: {out.strip()}")


def _closure(apt: PrivateApt, names: list[str]) -> dict[str, dict[str, object]]:
    """Every package apt installs for `names` on an empty system, with version, file, size, SHA256.

    apt's own resolver picks the versions and alternatives (as it will on a node); --print-uris
    prints each file with the SHA256 of the signed index, so no index is parsed here.
    """
    out = apt.run("apt-get", "install", "--print-uris", "-qq", "--no-install-recommends", *names)
    packages: dict[str, dict[str, object]] = {}
    for line in out.splitlines():
        match = re.match(r"^'(\S+)' (\S+) (\d+) SHA256:([0-9a-f]{64})$", line)
        if not match:
            continue
        url, filename, size, sha256 = match.groups()
        package, version, arch = filename[: -len(".deb")].split("_")
        packages[package] = {
            "version": urllib.parse.unquote(version),
            "architecture": arch,
            "filename": filename,
            "pool": urllib.parse.unquote(url.split("/pool/", 1)[1]) if "/pool/" in url else filename,
            "size": int(size),
            "sha256": sha256,
        }
    missing = [n for n in names if n not in packages]
    if missing:
        raise AptLockError(f"apt resolved no file for {', '.join(missing)}: {out.strip()[-500:]}")
    return dict(sorted(packages.items()))


def lock_path(reg: registry.Registry, name: str) -> Path:
    """constraints/apt/<release>.lock beside the registry that names it."""
    return reg.path.parent / reg.apt_lock_name(name)


def render(lock: dict[str, object]) -> str:
    return json.dumps(lock, indent=1, sort_keys=True) + "\n"


def write_lock(reg: registry.Registry, name: str, mirror: str | None) -> Path:
    lock = resolve(reg, name, mirror)
    path = lock_path(reg, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(lock))
    packages = lock["packages"]
    assert isinstance(packages, dict)
    total = sum(int(p["size"]) for p in packages.values())
    log(f"{name}: {len(packages)} packages ({total / 1e6:.0f} MB) -> {path}")
    return path


def drift(committed: dict[str, object], fresh: dict[str, object]) -> list[str]:
    """Lines naming what a fresh resolve gives differently from the committed lock."""
    old = committed.get("packages", {})
    new = fresh.get("packages", {})
    assert isinstance(old, dict) and isinstance(new, dict)
    lines = []
    for package in sorted(set(old) | set(new)):
        before = old.get(package, {}).get("version", "(none)")
        after = new.get(package, {}).get("version", "(none)")
        if before != after or old.get(package, {}).get("sha256") != new.get(package, {}).get("sha256"):
            lines.append(f"  {package}: locked {before}, the mirror gives {after}")
    for key in ("kernels", "installs"):
        if committed.get(key) != fresh.get(key):
            lines.append(f"  {key}: locked {committed.get(key)}, now {fresh.get(key)}")
    return lines


def read_lock(reg: registry.Registry, name: str) -> dict[str, object]:
    path = lock_path(reg, name)
    if not path.exists():
        raise AptLockError(f"{path} does not exist; fix: make lock")
    data: dict[str, object] = json.loads(path.read_text())
    return data


def input_drift(reg: registry.Registry, name: str, lock: dict[str, object]) -> list[str]:
    """What the registry asks for that the committed lock was not resolved from (offline)."""
    release = reg.kit.apt.releases[name]
    installs = lock.get("installs", {})
    assert isinstance(installs, dict)
    lines = []
    for group, names in wanted(reg, release).items():
        if sorted(names) != installs.get(group):
            lines.append(f"  {group}: the registry asks for {sorted(names)}, the lock has {installs.get(group)}")
    kernels = lock.get("kernels", [])
    assert isinstance(kernels, list)
    for kernel in release.kernels:
        if kernel not in kernels:
            lines.append(f"  kernels: the registry asks for the headers of {kernel}, the lock has {kernels}")
    return lines


def check(reg: registry.Registry, releases: list[str], mirror: str | None, strict: bool) -> int:
    """Exit 1 when a lock no longer matches its input (the registry); versions the mirror has moved
    past since are named, and fail only with `strict`: the archive moves on its own (security
    updates), and a commit that did not touch the lock must not fail for it (docs/decisions.md)."""
    failed = False
    for name in releases:
        lock = read_lock(reg, name)
        where = reg.apt_lock_name(name)
        lines = input_drift(reg, name, lock)
        if lines:
            failed = True
            print(f"{where} was not resolved from what the registry asks now:\n" + "\n".join(lines))
            continue
        try:
            moved = drift(lock, resolve(reg, name, mirror))
        except AptLockError as err:
            print(f"{where}: matches the registry; the mirror could not be read ({err}); versions not compared")
            failed = failed or strict
            continue
        if moved:
            failed = failed or strict
            print(f"{where}: matches the registry; the mirror has moved since it was resolved:\n" + "\n".join(moved))
            print("  (make lock takes the new versions; until then every node keeps the locked ones)")
        else:
            print(f"{where}: up to date")
    if failed:
        print("fix: make lock (then commit constraints/apt/)")
    return 1 if failed else 0


def sizes(lock: dict[str, object]) -> str:
    """A table: each installer's closure (packages, MB), then the whole repository."""
    packages = lock["packages"]
    closure = lock.get("closure", {})
    assert isinstance(packages, dict) and isinstance(closure, dict)

    def mb(names: list[str]) -> str:
        return f"{sum(int(packages[n]['size']) for n in names) / 1e6:.1f}"

    rows = [f"{lock['release']}: installer | packages | MB", "---|---|---"]
    rows += [f"{group} | {len(names)} | {mb(names)}" for group, names in sorted(closure.items())]
    rows.append(f"the repository | {len(packages)} | {mb(list(packages))}")
    return "\n".join(rows)


# ---------------------------------------------------------------- the repository
def repo_name(reg: registry.Registry, name: str, lock_file: Path | None = None) -> str:
    """The repository's directory: the release and the lock's digest (a new lock, a new repository)."""
    return f"{name}-{hashlib.sha256((lock_file or lock_path(reg, name)).read_bytes()).hexdigest()[:12]}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def signing_key(artifacts: Path) -> tuple[Path, Path]:
    """The kit's repository key (GnuPG home under artifacts/secrets/apt/, made on first use) and
    its public half, exported beside the repositories (artifacts/apt/glmdeploy-apt.asc)."""
    home = artifacts / "secrets" / "apt"
    public = artifacts / "apt" / "glmdeploy-apt.asc"
    if shutil.which("gpg") is None:
        raise AptLockError(
            "gpg is not installed on this control node; fix: apt install gnupg (it signs the kit's apt repository)"
        )
    with _locked(artifacts / "apt" / ".key.lock"):
        if not (home / "ready").exists():
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir(parents=True, mode=0o700)
            log(f"creating the kit's apt repository key in {home}")
            _gpg(home, "--quick-gen-key", KEY_NAME, "ed25519", "sign", "never")
            (home / "ready").touch()
        if not public.exists():
            public.parent.mkdir(parents=True, exist_ok=True)
            armored = _gpg(home, "--armor", "--export", KEY_NAME)
            tmp = public.with_suffix(".tmp")
            tmp.write_text(armored)
            tmp.replace(public)
    return home, public


def _gpg(home: Path, *args: str) -> str:
    """gpg on the kit's key, run in a short copy of its home under the system's temporary directory.

    Why a copy: gpg reaches its agent through a socket in the home directory, and a socket's path
    is limited to 108 bytes. A checkout at a long path (a second control node restored under a
    user's project tree) failed to sign with "No agent running". The copy's agent is stopped and
    what gpg wrote (a new key, its trust database) goes back to the kit's home.
    """
    with tempfile.TemporaryDirectory(prefix="glmdeploy-gpg-") as short:
        shutil.copytree(home, short, dirs_exist_ok=True, ignore=shutil.ignore_patterns("S.*"))
        os.chmod(short, 0o700)
        try:
            proc = subprocess.run(
                ["gpg", "--homedir", short, "--batch", "--quiet", "--pinentry-mode", "loopback", "--passphrase", "",
                 *args],
                capture_output=True,
                text=True,
                check=False,
            )  # fmt: skip
        finally:
            subprocess.run(["gpgconf", "--homedir", short, "--kill", "all"], capture_output=True, check=False)
        if proc.returncode == 0:
            shutil.copytree(short, home, dirs_exist_ok=True, ignore=shutil.ignore_patterns("S.*"))
    if proc.returncode != 0:
        raise AptLockError(f"gpg {args[0]} failed: {proc.stderr.strip()[-800:]}")
    return proc.stdout


def build_repo(
    reg: registry.Registry,
    name: str,
    artifacts: Path,
    cache: Path,
    mirror: str | None = None,
    lock_file: Path | None = None,
) -> Path:
    """artifacts/apt/<release>-<digest>/: the lock's .debs, checked, indexed and signed; made once.
    `lock_file`: another lock of the release than the committed one (an update drill's older lock)."""
    lock = json.loads(lock_file.read_text()) if lock_file else read_lock(reg, name)
    repo = artifacts / "apt" / repo_name(reg, name, lock_file)
    if (repo / "InRelease").exists():
        return repo
    if shutil.which("apt-ftparchive") is None:
        raise AptLockError("apt-ftparchive is not installed on this control node; fix: apt install apt-utils")
    home, _ = signing_key(artifacts)
    with _locked(artifacts / "apt" / f".{name}.lock"):
        if (repo / "InRelease").exists():  # another node of the run built it meanwhile
            return repo
        packages = lock["packages"]
        assert isinstance(packages, dict)
        debs = cache / name
        _fetch(reg, name, packages, debs, mirror)
        tmp = repo.with_name(f".{repo.name}.new")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for package, entry in packages.items():
            src = debs / str(entry["filename"])
            if file_sha256(src) != entry["sha256"]:
                src.unlink()
                raise AptLockError(
                    f"{src} ({package} {entry['version']}) does not match the lock's SHA256; it was removed. "
                    "fix: run the command again (it downloads the file again)"
                )
            with contextlib.suppress(OSError):
                os.link(src, tmp / src.name)
            if not (tmp / src.name).exists():
                shutil.copy2(src, tmp / src.name)
        _index(tmp, name, home)
        shutil.rmtree(repo, ignore_errors=True)
        tmp.rename(repo)
    size = sum(int(e["size"]) for e in packages.values())
    log(f"apt repository {repo} ready: {len(packages)} packages, {size / 1e6:.0f} MB, signed")
    return repo


def _fetch(
    reg: registry.Registry, name: str, packages: dict[str, dict[str, object]], debs: Path, mirror: str | None
) -> None:
    """Every locked .deb into the cache that is not there with the lock's SHA256 (apt-get download:
    apt checks each against the release's signed index)."""
    debs.mkdir(parents=True, exist_ok=True)
    missing = [
        (p, e)
        for p, e in packages.items()
        if not (debs / str(e["filename"])).exists() or file_sha256(debs / str(e["filename"])) != e["sha256"]
    ]
    if not missing:
        return
    for _, entry in missing:  # a damaged copy would be taken as downloaded (apt-get skips a file that is there)
        (debs / str(entry["filename"])).unlink(missing_ok=True)
    release = reg.kit.apt.releases[name]
    size = sum(int(str(e["size"])) for _, e in missing)
    log(f"{name}: downloading {len(missing)} of {len(packages)} locked packages ({size / 1e6:.0f} MB) into {debs}")
    with tempfile.TemporaryDirectory(prefix="glmdeploy-aptrepo-") as tmp:
        apt = PrivateApt(Path(tmp), mirror_sources(release, mirror, _codenames(reg, release)))
        apt.prepare()
        apt.run("apt-get", "update", "-q")
        specs = [f"{p}={e['version']}" for p, e in missing]
        proc = subprocess.run(
            ["apt-get", *apt.options(), "download", "-q", *specs],
            cwd=debs,
            capture_output=True,
            text=True,
            check=False,
            env=_apt_env(),
        )
        if proc.returncode != 0:
            gone = re.findall(r"Version '([^']+)' for '([^']+)' was not found", proc.stderr)
            hint = f" ({', '.join(f'{p} {v}' for v, p in gone)} no longer on the mirror)" if gone else ""
            raise AptLockError(
                f"downloading the locked packages of {name} failed{hint}:\n{proc.stderr.strip()[-1500:]}\n"
                "fix: make lock (re-resolve against the mirror as it is now), or name a mirror that still carries "
                "these versions (a snapshot of the archive: APT_MIRROR=<uri>)"
            )


def _index(repo: Path, name: str, home: Path) -> None:
    """Packages and a Release signed into InRelease (apt-ftparchive, gpg): a flat repository."""
    packages = subprocess.run(["apt-ftparchive", "packages", "."], cwd=repo, capture_output=True, text=True, check=True)
    (repo / "Packages").write_text(packages.stdout)
    release = subprocess.run(
        [
            "apt-ftparchive",
            "-o", "APT::FTPArchive::Release::Origin=glmdeploy",
            "-o", "APT::FTPArchive::Release::Label=glmdeploy",
            "-o", f"APT::FTPArchive::Release::Suite={name}",
            "-o", f"APT::FTPArchive::Release::Codename={name}",
            "-o", f"APT::FTPArchive::Release::Architectures={ARCH}",
            "release", ".",
        ],
        cwd=repo, capture_output=True, text=True, check=True,
    )  # fmt: skip
    (repo / "Release").write_text(release.stdout)
    _gpg(
        home,
        "--local-user",
        KEY_NAME,
        "--digest-algo",
        "SHA512",
        "--clearsign",
        "--output",
        str(repo / "InRelease"),
        str(repo / "Release"),
    )


# ---------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glmdeploy_control.aptlock",
        description=__doc__.splitlines()[0],
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for cmd, text in (
        ("lock", "resolve each release's lock from the mirror and write it"),
        ("check", "resolve again; exit 1 naming every package that drifted from the committed lock"),
        ("repo", "build the repository of a release's lock under ARTIFACTS/apt/ (once; prints its directory)"),
        ("name", "print the repository's directory name of a release's lock"),
        (
            "sizes",
            "print what each installer's packages weigh in each release's lock (what a node of that role fetches)",
        ),
    ):
        p = sub.add_parser(cmd, help=text, description=text)
        p.add_argument("--release", action="append", help="a release of [kit.apt.releases] (repeatable; default: all)")
        p.add_argument("--mirror", help="the archive's URI for a release this machine's apt sources do not carry")
        if cmd == "check":
            p.add_argument(
                "--strict",
                action="store_true",
                help="fail on versions the mirror has moved past too (default: name them)",
            )
        if cmd == "repo":
            p.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
            p.add_argument(
                "--cache", type=Path, default=DEFAULT_CACHE, help=f"downloaded .debs (default {DEFAULT_CACHE})"
            )
            p.add_argument("--lock", type=Path, help="another lock file of the release (default: the committed one)")
    args = parser.parse_args(argv)
    reg = registry.load()
    releases = args.release or list(reg.kit.apt.releases)
    try:
        for name in releases:
            reg.apt_lock_name(name)
        if args.command == "lock":
            for name in releases:
                write_lock(reg, name, args.mirror)
        elif args.command == "check":
            return check(reg, releases, args.mirror, args.strict)
        elif args.command == "repo":
            for name in releases:
                print(build_repo(reg, name, args.artifacts, args.cache, args.mirror, args.lock))
        elif args.command == "sizes":
            for name in releases:
                print(sizes(read_lock(reg, name)))
        else:
            for name in releases:
                print(repo_name(reg, name))
    except (AptLockError, registry.RegistryError) as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
