"""Pack a source tree into one reproducible tar for the nodes.

Copying a tree of small files file by file costs one Ansible module round trip
per file (about half a second each over SSH: 25 s for the kit's package on three
hosts). One archive is one transfer, and because the archive is byte-identical
for identical content (names sorted, times, owners and modes fixed), the copy
reports a change only when a file really changed, which keeps re-runs at
`changed=0`. The archive is rewritten only when its bytes differ, through a
temporary file and a rename, so a reader never sees half an archive.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import sys
import tarfile
from pathlib import Path


def members(src: Path, patterns: list[str]) -> list[Path]:
    """Files under `src` matching any glob pattern, sorted, caches left out."""
    found = {p for pattern in patterns for p in src.glob(pattern) if p.is_file()}
    return sorted(p for p in found if "__pycache__" not in p.parts and p.suffix != ".pyc")


def pack(src: Path, patterns: list[str]) -> bytes:
    """The archive's bytes: root-owned, 0644 files and 0755 directories, time 0."""
    files = members(src, patterns)
    if not files:
        raise ValueError(f"no files under {src} match {', '.join(patterns)}")
    dirs = sorted({parent for f in files for parent in f.relative_to(src).parents if parent != Path(".")})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for d in dirs:
            info = _info(str(d), tarfile.DIRTYPE, 0o755)
            tar.addfile(info)
        for f in files:
            data = f.read_bytes()
            info = _info(str(f.relative_to(src)), tarfile.REGTYPE, 0o644)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _info(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def write_if_changed(data: bytes, out: Path) -> bool:
    """Replace `out` atomically when its bytes differ; True when it was (re)written."""
    if out.is_file() and out.read_bytes() == data:
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glmdeploy_control.bundle",
        description="Pack files of a source tree into one reproducible tar (for one-transfer copies to nodes).",
    )
    parser.add_argument("src", type=Path, help="source directory")
    parser.add_argument("out", type=Path, help="archive to write (rewritten only when its content changes)")
    parser.add_argument(
        "--include", action="append", required=True, metavar="GLOB", help="glob relative to src (repeatable)"
    )
    args = parser.parse_args(argv)
    if not args.src.is_dir():
        print(f"error: {args.src} is not a directory", file=sys.stderr)
        return 2
    try:
        data = pack(args.src, args.include)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    changed = write_if_changed(data, args.out)
    digest = hashlib.sha256(data).hexdigest()
    print(f"{'wrote' if changed else 'unchanged'} {args.out} ({len(data)} bytes, sha256 {digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
