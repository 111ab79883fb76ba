"""Lock tooling: resolve `.in` files into hash-locked sets, fetch and check wheelhouses.

Why a script and not bare `uv pip compile` in the Makefile: the resolve must be
dated, per Python version, must see the machine's own wheel mirrors (uv ignores
pip's configuration), and the wheelhouse must be checked against the lock before
any host is touched. Keeping that in one place keeps `make lock`, `make
wheelhouse` and the deploy preflight agreeing on file names.
"""

from __future__ import annotations

import argparse
import fcntl
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# How a lock is read and compared with an environment: shared with the node-side module that checks
# an environment before a deploy trusts it (module_utils, stdlib only; on the path through the
# tool environment's .pth, or PYTHONPATH where the Makefile runs this before that exists).
import glmdeploy_environment as environment
import glmdeploy_integrity as integrity

from glmdeploy_control import registry

#: The registry, and beside it the lock files and their `.in` sources.
PROFILES = registry.DEFAULT_PATH
CONSTRAINTS = PROFILES.parent


class LockError(RuntimeError):
    """A problem the user can fix; printed without a traceback."""


def load_profiles() -> dict[str, registry.LockSet]:
    """Every requirement set the registry names (node profiles and the others), by name."""
    try:
        return registry.load(PROFILES).lock_sets()
    except registry.RegistryError as exc:
        raise LockError(str(exc)) from exc


def _lock_set(sets: dict[str, registry.LockSet], name: str) -> registry.LockSet:
    if name not in sets:
        raise LockError(f"no requirement set {name!r} in {PROFILES.name}: it has {', '.join(sets)}")
    return sets[name]


def lock_path(profile: str, python: str, registry_file: Path = PROFILES) -> Path:
    """The lock a profile installs for a Python, beside `registry_file` (another checkout's, for make verify)."""
    return registry_file.parent / registry.load(registry_file).lock_name(profile, python)


def pip_config(option: str) -> list[str]:
    """The values of one option (find-links, index-url, ...) in this machine's pip configuration
    (uv does not read it), in every scope pip reads (global, user, site, environment)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    values: list[str] = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(f".{option}"):
            for item in value.strip().strip("'\"").split():
                if item not in values:
                    values.append(item)
    return values


def pip_find_links() -> list[str]:
    """Read find-links from this machine's pip configuration (uv does not)."""
    return pip_config("find-links")


def _usable(location: str) -> bool:
    """pip skips a file:// index that does not exist (with a warning); uv would stop on it."""
    return not location.startswith("file://") or Path(location.removeprefix("file://")).is_dir()


def uv_source_args() -> list[str]:
    """uv arguments for the package sources this machine's pip configuration names, so a uv
    install reads the same mirrors and wheel directories as pip would."""
    args: list[str] = []
    for link in pip_find_links():
        args += ["--find-links", link]
    for url in pip_config("index-url")[:1]:
        args += ["--index-url", url]
    for url in filter(_usable, pip_config("extra-index-url")):
        args += ["--extra-index-url", url]
    # pip takes the best match from all its indexes; uv by default only the first that has the
    # package. Every install here requires the lock's hashes, which is what rules out a substitute.
    return [*args, "--index-strategy", "unsafe-best-match"] if args else args


def cmd_uv_args(_args: argparse.Namespace) -> None:
    print(" ".join(uv_source_args()))


def parse_lock(path: Path) -> dict[str, tuple[str, set[str]]]:
    """Map normalised name -> (version, allowed sha256 set)."""
    if not path.exists():
        raise LockError(f"lock file {path} is missing: run `make lock`")
    return environment.parse_lock_text(path.read_text())


normalise = environment.normalise


def uv() -> str:
    exe = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(exe).exists():
        raise LockError("uv not found: run `make tools` first")
    return exe


def compile_one(name: str, spec: registry.LockSet, python: str, out: Path) -> None:
    cmd = [
        uv(),
        "pip",
        "compile",
        str(CONSTRAINTS / f"{name}.in"),
        "--generate-hashes",
        "--no-header",
        "--quiet",
        "--python-version",
        python,
        "--python-platform",
        "x86_64-manylinux_2_28",
        "--exclude-newer",
        spec.exclude_newer,
        "--output-file",
        str(out),
    ]
    for pkg in spec.no_emit:
        cmd += ["--no-emit-package", pkg]
    for pkg, date in spec.exclude_newer_package.items():
        cmd += ["--exclude-newer-package", f"{pkg}={date}"]
    if spec.local_wheels:
        for link in pip_find_links():
            cmd += ["--find-links", link]
    print(f"==> resolving {name} for Python {python} (releases before {spec.exclude_newer})", flush=True)
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LockError(f"resolving {name} for Python {python} failed:\n{result.stderr.strip()}")


def cmd_lock(args: argparse.Namespace) -> None:
    profiles = load_profiles()
    names = args.profile or list(profiles)
    for name in names:
        spec = _lock_set(profiles, name)
        for python in spec.python:
            compile_one(name, spec, python, lock_path(name, python))
            print(f"    wrote {lock_path(name, python).relative_to(CONSTRAINTS.parent)}")


def cmd_check(args: argparse.Namespace) -> None:
    """Re-resolve into a scratch dir and fail if any committed lock differs."""
    profiles = load_profiles()
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.profile or list(profiles):
            spec = _lock_set(profiles, name)
            for python in spec.python:
                fresh = Path(tmp) / lock_path(name, python).name
                compile_one(name, spec, python, fresh)
                committed = lock_path(name, python)
                if not committed.exists() or parse_lock(committed) != parse_lock(fresh):
                    stale.append(committed.name)
    if stale:
        raise LockError(f"lock files out of date: {', '.join(stale)}: run `make lock` and commit")
    print("==> all lock files match a fresh resolve")


def sha256(path: Path) -> str:
    """The file's SHA256, read once per process.

    A wheelhouse is checked several times in one run (before and after the cache sync, and the
    cache's hard links are the same files): 3.3 GB for gpu-cu121 took ~20 s a run. The memo is
    keyed by inode, size and modification time, and lives only as long as this process, so every
    run still reads every wheel at least once.
    """
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _SHA256_SEEN:
        _SHA256_SEEN[key] = integrity.file_sha256(path)
    return _SHA256_SEEN[key]


_SHA256_SEEN: dict[tuple[int, int, int, int], str] = {}


def wheel_name(filename: str) -> str:
    return normalise(filename.split("-")[0])


def verify_wheelhouse(lock: Path, wheelhouse: Path) -> list[str]:
    """Return problems; empty when every locked package has a wheel with a locked hash."""
    entries = parse_lock(lock)
    if not wheelhouse.is_dir():
        return [f"wheelhouse {wheelhouse} does not exist: run `make wheelhouse`"]
    found: dict[str, list[Path]] = {}
    for whl in sorted(wheelhouse.glob("*.whl")):
        found.setdefault(wheel_name(whl.name), []).append(whl)
    problems = []
    for name, (version, hashes) in sorted(entries.items()):
        candidates = [w for w in found.get(name, []) if f"-{version}-" in w.name]
        if not candidates:
            problems.append(f"missing wheel: {name}=={version} is not in {wheelhouse}")
            continue
        for whl in candidates:
            if sha256(whl) not in hashes:
                problems.append(f"tampered wheel: {whl.name} does not match any sha256 in {lock.name}")
    return problems


def platform_args(glibc_minor: int = 35) -> list[str]:
    """Every manylinux tag an x86_64 node with glibc 2.35 accepts (Ubuntu 22.04; Debian 12 has 2.36).

    With --platform, pip takes only the tags given (no expansion to older
    manylinux levels), so a wheel tagged manylinux2014 only would be missed.
    """
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc_minor, 4, -1)]
    tags += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    return [arg for tag in tags for arg in ("--platform", tag)]


def sync_cache(lock: Path, source: Path, target: Path) -> int:
    """Put every wheel of `source` whose sha256 the lock holds into `target`; returns how many were placed.

    Why a cache of our own: pip's cache does not cover every mirror kind, and a checkout's
    artifacts/ goes with the checkout; wheels kept per machine are fetched once. Each wheel is
    checked against the lock on the way, so a damaged cache entry is never used.
    """
    if not source.is_dir():
        return 0
    entries = parse_lock(lock)
    placed = 0
    try:
        target.mkdir(parents=True, exist_ok=True)
        for whl in sorted(source.glob("*.whl")):
            name = wheel_name(whl.name)
            if name not in entries or f"-{entries[name][0]}-" not in whl.name:
                continue
            hashes = entries[name][1]
            existing = target / whl.name
            if existing.exists() and sha256(existing) in hashes:
                continue
            if sha256(whl) in hashes:  # a damaged entry on the other side is replaced
                integrity.place(whl, existing)
                placed += 1
    except OSError as exc:  # the cache only saves time: a control node that cannot write it still works
        print(f"WARNING: wheel cache {target} not used: {exc}", file=sys.stderr)
    return placed


def cmd_wheelhouse(args: argparse.Namespace) -> None:
    lock = lock_path(args.profile, args.python)
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    # One filler per wheelhouse: `make test` starts the downloads in the background while the
    # linters run, and a deploy that needs the wheelhouse meanwhile waits for them here.
    with (dest.parent / f".{dest.name}.lock").open("w") as guard:
        try:
            fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"==> waiting for another download into {dest} to finish", flush=True)
            fcntl.flock(guard, fcntl.LOCK_EX)
        _fill_wheelhouse(args, lock, dest)


def _fill_wheelhouse(args: argparse.Namespace, lock: Path, dest: Path) -> None:
    cache = Path(args.cache) if args.cache else None
    tampered = [p for p in verify_wheelhouse(lock, dest) if p.startswith("tampered wheel:")]
    if tampered:
        # Never repaired behind the user's back: a wheel that does not match the lock is news.
        fix = f"fix: delete the named wheels from {dest} (or run `make wheelhouse PROFILE={args.profile}` after that)"
        raise LockError("\n".join([*tampered, fix]))
    placed = sync_cache(lock, cache, dest) if cache is not None and verify_wheelhouse(lock, dest) else 0
    if placed:
        print(f"==> {placed} wheels taken from the wheel cache {cache}", flush=True)
    if not verify_wheelhouse(lock, dest):
        print(
            f"==> wheelhouse {dest} {'filled from the cache and verified' if placed else 'already matches'} {lock.name}"
        )
        if cache is not None:
            sync_cache(lock, dest, cache)
        return
    print(f"==> downloading wheels for {lock.name} into {dest} (this takes a few minutes the first time)", flush=True)
    # pip (not uv) so the machine's own mirrors and find-links apply.
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "--progress-bar",
        "off",
        "--dest",
        str(dest),
        "--python-version",
        args.python,
        *platform_args(),
        "-r",
        str(lock),
    ]
    subprocess.run(cmd, check=True)
    problems = verify_wheelhouse(lock, dest)
    if problems:
        raise LockError("\n".join(problems))
    if cache is not None:
        sync_cache(lock, dest, cache)
    print(f"==> wheelhouse {dest} complete and verified against {lock.name}")


def cmd_verify(args: argparse.Namespace) -> None:
    lock = lock_path(args.profile, args.python)
    problems = verify_wheelhouse(lock, Path(args.dest))
    if problems:
        fix = f"fix: run `make wheelhouse PROFILE={args.profile}` to re-fetch the missing or damaged wheels"
        raise LockError("\n".join([*problems, fix]))
    print(f"==> {args.dest} matches {lock.name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy_control.lock", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("lock", help="resolve .in files into hash-locked <profile>-pyXY.txt")
    p.add_argument("profile", nargs="*", help="profiles to lock (default: all)")
    p.set_defaults(func=cmd_lock)
    p = sub.add_parser("check", help="fail if a committed lock differs from a fresh resolve")
    p.add_argument("profile", nargs="*")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("uv-args", help="print uv's --find-links/--index-url arguments from this machine's pip config")
    p.set_defaults(func=cmd_uv_args)
    for verb, func, helptext in (
        ("wheelhouse", cmd_wheelhouse, "download a profile's wheels and verify them"),
        ("verify", cmd_verify, "check a wheelhouse against its lock (missing or tampered wheels)"),
    ):
        p = sub.add_parser(verb, help=helptext)
        p.add_argument("--profile", required=True)
        p.add_argument("--python", default="3.11")
        p.add_argument("--dest", required=True, help="wheelhouse directory")
        if verb == "wheelhouse":
            p.add_argument("--cache", default="", help="wheels kept on this machine across checkouts (checked by hash)")
        p.set_defaults(func=func)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except LockError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"ERROR: {' '.join(map(str, exc.cmd[:4]))} ... exited {exc.returncode}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
