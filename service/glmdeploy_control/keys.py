"""make keys: a key per user or project for the API behind the balancer.

`add NAME` creates a key and shows it once; `revoke NAME` removes one; with neither, the keys
are listed with their creation and last use (as each balancer's glmdeploy-lb-keys saw it).

The control node keeps only each key's SHA-256 digest, in a root-only store beside the
deployment's own key (artifacts/secrets/api-keys.json, 0600). A change is written to the store,
then `--push` (the Makefile's `ansible-playbook playbooks/keys.yml`) copies it to the balancers,
whose keys service re-reads it at once: no nginx reload, and requests already running go on.
A push that fails puts the store back as it was (and a new key is never shown), so the store
never lists a key the balancers do not have, nor keeps one they dropped.

Standard library only; the digest is glmdeploy.balancer.lb_keys.digest's (tests/unit/test_lb_keys.py
proves the two agree: that module runs on balancers and imports prometheus_client).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from glmdeploy_control import registry

#: A key's name: it shows in the balancer's log, metrics labels and nginx's limit zones.
NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
#: The deployment's own key (the kit's checks use it); the balancer lists it under this name.
DEPLOYMENT = "deployment"
PREFIX = "glm-"


class KeysError(RuntimeError):
    """Bad input or a failed step; the message names the cause and the fix."""


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise KeysError(
            f"the key name {name!r} is not a plain identifier; fix: use 1-32 lowercase letters, digits"
            " and underscores, starting with a letter (e.g. alice or project_x)"
        )
    if name == DEPLOYMENT:
        raise KeysError(f"{DEPLOYMENT!r} is the deployment's own key; fix: choose another name")
    return name


def read_store(path: Path) -> dict[str, dict[str, str]]:
    if not path.exists():
        return {}
    try:
        keys = json.loads(path.read_text())["keys"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KeysError(f"cannot read the key store {path}: {exc}; fix: restore it from a backup") from exc
    return {str(name): dict(entry) for name, entry in keys.items()}


def write_store(path: Path, keys: dict[str, dict[str, str]]) -> None:
    """Root-only, written by rename (a crash leaves the old store or the new one, never half)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    new = path.with_name(f".{path.name}.new")
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"keys": dict(sorted(keys.items()))}, out, indent=1)
        out.write("\n")
    os.chmod(new, 0o600)
    os.replace(new, path)


def push(command: list[str], store: Path, before: dict[str, dict[str, str]]) -> None:
    """Run the push; on failure (or Ctrl-C) put the store back and say what the balancers may hold."""
    if not command:
        return
    print(f"==> copying the key store to the balancers: {' '.join(command)}", flush=True)
    try:
        rc = subprocess.run(command, check=False).returncode
    except KeyboardInterrupt:
        rc = 130
    if rc != 0:
        write_store(store, before)
        raise KeysError(
            f"copying the keys to the balancers failed (exit {rc}); the store is back as it was and a balancer"
            " that took the new file keeps it until the next `make keys` or `make lb`; fix: the cause above, then"
            " run the same command again"
        )


def add(store: Path, name: str, command: list[str]) -> str:
    keys = read_store(store)
    check_name(name)
    if name in keys:
        raise KeysError(
            f"a key named {name!r} exists (created {keys[name]['created']}); fix: revoke it or choose another name"
        )
    key = PREFIX + secrets.token_urlsafe(30)
    created = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    write_store(store, keys | {name: {"sha256": digest(key), "created": created}})
    push(command, store, keys)
    return key


def revoke(store: Path, name: str, command: list[str]) -> None:
    keys = read_store(store)
    if name not in keys:
        known = ", ".join(sorted(keys)) or "none"
        raise KeysError(f"no key named {name!r} (keys: {known}); fix: `make keys` lists them")
    write_store(store, {k: v for k, v in keys.items() if k != name})
    push(command, store, keys)


def balancer_urls(inventory: Path) -> dict[str, str]:
    """Each balancer's /keys, from the inventory's glmdeploy_lb group (as Ansible reads it)."""
    out = subprocess.run(
        ["ansible-inventory", "-i", str(inventory), "--list"], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise KeysError(
            f"cannot read the inventory {inventory}: {out.stderr.strip()[-500:]}; fix: INVENTORY=<your inventory>"
        )
    data = json.loads(out.stdout)
    hostvars = data.get("_meta", {}).get("hostvars", {})
    port = registry.load().kit.balancer.keys_port
    urls = {}
    for host in data.get("glmdeploy_lb", {}).get("hosts", []):
        facts = hostvars.get(host, {})
        address = facts.get("ansible_host", host)
        urls[host] = f"http://{address}:{facts.get('load_balancer_keys_port', port)}/keys"
    return urls


def last_use(urls: dict[str, str]) -> tuple[dict[str, float], list[str]]:
    """The latest use of each name over all balancers, and the balancers that did not answer."""
    seen: dict[str, float] = {}
    missing = []
    for host, url in urls.items():
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                listing = json.loads(response.read())["keys"]
        except (OSError, ValueError, KeyError) as exc:
            missing.append(f"{host} ({exc})")
            continue
        for name, entry in listing.items():
            if entry.get("last_used") is not None:
                seen[name] = max(seen.get(name, 0.0), float(entry["last_used"]))
    return seen, missing


def table(keys: dict[str, dict[str, str]], seen: dict[str, float]) -> str:
    rows = [("name", "created", "last use")]
    for name, entry in sorted(keys.items()):
        used = seen.get(name)
        when = dt.datetime.fromtimestamp(used, dt.timezone.utc).replace(microsecond=0).isoformat() if used else "never"
        rows.append((name, entry.get("created", ""), when))
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(cell.ljust(width[i]) for i, cell in enumerate(row)).rstrip() for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make keys", description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="the control node's key store (digests, 0600)")
    parser.add_argument("--inventory", type=Path, help="inventory whose glmdeploy_lb hosts report last use")
    parser.add_argument("--add", metavar="NAME", help="create a key for NAME and show it once")
    parser.add_argument("--revoke", metavar="NAME", help="remove NAME's key")
    parser.add_argument(
        "push", nargs=argparse.REMAINDER, help="after --: the command that copies the store to the balancers"
    )
    args = parser.parse_args(argv)
    command = args.push[1:] if args.push[:1] == ["--"] else args.push
    try:
        if args.add and args.revoke:
            raise KeysError("ADD and REVOKE given together; fix: one change per run")
        if (args.add or args.revoke) and args.inventory and not balancer_urls(args.inventory):
            print(f"warning: {args.inventory} has no glmdeploy_lb hosts: keys take effect on a balancer's next deploy")
        if args.add:
            key = add(args.store, args.add, command)
            print(f"==> key for {args.add} (shown once; only its SHA-256 is kept):\n{key}")
        elif args.revoke:
            revoke(args.store, args.revoke, command)
            print(f"==> {args.revoke}'s key is revoked: refused from the next request on")
        else:
            keys = read_store(args.store)
            seen, missing = last_use(balancer_urls(args.inventory)) if args.inventory else ({}, [])
            print(table(keys, seen) if keys else f"no user keys yet; fix: make keys ADD=<name> (store {args.store})")
            for host in missing:
                print(f"warning: last use unknown on balancer {host}")
    except KeysError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
