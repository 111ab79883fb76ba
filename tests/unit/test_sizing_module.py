"""The vllm_server role's sizing module (library/glmdeploy_sizing.py), run as Ansible runs it.

The module runs with the release's own Python, so the vLLM it finds installed is the one that
will start; the GPU class's --api-server-count must reach that engine only when it has the option
(the class's api_servers_since). Here the "installed" vLLM is a bare distribution record on the
module's path: the module reads versions through importlib.metadata, as on a node, and nothing
of vLLM itself is needed. Before this test the module sized without the engine's version, and
the launcher's `vllm serve` branch could never be rendered by a deploy.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from glmdeploy_control import registry

ROOT = Path(__file__).resolve().parents[2]
TOOLS_PYTHON = ROOT / ".venv" / "tools" / "bin" / "python"
REGISTRY = registry.load()

pytestmark = pytest.mark.skipif(not TOOLS_PYTHON.exists(), reason="needs the tool environment (make tools): Ansible")


def run_module(tmp_path: Path, vllm: str | None, **params: object) -> dict:
    """The module's JSON result, with vLLM `vllm` "installed" (None: not installed)."""
    site = tmp_path / f"site-{vllm}"
    site.mkdir()
    if vllm is not None:
        record = site / f"vllm-{vllm}.dist-info"
        record.mkdir()
        (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {vllm}\n")
    args = tmp_path / "args.json"
    classes = {name: dataclasses.asdict(c) for name, c in REGISTRY.kit.gpu_classes.items()}
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"classes": classes, "max_model_len": 32768, **params}}))
    proc = subprocess.run(
        [str(TOOLS_PYTHON), str(ROOT / "library" / "glmdeploy_sizing.py"), str(args)],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": f"{site}:{ROOT / 'service'}", "PATH": "/usr/bin:/bin"},
    )
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    ("vllm", "passed"), [("0.26.0", True), ("0.27.1+cu130", True), ("0.4.3", False), (None, False)]
)
def test_api_servers_reach_only_an_engine_that_has_the_option(tmp_path, vllm, passed):
    since = REGISTRY.kit.gpu_classes["h200"].api_servers_since
    result = run_module(tmp_path, vllm, gpu_class="h200")
    assert not result.get("failed"), result
    assert ("--api-server-count" in result["vllm_args"]) is passed, (since, result["vllm_args"])
    assert result["engine"] == (vllm.split("+")[0] if vllm else None)


def test_unknown_class_is_refused_naming_the_registrys_classes(tmp_path):
    result = run_module(tmp_path, "0.4.3", gpu_class="t4", setting="vllm_server_gpu_class")
    assert result["failed"]
    assert result["msg"].startswith("vllm_server_gpu_class=t4: not a known GPU class (rtx-4090, ")
    assert "fix:" in result["msg"]
