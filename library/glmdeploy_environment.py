#!/usr/bin/python
"""Check an installed environment against its lock before a deploy trusts it; repair it in place.

Why: an environment is built once per lock and then only marked complete, so an admin's
`pip install tokenizers==...` into it went unseen by a deploy (the marker was there) until the
health gate failed on it, or until the next restart of a service that had kept the old code in
memory. This module compares what each site-packages directory holds with the lock (the same
comparison `make verify` makes from a fingerprint, ``module_utils/glmdeploy_environment.py``) and
names every difference: package, installed and locked version. With ``repair`` it puts the lock
back: the wrong or missing pins are installed again from the wheelhouse with the lock's own hashes
(``--force-reinstall --no-deps --require-hashes``, offline), what the lock does not name is
uninstalled, bytecode is compiled again, and the environment is read once more to prove it clean.
Without ``repair`` it fails before changing anything. Check mode reports what a repair would do.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from ansible.module_utils import glmdeploy_environment as environment
from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glmdeploy_environment
short_description: Check a venv against its hash-locked requirements file; reinstall or remove what differs
options:
  venv: {description: the virtual environment on the node, type: path, required: true}
  lock: {description: >-
      the lock on the node; omitted, the venv may hold only C(allowed) and pip's seeds (a release's own venv, which sees
      the lock's environment through a .pth file), type: path}
  allowed: {description: names the venv may hold at any version besides the lock and pip's own seed packages
            (pip, setuptools, wheel), type: list, elements: str, default: []}
  find_links: {description: the wheelhouse (directory or URL) a repair installs from, type: str}
  repair: {description: put the lock back in place; false fails naming the differences and changes nothing,
           type: bool, default: true}
"""

RETURN = r"""
drift: {description: every difference found before any repair (C(name installed (lock version))), type: list}
reinstalled: {description: pins installed again (or that would be), type: list}
removed: {description: distributions uninstalled (or that would be), type: list}
"""

# Only the lock and the wheelhouse count: any pip configuration on the node is ignored.
PIP_ENV = {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def _state(venv: Path, pinned: dict[str, str], allowed: frozenset[str]) -> tuple[dict[str, str], list[str]]:
    site = environment.site_packages(venv)
    installed = environment.installed_in(site) if site else {}
    return installed, environment.drift(pinned, installed, allowed)


def _pip(module: AnsibleModule, venv: Path, args: list[str], what: str) -> None:
    env = {**os.environ, **PIP_ENV, "TMPDIR": str(venv.parent)}
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = " | ".join(ln for ln in proc.stdout.splitlines()[-5:] + proc.stderr.splitlines()[-5:] if ln.strip())
        module.fail_json(msg=f"{what} in {venv} failed: {tail}")


def _reinstall(
    module: AnsibleModule, venv: Path, entries: dict[str, tuple[str, set[str]]], names: set[str], find_links: str
) -> None:
    """The lock's pins and hashes for `names`, installed again from the wheelhouse (hashes required)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", dir=venv.parent, delete=False) as req:
        req.write(environment.lock_requirements(entries, names))
    source = ["--no-index", "--find-links", find_links]
    if find_links.startswith("http://"):
        source += ["--trusted-host", find_links.split("/")[2]]
    exact = ["--require-hashes", "--no-deps", "--only-binary=:all:", "--force-reinstall", "--no-compile"]
    try:
        _pip(
            module,
            venv,
            ["install", *source, *exact, "--progress-bar", "off", "-r", req.name],
            "reinstalling " + ", ".join(sorted(names)),
        )
    finally:
        os.unlink(req.name)


def _compile(venv: Path) -> None:
    """Bytecode as the first build made it (the service user cannot write it at run time); exit
    status 1 is compileall's "some file did not compile" (test files for newer Pythons), as in the build."""
    subprocess.run([str(venv / "bin" / "python"), "-m", "compileall", "-qq", "-j", "0", str(venv / "lib")], check=False)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "venv": {"type": "path", "required": True},
            "lock": {"type": "path"},
            "allowed": {"type": "list", "elements": "str", "default": []},
            "find_links": {"type": "str"},
            "repair": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    venv = Path(module.params["venv"])
    entries = environment.parse_lock_text(Path(module.params["lock"]).read_text() if module.params["lock"] else "")
    pinned = {n: v for n, (v, _) in entries.items()}
    allowed = environment.VENV_SEED_PACKAGES | {environment.normalise(n) for n in module.params["allowed"]}
    if not (venv / "bin" / "python").exists():
        module.exit_json(changed=False, drift=[], reinstalled=[], removed=[], msg=f"{venv} is not built yet")
    installed, found = _state(venv, pinned, allowed)
    if not found:
        module.exit_json(changed=False, drift=[], reinstalled=[], removed=[])
    reinstall = environment.to_reinstall(pinned, installed)
    remove = environment.intruders(pinned, installed, allowed)
    result = {"drift": found, "reinstalled": sorted(reinstall), "removed": sorted(remove)}
    named = f"{venv} was changed in place, it is not its lock: {'; '.join(found)}"
    if not module.params["repair"]:
        module.fail_json(
            msg=f"{named}. Nothing was changed. fix: deploy with repair on (python_env_repair: true) to "
            "reinstall these from the wheelhouse, or undo the change by hand",
            **result,
        )
    if module.check_mode:
        module.warn(f"{named}; a deploy puts the lock back from the wheelhouse")
        module.exit_json(changed=True, **result)
    if reinstall and not module.params["find_links"]:
        module.fail_json(msg=f"{named}; no wheelhouse was given to reinstall from (find_links)", **result)
    if remove:
        _pip(module, venv, ["uninstall", "--yes", *sorted(remove)], "removing " + ", ".join(sorted(remove)))
    if reinstall:
        _reinstall(module, venv, entries, reinstall, module.params["find_links"])
    _compile(venv)
    _, still = _state(venv, pinned, allowed)
    if still:
        module.fail_json(msg=f"{venv} still differs from its lock after the repair: {'; '.join(still)}", **result)
    module.warn(f"{named}; repaired from the wheelhouse (the lock's hashes), the services restart on it")
    module.exit_json(changed=True, **result)


if __name__ == "__main__":
    main()
