"""The node runs the model in fp16, and its GPU (if the profile has one) is healthy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glmdeploy.config import NodeConfig


def test_model_config_and_node_agree_on_float16(node: NodeConfig) -> None:
    config = json.loads((Path(node.model_dir) / "config.json").read_text())
    assert config["torch_dtype"] == "float16", f"model config says {config['torch_dtype']}"
    assert node.dtype == "float16", f"node configured for {node.dtype}; ChatGLM3-6B-32k runs in float16"


def test_gpu_is_visible_to_nvml(node: NodeConfig) -> None:
    if node.profile == "cpu":
        pytest.skip("cpu profile: this node has no GPU, GPU health is not checked")
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed in this environment")
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() >= 1
