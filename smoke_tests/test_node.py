"""The node runs the model in fp16, and its GPU (if the profile has one) is healthy."""

from __future__ import annotations

import json
from pathlib import Path

from glmdeploy.config import NodeConfig
from glmdeploy.serving.servicelog import last_engine_start, service_log


def test_model_config_and_node_agree_on_float16(node: NodeConfig) -> None:
    config = json.loads((Path(node.model_dir) / "config.json").read_text())
    assert config["torch_dtype"] == "float16", f"model config says {config['torch_dtype']}"
    assert node.dtype == "float16", f"node configured for {node.dtype}; ChatGLM3-6B-32k runs in float16"


def test_engine_as_started_runs_the_model_in_float16(node: NodeConfig) -> None:
    source, lines = service_log(node.service_unit, node.service_log_file)
    start = last_engine_start(lines)
    assert start is not None, f"no vLLM engine start line in {source}: is the server running under the kit's unit?"
    assert start.dtype == "float16", f"the running engine uses {start.dtype} ({source}): {start.line[:300]}"
    assert start.model == node.model_dir, f"the running engine serves {start.model}, the node expects {node.model_dir}"
