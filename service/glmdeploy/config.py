"""The node's deployed settings, as rendered by the vllm_server role.

Why a file and not constants: ports, URLs and paths are defined once in the
Ansible role defaults; the UI, the CLI and the smoke tests read what was
actually deployed instead of repeating those values.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

DEFAULT_PATH = Path("/etc/glmdeploy/node.json")
ENV_VAR = "GLMDEPLOY_NODE_CONFIG"


@dataclass(frozen=True)
class NodeConfig:
    api_url: str
    served_model_name: str
    model_dir: str
    profile: str
    dtype: str
    ui_url: str = ""
    # The model's name (golden files and manifests are kept under it); model_dir's last part
    # carries the manifest digest on a node (/opt/glmdeploy/models/<name>-<digest>).
    model_name: str = ""
    api_key: str = field(default="", repr=False)  # out of tracebacks and logs
    # The profile's GPU requirements (min_driver, min_memory_mib); empty on GPU-less profiles.
    gpu: dict[str, object] = field(default_factory=dict)
    trust_remote_code: bool = False
    # Where the vLLM service logs: its systemd unit, or the kit's log file under supervisord.
    service_unit: str = ""
    service_log_file: str = ""
    # The server takes the `return_token_ids` request field (a capability of the profile's vLLM).
    server_returns_token_ids: bool = False

    @classmethod
    def load(cls, path: str | Path | None = None) -> NodeConfig:
        source = Path(path or os.environ.get(ENV_VAR) or DEFAULT_PATH)
        data = json.loads(source.read_text(encoding="utf-8"))
        known = {f for f in cls.__dataclass_fields__}
        node = cls(**{k: v for k, v in data.items() if k in known})
        return node if node.model_name else replace(node, model_name=Path(node.model_dir).name)
