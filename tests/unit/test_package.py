"""The kit's wheel: what a release installs on a node (roles/python_env, tasks/kit.yml).

Built here with the tool lock's uv, as the deploy builds it; installed the way the deploy installs
it (a small venv made by a lock environment's own Python, the wheel with --no-deps --no-index, a
.pth that adds the environment's site-packages). The lock environment here is the reference
tokenizer environment (transformers 4.40.2, tokenizers 0.19.1): the node modules that need a
third-party package find it there, as they find the lock's packages on a node. Streamlit is not
in it, so ``glmdeploy.chat_ui.ui`` is the one node module not imported here (the e2e chat UI test runs it).
"""

from __future__ import annotations

import configparser
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import glmdeploy

ROOT = Path(__file__).resolve().parents[2]
UV = ROOT / ".venv" / "tools" / "bin" / "uv"
WHEEL = f"glmdeploy-{glmdeploy.__version__}-py3-none-any.whl"
SCRIPTS = {
    "glmdeploy-ready": "glmdeploy.serving.ready:main",
    "glmdeploy-chat": "glmdeploy.tools.chat:main",
    "glmdeploy-bench": "glmdeploy.tools.bench.cli:main",
    "glmdeploy-golden": "glmdeploy.model.golden:main",
    "glmdeploy-outputs": "glmdeploy.tools.outputs:main",
    "glmdeploy-soak": "glmdeploy.tools.soak:main",
    "glmdeploy-prober": "glmdeploy.monitoring.prober:main",
    "glmdeploy-gpu-exporter": "glmdeploy.monitoring.gpu_exporter:main",
    "glmdeploy-fingerprint": "glmdeploy.serving.fingerprint:main",
    "glmdeploy-procguard": "glmdeploy.serving.procguard:main",
    "glmdeploy-ui": "glmdeploy.chat_ui.ui_launch:main",
}
# Every node module but ui (Streamlit runs it as a script; see the module docstring).
#: Every module of the package by its path under glmdeploy/ ("serving/ready"), sub-packages included.
PACKAGE = ROOT / "service" / "glmdeploy"
MODULES = sorted(str(p.relative_to(PACKAGE).with_suffix("")) for p in PACKAGE.rglob("*.py"))
NODE_MODULES = [m for m in MODULES if m != "chat_ui/ui" and not m.endswith("__main__")]


def build(source: Path, out: Path) -> Path:
    if not UV.exists():
        pytest.fail(f"{UV} missing: run `make tools` (make unit does it)")
    subprocess.run(
        [str(UV), "build", "--wheel", "--offline", "--quiet", "--out-dir", str(out), str(source)], check=True
    )
    return out / WHEEL


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(ROOT / "service", tmp_path_factory.mktemp("dist"))


def test_wheel_holds_the_node_package_and_its_entry_points_only(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = zf.read(f"glmdeploy-{glmdeploy.__version__}.dist-info/entry_points.txt").decode()
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"glmdeploy", f"glmdeploy-{glmdeploy.__version__}.dist-info"}, tops
    assert {f"glmdeploy/{m}.py" for m in MODULES} <= set(names)
    parser = configparser.ConfigParser()
    parser.read_string(entry_points)
    assert dict(parser["console_scripts"]) == SCRIPTS


def test_wheel_is_the_same_bytes_from_the_same_sources(wheel, tmp_path):
    """The release is named after the wheel's digest: a rebuild must not make a new release."""
    copy = shutil.copytree(ROOT / "service", tmp_path / "service", ignore=shutil.ignore_patterns("__pycache__"))
    for path in copy.rglob("*"):
        os.utime(path, (1, 1))  # other timestamps, as in another clone
    again = build(copy, tmp_path / "dist")
    assert hashlib.sha256(again.read_bytes()).hexdigest() == hashlib.sha256(wheel.read_bytes()).hexdigest()


def test_node_modules_import_from_a_release_environment_built_like_the_kits(wheel, tmp_path):
    env_site = sysconfig.get_path("purelib")  # the lock environment: this test's own venv
    overlay = tmp_path / "kits" / "w-env" / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(overlay)], check=True)
    clean = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    pip = [str(overlay / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index", "--disable-pip-version-check"]
    subprocess.run([*pip, str(wheel)], check=True, env=clean)
    site = next((overlay / "lib").glob("python3.*/site-packages"))
    (site / "glmdeploy-environment.pth").write_text(f"import site; site.addsitedir({env_site!r})\n")
    probe = (
        "import importlib, sys, transformers\n"
        f"mods = [importlib.import_module('glmdeploy.' + m.replace('/', '.')) for m in {NODE_MODULES!r}]\n"
        "print(mods[0].__file__)\n"
    )
    out = subprocess.run(
        [str(overlay / "bin" / "python"), "-c", probe], capture_output=True, text=True, env=clean, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(site), f"imported {out.stdout.strip()}, not the installed wheel"
    for script in SCRIPTS:
        assert (overlay / "bin" / script).read_text().startswith(f"#!{overlay}/bin/python")
    helped = subprocess.run(
        [str(overlay / "bin" / "glmdeploy-procguard"), "--help"], capture_output=True, text=True, env=clean
    )
    assert helped.returncode == 0 and "usage:" in helped.stdout, helped.stderr


def test_release_logic_runs_on_the_nodes_system_python_with_the_standard_library_only():
    """module_utils/glmdeploy_release.py is what the glmdeploy_release module runs on the node:
    under the system Python, isolated from any environment (a rollback must work when one is broken)."""
    system = shutil.which("python3", path="/usr/bin:/bin")
    assert system, "no python3 in /usr/bin: the node's system Python"
    code = "import sys; sys.path.insert(0, sys.argv[1]); import glmdeploy_release as r; print(r.__file__)"
    out = subprocess.run([system, "-I", "-S", "-c", code, str(ROOT / "module_utils")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("module_utils/glmdeploy_release.py")


def _imports(path: Path) -> set[str]:
    """The glmdeploy modules a file imports (absolute imports; the package uses no relative ones)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("glmdeploy"):
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("glmdeploy")}
    return found


def test_what_runs_on_a_node_imports_no_client_tool():
    """The serving side, the monitoring, the balancer and the UI run on nodes and hosts of the fleet;
    the client tools (benchmark, soak, load generator, output recorder) must not ride along."""
    node_side = [m for m in MODULES if not m.startswith("tools/")]
    offenders = {
        m: sorted(i for i in _imports(PACKAGE / f"{m}.py") if i.startswith("glmdeploy.tools")) for m in node_side
    }
    assert {m: i for m, i in offenders.items() if i} == {}


def test_no_file_of_the_kit_loads_another_by_path():
    """Modules are imported as modules (the tool environment has the checkout on its path, nodes
    the wheel): no sys.path edits, no spec_from_file_location, outside the model's own remote code."""
    kit = [*ROOT.glob("service/**/*.py"), *ROOT.glob("plugins/**/*.py"), *ROOT.glob("library/*.py")]
    allowed = {PACKAGE / "model" / "served_tokenizer.py"}  # loads the model directory's tokenizer code
    found = [
        str(p.relative_to(ROOT))
        for p in kit
        if p not in allowed and ("sys.path.insert" in p.read_text() or "spec_from_file_location" in p.read_text())
    ]
    assert found == []
