"""Each lint of tests/lint catches what it exists to catch (run by `make lint`, in the tool venv).

Why: a lint that passes proves nothing by itself. single_source.py passed a planted
`node_metrics_prober_port: 9811` in a role's defaults, because its rules were a copy of the
registry's values from before the prober had a port. So every lint here, and every rule of
single_source, gets a test that plants one violation into a copy of the part of the tree it reads
and expects the lint to fail naming the file and the line, and the registry key or the fix; and
one test that the checkout itself passes. Nothing here touches the checkout: each test works in
its own tmp_path.

These live beside the lints, not in tests/unit: `make unit` runs in the reference tokenizer
environment and tests the kit's code; these test the lints, in the environment `make lint` runs
them with.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _script(name: str) -> ModuleType:
    """A lint script of this folder as a module (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


single_source = _script("single_source")
facts = _script("facts")
role_docs = _script("role_docs")


def copy(root: Path, *parts: str) -> None:
    """Copy files or folders of the checkout into the tree at root (same relative paths)."""
    for rel in parts:
        source, dest = ROOT / rel, root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, dest)


def plant(root: Path, rel: str, text: str, mark: int = -1) -> int:
    """Append text to root/rel (the checkout's file first, where there is one); returns the line
    number of the planted line `mark` (an index into text's lines: the last by default)."""
    path = root / rel
    if not path.exists() and (ROOT / rel).is_file():
        copy(root, rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    if before and not before.endswith("\n"):
        before += "\n"
    path.write_text(before + text.rstrip("\n") + "\n", encoding="utf-8")
    planted = text.rstrip("\n").splitlines()
    return len(before.splitlines()) + (mark % len(planted)) + 1


# ---------------------------------------------------------------------------- single_source


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The least of a checkout single_source reads: the registry, and node.json's one schema."""
    copy(tmp_path, "constraints/profiles.toml", "service/glmdeploy/config.py")
    return tmp_path


def only_problem(root: Path) -> str:
    found = single_source.problems(root)
    assert len(found) == 1, "\n".join(found) or "the planted violation was not caught"
    return found[0]


def assert_caught(root: Path, rel: str, line: int, key: str) -> None:
    problem = only_problem(root)
    assert problem.startswith(f"{rel}:{line}: "), problem
    assert key in problem.split("fix: read ", 1)[-1], problem


def test_planted_prober_port_literal_is_caught(tree: Path) -> None:
    rel = "roles/node_metrics/defaults/main.yml"
    line = plant(tree, rel, "node_metrics_prober_port: 9811")
    assert_caught(tree, rel, line, "kit.services.prober.port")


def test_the_cli_exits_1_naming_file_line_and_key(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rel = "roles/node_metrics/defaults/main.yml"
    line = plant(tree, rel, "node_metrics_prober_port: 9811")
    assert single_source.main(["--root", str(tree)]) == 1
    err = capsys.readouterr().err
    assert f"{rel}:{line}: port 9811 written as a literal" in err
    assert "fix: read kit.services.prober.port from the registry instead" in err


def _registry_ports() -> list[tuple[str, int]]:
    reg = single_source.registry.load(ROOT / "constraints/profiles.toml")
    return list(single_source._ports(reg.to_dict()))


@pytest.mark.parametrize(("key", "port"), _registry_ports(), ids=[k for k, _ in _registry_ports()])
def test_every_port_the_registry_defines_is_caught_as_a_setting(tree: Path, key: str, port: int) -> None:
    rel = "roles/node_firewall/defaults/main.yml"
    line = plant(tree, rel, f"node_firewall_planted_port: {port}")
    assert_caught(tree, rel, line, key)


@pytest.mark.parametrize(
    ("rel", "text", "key"),
    [
        ("roles/load_balancer/templates/glmdeploy.conf.j2", "    listen 127.0.0.1:9813;", "kit.balancer.health_port"),
        (
            "roles/monitoring/templates/targets.j2",
            "{% set port = hostvars[host].load_balancer_keys_port | default(9814) %}",
            "kit.balancer.keys_port",
        ),
        ("service/glmdeploy/monitoring/prober.py", "PLANTED_SHARE_PORT = 8873", "kit.share.port"),
        (
            "service/glmdeploy/monitoring/prober.py",
            'PLANTED_ARGS = ["--port", "8000"]',
            "kit.services.vllm_server.port",
        ),
        ("Makefile", "PLANTED_UI := http://127.0.0.1:8501/", "kit.services.chat_ui.port"),
    ],
    ids=["nginx-listen-address", "jinja-default", "python-constant", "python-argv", "makefile-url"],
)
def test_planted_port_in_an_address_default_or_argument_is_caught(tree: Path, rel: str, text: str, key: str) -> None:
    line = plant(tree, rel, text)
    assert_caught(tree, rel, line, key)


def test_planted_profile_comparison_is_caught(tree: Path) -> None:
    rel = "roles/vllm_server/tasks/main.yml"
    text = "- name: Planted\n  ansible.builtin.debug:\n    var: glmdeploy_profile\n  when: glmdeploy_profile == 'cpu'"
    line = plant(tree, rel, text)
    assert_caught(tree, rel, line, "profiles.cpu / kit.auto.none")


def test_planted_profile_name_as_a_value_is_caught(tree: Path) -> None:
    rel = "roles/vllm_server/defaults/main.yml"
    line = plant(tree, rel, "vllm_server_planted_profile: gpu-cu121")
    assert_caught(tree, rel, line, "profiles.gpu-cu121 / kit.auto.gpu")


def test_planted_unit_name_is_caught_in_a_module_argument(tree: Path) -> None:
    rel = "roles/vllm_server/tasks/main.yml"
    text = (
        "- name: Planted restart\n  ansible.builtin.systemd:\n    name: glmdeploy-vllm_server.service\n"
        "    state: restarted"
    )
    line = plant(tree, rel, text, mark=2)
    assert_caught(tree, rel, line, "kit.unit")


def test_unit_name_built_again_from_the_pattern_is_caught(tree: Path) -> None:
    rel = "service/glmdeploy/serving/procguard.py"
    line = plant(tree, rel, 'PLANTED_UNIT = f"glmdeploy-{__name__}.service"')
    assert_caught(tree, rel, line, "kit.unit")


@pytest.mark.parametrize(
    ("rel", "text", "key"),
    [
        ("roles/model/defaults/main.yml", "model_planted_name: chatglm3-6b-32k", "kit.served_model_name"),
        ("service/glmdeploy/serving/ready.py", 'PLANTED_MODEL = "chatglm3-fixture"', "profiles.cpu.model"),
    ],
    ids=["served-model-yaml", "fixture-model-python"],
)
def test_planted_model_name_is_caught(tree: Path, rel: str, text: str, key: str) -> None:
    line = plant(tree, rel, text)
    assert_caught(tree, rel, line, key)


def test_planted_gpu_vendor_id_is_caught(tree: Path) -> None:
    rel = "roles/preflight/tasks/main.yml"
    text = (
        "- name: Planted GPU probe\n"
        "  ansible.builtin.command: grep -qx 0x10de /sys/bus/pci/devices/0000:00:00.0/vendor\n"
        "  changed_when: false"
    )
    line = plant(tree, rel, text, mark=1)
    assert_caught(tree, rel, line, "kit.gpu_pci_vendor")


@pytest.mark.parametrize(
    ("rel", "text", "key"),
    [
        ("roles/python_env/defaults/main.yml", "python_env_planted_lock: constraints/cpu-py311.txt", "kit.lock_file"),
        ("service/glmdeploy/serving/fingerprint.py", 'PLANTED_LOCK = f"{__name__}-py{3}.txt"', "kit.lock_file"),
        ("Makefile", "PLANTED_WHEELHOUSE := $(ARTIFACTS)/wheelhouse/gpu-cu121-py310", "kit.wheelhouse"),
        ("roles/glmdeploy/defaults/main.yml", "glmdeploy_planted: constraints/apt/debian-12.lock", "kit.apt.lock_file"),
    ],
    ids=["lock-file-yaml", "lock-file-python-format", "wheelhouse-makefile", "apt-lock-yaml"],
)
def test_planted_file_name_of_a_registry_pattern_is_caught(tree: Path, rel: str, text: str, key: str) -> None:
    line = plant(tree, rel, text)
    assert_caught(tree, rel, line, key)


def test_a_port_profile_and_model_added_to_the_registry_are_checked_from_then_on(tree: Path) -> None:
    registry = tree / "constraints/profiles.toml"
    text = registry.read_text(encoding="utf-8")
    cpu = re.search(r"^\[profile\.cpu\]$.*?(?=^\[(?!profile\.cpu\.))", text, re.M | re.S)
    assert cpu, "constraints/profiles.toml has no [profile.cpu] to copy"
    added = cpu.group(0).replace("[profile.cpu", "[profile.planted").replace('"chatglm3-fixture"', '"planted-model"')
    registry.write_text(f"{text}\n{added}\n[kit.services.planted]\nport = 9900\n", encoding="utf-8")
    rel = "roles/vllm_server/defaults/main.yml"
    lines = [
        plant(tree, rel, "vllm_server_planted_port: 9900"),
        plant(tree, rel, "vllm_server_planted_when: \"{{ glmdeploy_profile == 'planted' }}\""),
        plant(tree, rel, "vllm_server_planted_model: planted-model"),
    ]
    found = single_source.problems(tree)
    assert [p.split(": ", 1)[0] for p in found] == [f"{rel}:{n}" for n in lines], "\n".join(found)
    keys = ["kit.services.planted.port", "profiles.planted", "profiles.planted.model"]
    for problem, key in zip(found, keys, strict=True):
        assert f"fix: read {key}" in problem


def test_prose_naming_registry_values_is_not_caught(tree: Path) -> None:
    plant(
        tree,
        "roles/vllm_server/tasks/main.yml",
        "# vllm_server_port: 8000 on cpu and gpu-cu121 nodes alike\n"
        "- name: Open port 9811 for glmdeploy-prober.service (vendor 0x10de nodes, cpu-py311.txt)\n"
        "  ansible.builtin.assert:\n"
        "    that: vllm_server_port | int > 0\n"
        "    fail_msg: >-\n"
        "      give each its own port (e.g. -e chat_ui_port=8501 or model_name=chatglm3-6b-32k)",
    )
    plant(
        tree,
        "service/glmdeploy/monitoring/prober.py",
        'def planted() -> None:\n    """Serve on port=9811 (the registry\'s kit.services.prober.port)."""\n\n\n'
        'PLANTED = {"cpu": 1}  # the host\'s CPU, not the cpu profile\n'
        'PLANTED_HELP = dict(help="e.g. http://127.0.0.1:8000/v1")',
    )
    assert single_source.problems(tree) == []


def test_the_registry_and_its_loader_are_not_checked(tree: Path) -> None:
    copy(tree, "service/glmdeploy_control/registry.py")
    assert single_source.problems(tree) == []


def test_a_second_node_json_schema_is_caught(tree: Path) -> None:
    plant(tree, "smoke_tests/planted.py", "class NodeConfig:\n    pass")
    problem = only_problem(tree)
    assert "schema must be defined once" in problem and "smoke_tests/planted.py" in problem


def test_the_checkout_passes_single_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert single_source.main(["--root", str(ROOT)]) == 0, capsys.readouterr().err


# ---------------------------------------------------------------------------- facts


@pytest.fixture
def two_roles(tmp_path: Path) -> Path:
    """The role that sets the planted fact and the one that reads it (facts.py reads roles/ and playbooks/)."""
    copy(tmp_path, "roles/node_metrics", "roles/monitoring")
    return tmp_path


SET_PLANTED = "- name: Planted hand-over\n  ansible.builtin.set_fact:\n    planted_handover: true"


def test_planted_undeclared_fact_is_caught(two_roles: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = two_roles
    setter = "roles/node_metrics/tasks/main.yml"
    reader = "roles/monitoring/templates/targets.j2"
    set_line = plant(root, setter, SET_PLANTED)
    read_line = plant(root, reader, "{{ planted_handover }}")
    assert facts.main(["--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert f"fact planted_handover, set in {setter}:{set_line}, is read in {reader}:{read_line}" in err, err
    assert "fix: name it (`planted_handover`) in the '## Facts' section of roles/node_metrics/README.md" in err


def test_a_fact_declared_in_the_setting_roles_readme_passes(two_roles: Path) -> None:
    root = two_roles
    plant(root, "roles/node_metrics/tasks/main.yml", SET_PLANTED)
    plant(root, "roles/monitoring/templates/targets.j2", "{{ planted_handover }}")
    readme = root / "roles/node_metrics/README.md"
    text = readme.read_text(encoding="utf-8")
    readme.write_text(text.replace("Set for others:\n", "Set for others:\n\n- `planted_handover`: planted.\n", 1))
    assert facts.main(["--root", str(root)]) == 0


def test_the_checkout_passes_facts(capsys: pytest.CaptureFixture[str]) -> None:
    assert facts.main(["--root", str(ROOT)]) == 0, capsys.readouterr().err


# ---------------------------------------------------------------------------- role_docs


@pytest.fixture
def roles(tmp_path: Path) -> Path:
    """One role with an argument spec, its table regenerated so that a planted change is the only one
    (whether the checkout's READMEs are up to date is test_the_checkout_passes_role_docs's question)."""
    copy(tmp_path, "roles/node_metrics")
    assert role_docs.main(["--write", "--roles-dir", str(tmp_path / "roles")]) == 0
    return tmp_path / "roles"


def check(roles_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = role_docs.main(["--check", "--roles-dir", str(roles_dir)])
    return code, capsys.readouterr().err


def table_line(readme: Path, variable: str) -> int:
    lines = readme.read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.startswith(f"| `{variable}` |"))


def test_planted_undocumented_role_argument_is_caught(roles: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = roles / "node_metrics/meta/argument_specs.yml"
    text = spec.read_text(encoding="utf-8")
    option = "      node_metrics_planted:\n        type: int\n        description: Planted, not in the README.\n"
    spec.write_text(text.replace("    options:\n", "    options:\n" + option, 1), encoding="utf-8")
    readme = roles / "node_metrics/README.md"
    first_row = table_line(readme, "node_metrics_listen")
    code, err = check(roles, capsys)
    assert code == 1
    assert f"node_metrics/README.md:{first_row}: the variables table is stale" in err, err
    assert "node_metrics_planted" in err and "fix: .venv/tools/bin/python tests/lint/role_docs.py --write" in err


def test_planted_default_of_a_role_without_a_spec_is_caught(roles: Path, capsys: pytest.CaptureFixture[str]) -> None:
    role = roles / "planted"
    (role / "defaults").mkdir(parents=True)
    (role / "defaults/main.yml").write_text("# Planted.\nplanted_old: 1\n", encoding="utf-8")
    (role / "README.md").write_text(f"# planted\n\n{role_docs.BEGIN}\n{role_docs.END}\n", encoding="utf-8")
    assert role_docs.main(["--write", "--roles-dir", str(roles)]) == 0
    plant(roles.parent, "roles/planted/defaults/main.yml", "# Planted later.\nplanted_new: 2")
    code, err = check(roles, capsys)
    assert code == 1
    row = table_line(role / "README.md", "planted_old") + 1
    assert f"planted/README.md:{row}: the variables table is stale" in err and "planted_new" in err, err


def test_a_role_without_a_readme_is_caught(roles: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (roles / "planted/defaults").mkdir(parents=True)
    (roles / "planted/defaults/main.yml").write_text("planted: 1\n", encoding="utf-8")
    code, err = check(roles, capsys)
    assert code == 1 and "planted: README.md is missing" in err, err


def test_write_makes_a_stale_table_pass_the_check(roles: Path, capsys: pytest.CaptureFixture[str]) -> None:
    defaults = roles / "node_metrics/defaults/main.yml"
    text = defaults.read_text(encoding="utf-8")
    defaults.write_text(re.sub(r"^(node_metrics_probe_interval): .*$", r"\1: 7", text, flags=re.M), encoding="utf-8")
    assert check(roles, capsys)[0] == 1
    assert role_docs.main(["--write", "--roles-dir", str(roles)]) == 0
    assert check(roles, capsys) == (0, "")


def test_the_checkout_passes_role_docs(capsys: pytest.CaptureFixture[str]) -> None:
    assert role_docs.main(["--check"]) == 0, capsys.readouterr().err
