"""vLLM settings per GPU class, derived from the card's memory and ChatGLM3-6B-32k's sizes.

Why computed: the seeds tune `gpu_memory_utilization` and batch sizes by
folklore. What fits on a card is arithmetic: memory x utilisation, minus the
fp16 weights, minus the activation peak of the largest batch the engine plans
for, minus CUDA context and graphs; the rest is KV cache at 28 KiB per token.

The two engine-dependent constants are calibrated, not guessed: with them the
formula gives 112.2 GiB of KV cache on an H200 at utilisation 0.90 with a
16,384-token batch, where vLLM reported 112 GiB in the maintainers' GPU anchor run
(docs/reference/gpu-settings.md, "The figures behind the formula").
Nothing here has run on a 24 GB card; the numbers for those classes are the
same formula, and a first deployment should compare them with the KV cache
size vLLM logs at start ("# GPU blocks" / "KV cache size").

The GPU classes (each card's memory, names and what its row asks of the engine) are the
registry's (constraints/profiles.toml [kit.gpu_classes]); a node gets them through its plan, in
node.json (`gpu.classes`), and the role's module passes them in. This module holds the rules only.

    python -m glmdeploy.serving.sizing show rtx-4090 --json   # a class's settings (the node's node.json classes)
    python -m glmdeploy.serving.sizing detect --json          # this node's class and settings (NVML)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

GIB = 2**30
MIB = 2**20
KIB = 2**10

# ChatGLM3-6B-32k (config.json): 28 layers, 2 KV groups (multi-query), 128 dims per head, fp16.
LAYERS, KV_GROUPS, HEAD_DIM, FP16_BYTES = 28, 2, 128, 2
KV_BYTES_PER_TOKEN = LAYERS * 2 * KV_GROUPS * HEAD_DIM * FP16_BYTES  # K and V: 28 KiB
WEIGHT_BYTES = 6_243_584_000 * FP16_BYTES  # 12.49 GB of fp16 parameters

# Calibrated on the H200 anchor (see module docstring).
ACTIVATION_BYTES_PER_BATCHED_TOKEN = 100 * KIB  # peak of one forward pass, per token in the batch
FIXED_OVERHEAD_BYTES = 1 * GIB  # CUDA context, cuBLAS workspaces, CUDA graphs

# Tensor parallel sizes vLLM accepts for 32 attention heads on one host.
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)

# The design point for max_num_seqs: a chat of ~2k tokens (history + reply) per running sequence.
TYPICAL_SEQUENCE_TOKENS = 2048


@dataclass(frozen=True)
class GpuClass:
    """A card the kit sizes the engine for: one [kit.gpu_classes.<name>] of the registry
    (docs/reference/profiles.md explains each key; the registry loads it with this class)."""

    #: Total memory as NVML reports it (MiB).
    memory_mib: int
    #: NVML device names of the class (the longest that a device's name contains wins).
    names: list[str]
    #: The class's engine chunks prefills: a batch need not hold a whole context.
    chunked_prefill: bool
    #: HTTP front-end processes (vLLM's --api-server-count), passed only to a vLLM at least
    #: `api_servers_since` (the release it was measured on; older parsers refuse the option).
    api_servers: int = 1
    api_servers_since: str = ""
    #: Leave max_num_batched_tokens and max_num_seqs to the engine.
    engine_batching: bool = False


def classes_from(data: Mapping[str, Mapping[str, Any]]) -> dict[str, GpuClass]:
    """The classes from plain data (the plan's `gpu_classes`, node.json's `gpu.classes`)."""
    known = {f.name for f in dataclasses.fields(GpuClass)}
    return {name: GpuClass(**{k: v for k, v in spec.items() if k in known}) for name, spec in data.items()}


def load_classes(path: str | Path | None = None) -> dict[str, GpuClass]:
    """The classes this node was deployed with (its node.json), or those of a JSON file of them."""
    from glmdeploy.config import NodeConfig

    if path is not None and Path(path).name != "node.json":
        return classes_from(json.loads(Path(path).read_text(encoding="utf-8")))
    classes = NodeConfig.load(path).gpu.get("classes", {})
    if not isinstance(classes, dict) or not classes:
        raise ValueError("node.json has no GPU classes: the node's profile has no GPU (or pass --classes FILE)")
    return classes_from(classes)


def version_tuple(text: str) -> tuple[int, ...] | None:
    """A release as numbers ("0.26.0+cu130" -> (0, 26, 0)); None when it is not one."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(part or 0) for part in match.groups()) if match else None


# What vLLM 0.26.0's OpenAI server batches per step on an H200 when not told (its start log:
# max_num_batched_tokens=8192). The activation term of a class with engine_batching assumes it.
ENGINE_DEFAULT_BATCHED_TOKENS = 8_192


def engine_version() -> tuple[int, ...] | None:
    """The installed vLLM's release as numbers ("0.26.0+cu130" -> (0, 26, 0)); None without vLLM."""
    try:
        return version_tuple(importlib.metadata.version("vllm"))
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Settings:
    gpu_class: str
    tensor_parallel_size: int
    memory_gib: float
    gpu_memory_utilization: float
    max_num_batched_tokens: int | None  # None: the engine's own (engine_batching)
    max_num_seqs: int | None
    kv_cache_gib: float
    kv_cache_tokens: int
    contexts_32k: int
    contexts_4k: int
    contexts_1k: int
    api_server_count: int = 1
    #: The oldest vLLM that takes --api-server-count (the class's api_servers_since).
    api_servers_since: str = field(default="")

    def vllm_args(self, engine: tuple[int, ...] | None = None, prefix_caching: bool = True) -> list[str]:
        """The engine's arguments; `engine` is the vLLM that will run them (engine_version()), None if
        unknown. `prefix_caching=False` (vllm_server_prefix_caching; docs/decisions.md, "Prefix caching
        between users") leaves it off: vLLM 0.4.3 has it off unless told, vLLM 0.26 (the GPU runs'
        engine) has it on unless told --no-enable-prefix-caching; engines between are not gated."""
        # Workers as local processes: vLLM 0.4.3 picks ray whenever it is installed (it is, in the lock),
        # which the kit neither configures nor needs on one host.
        tp = (
            ["--tensor-parallel-size", str(self.tensor_parallel_size), "--distributed-executor-backend", "mp"]
            if self.tensor_parallel_size > 1
            else []
        )
        # Only for an engine known to have it: unknown (None) and older engines get nothing.
        since = version_tuple(self.api_servers_since)
        front_end = (
            ["--api-server-count", str(self.api_server_count)]
            if self.api_server_count > 1 and engine is not None and since is not None and engine >= since
            else []
        )
        batching = [
            *(["--max-num-batched-tokens", str(self.max_num_batched_tokens)] if self.max_num_batched_tokens else []),
            *(["--max-num-seqs", str(self.max_num_seqs)] if self.max_num_seqs else []),
        ]
        return [
            *tp,
            "--gpu-memory-utilization",
            f"{self.gpu_memory_utilization:.2f}",
            *batching,
            *_prefix_caching(engine, prefix_caching),
            *front_end,
        ]


#: The first vLLM the kit has run that takes --no-enable-prefix-caching (and caches by default).
PREFIX_CACHING_DEFAULT_ON_SINCE = (0, 26)


def _prefix_caching(engine: tuple[int, ...] | None, wanted: bool) -> list[str]:
    if wanted:
        return ["--enable-prefix-caching"]
    return ["--no-enable-prefix-caching"] if engine is not None and engine >= PREFIX_CACHING_DEFAULT_ON_SINCE else []


def _power_of_two_at_most(value: float) -> int:
    result = 1
    while result * 2 <= value:
        result *= 2
    return result


def kv_bytes_per_token_per_gpu(tensor_parallel: int) -> int:
    """Each GPU keeps its share of the KV groups; past 2-way, vLLM replicates ChatGLM3's 2 groups."""
    return KV_BYTES_PER_TOKEN // min(tensor_parallel, KV_GROUPS)


def settings_for(
    gpu_class: str,
    memory_mib: int,
    chunked_prefill: bool,
    max_model_len: int,
    utilization: float = 0.90,
    tensor_parallel: int = 1,
    api_servers: int = 1,
    engine_batching: bool = False,
    api_servers_since: str = "",
) -> Settings:
    """The settings for one card (or `tensor_parallel` such cards in one host); ValueError when it does not fit.

    engine_batching: pass no batch sizes (the engine picks them); the KV estimate then assumes
    ENGINE_DEFAULT_BATCHED_TOKENS per step.
    """
    if tensor_parallel not in TENSOR_PARALLEL_SIZES:
        raise ValueError(
            f"tensor parallel size {tensor_parallel}: ChatGLM3's 32 attention heads split"
            f" {', '.join(map(str, TENSOR_PARALLEL_SIZES))} ways"
        )
    if engine_batching:
        batched = ENGINE_DEFAULT_BATCHED_TOKENS
    else:
        batched = (16_384 if memory_mib * MIB >= 40 * GIB else 8_192) if chunked_prefill else max_model_len
    budget = memory_mib * MIB * utilization  # per GPU
    kv_bytes = (
        budget - WEIGHT_BYTES / tensor_parallel - batched * ACTIVATION_BYTES_PER_BATCHED_TOKEN - FIXED_OVERHEAD_BYTES
    )
    kv_tokens = int(kv_bytes // kv_bytes_per_token_per_gpu(tensor_parallel))
    if kv_tokens < max_model_len:
        raise ValueError(
            f"{gpu_class}: {memory_mib} MiB at utilisation {utilization} leaves KV cache for"
            f" {max(kv_tokens, 0)} tokens,"
            f" less than one {max_model_len}-token context: use a larger card or a shorter --max-model-len"
        )
    seqs = max(16, min(512, _power_of_two_at_most(kv_tokens / TYPICAL_SEQUENCE_TOKENS)))
    return Settings(
        gpu_class=gpu_class,
        tensor_parallel_size=tensor_parallel,
        memory_gib=round(memory_mib * MIB / GIB, 2),
        gpu_memory_utilization=utilization,
        max_num_batched_tokens=None if engine_batching else batched,
        max_num_seqs=None if engine_batching else seqs,
        kv_cache_gib=round(kv_bytes * tensor_parallel / GIB, 2),
        kv_cache_tokens=kv_tokens,
        contexts_32k=kv_tokens // max_model_len,
        contexts_4k=kv_tokens // 4096,
        contexts_1k=kv_tokens // 1024,
        api_server_count=api_servers,
        api_servers_since=api_servers_since,
    )


def for_class(
    gpu_class: str, classes: Mapping[str, GpuClass], max_model_len: int, tensor_parallel: int = 1
) -> Settings:
    if gpu_class not in classes:
        raise ValueError(f"unknown GPU class {gpu_class!r}; known: {', '.join(classes)}")
    spec = classes[gpu_class]
    return settings_for(
        gpu_class,
        spec.memory_mib,
        spec.chunked_prefill,
        max_model_len,
        tensor_parallel=tensor_parallel,
        api_servers=spec.api_servers,
        engine_batching=spec.engine_batching,
        api_servers_since=spec.api_servers_since,
    )


def classify(name: str, classes: Mapping[str, GpuClass]) -> str | None:
    """The class of an NVML device name ("NVIDIA GeForce RTX 4090" -> "rtx-4090"); longest match wins."""
    matches = [(len(n), cls) for cls, spec in classes.items() for n in spec.names if n in name]
    return max(matches)[1] if matches else None


def detect() -> tuple[str, int]:
    """This node's first GPU: its NVML name and total memory in MiB."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        return (name.decode() if isinstance(name, bytes) else str(name)), pynvml.nvmlDeviceGetMemoryInfo(
            handle
        ).total // MIB
    finally:
        pynvml.nvmlShutdown()


def table(classes: Mapping[str, GpuClass], max_model_len: int) -> str:
    """Every class's settings as a Markdown table (docs/reference/gpu-settings.md holds it, generated)."""
    lines = [
        "| GPU class | memory (GiB) | gpu_memory_utilization | max_num_batched_tokens | max_num_seqs "
        "| KV cache (GiB) | KV tokens | 32k contexts | 4k contexts | 1k contexts | API servers |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in classes:
        s = for_class(name, classes, max_model_len)
        engine = f"engine's ({ENGINE_DEFAULT_BATCHED_TOKENS:,})"
        batched = f"{s.max_num_batched_tokens:,}" if s.max_num_batched_tokens else engine
        seqs = str(s.max_num_seqs) if s.max_num_seqs else "engine's"
        servers = f"{s.api_server_count} (vLLM {s.api_servers_since}+)" if s.api_server_count > 1 else "1"
        lines.append(
            f"| {name} | {s.memory_gib} | {s.gpu_memory_utilization:.2f} | {batched}"
            f" | {seqs} | {s.kv_cache_gib} | {s.kv_cache_tokens:,}"
            f" | {s.contexts_32k} | {s.contexts_4k} | {s.contexts_1k} | {servers} |"
        )
    return "\n".join(lines)


def _inputs(args: argparse.Namespace) -> tuple[dict[str, GpuClass], int]:
    """The classes and context length: a JSON file of classes and --max-model-len, or the node's node.json."""
    if args.classes:
        if not args.max_model_len:
            raise ValueError("--classes needs --max-model-len (the profile's runtime.max_model_len)")
        return load_classes(args.classes), args.max_model_len
    from glmdeploy.config import NodeConfig

    node = NodeConfig.load(args.node_json)
    return load_classes(args.node_json), args.max_model_len or node.max_model_len


def _detected(classes: Mapping[str, GpuClass]) -> str:
    try:
        name, memory = detect()
    except Exception as exc:  # no NVML, no driver, no GPU: say so
        raise ValueError(
            f"cannot read the GPU through NVML ({exc}); set vllm_server_gpu_class in the inventory"
        ) from exc
    gpu_class = classify(name, classes)
    if gpu_class is None:
        raise ValueError(
            f"{name} ({memory} MiB) is not a known class ({', '.join(classes)}); "
            "set vllm_server_gpu_class in the inventory"
        )
    return gpu_class


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy.serving.sizing", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    table_cmd = sub.add_parser("table", help="print the settings of every class as a Markdown table")
    show = sub.add_parser("show", help="the settings of one class")
    show.add_argument("gpu_class")
    det = sub.add_parser("detect", help="detect this node's GPU class through NVML and print its settings")
    for cmd in (table_cmd, show, det):
        cmd.add_argument("--node-json", help="the node's settings, whose gpu.classes are used (default: the node's)")
        cmd.add_argument("--classes", help="a JSON file of GPU classes instead (the registry's [kit.gpu_classes])")
        cmd.add_argument("--max-model-len", type=int, help="context length (default: node.json's)")
    for cmd in (show, det):
        cmd.add_argument("--json", action="store_true")
        cmd.add_argument(
            "--tensor-parallel",
            type=int,
            default=1,
            choices=TENSOR_PARALLEL_SIZES,
            help="GPUs of this host serving one model (default 1)",
        )
    args = parser.parse_args(argv)
    try:
        classes, max_model_len = _inputs(args)
        if args.command == "table":
            print(table(classes, max_model_len))
            return 0
        gpu_class = args.gpu_class if args.command == "show" else _detected(classes)
        settings = for_class(gpu_class, classes, max_model_len, args.tensor_parallel)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = engine_version()
    if args.json:
        print(
            json.dumps(
                {
                    **asdict(settings),
                    "engine": ".".join(map(str, engine)) if engine else None,
                    "vllm_args": settings.vllm_args(engine),
                },
                indent=2,
            )
        )
    else:
        for key, value in asdict(settings).items():
            print(f"{key:24} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
