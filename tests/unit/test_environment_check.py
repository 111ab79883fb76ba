"""library/glmdeploy_environment.py: an environment changed in place is named, then put back or refused.

The module runs as a deploy runs it (Ansible's ad-hoc runner on this machine, the kit's library and
module_utils), against a real venv and real pip. The wheels are made here, two versions of one
tiny distribution, so an "admin's pip install" of the other version is real and quick; the lock
pins one of them with its true SHA256, as `make lock` writes it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import glmdeploy_environment as environment
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".venv" / "tools" / "bin"

pytestmark = pytest.mark.skipif(not (TOOLS / "ansible").exists(), reason="needs the tool environment: make tools")


def _wheel(where: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of one module, `<name>.py` holding its version: enough for pip to install."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(body.encode()).digest()).rstrip(b'=').decode()},{len(body)}"
        for path, body in files.items()
    ]
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    path = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, body in files.items():
            zf.writestr(member, body)
    return path


def _lock_line(wheel: Path, name: str, version: str) -> str:
    return f"{name}=={version} \\\n    --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}\n"


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    """A venv built from a lock of two distributions, as the role builds one, and its wheelhouse."""
    house = tmp_path / "wheelhouse"
    house.mkdir()
    a1, b1 = _wheel(house, "glmdeploy_pkg_a", "1.0"), _wheel(house, "glmdeploy_pkg_b", "1.0")
    other = tmp_path / "elsewhere"
    other.mkdir()
    a2, extra = _wheel(other, "glmdeploy_pkg_a", "2.0"), _wheel(other, "glmdeploy_extra", "0.1")
    lock = tmp_path / "requirements.lock"
    lock.write_text(_lock_line(a1, "glmdeploy-pkg-a", "1.0") + _lock_line(b1, "glmdeploy-pkg-b", "1.0"))
    venv = tmp_path / "env" / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    subprocess.run([*pip, "--find-links", str(house), "--require-hashes", "-r", str(lock)], check=True)
    return {"venv": venv, "lock": lock, "house": house, "a2": a2, "extra": extra, "pip": Path(pip[0])}


def _admin_installs(node: dict[str, Path], *wheels: Path) -> None:
    """What the admin did: `pip install <wheel>` straight into the environment."""
    cmd = [str(node["pip"]), "-m", "pip", "install", "-q", "--no-index", "--no-deps", *map(str, wheels)]
    subprocess.run(cmd, check=True)


def _module(node: dict[str, Path], check: bool = False, **args: object) -> dict:
    params = {"venv": str(node["venv"]), "lock": str(node["lock"]), "find_links": str(node["house"]), **args}
    cmd = [str(TOOLS / "ansible"), "localhost", "-m", "glmdeploy_environment", "-a", json.dumps(params)]
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_PYTHON_INTERPRETER": str(TOOLS / "python"),
    }
    proc = subprocess.run(
        [*cmd, "-c", "local", *(["--check"] if check else [])], capture_output=True, text=True, env=env, cwd=ROOT
    )
    result, _ = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("{") :])  # then the timing table
    return result["plays"][0]["tasks"][0]["hosts"]["localhost"]


def _installed(node: dict[str, Path]) -> dict[str, str]:
    site = environment.site_packages(node["venv"])
    assert site is not None
    return environment.installed_in(site)


def test_lock_text_parses_pins_and_hashes_and_keeps_only_named_lines(node):
    text = node["lock"].read_text()
    pins = environment.parse_lock_text(text)
    assert set(pins) == {"glmdeploy-pkg-a", "glmdeploy-pkg-b"} and pins["glmdeploy-pkg-a"][0] == "1.0"
    subset = environment.lock_requirements(pins, {"glmdeploy-pkg-b"})
    assert subset == f"glmdeploy-pkg-b==1.0 --hash=sha256:{next(iter(pins['glmdeploy-pkg-b'][1]))}\n"


def test_unchanged_is_left_alone_and_a_change_is_named_in_check_mode_and_refused_without_repair(node):
    result = _module(node)
    assert not result.get("failed"), result
    assert result["changed"] is False and result["drift"] == []
    _admin_installs(node, node["a2"], node["extra"])
    before = _installed(node)
    checked = _module(node, check=True)
    assert checked["changed"] is True and checked["reinstalled"] == ["glmdeploy-pkg-a"]
    assert checked["removed"] == ["glmdeploy-extra"]
    refused = _module(node, repair=False)
    assert refused.get("failed"), refused
    assert "glmdeploy-pkg-a 2.0 (lock 1.0)" in refused["msg"] and "glmdeploy-extra 0.1 (not in lock)" in refused["msg"]
    assert "Nothing was changed" in refused["msg"] and "python_env_repair" in refused["msg"]
    assert _installed(node) == before


def test_changed_package_is_reinstalled_from_the_wheelhouse_and_intruder_removed(node):
    _admin_installs(node, node["a2"], node["extra"])
    result = _module(node)
    assert not result.get("failed"), result
    assert result["changed"] is True
    assert result["reinstalled"] == ["glmdeploy-pkg-a"] and result["removed"] == ["glmdeploy-extra"]
    now = _installed(node)
    assert now["glmdeploy-pkg-a"] == "1.0" and "glmdeploy-extra" not in now
    code = "import glmdeploy_pkg_a; print(glmdeploy_pkg_a.VERSION)"
    assert subprocess.run([str(node["pip"]), "-c", code], capture_output=True, text=True).stdout.strip() == "1.0"
    assert _module(node)["changed"] is False


def test_a_repair_takes_only_the_locked_bytes(node):
    """A wheelhouse whose wheel is not the one the lock hashed fails the repair, naming the package."""
    _admin_installs(node, node["a2"])
    wheel = next(node["house"].glob("glmdeploy_pkg_a-1.0-*.whl"))
    wheel.unlink()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("glmdeploy_pkg_a.py", "VERSION = 'tampered'\n")
    result = _module(node)
    assert result.get("failed") and "reinstalling glmdeploy-pkg-a" in result["msg"]
    assert _installed(node)["glmdeploy-pkg-a"] == "2.0"


def test_a_release_venv_may_hold_only_the_kit(node):
    """The release's own venv (no lock): anything besides the allowed names is an intruder."""
    _admin_installs(node, node["extra"])
    result = _module(node, lock=None, allowed=["glmdeploy-pkg-a", "glmdeploy-pkg-b"])
    assert result["removed"] == ["glmdeploy-extra"] and "glmdeploy-extra" not in _installed(node)
