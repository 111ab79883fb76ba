"""What a control node must not lose, in one archive (`make backup`), and taken up by another
checkout (`make restore`).

Why: a fleet is driven from one checkout, often on a laptop. Its secrets (the deployment's API
key, the users' key digests, the lab CA and its key, the apt repository's signing key) and its
recordings (tokenizer golden files, output recordings, throughput baselines) and locks exist
there only; without them a second admin's checkout would mint a new API key (every user locked
out), a new CA (every client's trust broken) and a new apt key (every node's repository refused).

The archive is a gzip'd tar written with mode 0600, holding a manifest (each file's SHA-256 and
mode, the kit's commit); `restore` checks every file against it before anything is written,
never overwrites a file that differs unless told to (naming each), and writes each file whole
(a temporary name renamed into place). Not encrypted: the lab keeps it like a password, or
encrypts it at rest (`gpg --symmetric`); both commands say so.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from glmdeploy_control import registry

ROOT = registry.ROOT
#: What a control node keeps that a fresh checkout lacks or may differ in: every file below these.
KEPT = (
    "artifacts/secrets",
    "constraints",
    "smoke_tests/golden",
    "smoke_tests/outputs",
    "smoke_tests/baselines",
)
#: The secrets a fleet depends on, by what they are, for `lacks` (paths under the checkout).
SECRETS = {
    "artifacts/secrets/api_key": "the deployment's API key (nodes behind a balancer require it)",
    "artifacts/secrets/api-keys.json": "the users' API key digests (make keys)",
    "artifacts/secrets/tls": "the lab CA and its key (the balancer's TLS)",
    "artifacts/secrets/apt": "the kit's apt repository signing key (every node trusts it)",
}
MANIFEST = "glmdeploy-backup.json"
WARNING = (
    "it holds the deployment's API key and the private keys of the lab CA and the apt repository: "
    "keep it like a password (mode 0600 here; encrypt it at rest, e.g. gpg --symmetric)"
)


class BackupError(RuntimeError):
    """A problem the user can fix; printed without a traceback."""


@dataclass(frozen=True)
class Entry:
    path: str
    sha256: str
    mode: int


def _files(root: Path, inventory: Path | None) -> list[Path]:
    found = [p for top in KEPT for p in sorted((root / top).rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    if inventory is not None:
        found.append(inventory.resolve())
    return found


def _name(root: Path, path: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError as exc:
        raise BackupError(f"{path} is outside the checkout {root}: fix: keep the inventory in the checkout") from exc


def _commit(root: Path) -> str:
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def write(root: Path, out: Path, inventory: Path | None = None) -> list[Entry]:
    """The archive at `out` (mode 0600, written whole); the entries it holds."""
    if out.exists():
        raise BackupError(f"{out} exists: fix: name another file (OUT=...), or move it away first")
    files = _files(root, inventory)
    entries = [
        Entry(_name(root, p), hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode & 0o777) for p in files
    ]
    manifest = {
        "kit_commit": _commit(root),
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": [e.__dict__ for e in entries],
    }
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        data = json.dumps(manifest, indent=2).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mode = len(data), 0o600
        tar.addfile(info, io.BytesIO(data))
        for path, entry in zip(files, entries, strict=True):
            tar.add(path, arcname=entry.path, recursive=False)
    tmp.replace(out)
    return entries


def _read(archive: Path) -> tuple[dict[str, object], dict[str, bytes]]:
    """The manifest and every file's bytes, each checked against the manifest."""
    if not archive.is_file():
        raise BackupError(f"no archive at {archive}: fix: ARCHIVE=<the file make backup wrote>")
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
            if MANIFEST not in members:
                raise BackupError(f"{archive} is not a glmdeploy backup (no {MANIFEST})")
            manifest = json.loads(tar.extractfile(members[MANIFEST]).read())  # type: ignore[union-attr]
            data = {name: tar.extractfile(m).read() for name, m in members.items() if name != MANIFEST}  # type: ignore[union-attr]
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise BackupError(f"{archive} cannot be read ({exc}): fix: use the file make backup wrote, whole") from exc
    for entry in manifest["files"]:
        name = entry["path"]
        if name.startswith("/") or ".." in Path(name).parts:
            raise BackupError(f"{archive}: {name!r} points outside the checkout; nothing was restored")
        if name not in data or hashlib.sha256(data[name]).hexdigest() != entry["sha256"]:
            raise BackupError(
                f"{archive}: {name} does not match its manifest (damaged or altered); nothing was restored"
            )
    return manifest, data


def restore(root: Path, archive: Path, force: bool = False) -> tuple[list[str], list[str], str]:
    """(written, already the same, the kit commit it was written by): every file of the archive into
    `root`. A file there that differs is refused, all of them named, before anything is written,
    unless `force`."""
    manifest, data = _read(archive)
    entries = manifest["files"]
    assert isinstance(entries, list)
    differ = [
        e["path"]
        for e in entries
        if (root / e["path"]).exists() and hashlib.sha256((root / e["path"]).read_bytes()).hexdigest() != e["sha256"]
    ]
    if differ and not force:
        raise BackupError(
            f"{len(differ)} file(s) here differ from the archive: {', '.join(differ[:8])}"
            f"{' ...' if len(differ) > 8 else ''}. Nothing was restored. fix: FORCE=1 to replace them with the "
            "archive's (a checkout that already drives the fleet keeps its own: restore into a fresh one)"
        )
    written, same = [], []
    for e in entries:
        dest = root / e["path"]
        if dest.exists() and e["path"] not in differ:
            same.append(e["path"])
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        if e["path"].startswith("artifacts/secrets/"):
            for folder in (root / "artifacts/secrets", dest.parent):
                os.chmod(folder, 0o700)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data[e["path"]])
        os.chmod(tmp, e["mode"])
        tmp.replace(dest)
        written.append(e["path"])
    return written, same, str(manifest.get("kit_commit", "unknown"))


def lacks(root: Path) -> list[str]:
    """The fleet's secrets this checkout does not hold, each with what it is."""
    return [f"{path}: {what}" for path, what in SECRETS.items() if not (root / path).exists()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy_control.backup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the kit checkout (default: %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write the archive (make backup)")
    w.add_argument("--out", type=Path, required=True, help="the archive to write (must not exist)")
    w.add_argument("--inventory", type=Path, help="an inventory file of the checkout to keep with it")
    r = sub.add_parser("restore", help="take an archive up into this checkout (make restore)")
    r.add_argument("archive", type=Path)
    r.add_argument("--force", action="store_true", help="replace files here that differ from the archive's")
    sub.add_parser("lacks", help="name the fleet's secrets this checkout does not hold")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        if args.command == "write":
            entries = write(root, args.out, args.inventory)
            print(f"==> {args.out}: {len(entries)} files, mode 0600. Warning: {WARNING}.")
            missing = lacks(root)
            if missing:
                print(f"==> not in it, since this checkout has none yet: {'; '.join(missing)}")
        elif args.command == "restore":
            written, same, commit = restore(root, args.archive, args.force)
            print(f"==> restored {len(written)} file(s) into {root}; {len(same)} were already the same")
            if commit != _commit(root):
                print(
                    f"==> written by the kit at {commit}, this checkout is at {_commit(root)}: check out that commit "
                    "first if this one's locks or recordings should not be replaced"
                )
            print(f"==> {args.archive}: {WARNING}; remove the copy here once it is kept elsewhere")
        else:
            missing = lacks(root)
            print("\n".join(missing) if missing else "this checkout holds every secret the fleet depends on")
            return 1 if missing else 0
    except BackupError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
