#!/usr/bin/python
"""Distribution packages at the versions of the kit's apt lock, from the kit's own repository only.

Why a module and not ``ansible.builtin.apt``: the apt module installs from whatever sources the
node's apt has, at whatever version they carry, and needs them reachable. Here:

- the installed versions are read with ``dpkg-query`` first: a node whose packages already are
  the locked versions, held, is left alone with no network and no apt run (a re-run costs
  milliseconds, and a node's repository need not be reachable then);
- otherwise apt runs with a private configuration whose only source is the kit's repository
  (``signed-by`` the kit's key, written under ``state_dir``), its own lists and cache: the node's
  own sources are neither read nor changed, and the kit's repository never becomes one of them;
- every package is installed as ``name=version`` (a downgrade included) and held (``apt-mark
  hold``): an unattended upgrade from the node's own sources cannot replace it
  (docs/decisions.md, "The apt lock");
- a package installed at another version than the lock's (an admin's ``apt-get install``) is
  drift: repaired from the repository, or with ``repair=false`` refused before any change,
  naming the package, the installed and the locked version.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glmdeploy_apt
short_description: Install distribution packages at the kit's locked versions from the kit's repository alone
options:
  name:
    description: >-
      the packages to install (each must be in versions); empty - every package the kit installed on this node
      before (the record in state_dir, each package under the installer that placed it)
    type: list
    elements: str
    default: []
  installer: {description: who installs (a role); the record names each package's installer, type: str, default: ""}
  state:
    description: >-
      present (installed at the lock's versions and held) or checked (read only, drift returned, never fails on it)
    type: str
    choices: [present, checked]
    default: present
  versions: {description: the release's lock (package -> version), type: dict, required: true}
  repo:
    description: "the repository: a URL (http://...) or a directory on the node (file:/...)"
    type: str
    required: true
  key: {description: the repository's public key (ASCII-armored), type: str, required: true}
  repair:
    description: a package at another version is reinstalled at the lock's; false fails naming it
    type: bool
    default: true
  hold: {description: hold the packages (apt-mark hold), type: bool, default: true}
  state_dir: {description: the private apt configuration, lists and cache, type: path, default: /var/lib/glmdeploy/apt}
  lock_name: {description: the lock's file, for messages, type: str, default: the apt lock}
"""

RETURN = r"""
installed: {description: package -> version now installed, type: dict}
drift: {description: "package -> {installed, locked} for each package found at another version", type: dict}
packages: {description: "package -> {installed, locked, installer} for every package checked", type: dict}
summary: {description: "the drift in one line: <package> installed <version>, locked <version>; ...", type: str}
missing: {description: packages that were not installed, type: list}
source: {description: "the kit's repository this node last installed from, by name (\"\" never)", type: str}
"""


def installed_versions(module: AnsibleModule, names: list[str]) -> dict[str, str]:
    """package -> version for those dpkg has fully installed (others are left out)."""
    _, out, _ = module.run_command(
        ["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\n", *names],
        environ_update={"LC_ALL": "C"},
    )
    found = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[2].strip() in ("ii", "hi"):
            found[parts[0]] = parts[1]
    return found


def held(module: AnsibleModule) -> set[str]:
    rc, out, err = module.run_command(["apt-mark", "showhold"])
    if rc != 0:
        module.fail_json(msg=f"apt-mark showhold failed: {err.strip()}")
    return set(out.split())


def apt_options(state: Path, repo_host: str | None) -> list[str]:
    """apt's private configuration: the kit's repository its only source, its own lists and cache."""
    opts = [
        f"Dir::Etc::SourceList={state / 'sources.list'}",
        f"Dir::Etc::SourceParts={state / 'sources.list.d'}",
        f"Dir::State::Lists={state / 'lists'}",
        f"Dir::Cache={state / 'cache'}",
        "APT::Install-Recommends=false",
        "APT::Get::Assume-Yes=true",
        "Acquire::Languages=none",
        "Dpkg::Options::=--force-confdef",
        "Dpkg::Options::=--force-confold",
    ]
    if repo_host:  # the control node is reached directly, never through the node's apt proxy
        opts.append(f"Acquire::http::Proxy::{repo_host}=DIRECT")
    return [arg for opt in opts for arg in ("-o", opt)]


def prepare(state: Path, repo: str, key: str) -> None:
    for sub in ("sources.list.d", "lists/partial", "cache/archives/partial"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o755)
    keyfile = state / "glmdeploy-apt.asc"
    keyfile.write_text(key if key.endswith("\n") else key + "\n")
    uri = repo if "://" in repo or repo.startswith("file:") else f"file:{repo}"
    (state / "sources.list").write_text(f"deb [signed-by={keyfile}] {uri} ./\n")


def run_apt(module: AnsibleModule, argv: list[str], what: str, fix: str) -> str:
    rc, out, err = module.run_command(argv, environ_update={"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C.UTF-8"})
    if rc != 0:
        module.fail_json(msg=f"{what} failed: {(err or out).strip()[-1500:]} fix: {fix}", rc=rc)
    return out


def read_record(state: Path) -> dict[str, str]:
    """package -> installer, of every package the kit installed on this node."""
    path = state / "installed.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def last_source(state: Path) -> str:
    """The name of the kit's repository this node last installed from (its sources.list, written
    by prepare): the one that carries the versions a failed update goes back to (make update)."""
    try:
        line = (state / "sources.list").read_text().split()
    except OSError:
        return ""
    uri = next((word for word in line if "://" in word or word.startswith("file:")), "")
    return uri.rstrip("/").rsplit("/", 1)[-1]


def write_record(state: Path, record: dict[str, str]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    tmp = state / ".installed.json.tmp"
    tmp.write_text(json.dumps(dict(sorted(record.items())), indent=1) + "\n")
    tmp.replace(state / "installed.json")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "list", "elements": "str", "default": []},
            "installer": {"type": "str", "default": ""},
            "state": {"type": "str", "choices": ["present", "checked"], "default": "present"},
            "versions": {"type": "dict", "required": True},
            "repo": {"type": "str", "required": True},
            "key": {"type": "str", "required": True, "no_log": False},
            "repair": {"type": "bool", "default": True},
            "hold": {"type": "bool", "default": True},
            "state_dir": {"type": "path", "default": "/var/lib/glmdeploy/apt"},
            "lock_name": {"type": "str", "default": "the apt lock"},
        },
        supports_check_mode=True,
    )
    p = module.params
    state = Path(p["state_dir"])
    record = read_record(state)
    names: list[str] = p["name"] or sorted(record)
    lock: dict[str, str] = p["versions"]
    unknown = [n for n in names if n not in lock]
    if unknown and p["state"] == "present":
        module.fail_json(
            msg=f"{', '.join(unknown)} not in {p['lock_name']}; fix: add it to the registry's [kit.apt], then make lock"
        )
    have = installed_versions(module, names) if names else {}
    missing = [n for n in names if n not in have]
    drift = {
        n: {"installed": have[n], "locked": lock.get(n, "(not in the lock)")}
        for n in names
        if n in have and have[n] != lock.get(n)
    }
    result = {
        "installed": have,
        "drift": drift,
        "missing": missing,
        "source": last_source(state),
        "changed": False,
        "packages": {
            n: {
                "installed": have.get(n, "(not installed)"),
                "locked": lock.get(n, "(not in the lock)"),
                "installer": record.get(n, p["installer"]),
            }
            for n in names
        },
    }
    result["summary"] = "; ".join(
        f"{n} installed {d['installed']}, locked {d['locked']}" for n, d in sorted(drift.items())
    )
    if p["state"] == "checked":
        module.exit_json(**result)
    unheld = sorted(set(names) - held(module)) if p["hold"] and names else []
    new_record = {**record, **{n: record.get(n) or p["installer"] or "kit" for n in names}}
    if drift and not p["repair"]:
        module.fail_json(
            msg=f"packages differ from {p['lock_name']}: {result['summary']}. Nothing was changed. "
            "fix: make deploy with repair on reinstalls the locked versions from the kit's repository; "
            "or make lock if the new versions are wanted",
            **result,
        )
    if not missing and not drift and not unheld:
        if new_record != record and not module.check_mode:
            write_record(state, new_record)
        module.exit_json(**result)
    result["changed"] = True
    todo = sorted(missing + list(drift))
    result["diff"] = {
        "before": "".join(f"{n} {have.get(n, '(not installed)')}\n" for n in todo),
        "after": "".join(f"{n} {lock[n]}\n" for n in todo),
    }
    if module.check_mode:
        module.exit_json(**result)
    if todo:
        prepare(state, p["repo"], p["key"])
        opts = apt_options(state, urlsplit(p["repo"]).hostname if "://" in p["repo"] else None)
        fix = (
            f"check that the node reaches {p['repo']} (make deploy serves it for the run) "
            f"and that {p['lock_name']} is the repository's"
        )
        run_apt(module, ["apt-get", *opts, "update", "-q"], f"reading the kit's apt repository {p['repo']}", fix)
        specs = [f"{n}={lock[n]}" for n in todo]
        run_apt(
            module,
            ["apt-get", *opts, "install", "-q", "--allow-downgrades", "--allow-change-held-packages", *specs],
            f"installing {' '.join(specs)} from the kit's apt repository",
            "the message above names the package apt could not place; a node whose base is newer than the "
            f"lock's needs a new lock (make lock), a kernel not in {p['lock_name']} needs its headers locked",
        )
        result["installed"] = installed_versions(module, names)
        left = {n: v for n, v in lock.items() if n in names and result["installed"].get(n) != v}
        if left:
            module.fail_json(msg=f"after the install, {left} still differ from {p['lock_name']}", **result)
    if p["hold"] and names:
        rc, _, err = module.run_command(["apt-mark", "hold", *names])
        if rc != 0:
            module.fail_json(msg=f"apt-mark hold failed: {err.strip()}", **result)
    write_record(state, new_record)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
