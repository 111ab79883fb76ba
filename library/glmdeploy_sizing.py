#!/usr/bin/python
"""The engine's settings for the node's GPU class, as Ansible facts rather than parsed stdout.

The rules are the kit's own ``glmdeploy.serving.sizing``, imported from the release being built: the
module runs with that release's environment as its interpreter, where the kit's wheel is
installed (NVML comes from it too: nvidia-ml-py is in the GPU lock), so the engine whose version
gates the class's options (``--api-server-count``) is the one that will start. The classes come
from the registry through the node's plan. Reads only: nothing on the node changes, in check
mode or not.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import asdict
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glmdeploy_sizing
short_description: vLLM settings for the node's GPU class (given, or detected through NVML)
options:
  gpu_class: {description: the class; empty to detect the node's first GPU, type: str, default: ""}
  prefix_caching: {description: "false: the prefix cache off (users must not share it)", type: bool, default: true}
  classes: {description: the registry's GPU classes (the node plan's gpu_classes), type: dict, required: true}
  max_model_len: {description: the profile's context length, type: int, required: true}
  tensor_parallel: {description: GPUs of the host serving one model, type: int, default: 1}
  setting: {description: the inventory setting that names the class (for the error), type: str, default: gpu_class}
"""

RETURN = r"""
settings: {description: the class's settings (memory utilisation, batch sizes, KV cache), type: dict}
engine: {description: the release's vLLM version (null without vLLM), type: str}
vllm_args: {description: the engine arguments those settings give that engine, type: list}
"""


def size(sizing: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The result for these parameters; ValueError with the user's message when they cannot be met."""
    classes = sizing.classes_from(params["classes"])
    known = ", ".join(classes) or "none: the profile has no GPU"
    gpu_class = params["gpu_class"]
    if gpu_class and gpu_class not in classes:
        raise ValueError(
            f"{params['setting']}={gpu_class}: not a known GPU class ({known}). "
            "fix: one of those, or empty to detect it"
        )
    if not gpu_class:
        try:
            name, memory = sizing.detect()
        except Exception as exc:  # no NVML, no driver, no GPU: say so
            raise ValueError(
                f"cannot read the GPU through NVML ({exc}). fix: set {params['setting']} ({known})"
            ) from exc
        gpu_class = sizing.classify(name, classes)
        if gpu_class is None:
            raise ValueError(f"{name} ({memory} MiB) is not a known GPU class ({known}). fix: set {params['setting']}")
    if params["tensor_parallel"] not in sizing.TENSOR_PARALLEL_SIZES:
        raise ValueError(f"tensor parallel size {params['tensor_parallel']}: use one of {sizing.TENSOR_PARALLEL_SIZES}")
    settings = sizing.for_class(gpu_class, classes, params["max_model_len"], params["tensor_parallel"])
    engine = sizing.engine_version()
    return {
        "settings": asdict(settings),
        "engine": ".".join(map(str, engine)) if engine else None,
        "vllm_args": settings.vllm_args(engine, prefix_caching=params["prefix_caching"]),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "gpu_class": {"type": "str", "default": ""},
            "classes": {"type": "dict", "required": True},
            "max_model_len": {"type": "int", "required": True},
            "tensor_parallel": {"type": "int", "default": 1},
            "setting": {"type": "str", "default": "gpu_class"},
            "prefix_caching": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    try:
        sizing = importlib.import_module("glmdeploy.serving.sizing")
    except ImportError as exc:
        module.fail_json(msg=f"the kit's package is not installed for {sys.executable} ({exc}): deploy the node first")
    try:
        module.exit_json(changed=False, **size(sizing, module.params))
    except ValueError as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()
