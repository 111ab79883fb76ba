"""Releases on a node: immutable directories, one `current` link, rollback by switching it back.

Layout under the kit root (``/opt/glmdeploy``)::

    envs/<profile>-py<XY>-<lock>/venv   Python environments, named by the lock they install
    models/<name>-<manifest>/           model files, named by their SHA256SUMS
    kits/<digest>/glmdeploy/            the kit's own package, named by its archive's digest
    releases/<id>/                      links to one of each + the rendered config (bin/, node.json)
                                        + release.json; `promoted` once it passed its smoke tests,
                                        `failed` when it did not
    current  -> releases/<id>           what the services run (units name only `current`)
    previous -> releases/<id>           where `rollback` returns to

Why links and content-named stores: a switch is one rename(2), so a node is never half
old and half new, and a rollback needs no rebuild, no wheelhouse and no network - the
previous release is still on disk, whole. Everything here is stdlib: it must run with the
node's system Python even when an environment is broken.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

STORES = ("envs", "models", "kits")
LINKS = {"venv": "envs", "model": "models", "app": "kits"}


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
    info = status(root)
    protected = {info["current"], info["previous"]}
    promoted = [row["id"] for row in info["releases"] if row["state"] == "promoted"]
    protected.update(promoted[-keep:] if keep > 0 else [])
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
            inner = [entry / sub for sub in ("", "venv", "glmdeploy")]
            if not any(os.path.normpath(p) in used for p in inner):
                if not dry_run:
                    shutil.rmtree(entry)
                removed.append(f"{store}/{entry.name}")
    return removed


def table(statuses: dict[str, dict[str, Any]]) -> str:
    """One line per node: which release it runs and which it would roll back to."""
    lines = [f"{'node':<16} {'current':<44} {'previous':<44} releases kept"]
    for node, info in sorted(statuses.items()):
        kept = ", ".join(f"{row['id']}({row['state']})" for row in info.get("releases", []))
        lines.append(f"{node:<16} {info.get('current') or '-':<44} {info.get('previous') or '-':<44} {kept}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy.release", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/opt/glmdeploy", help="kit root on the node (default /opt/glmdeploy)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="current, previous and every release kept (JSON)")
    p = sub.add_parser("switch", help="make a release current (atomic link swap)")
    p.add_argument("--to", required=True, help="release id, or `previous`")
    p.add_argument("--previous", help="what `previous` names afterwards (default: the release that was current)")
    p = sub.add_parser("mark", help="record a release as promoted or failed")
    p.add_argument("--id", required=True)
    p.add_argument("--state", choices=["promoted", "failed"], required=True)
    p = sub.add_parser("prune", help="remove releases beyond the newest KEEP and stores nothing uses")
    p.add_argument("--keep", type=int, default=2)
    p = sub.add_parser("table", help="fleet table from per-node status JSON files")
    p.add_argument("files", nargs="+", help="<node>.json files written by `status`")
    args = parser.parse_args(argv)
    root = Path(args.root)
    try:
        if args.command == "status":
            result: object = status(root)
        elif args.command == "switch":
            result = switch(root, args.to, args.previous)
        elif args.command == "mark":
            result = {"changed": mark(root, args.id, args.state)}
        elif args.command == "prune":
            if args.keep < 1:
                raise ReleaseError("--keep must be 1 or more: the current release is always kept")
            removed = prune(root, args.keep)
            result = {"changed": bool(removed), "removed": removed}
        else:
            print(table({Path(f).stem: json.loads(Path(f).read_text()) for f in args.files}))
            return 0
    except ReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
