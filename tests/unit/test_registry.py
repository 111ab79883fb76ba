"""The profile registry (constraints/profiles.toml) and the node plan computed from it."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import node_json  # tests/support
import pytest
import tomllib

from glmdeploy.config import NodeConfig
from glmdeploy_control import lock, plan, registry

ROOT = Path(__file__).resolve().parents[2]
CPU_HOST = {"python": "3.11", "pci_vendors": "0x8086 0x1af4"}
GPU_HOST = {"python": "3.10", "pci_vendors": "0x8086 0x10de"}


def _plan(reg: registry.Registry, probe: dict[str, str], profile: str = "auto") -> plan.NodePlan:
    return plan.plan(reg, host="node1", profile=profile, python_path="/usr/bin/python3", probe=probe)


def test_every_profile_and_python_has_its_lock_and_the_engine_is_pinned_in_it():
    reg = registry.load()
    for name, profile in reg.profiles.items():
        for python in profile.python:
            entries = lock.parse_lock(lock.lock_path(name, python))
            assert profile.engine in entries, f"{name} py{python}: engine {profile.engine} not in the lock"


def test_gpu_rule_gives_the_gpu_profile_to_a_node_with_an_nvidia_device_only():
    reg = registry.load()
    assert _plan(reg, GPU_HOST).profile == "gpu-cu121"
    assert _plan(reg, CPU_HOST).profile == "cpu"
    assert _plan(reg, CPU_HOST).profile_source == "auto"


def test_plan_names_the_lock_and_wheelhouse_for_the_nodes_python():
    node = _plan(registry.load(), GPU_HOST)
    assert node.lock_name == "gpu-cu121-py310.txt"
    assert Path(node.lock_file) == ROOT / "constraints" / "gpu-cu121-py310.txt"
    assert node.wheelhouse_name == "gpu-cu121-py310"
    assert node.gpu_required and node.gpu_present


def test_plan_of_a_python_without_a_lock_has_no_lock_and_says_which_pythons_have_one():
    node = _plan(registry.load(), {"python": "3.12", "pci_vendors": ""}, profile="cpu")
    assert node.lock_name == "" and node.lock_file == ""
    assert node.profile_source == "inventory" and node.pythons == ["3.11"]


def test_python_without_a_lock_names_the_container_runtime_as_the_other_fix():
    node = _plan(registry.load(), {"python": "3.13", "pci_vendors": ""}, profile="cpu")
    (problem,) = node.problems
    assert "/usr/bin/python3 is 3.13" in problem
    assert "glmdeploy_runtime: container for node1" in problem and "Python 3.11" in problem


def test_container_runtime_takes_the_images_python_lock_whatever_the_host_runs():
    reg = registry.load()
    node = plan.plan(
        reg,
        host="node1",
        profile="cpu",
        python_path="/usr/bin/python3",
        probe={"python": "3.13", "pci_vendors": ""},
        runtime="container",
    )
    assert node.problems == [] and node.runtime == "container"
    assert node.python == reg.kit.image.python and node.host_python == "3.13"
    assert node.lock_name == reg.lock_name("cpu", reg.kit.image.python)


def test_unknown_runtime_is_refused_naming_the_ones_there_are():
    with pytest.raises(registry.RegistryError, match="venv, container"):
        plan.plan(
            registry.load(),
            host="node1",
            profile="cpu",
            python_path="/usr/bin/python3",
            probe={"python": "3.11", "pci_vendors": ""},
            runtime="docker",
        )


def test_plan_of_a_gpu_profile_on_a_node_without_a_gpu_reports_it_without_failing():
    node = _plan(registry.load(), CPU_HOST, profile="gpu-cu121")
    assert node.gpu_required and not node.gpu_present


def test_unknown_profile_is_refused_naming_the_ones_there_are():
    with pytest.raises(registry.RegistryError, match=r"unknown profile 'rocm'.*cpu, gpu-cu121.*fix:"):
        _plan(registry.load(), CPU_HOST, profile="rocm")


def _registry_data() -> dict:
    with registry.DEFAULT_PATH.open("rb") as fh:
        return tomllib.load(fh)


def test_unknown_key_in_the_registry_is_refused_by_name():
    data = _registry_data()
    data["profile"]["cpu"]["max_model_length"] = 4096
    with pytest.raises(registry.RegistryError, match=r"\[profile.cpu\]: unknown key 'max_model_length'"):
        registry.parse(data, registry.DEFAULT_PATH)


def test_missing_key_and_wrong_type_are_refused_by_name():
    data = _registry_data()
    del data["profile"]["gpu-cu121"]["model"]
    with pytest.raises(registry.RegistryError, match=r"\[profile.gpu-cu121\]: missing key 'model'"):
        registry.parse(data, registry.DEFAULT_PATH)
    data = _registry_data()
    data["kit"]["services"]["vllm_server"]["port"] = "8000"
    with pytest.raises(registry.RegistryError, match=r"port must be int"):
        registry.parse(data, registry.DEFAULT_PATH)


THIRD_PROFILE = """
[profile.rocm-x]
python = ["3.11"]
exclude_newer = "2026-11-01"
engine = "vllm"
model = "chatglm3-6b-32k"
model_source = "weights"
packages = ["rocm-smi"]

[profile.rocm-x.runtime]
max_model_len = 8192
trust_remote_code = true
return_token_ids = false
extra_args = []
extra_env = {}
first_byte_timeout_s = 60

[profile.rocm-x.gpu]
driver_branch = "6.2"
min_driver = "6.2.0"
min_memory_mib = 20000
"""


def test_a_third_profile_is_one_registry_entry_and_a_lock(tmp_path):
    constraints = tmp_path / "constraints"
    shutil.copytree(ROOT / "constraints", constraints, ignore=shutil.ignore_patterns("*.txt"))
    path = constraints / "profiles.toml"
    path.write_text(path.read_text() + THIRD_PROFILE)
    (constraints / "rocm-x-py311.txt").write_text("vllm==0.4.3 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    reg = registry.load(path)

    node = _plan(reg, CPU_HOST, profile="rocm-x")
    assert (node.profile, node.lock_name, node.wheelhouse_name) == ("rocm-x", "rocm-x-py311.txt", "rocm-x-py311")
    assert Path(node.lock_file).is_file() and node.gpu_required
    assert reg.profile("rocm-x").packages == ["rocm-smi"]
    assert reg.unit_name("vllm_server") == "glmdeploy-vllm_server.service"
    # What the vllm_server role renders into node.json for it, read whole by the node's schema.
    node_config = NodeConfig.from_dict(node_json.render("rocm-x", registry_file=path))
    assert (node_config.profile, node_config.max_model_len) == ("rocm-x", 8192)
    assert node_config.gpu["min_memory_mib"] == 20000


def test_makefile_cli_reads_the_same_registry():
    def cli(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "glmdeploy_control.registry", *args],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONPATH": str(ROOT / "service")},
        ).stdout.strip()

    words = cli("make-vars", "--python", "3.10", "--control-python", "3.11").split()
    assert "REG_PROFILES=cpu,gpu-cu121" in words
    assert "REG_FIXTURE_MODEL=chatglm3-fixture" in words
    assert "REG_WHEELHOUSE.gpu-cu121=gpu-cu121-py310" in words
    assert "REG_TOOLS_LOCK=tools-py311.txt" in words
    assert cli("get", "profiles.cpu.gpu") == ""
    bad = subprocess.run(
        [sys.executable, "-m", "glmdeploy_control.registry", "lock-name", "rocm", "3.11"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "service")},
        check=False,
    )
    assert bad.returncode == 2 and "unknown profile 'rocm'" in bad.stderr


def test_plan_carries_the_profiles_spec_units_ports_and_packages_roles_read():
    reg = registry.load()
    node = _plan(reg, GPU_HOST)
    assert node.spec == dataclasses.asdict(reg.profiles[node.profile])
    assert node.units["vllm_server"] == reg.unit_name("vllm_server")
    assert set(node.units) == set(reg.kit.services) | set(reg.kit.node_units)
    assert node.ports == {name: service.port for name, service in reg.kit.services.items()}
    assert node.base_packages == [*reg.kit.packages, *reg.profiles[node.profile].packages]
    assert node.driver_branch == reg.profiles[node.profile].gpu.driver_branch


def test_gpu_profile_in_a_container_is_a_plan_problem_naming_the_venv_runtime():
    node = plan.plan(
        registry.load(),
        host="node1",
        profile="auto",
        python_path="/usr/bin/python3",
        probe=GPU_HOST,
        runtime="container",
    )
    assert node.base_packages == registry.load().kit.image.host_packages
    assert any("glmdeploy_runtime: venv for this host" in p for p in node.problems)


def test_rehearsal_lets_a_gpu_profile_plan_a_node_without_a_gpu_and_the_driver_stages_only():
    reg = registry.load()
    kept = plan.plan(reg, host="n", profile="gpu-cu121", python_path="p", probe=CPU_HOST, require_gpu=False)
    refused = _plan(reg, CPU_HOST, profile="gpu-cu121")
    assert kept.problems == [] and kept.gpu_problem == "" and not kept.gpu_present
    assert refused.gpu_problem in refused.problems and f"PROFILE={reg.kit.auto.none}" in refused.gpu_problem
