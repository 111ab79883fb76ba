"""The node's GPUs, read through NVML: driver, memory, ECC, persistence.

On a profile without a GPU every test here skips with that reason; on a GPU
profile a missing NVML binding is a failure, never a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from glmdeploy.config import NodeConfig


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


@pytest.fixture(scope="module")
def nvml(node: NodeConfig) -> Iterator[Any]:
    if not node.gpu:
        pytest.skip(f"profile {node.profile} has no GPU: driver, memory, ECC and persistence checks do not apply")
    absent = os.environ.get("SMOKE_GPU_ABSENT_REASON", "")
    if absent:  # the gpu-cu121 rehearsal (docs/rehearsal.md): a GPU profile on purpose without a GPU
        pytest.skip(f"no GPU on this node, on purpose: {absent}")
    try:
        import pynvml
    except ImportError:
        pytest.fail(f"profile {node.profile} needs nvidia-ml-py (pynvml) in its lock to check the GPU")
    pynvml.nvmlInit()
    yield pynvml
    pynvml.nvmlShutdown()


@pytest.fixture(scope="module")
def handles(nvml: Any) -> list[Any]:
    count = nvml.nvmlDeviceGetCount()
    assert count >= 1, "NVML sees no GPU on this node"
    return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def test_driver_meets_the_lock_minimum(nvml: Any, node: NodeConfig) -> None:
    loaded = _text(nvml.nvmlSystemGetDriverVersion())
    wanted = str(node.gpu["min_driver"])
    assert _version(loaded) >= _version(wanted), (
        f"driver {loaded} is older than {wanted}, the minimum for profile {node.profile}: "
        "upgrade the driver (nvidia_driver role) before deploying this lock"
    )


def test_every_gpu_has_the_memory_the_profile_needs(nvml: Any, handles: list[Any], node: NodeConfig) -> None:
    wanted = int(node.gpu["min_memory_mib"])  # type: ignore[call-overload]
    for index, handle in enumerate(handles):
        total = nvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20
        name = _text(nvml.nvmlDeviceGetName(handle))
        assert total >= wanted, f"GPU {index} ({name}) has {total} MiB; profile {node.profile} needs {wanted} MiB"


def test_no_uncorrected_ecc_errors(nvml: Any, handles: list[Any]) -> None:
    checked = 0
    for index, handle in enumerate(handles):
        try:
            errors = nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            )
        except nvml.NVMLError_NotSupported:
            continue
        checked += 1
        assert errors == 0, f"GPU {index} reports {errors} uncorrected ECC errors since the driver loaded: drain it"
    if not checked:
        pytest.skip("no GPU on this node supports ECC (consumer cards): nothing to check")


def test_persistence_mode_is_on(nvml: Any, handles: list[Any]) -> None:
    off = [i for i, h in enumerate(handles) if nvml.nvmlDeviceGetPersistenceMode(h) != nvml.NVML_FEATURE_ENABLED]
    assert not off, (
        f"persistence mode is off on GPU(s) {off}: the driver unloads between clients and the first request "
        "pays the re-initialisation; enable nvidia-persistenced (nvidia_driver role)"
    )
