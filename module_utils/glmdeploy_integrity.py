"""File integrity: a file's SHA-256 and the `sha256sum` manifest format (SHA256SUMS).

One helper for every part that checks files: the Ansible modules on a node (the model store,
the pack cache, the image archive), the kit's package (glmdeploy.manifest, the fingerprint) and
the control node's lock tooling. Standard library only. The node package carries it as
``glmdeploy.integrity``, a link to this file (the wheel holds its content), because a node's
release environment has no Ansible module_utils; the modules import it as
``ansible.module_utils.glmdeploy_integrity``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

#: Bytes read at a time: large enough that hashing a 12 GB model is disk-bound, not call-bound.
CHUNK = 8 << 20


def file_sha256(path: str | Path) -> str:
    """The file's SHA-256, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def parse_sums(text: str) -> dict[str, str]:
    """name -> SHA-256 from `sha256sum` output (`<hex>  <name>`, or `<hex> *<name>` in binary mode)."""
    entries = {}
    for line in text.splitlines():
        if line.strip():
            digest, _, name = line.partition(" ")
            entries[name[1:] if name[:1] in (" ", "*") else name] = digest
    return entries


def place(src: str | Path, dest: str | Path) -> None:
    """`dest` becomes `src`'s bytes, whole or not at all: a hard link where both share a file
    system (no second copy of gigabytes), else a copy; renamed into place, so a reader never sees
    half a file."""
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    tmp.replace(dest)


def format_sums(entries: dict[str, str]) -> str:
    """`sha256sum` output for name -> SHA-256, sorted by name: `sha256sum -c` checks it."""
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(entries.items()))
