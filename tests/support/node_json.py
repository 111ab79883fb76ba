"""node.json as the vllm_server role writes it: its template rendered with a profile's values.

The reader's tests (NodeConfig) use this instead of hand-written dictionaries, so the writer and
the reader are held to each other: a key added to one and not the other fails the unit tests.
Only the template's own Jinja is used; `to_nice_json` is Ansible's (4-space indent, sorted keys).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2

from glmdeploy_control import plan, registry

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "roles" / "vllm_server" / "templates" / "node.json.j2"


def render(profile: str = "cpu", registry_file: Path = registry.DEFAULT_PATH, **overrides: Any) -> dict[str, Any]:
    """The template's output for `profile`, with the role's defaults and `overrides` (role variables)."""
    reg = registry.load(registry_file)
    spec = reg.profile(profile)
    assert spec.runtime is not None
    node = plan.plan(
        reg, host="node1", profile=profile, python_path="python3", probe={"python": "3.11", "pci_vendors": ""}
    )
    values: dict[str, Any] = {
        "glmdeploy_registry": reg.to_dict(),
        "glmdeploy_plan": node.to_dict(),
        "glmdeploy_profile": profile,
        "vllm_server_host": "127.0.0.1",
        "vllm_server_port": reg.kit.services["vllm_server"].port,
        "vllm_server_served_model_name": reg.kit.served_model_name,
        "vllm_server_model_dir": f"/opt/glmdeploy/models/{spec.model}-0123456789ab",
        "vllm_server_model_name": spec.model,
        "vllm_server_dtype": "float16",
        "vllm_server_max_model_len": spec.runtime.max_model_len,
        "vllm_server_trust_remote_code": spec.runtime.trust_remote_code,
        "vllm_server_return_token_ids": spec.runtime.return_token_ids,
        "vllm_server_unit": reg.unit_name("vllm_server"),
        "vllm_server_log_file": "/var/log/glmdeploy/" + reg.log_name("vllm_server"),
        "chat_ui_host": "127.0.0.1",
        "chat_ui_port": reg.kit.services["chat_ui"].port,
        **overrides,
    }
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["to_nice_json"] = lambda value: json.dumps(value, indent=4, sort_keys=True)
    env.filters["combine"] = lambda value, other: {**value, **other}  # Ansible's, for two dicts
    return json.loads(env.from_string(TEMPLATE.read_text()).render(values))


def write(path: Path, profile: str = "cpu", **overrides: Any) -> Path:
    path.write_text(json.dumps(render(profile, **overrides)))
    return path
