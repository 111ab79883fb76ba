"""The node's deployed settings (node.json), as the vllm_server role renders them.

Why a file and not constants: ports, URLs and paths are defined once (the profile registry and
the role defaults); the UI, the CLI, the benchmark and the smoke tests read what was actually
deployed instead of repeating those values.

This class is the file's one schema: the writer's test renders the role's template and reads it
back through `from_dict`, and every reader goes through `load`. A key that is missing, unknown or
of the wrong type is refused by name: a reader that dropped an unknown key silently would hide a
writer and reader out of step (a node.json of another kit version).
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path("/etc/glmdeploy/node.json")
ENV_VAR = "GLMDEPLOY_NODE_CONFIG"


class NodeConfigError(ValueError):
    """node.json does not match this kit's schema; the message names the key and the fix."""


@dataclass(frozen=True)
class NodeConfig:
    #: The OpenAI-compatible base URL clients on the node use (a wildcard bind becomes 127.0.0.1).
    api_url: str
    served_model_name: str
    #: The release's model directory (content-named: /opt/glmdeploy/models/<name>-<digest>).
    model_dir: str
    #: The model's name (golden files and manifests are kept under it).
    model_name: str
    profile: str
    #: The profile's GPU requirements (min_driver, min_memory_mib, ...); empty on GPU-less profiles.
    gpu: dict[str, object]
    dtype: str
    max_model_len: int
    trust_remote_code: bool
    #: The server takes the `return_token_ids` request field (a capability of the profile's vLLM).
    server_returns_token_ids: bool
    #: Where the vLLM service logs: its systemd unit, or the kit's log file under supervisord.
    service_unit: str
    service_log_file: str
    #: "" when the API listens on loopback only; out of tracebacks and logs.
    api_key: str = field(repr=False)
    ui_url: str

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "node.json") -> NodeConfig:
        """The config from parsed JSON: every key there, none unknown, each of its type."""
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        fix = "fix: deploy the node again with this kit (make deploy), or use the kit version that deployed it"
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise NodeConfigError(f"{source}: unknown key {unknown[0]!r} (this kit reads {', '.join(names)}); {fix}")
        missing = [n for n in names if n not in data]
        if missing:
            raise NodeConfigError(f"{source}: missing key {missing[0]!r}; {fix}")
        for name in names:
            want = typing.get_origin(hints[name]) or hints[name]
            value = data[name]
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise NodeConfigError(f"{source}: {name} must be {want.__name__}, not {value!r}; {fix}")
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path | None = None) -> NodeConfig:
        source = Path(path or os.environ.get(ENV_VAR) or DEFAULT_PATH)
        return cls.from_dict(json.loads(source.read_text(encoding="utf-8")), str(source))

    def public(self) -> dict[str, Any]:
        """The settings without the API key: what reports and benchmark results may keep."""
        data = dataclasses.asdict(self)
        del data["api_key"]
        return data
