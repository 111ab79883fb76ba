#!/usr/bin/python
"""The engine's settings for the node's GPU class, as Ansible facts rather than parsed stdout.

The rules are the kit's own ``glmdeploy.sizing``, imported from the release being built: the
module runs with that release's environment as its interpreter, where the kit's wheel is
installed (NVML comes from it too: nvidia-ml-py is in the GPU lock). Reads only: nothing on the
node changes, in check mode or not.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import asdict

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glmdeploy_sizing
short_description: vLLM settings for the node's GPU class (given, or detected through NVML)
options:
  gpu_class: {description: the class; empty to detect the node's first GPU, type: str, default: ""}
  tensor_parallel: {description: GPUs of the host serving one model, type: int, default: 1}
  setting: {description: the inventory setting that names the class (for the error), type: str, default: gpu_class}
"""

RETURN = r"""
settings: {description: the class's settings (memory utilisation, batch sizes, KV cache), type: dict}
vllm_args: {description: the engine arguments those settings give, type: list}
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "gpu_class": {"type": "str", "default": ""},
            "tensor_parallel": {"type": "int", "default": 1},
            "setting": {"type": "str", "default": "gpu_class"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        sizing = importlib.import_module("glmdeploy.sizing")
    except ImportError as exc:
        module.fail_json(msg=f"the kit's package is not installed for {sys.executable} ({exc}): deploy the node first")
    known = ", ".join(sizing.GPU_CLASSES)
    gpu_class = p["gpu_class"]
    if gpu_class and gpu_class not in sizing.GPU_CLASSES:
        module.fail_json(
            msg=f"{p['setting']}={gpu_class}: not a known GPU class ({known}). fix: one of those, or empty to detect it"
        )
    if not gpu_class:
        try:
            name, memory = sizing.detect()
        except Exception as exc:  # no NVML, no driver, no GPU: say so
            module.fail_json(msg=f"cannot read the GPU through NVML ({exc}). fix: set {p['setting']} ({known})")
        gpu_class = sizing.classify(name)
        if gpu_class is None:
            module.fail_json(msg=f"{name} ({memory} MiB) is not a known GPU class ({known}). fix: set {p['setting']}")
    if p["tensor_parallel"] not in sizing.TENSOR_PARALLEL_SIZES:
        module.fail_json(msg=f"tensor parallel size {p['tensor_parallel']}: use one of {sizing.TENSOR_PARALLEL_SIZES}")
    try:
        settings = sizing.for_class(gpu_class, p["tensor_parallel"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, settings=asdict(settings), vllm_args=settings.vllm_args())


if __name__ == "__main__":
    main()
