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

    python -m glmdeploy.sizing table            # the docs table
    python -m glmdeploy.sizing detect --json    # this node's class and settings (NVML)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import sys
from dataclasses import asdict, dataclass

GIB = 2**30
MIB = 2**20
KIB = 2**10

# ChatGLM3-6B-32k (config.json): 28 layers, 2 KV groups (multi-query), 128 dims per head, fp16.
LAYERS, KV_GROUPS, HEAD_DIM, FP16_BYTES = 28, 2, 128, 2
KV_BYTES_PER_TOKEN = LAYERS * 2 * KV_GROUPS * HEAD_DIM * FP16_BYTES  # K and V: 28 KiB
WEIGHT_BYTES = 6_243_584_000 * FP16_BYTES  # 12.49 GB of fp16 parameters
MAX_MODEL_LEN = 32_768

# Calibrated on the H200 anchor (see module docstring).
ACTIVATION_BYTES_PER_BATCHED_TOKEN = 100 * KIB  # peak of one forward pass, per token in the batch
FIXED_OVERHEAD_BYTES = 1 * GIB  # CUDA context, cuBLAS workspaces, CUDA graphs

# Tensor parallel sizes vLLM accepts for 32 attention heads on one host.
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)

# The design point for max_num_seqs: a chat of ~2k tokens (history + reply) per running sequence.
TYPICAL_SEQUENCE_TOKENS = 2048

# Total memory as NVML reports it (MiB), and whether the class's engine can chunk prefills.
# The 24 GB classes run the gpu-cu121 lock (vLLM 0.4.3): no chunked prefill together with
# prefix caching there, so a batch must hold a whole 32k prompt. The H200 runs a current vLLM.
# api_servers: HTTP front-end processes (vLLM's --api-server-count). One API-server process
# (JSON, SSE framing, detokenisation of every stream) paced 256 streams on the H200 at 8-11 k
# out tok/s; four carried 16.4-16.6 k (bench/h200/README.md, 2026-12-02 front end). The 24 GB
# classes keep 1: at their 64 sequences one API server kept up, and 0.4.3 has no such option.
# engine_batching: leave max_num_batched_tokens and max_num_seqs to the engine. On the H200 the
# derived 16,384 / 512 lost to vLLM 0.26's own choice at 64 streams in two sessions (-7 %, 3 passes
# each in the 2026-12-04 one) and won nothing the API servers did not (bench/h200/README.md, settle).
GPU_CLASSES: dict[str, dict[str, object]] = {
    "rtx-4090": {"memory_mib": 24_564, "chunked_prefill": False, "names": ["RTX 4090", "RTX 4090 D"]},
    "rtx-3090": {"memory_mib": 24_576, "chunked_prefill": False, "names": ["RTX 3090"]},
    "a10": {"memory_mib": 23_028, "chunked_prefill": False, "names": ["A10"]},
    "l4": {"memory_mib": 23_034, "chunked_prefill": False, "names": ["L4"]},
    "h200": {
        "memory_mib": 143_771,
        "chunked_prefill": True,
        "api_servers": 4,
        "engine_batching": True,
        "names": ["H200"],
    },
}

# --api-server-count is passed only to an engine at least this new: the vLLM it was measured on.
# Older ones lack it (0.4.3's parser refuses it: the server would not start) or were not checked.
# The role's sizing runs with the release's own Python, so the engine it sees is the one that starts.
API_SERVER_COUNT_SINCE = (0, 26, 0)

# What vLLM 0.26.0's OpenAI server batches per step on an H200 when not told (its start log:
# max_num_batched_tokens=8192). The activation term of a class with engine_batching assumes it.
ENGINE_DEFAULT_BATCHED_TOKENS = 8_192


def engine_version() -> tuple[int, ...] | None:
    """The installed vLLM's release as numbers ("0.26.0+cu130" -> (0, 26, 0)); None without vLLM."""
    try:
        text = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(part or 0) for part in match.groups()) if match else None


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

    def vllm_args(self, engine: tuple[int, ...] | None = None) -> list[str]:
        """The engine's arguments; `engine` is the vLLM that will run them (engine_version()), None if unknown."""
        # Workers as local processes: vLLM 0.4.3 picks ray whenever it is installed (it is, in the lock),
        # which the kit neither configures nor needs on one host.
        tp = (
            ["--tensor-parallel-size", str(self.tensor_parallel_size), "--distributed-executor-backend", "mp"]
            if self.tensor_parallel_size > 1
            else []
        )
        # Only for an engine known to have it: unknown (None) and older engines get nothing.
        front_end = (
            ["--api-server-count", str(self.api_server_count)]
            if self.api_server_count > 1 and engine is not None and engine >= API_SERVER_COUNT_SINCE
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
            "--enable-prefix-caching",
            *front_end,
        ]


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
    utilization: float = 0.90,
    tensor_parallel: int = 1,
    api_servers: int = 1,
    engine_batching: bool = False,
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
        batched = (16_384 if memory_mib * MIB >= 40 * GIB else 8_192) if chunked_prefill else MAX_MODEL_LEN
    budget = memory_mib * MIB * utilization  # per GPU
    kv_bytes = (
        budget - WEIGHT_BYTES / tensor_parallel - batched * ACTIVATION_BYTES_PER_BATCHED_TOKEN - FIXED_OVERHEAD_BYTES
    )
    kv_tokens = int(kv_bytes // kv_bytes_per_token_per_gpu(tensor_parallel))
    if kv_tokens < MAX_MODEL_LEN:
        raise ValueError(
            f"{gpu_class}: {memory_mib} MiB at utilisation {utilization} leaves KV cache for"
            f" {max(kv_tokens, 0)} tokens,"
            f" less than one {MAX_MODEL_LEN}-token context: use a larger card or a shorter --max-model-len"
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
        contexts_32k=kv_tokens // MAX_MODEL_LEN,
        contexts_4k=kv_tokens // 4096,
        contexts_1k=kv_tokens // 1024,
        api_server_count=api_servers,
    )


def for_class(gpu_class: str, tensor_parallel: int = 1) -> Settings:
    if gpu_class not in GPU_CLASSES:
        raise ValueError(f"unknown GPU class {gpu_class!r}; known: {', '.join(GPU_CLASSES)}")
    spec = GPU_CLASSES[gpu_class]
    return settings_for(
        gpu_class,
        int(spec["memory_mib"]),  # type: ignore[call-overload]
        bool(spec["chunked_prefill"]),
        tensor_parallel=tensor_parallel,
        api_servers=int(spec.get("api_servers", 1)),  # type: ignore[call-overload]
        engine_batching=bool(spec.get("engine_batching", False)),
    )


def classify(name: str) -> str | None:
    """The class of an NVML device name ("NVIDIA GeForce RTX 4090" -> "rtx-4090"); longest match wins."""
    matches = [(len(n), cls) for cls, spec in GPU_CLASSES.items() for n in spec["names"] if n in name]  # type: ignore[attr-defined]
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


def table() -> str:
    lines = [
        "| GPU class | memory (GiB) | gpu_memory_utilization | max_num_batched_tokens | max_num_seqs "
        "| KV cache (GiB) | KV tokens | 32k contexts | 4k contexts | 1k contexts | API servers |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in GPU_CLASSES:
        s = for_class(name)
        engine = f"engine's ({ENGINE_DEFAULT_BATCHED_TOKENS:,})"
        batched = f"{s.max_num_batched_tokens:,}" if s.max_num_batched_tokens else engine
        seqs = str(s.max_num_seqs) if s.max_num_seqs else "engine's"
        lines.append(
            f"| {name} | {s.memory_gib} | {s.gpu_memory_utilization:.2f} | {batched}"
            f" | {seqs} | {s.kv_cache_gib} | {s.kv_cache_tokens:,}"
            f" | {s.contexts_32k} | {s.contexts_4k} | {s.contexts_1k} | {s.api_server_count} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy.sizing", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("table", help="print the settings of every known GPU class as a Markdown table")
    show = sub.add_parser("show", help="the settings of one class")
    show.add_argument("gpu_class", choices=sorted(GPU_CLASSES))
    det = sub.add_parser("detect", help="detect this node's GPU class through NVML and print its settings")
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
    if args.command == "table":
        print(table())
        return 0
    if args.command == "show":
        settings = for_class(args.gpu_class, args.tensor_parallel)
    else:
        try:
            name, memory = detect()
        except Exception as exc:  # no NVML, no driver, no GPU: say so
            print(
                f"error: cannot read the GPU through NVML ({exc}); set vllm_server_gpu_class in the inventory",
                file=sys.stderr,
            )
            return 2
        gpu_class = classify(name)
        if gpu_class is None:
            print(
                f"error: {name} ({memory} MiB) is not a known class ({', '.join(GPU_CLASSES)});"
                " set vllm_server_gpu_class in the inventory",
                file=sys.stderr,
            )
            return 2
        settings = for_class(gpu_class, args.tensor_parallel)
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
