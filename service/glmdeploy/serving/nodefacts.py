"""What a node is, as its own programs report it: its hardware and its hardware class (the key
baselines and output recordings are kept under), and the memory its server uses.

Why a module of its own: the prober (a node daemon), the output recorder, the soak and the
benchmark all need these facts; before, the prober imported the benchmark and the soak for them
and so carried client tooling into every node's monitoring.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from glmdeploy.config import NodeConfig
from glmdeploy.serving import procguard, sizing

#: The node's inference server, as glmdeploy.serving.procguard marks its processes.
SERVICE = "vllm_server"


def hardware() -> dict[str, Any]:
    """What ran the server, when the bench runs on the node itself (GPU names via NVML when present)."""
    info: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    try:
        model = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")]
        info["cpu"] = model[0].split(":", 1)[1].strip() if model else info["cpu"]
    except OSError:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        names = [pynvml.nvmlDeviceGetName(h) for h in handles]
        info["gpus"] = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        driver = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:
        info["gpus"] = []
    return info


def hardware_class(info: dict[str, Any], classes: Mapping[str, sizing.GpuClass]) -> str:
    """Baselines are kept per class: the GPU model and count, or the CPU count on GPU-less nodes."""
    gpus = info.get("gpus") or []
    if gpus:
        # The sizing classes (rtx-4090, a10, h200, ...) name known cards; another card keeps its own name.
        name = sizing.classify(gpus[0], classes) or gpus[0].lower().replace("nvidia", "").strip().replace(" ", "-")
        return f"{name}x{len(gpus)}"
    return f"cpu{info.get('cpu_count')}"


def node_hardware_class(node: NodeConfig) -> str:
    """This node's hardware class, by the GPU classes it was deployed with (node.json)."""
    classes = node.gpu.get("classes", {})
    return hardware_class(hardware(), sizing.classes_from(classes if isinstance(classes, dict) else {}))


def service_memory_mb(service: str = SERVICE) -> float | None:
    """PSS of every process of the service's runs in MB (shared pages counted once); None when no
    process of it is found here (the load goes to another machine, or the server is down)."""
    import psutil  # every node lock has it (a dependency of vLLM)

    total, seen = 0, False
    for pid in procguard.processes(service):
        try:
            total += psutil.Process(pid).memory_full_info().pss
            seen = True
        except (psutil.Error, OSError):
            continue
    return round(total / 2**20, 1) if seen else None


@functools.cache
def _gpus() -> tuple[Any, list[Any]] | None:
    """NVML and the node's GPU handles, looked up once per soak; None where NVML does not answer."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:
        return None


def gpu_memory_mb() -> float | None:
    """GPU memory in use on all of the node's GPUs in MB, where NVML answers."""
    gpus = _gpus()
    if gpus is None:
        return None
    nvml, handles = gpus
    try:
        return round(float(sum(nvml.nvmlDeviceGetMemoryInfo(h).used for h in handles)) / 2**20, 1)
    except Exception:
        return None
