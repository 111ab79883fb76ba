#!/usr/bin/python
"""Keep environment packs in a cache on the control node, outside any checkout.

An environment is a function of its lock (and the node's architecture and Python, both in the
pack's name), so a pack built once is good for every later deploy of the same lock: from a fresh
checkout, on a new node, in the next CI run. Without the cache, each checkout's first deploy
runs pip for minutes (3.3 GB of wheels for gpu-cu121) although the same bytes were packed before.

``published`` renames a pack just brought from a node (``partial``) into the pack directory and
writes its SHA256 file, under a lock on the pack directory: two deploys from one checkout that
built the same pack at the same time (make test deploys this machine and the test hosts side by
side) publish one of them whole, never one's bytes under the other's SHA256; the second's copy is
dropped. ``restored`` puts a cached pack into the checkout's pack directory when that lacks it, after
checking the pack against its SHA256 (a bad entry is removed from the cache and reported, and the
deploy builds the environment from the wheelhouse as if there were no cache). ``stored`` puts a
pack the deploy just published into the cache and removes the least recently used packs beyond
``keep``. Both hard-link when the two directories share a filesystem (no copy) and write through
a temporary name and a rename (a reader never sees half a pack). The cache is a speed-up only: a
cache directory that cannot be written is a warning, never a failed deploy.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glmdeploy_integrity import file_sha256, place

DOCUMENTATION = r"""
module: glmdeploy_pack_cache
short_description: Restore environment packs from, or store them in, the control node's pack cache
options:
  names: {description: pack file names (C(env-<lock>-<arch>.tar.zst)), type: list, elements: str, required: true}
  pack_dir: {description: the checkout's pack directory (what deploys read), type: path, required: true}
  cache_dir: {description: the cache outside the checkout; empty turns the cache off, type: str, default: ""}
  partial: {description: with published, the pack as brought from the node (renamed into pack_dir), type: path}
  state:
    description: published (partial -> pack_dir), restored (cache -> pack_dir) or stored (pack_dir -> cache)
    type: str
    choices: [published, restored, stored]
  keep: {description: packs the cache keeps after a store (least recently used go first), type: int, default: 4}
"""

RETURN = r"""
restored: {description: names placed into pack_dir from the cache, type: list}
stored: {description: names placed into the cache, type: list}
published: {description: names renamed into pack_dir with their SHA256 (none when published before), type: list}
pruned: {description: names removed from the cache (beyond keep, or not matching their SHA256), type: list}
"""


def recorded_sha256(sums: Path) -> str:
    """The digest in a `sha256sum` line (`<hex>  <name>`); empty when unreadable."""
    try:
        return sums.read_text(encoding="utf-8").split()[0]
    except (OSError, IndexError):
        return ""


def place_pack(name: str, src_dir: Path, dest_dir: Path) -> None:
    """The pack, then its SHA256 file: a pack is used only once its SHA256 file exists."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    place(src_dir / name, dest_dir / name)
    place(src_dir / f"{name}.sha256", dest_dir / f"{name}.sha256")


def remove_pack(name: str, where: Path) -> None:
    for path in (where / f"{name}.sha256", where / name):
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """An exclusive flock on directory/.publish.lock while the block runs (another run waits)."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".publish.lock").open("w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        yield


def publish(name: str, pack_dir: Path, partial: Path, check: bool) -> list[str]:
    """partial becomes pack_dir/name, then its SHA256 file; a pack already published stays and
    partial is dropped (its bytes differ, by timestamps, from the published one's)."""

    def published() -> bool:
        return (pack_dir / f"{name}.sha256").is_file() and (pack_dir / name).is_file()

    if check:
        return [] if published() else [name]
    with locked(pack_dir):
        if published():
            partial.unlink(missing_ok=True)
            return []
        digest = file_sha256(partial)
        partial.replace(pack_dir / name)
        sums = pack_dir / f".{name}.sha256.{os.getpid()}.partial"
        sums.write_text(f"{digest}  {name}\n", encoding="utf-8")
        sums.replace(pack_dir / f"{name}.sha256")
    return [name]


def restore(names: list[str], pack_dir: Path, cache: Path, check: bool) -> tuple[list[str], list[str]]:
    """Cached packs the pack directory lacks, checked by SHA256; bad cache entries are removed."""
    restored, bad = [], []
    for name in names:
        if (pack_dir / f"{name}.sha256").is_file() or not (cache / f"{name}.sha256").is_file():
            continue
        pack = cache / name
        if not pack.is_file() or file_sha256(pack) != recorded_sha256(cache / f"{name}.sha256"):
            bad.append(name)
            if not check:
                remove_pack(name, cache)
            continue
        if not check:
            place_pack(name, cache, pack_dir)
            os.utime(pack)  # used now: the least recently used packs are pruned first
        restored.append(name)
    return restored, bad


def store(names: list[str], pack_dir: Path, cache: Path, keep: int, check: bool) -> tuple[list[str], list[str]]:
    """Published packs the cache lacks go into it; then the cache keeps the `keep` most recently used."""
    stored = []
    for name in names:
        sums = pack_dir / f"{name}.sha256"
        if not sums.is_file() or recorded_sha256(cache / f"{name}.sha256") == recorded_sha256(sums):
            continue
        if not check:
            place_pack(name, pack_dir, cache)
        stored.append(name)
    in_cache = sorted(cache.glob("*.tar.zst"), key=lambda p: p.stat().st_mtime, reverse=True) if cache.is_dir() else []
    pruned = [p.name for p in in_cache[keep:] if p.name not in names]
    if not check:
        for name in pruned:
            remove_pack(name, cache)
    return stored, pruned


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "names": {"type": "list", "elements": "str", "required": True},
            "pack_dir": {"type": "path", "required": True},
            "cache_dir": {"type": "str", "default": ""},
            "partial": {"type": "path"},
            "state": {"type": "str", "choices": ["published", "restored", "stored"], "required": True},
            "keep": {"type": "int", "default": 4},
        },
        required_if=[("state", "published", ["partial"])],
        supports_check_mode=True,
    )
    p = module.params
    result: dict = {"changed": False, "restored": [], "stored": [], "pruned": [], "published": []}
    if p["state"] == "published":
        if len(p["names"]) != 1:
            module.fail_json(msg=f"state=published takes one name, got {p['names']}")
        result["published"] = publish(p["names"][0], Path(p["pack_dir"]), Path(p["partial"]), module.check_mode)
        result["changed"] = bool(result["published"])
        module.exit_json(**result)
    if not p["cache_dir"]:
        module.exit_json(**result)
    cache, pack_dir, names = Path(p["cache_dir"]), Path(p["pack_dir"]), sorted(set(p["names"]))
    try:
        if p["state"] == "restored":
            result["restored"], result["pruned"] = restore(names, pack_dir, cache, module.check_mode)
        else:
            result["stored"], result["pruned"] = store(names, pack_dir, cache, max(p["keep"], 1), module.check_mode)
    except OSError as exc:
        module.warn(f"the environment pack cache {cache} was not used ({exc}); fix: make it writable, or PACK_CACHE=")
        module.exit_json(**result)
    for name in result["pruned"] if p["state"] == "restored" else []:
        module.warn(f"{cache}/{name} did not match its SHA256 and was removed; the wheelhouse builds the environment")
    result["changed"] = bool(result["restored"] or result["stored"] or result["pruned"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
