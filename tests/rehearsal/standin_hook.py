"""Activation of the rehearsal stand-in: patches vLLM 0.4.3 when (and only when) its engine module loads.

Installed by `install_standin.py` as the package `glmdeploy_rehearsal_standin` (this file is its
`__init__.py`, next to a copy of `standin_executor.py`) plus `glmdeploy_rehearsal_standin.pth`,
whose one line runs `activate()` at every interpreter start of that venv. `activate()` only puts an
import hook on `sys.meta_path` (no vLLM or torch import, so `pip`, `python -m glmdeploy.serving.sizing` and
other tools start as fast as before). When `vllm.engine.async_llm_engine` is imported (the OpenAI
server does it at start), the hook applies the patches below to that module, after vLLM's own code ran:

1. `AsyncLLMEngine.from_engine_args`: before vLLM's own body runs, the three GPU executor classes it
   may import (`GPUExecutorAsync`, `MultiprocessingGPUExecutorAsync`, `RayGPUExecutorAsync`) are
   replaced in their modules by stand-in subclasses named after them, so vLLM's own selection logic
   still decides which one (its choice is logged), and the engine gets the stand-in.
2. `initialize_ray_cluster` (as bound in `vllm.engine.async_llm_engine`): logs the request instead of
   starting a Ray cluster and a placement group for GPUs this machine does not have.
3. At activation, `VLLM_NO_USAGE_STATS=1` and `DO_NOT_TRACK=1` unless already set (the kit's unit sets
   both): a rehearsal never reports usage to anyone, whatever environment it is started from.

Nothing else in vLLM is changed. Set `GLMDEPLOY_REHEARSAL_STANDIN=0` to start the venv's vLLM untouched.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

TARGET = "vllm.engine.async_llm_engine"
ENV = "GLMDEPLOY_REHEARSAL_STANDIN"

#: vLLM 0.4.3's async GPU executors: module -> class name.
GPU_EXECUTORS = {
    "vllm.executor.gpu_executor": "GPUExecutorAsync",
    "vllm.executor.multiproc_gpu_executor": "MultiprocessingGPUExecutorAsync",
    "vllm.executor.ray_gpu_executor": "RayGPUExecutorAsync",
}


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip() not in ("0", "false", "no", "off", "")


def _executor_module() -> ModuleType:
    """The stand-in executor, wherever this hook lives (installed package, or tests/rehearsal on sys.path)."""
    return importlib.import_module(f"{__package__}.standin_executor" if __package__ else "standin_executor")


def _swap_executors(standin: ModuleType) -> None:
    for module_name, class_name in GPU_EXECUTORS.items():
        module = importlib.import_module(module_name)
        current = getattr(module, class_name)
        if not (isinstance(current, type) and issubclass(current, standin.StandinExecutorAsync)):
            setattr(module, class_name, standin.standin_for(class_name))


def patch(module: ModuleType) -> None:
    """Apply the patches to an imported vllm.engine.async_llm_engine (idempotent)."""
    engine_cls = module.AsyncLLMEngine
    if getattr(engine_cls, "_glmdeploy_rehearsal", False):
        return
    standin = _executor_module()
    logger = standin.logger
    original = engine_cls.from_engine_args.__func__

    def from_engine_args(cls: type, engine_args: Any, *args: Any, **kwargs: Any) -> Any:
        _swap_executors(standin)
        return original(cls, engine_args, *args, **kwargs)

    from_engine_args.__doc__ = original.__doc__
    from_engine_args.__wrapped__ = original  # type: ignore[attr-defined]
    engine_cls.from_engine_args = classmethod(from_engine_args)

    def initialize_ray_cluster(parallel_config: Any, ray_address: str | None = None) -> None:
        logger.info(
            "glmdeploy rehearsal: vLLM asked for a Ray cluster for %d GPU worker(s); not started (stand-in)",
            parallel_config.world_size,
        )

    module.initialize_ray_cluster = initialize_ray_cluster
    engine_cls._glmdeploy_rehearsal = True
    logger.info("%s: patched %s", standin.BANNER, module.__name__)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...: the real loader's
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def activate() -> None:
    """Install the hook (or patch at once if vLLM's engine is already imported). No-op when disabled."""
    if not enabled():
        return
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if TARGET in sys.modules:
        patch(sys.modules[TARGET])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
