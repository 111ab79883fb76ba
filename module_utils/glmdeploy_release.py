"""Releases on a node: immutable directories, one `current` link, rollback by switching it back.

Layout under the kit root (``/opt/glmdeploy``)::

    envs/<profile>-py<XY>-<lock>/venv   Python environments, named by the lock they install
    models/<name>-<manifest>/           model files, named by their SHA256SUMS
    kits/<wheel>-<env>/venv             the kit's wheel installed over one environment, named by
                                        the wheel's digest and the environment's name
    releases/<id>/                      links to one of each (venv, env, model) + the rendered
                                        config (bin/, node.json) + release.json; `promoted` once
                                        it passed its smoke tests, `failed` when it did not
    current  -> releases/<id>           what the services run (units name only `current`)
    previous -> releases/<id>           where `rollback` returns to

Why links and content-named stores: a switch is one rename(2), so a node is never half
old and half new, and a rollback needs no rebuild, no wheelhouse and no network - the
previous release is still on disk, whole.

Why this file is an Ansible module_utils and not part of the kit's wheel: it must run with the
node's system Python even when an environment is broken, and the kit's Ansible module
(``library/glmdeploy_release.py``) ships it to the node with itself, so that is where it runs.
Stdlib only.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

STORES = ("envs", "models", "kits")
# Release links that keep a store entry in use. `app` is the kit of releases made before the kit
# was a wheel (kits/<digest>/glmdeploy): still honoured, so they stay whole until pruned.
LINKS = ("venv", "env", "model", "app")


class ReleaseError(RuntimeError):
    """A request the node cannot carry out; the message names the fix."""


def releases_dir(root: Path) -> Path:
    return root / "releases"


def link_target(link: Path) -> str | None:
    """The release id a `current`/`previous` link names, or None."""
    if not link.is_symlink():
        return None
    return Path(os.readlink(link)).name


def replace_link(link: Path, target: str) -> None:
    """Point `link` at `target` in one rename: readers see the old or the new link, never none."""
    tmp = link.with_name(f".{link.name}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def release_path(root: Path, release: str) -> Path:
    path = releases_dir(root) / release
    if not (path / "release.json").is_file():
        raise ReleaseError(f"no release {release!r} on this node (in {releases_dir(root)}); fix: `status` lists them")
    return path


def switch(root: Path, to: str, previous: str | None = None, dry_run: bool = False) -> dict[str, object]:
    """Make `to` current; `previous` becomes the release that was current (or the one given;
    `none`: no previous release, as on a node that had one release before a failed one).

    Two renames, ordered so that an interruption between them loses the least: going forward,
    `previous` is written first (stopped there, `current` still names the serving release);
    going back to `previous` (a rollback), `current` first (stopped there, the node is on the
    release it was sent to). ``dry_run``: the same answer, nothing renamed (Ansible's check mode)."""
    rollback = to == "previous"
    if rollback:
        to = link_target(root / "previous") or ""
        if not to:
            raise ReleaseError("this node has no previous release to return to")
    release_path(root, to)
    before = link_target(root / "current")
    new_previous = previous if previous is not None else (before if before != to else link_target(root / "previous"))
    if new_previous not in (None, "none") and new_previous != to:
        release_path(root, new_previous)
    previous_before = link_target(root / "previous")
    if dry_run:
        new_previous = None if new_previous == "none" else new_previous
    elif rollback:
        _move_current(root, before, to)
        new_previous = _move_previous(root, new_previous, to)
    else:
        new_previous = _move_previous(root, new_previous, to)
        _move_current(root, before, to)
    changed = before != to or (new_previous != previous_before and new_previous != to)
    return {"changed": changed, "from": before, "to": to, "previous": new_previous, "previous_before": previous_before}


def _move_current(root: Path, before: str | None, to: str) -> None:
    if before != to:
        replace_link(root / "current", f"releases/{to}")


def _move_previous(root: Path, new_previous: str | None, to: str) -> str | None:
    if new_previous == "none":
        (root / "previous").unlink(missing_ok=True)
        return None
    if new_previous and new_previous != to and link_target(root / "previous") != new_previous:
        replace_link(root / "previous", f"releases/{new_previous}")
    return new_previous


def mark(root: Path, release: str, state: str, dry_run: bool = False) -> bool:
    """Record the outcome of a release's smoke tests; True when the mark is new (or would be)."""
    path = release_path(root, release)
    other = "failed" if state == "promoted" else "promoted"
    changed = (path / other).exists() or not (path / state).exists()
    if changed and not dry_run:
        (path / other).unlink(missing_ok=True)
        if not (path / state).exists():
            (path / state).write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    return changed


def status(root: Path) -> dict[str, Any]:
    rows = []
    base = releases_dir(root)
    for path in sorted(base.iterdir()) if base.is_dir() else []:
        meta = path / "release.json"
        if path.name.startswith(".") or not meta.is_file():
            continue
        info = json.loads(meta.read_text())
        state = "promoted" if (path / "promoted").exists() else "failed" if (path / "failed").exists() else "new"
        when = (path / state).read_text().strip() if state != "new" else ""
        rows.append({"id": path.name, "state": state, "since": when, "created": meta.stat().st_mtime, **info})
    rows.sort(key=lambda row: row["created"])
    return {"current": link_target(root / "current"), "previous": link_target(root / "previous"), "releases": rows}


def prune(root: Path, keep: int, dry_run: bool = False) -> list[str]:
    """Keep `current`, `previous` and the newest `keep` promoted releases; drop the rest and unused stores.

    ``dry_run``: what would be removed, nothing removed (Ansible's check mode)."""
    if keep < 1:
        raise ReleaseError(f"keep={keep}: must be 1 or more (the current release is always kept)")
    info = status(root)
    protected = {info["current"], info["previous"]}
    promoted = [row["id"] for row in info["releases"] if row["state"] == "promoted"]
    protected.update(promoted[-keep:])
    removed = []
    for row in info["releases"]:
        if row["id"] not in protected:
            if not dry_run:
                shutil.rmtree(releases_dir(root) / row["id"])
            removed.append(f"releases/{row['id']}")
    used = set()
    for path in releases_dir(root).iterdir():
        if dry_run and f"releases/{path.name}" in removed:
            continue
        for link in LINKS:
            if (path / link).is_symlink():
                used.add(os.path.normpath(path / os.readlink(path / link)))
    for store in STORES:
        for entry in sorted((root / store).iterdir()) if (root / store).is_dir() else []:
            top = os.path.normpath(entry)
            if not any(path == top or path.startswith(top + os.sep) for path in used):
                if not dry_run:
                    shutil.rmtree(entry)
                removed.append(f"{store}/{entry.name}")
    return removed
