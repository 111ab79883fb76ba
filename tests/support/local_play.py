"""Run a few of the kit's tasks on this machine with the tools environment's ansible-playbook
(test support, not part of the kit): the unit tests that prove a role's checks or templates as
Ansible itself runs them, without a host to deploy."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".venv" / "tools" / "bin"


def run_tasks(tmp_path: Path, tasks: list[dict], variables: dict | None = None) -> subprocess.CompletedProcess[str]:
    """One play on localhost (no facts gathered) with these tasks and extra variables; the kit's
    roles and registry are this checkout's."""
    if not (TOOLS / "ansible-playbook").exists():
        raise RuntimeError("the tools environment is missing; fix: make tools (make unit builds it first)")
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    extra = {"ansible_python_interpreter": str(TOOLS / "python"), "glmdeploy_control_dir": str(ROOT)}
    (tmp_path / "vars.json").write_text(json.dumps(extra | (variables or {})))
    return subprocess.run(
        [
            str(TOOLS / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"@{tmp_path / 'vars.json'}",
            str(tmp_path / "play.yml"),
        ],
        cwd=ROOT,
        env={"PATH": f"{TOOLS}:/usr/bin:/bin", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def module_argv(module: Path, spec: Path, args: dict, check: bool = False) -> list[str]:
    """The command that runs one of the kit's modules as Ansible runs it on a node (arguments in the
    JSON file `spec`, written here; the result on stdout), with the tools environment's Python.
    Ansible ships the kit's module_utils inside the module's zip; run from the checkout, the same
    files are put on `ansible.module_utils`' search path instead."""
    spec.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check}}))
    launcher = (
        "import runpy, sys, ansible.module_utils as mu; "
        f"mu.__path__.append({str(ROOT / 'module_utils')!r}); "
        f"sys.argv = [{str(module)!r}, {str(spec)!r}]; "
        f"runpy.run_path({str(module)!r}, run_name='__main__')"
    )
    return [str(TOOLS / "python"), "-c", launcher]


def run_module(module: Path, args: dict, check: bool = False) -> subprocess.CompletedProcess[str]:
    """module_argv's command run to its end."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = module_argv(module, Path(tmp) / "args.json", args, check)
        return subprocess.run(argv, capture_output=True, text=True, check=False)
