"""A vLLM 0.4.3 executor that does no model math: the rehearsal's stand-in for the GPU executor.

vLLM's engine talks to the GPU only through its executor (`ExecutorAsyncBase`):
"how many KV blocks fit", "allocate them", "run one step for these sequences".
This class answers those three questions without a GPU, so that everything
around it (argument parser, engine and its config checks, tokenizer, scheduler
with prefix caching, stop checker, detokenizer, OpenAI protocol layer, uvicorn)
is vLLM 0.4.3's own code running on the kit's real arguments and files.

- `determine_num_available_blocks`: the KV cache the kit's sizing predicts for
  the GPU class (`GLMDEPLOY_REHEARSAL_GPU_CLASS`, default rtx-4090), with the
  engine's own gpu_memory_utilization, max_num_batched_tokens and tensor
  parallel size, divided by vLLM's own cache block size (block_size x layers x
  KV heads per GPU x head size x 2 x dtype size; 16 x 28 KiB for ChatGLM3 fp16).
- `initialize_cache`: records the numbers, logs vLLM's own "# GPU blocks" line
  and applies the worker's own check (the model's max len must fit the cache).
- `execute_model(_async)`: one `SamplerOutput` per step. Each sequence gets a
  fake logits row (ordinary text ids 0, everything else -50, three preferred
  text ids at 10/9/8 chosen from a hash of the sequence's ids); the request's
  own logits processors (`logit_bias`, guided decoding) and the min_tokens mask
  are applied to it exactly as vLLM's sampler would, and the id is the row's
  argmax (deterministic; temperature, top-p/top-k and penalties are ignored).
  Logprobs and prompt logprobs are the row's log-softmax, with vLLM's ranks.
  When nothing changes the row (no processor, no min_tokens mask, at most 3
  logprobs), the same ids and values are computed from the row's structure
  instead of a 65,024-wide tensor (same ids; logprobs equal to ~1e-5).

Imports only pure-Python parts of vLLM (no `vllm._C`, no worker, no model loader).
"""

from __future__ import annotations

import inspect
import os
import struct
import zlib
from typing import Any

import torch
from vllm.executor.executor_base import ExecutorAsyncBase
from vllm.logger import init_logger
from vllm.lora.request import LoRARequest
from vllm.sequence import (
    CompletionSequenceGroupOutput,
    ExecuteModelRequest,
    Logprob,
    SamplerOutput,
    SequenceGroupMetadata,
    SequenceOutput,
)

# Under "vllm." so that vLLM's own handler and format apply (vllm/logger.py configures only that tree).
logger = init_logger("vllm.glmdeploy_rehearsal")

#: The line every rehearsal log must carry: nobody may mistake it for a real GPU run.
BANNER = "glmdeploy rehearsal: GPU executor replaced by the stand-in (no model math)"

#: ChatGLM3's id layout: 0-2 unk/bos/eos, 3-258 byte pieces, text pieces up to 64788, specials 64789-64797,
#: padding rows up to 65023. Only text pieces are ever preferred; every other id needs a logit bias.
FIRST_TEXT_ID = 259
FIRST_SPECIAL_ID = 64789
TEXT_LOGIT, OTHER_LOGIT, PREFERRED_LOGITS = 0.0, -50.0, (10.0, 9.0, 8.0)

#: GPU class whose memory the KV cache is sized for, when none is named in the environment.
DEFAULT_GPU_CLASS = "rtx-4090"
#: Used only when `glmdeploy.serving.sizing` cannot be imported: `python -m glmdeploy.serving.sizing show rtx-4090`
#: (kv_cache_tokens 218,510, at utilisation 0.90, 32,768 batched tokens, one GPU) in 16-token blocks.
FALLBACK_GPU_BLOCKS = 13_656


def _predicted_kv_bytes(
    gpu_class: str, utilization: float, batched_tokens: int, tensor_parallel: int, max_model_len: int
) -> tuple[int, int | None] | None:
    """KV-cache bytes per GPU by the kit's sizing formula applied to the engine's own settings, and the tokens
    the kit's sizing table gives for the class (None when the class cannot be sized); None without the kit.
    The classes are the node's (its node.json), or those of the JSON file GLMDEPLOY_REHEARSAL_CLASSES names."""
    try:
        from glmdeploy.serving import sizing
    except ImportError:
        return None
    classes = sizing.load_classes(os.environ.get("GLMDEPLOY_REHEARSAL_CLASSES"))
    if gpu_class not in classes:
        raise ValueError(f"GLMDEPLOY_REHEARSAL_GPU_CLASS={gpu_class!r} is not a GPU class ({', '.join(classes)})")
    memory = classes[gpu_class].memory_mib * sizing.MIB
    kv_bytes = (
        memory * utilization
        - sizing.WEIGHT_BYTES / tensor_parallel
        - batched_tokens * sizing.ACTIVATION_BYTES_PER_BATCHED_TOKEN
        - sizing.FIXED_OVERHEAD_BYTES
    )
    try:
        table_tokens: int | None = sizing.for_class(gpu_class, classes, max_model_len, tensor_parallel).kv_cache_tokens
    except ValueError:  # the class cannot hold a 32k context at that parallelism
        table_tokens = None
    return int(kv_bytes), table_tokens


def _mix(*parts: int) -> int:
    """A stable (process-independent) hash of a few ints."""
    return zlib.crc32(struct.pack(f"<{len(parts)}q", *parts))


def _tail(data: Any) -> tuple[list[int], int]:
    """The last 8 ids of a sequence (prompt then output) and its length, without copying a long prompt."""
    prompt, output = data.prompt_token_ids, data.output_token_ids
    tail = list(output[-8:]) if len(output) >= 8 else list(prompt[len(output) - 8 :]) + list(output)
    return tail, len(prompt) + len(output)


class StandinExecutorAsync(ExecutorAsyncBase):
    """Answers the engine's executor calls without a GPU; see the module docstring."""

    #: The vLLM executor class this one stands in for (set per subclass by the hook).
    replaces = "GPUExecutorAsync"

    # -- life cycle ------------------------------------------------------------------------------
    def _init_executor(self) -> None:
        self.gpu_class = os.environ.get("GLMDEPLOY_REHEARSAL_GPU_CLASS", DEFAULT_GPU_CLASS)
        self.vocab_size = self.model_config.get_vocab_size()
        last_text = min(FIRST_SPECIAL_ID, self.vocab_size)
        self.text_ids = range(FIRST_TEXT_ID, last_text) if last_text > FIRST_TEXT_ID else range(self.vocab_size)
        base = torch.full((self.vocab_size,), OTHER_LOGIT, dtype=torch.float32)
        base[self.text_ids.start : self.text_ids.stop] = TEXT_LOGIT
        self._base_row = base
        # Every fake row is a permutation of the same values: one log-sum-exp serves them all.
        self._row_logsumexp = float(torch.logsumexp(self.fake_row([0], 0), dim=0))
        self.num_gpu_blocks: int | None = None
        self.num_cpu_blocks: int | None = None
        self.steps = 0
        # Off by default: the kit turns request logging off (--disable-log-requests) for privacy.
        self.log_prompts = os.environ.get("GLMDEPLOY_REHEARSAL_LOG_PROMPTS") == "1"
        logger.info(BANNER)
        logger.info(
            "glmdeploy rehearsal: vLLM selected %s (tensor_parallel_size=%d, distributed_executor_backend=%s);"
            " the stand-in answers for it, sized for GPU class %s",
            self.replaces,
            self.parallel_config.tensor_parallel_size,
            self.parallel_config.distributed_executor_backend,
            self.gpu_class,
        )

    def cache_block_bytes(self) -> int:
        """vLLM's CacheEngine.get_cache_block_size, per GPU, from the engine's own model config."""
        head_size = self.model_config.get_head_size()
        kv_heads = self.model_config.get_num_kv_heads(self.parallel_config)
        layers = self.model_config.get_num_layers(self.parallel_config)
        dtype = self.model_config.dtype
        if self.cache_config.cache_dtype != "auto":
            from vllm.utils import STR_DTYPE_TO_TORCH_DTYPE

            dtype = STR_DTYPE_TO_TORCH_DTYPE[self.cache_config.cache_dtype]
        element = torch.tensor([], dtype=dtype).element_size()
        return element * layers * 2 * self.cache_config.block_size * kv_heads * head_size

    def determine_num_available_blocks(self) -> tuple[int, int]:
        block_bytes = self.cache_block_bytes()
        tp = self.parallel_config.tensor_parallel_size
        predicted = _predicted_kv_bytes(
            self.gpu_class,
            self.cache_config.gpu_memory_utilization,
            self.scheduler_config.max_num_batched_tokens,
            tp,
            self.model_config.max_model_len,
        )
        if predicted is None:
            num_gpu_blocks = FALLBACK_GPU_BLOCKS
            logger.warning(
                "glmdeploy rehearsal: glmdeploy.serving.sizing is not importable; using the fixed %d GPU blocks",
                num_gpu_blocks,
            )
        else:
            kv_bytes, table_tokens = predicted
            num_gpu_blocks = max(int(kv_bytes // block_bytes), 0)
            logger.info(
                "glmdeploy rehearsal: KV cache by the kit's sizing formula for %s x%d on this engine's settings:"
                " %.2f GiB per GPU, %d blocks of %d bytes (vLLM's block size); the sizing table says %s tokens",
                self.gpu_class,
                tp,
                kv_bytes / 2**30,
                num_gpu_blocks,
                block_bytes,
                table_tokens,
            )
            if table_tokens is not None and table_tokens // self.cache_config.block_size != num_gpu_blocks:
                logger.warning(
                    "glmdeploy rehearsal: the engine's settings are not the sizing table's for %s:"
                    " %d blocks instead of %d",
                    self.gpu_class,
                    num_gpu_blocks,
                    table_tokens // self.cache_config.block_size,
                )
        num_cpu_blocks = int(self.cache_config.swap_space_bytes // block_bytes)
        return num_gpu_blocks, num_cpu_blocks

    def initialize_cache(self, num_gpu_blocks: int, num_cpu_blocks: int) -> None:
        # The same line as GPUExecutor.initialize_cache: what a first real deploy compares with the sizing table.
        logger.info("# GPU blocks: %d, # CPU blocks: %d", num_gpu_blocks, num_cpu_blocks)
        # vllm/worker/worker.py raise_if_cache_size_invalid, same messages.
        if num_gpu_blocks <= 0:
            raise ValueError(
                "No available memory for the cache blocks. "
                "Try increasing `gpu_memory_utilization` when "
                "initializing the engine."
            )
        max_seq_len = self.cache_config.block_size * num_gpu_blocks
        if self.model_config.max_model_len > max_seq_len:
            raise ValueError(
                f"The model's max seq len ({self.model_config.max_model_len}) "
                "is larger than the maximum number of tokens that can be "
                f"stored in KV cache ({max_seq_len}). Try increasing "
                "`gpu_memory_utilization` or decreasing `max_model_len` when "
                "initializing the engine."
            )
        self.num_gpu_blocks, self.num_cpu_blocks = num_gpu_blocks, num_cpu_blocks

    def check_health(self) -> None:
        if self.num_gpu_blocks is None:
            raise RuntimeError("glmdeploy rehearsal stand-in: the KV cache was never initialised")

    # -- LoRA: the kit serves no adapters (vLLM rejects LoRA requests before they get here) ---------
    def add_lora(self, lora_request: LoRARequest) -> bool:
        raise NotImplementedError("the glmdeploy rehearsal stand-in loads no LoRA adapters")

    def remove_lora(self, lora_id: int) -> bool:
        raise NotImplementedError("the glmdeploy rehearsal stand-in loads no LoRA adapters")

    def list_loras(self) -> set[int]:
        return set()

    # -- one engine step ---------------------------------------------------------------------------
    def execute_model(self, execute_model_req: ExecuteModelRequest) -> list[SamplerOutput]:
        self.steps += 1
        groups = [self._group_output(meta) for meta in execute_model_req.seq_group_metadata_list]
        return [SamplerOutput(outputs=groups)]

    async def execute_model_async(self, execute_model_req: ExecuteModelRequest) -> list[SamplerOutput]:
        return self.execute_model(execute_model_req)

    def preferred_ids(self, token_ids: list[int], position: int, sample: int = 0) -> list[int]:
        """Three distinct ordinary text ids, a stable function of the sequence's last 8 ids, position and sample."""
        key = _mix(*token_ids[-8:], position, sample)
        n, ids, k = len(self.text_ids), [], 0
        while len(ids) < min(len(PREFERRED_LOGITS), n):
            candidate = self.text_ids[_mix(key, k) % n]
            if candidate not in ids:
                ids.append(candidate)
            k += 1
        return ids

    def fake_row(self, token_ids: list[int], position: int, sample: int = 0) -> torch.Tensor:
        """The logits row of one position: ordinary text ids 0, other ids -50, three preferred text ids."""
        row = self._base_row.clone()
        for token_id, logit in zip(self.preferred_ids(token_ids, position, sample), PREFERRED_LOGITS, strict=False):
            row[token_id] = logit
        return row

    def _sample(self, meta: SequenceGroupMetadata, seq_id: int, sample: int, top: int) -> SequenceOutput:
        """One sampled id: the argmax of the processed row, with vLLM's logprob dict."""
        data = meta.seq_data[seq_id]
        params = meta.sampling_params
        masked = params.min_tokens > 0 and len(data.output_token_ids) < params.min_tokens
        if not params.logits_processors and not masked and top <= len(PREFERRED_LOGITS):
            # Nothing changes the fake row: its argmax and log-softmax are known without building it
            # (the tensor path costs ~5 ms per sequence and step on a 2-core box, this one ~20 us).
            preferred = self.preferred_ids(*_tail(data), sample)
            return SequenceOutput(seq_id, preferred[0], self._known_logprobs(preferred, preferred[0], top))
        row = self._processed_row(meta, seq_id, sample)
        chosen = int(torch.argmax(row))
        return SequenceOutput(seq_id, chosen, self._logprobs(torch.log_softmax(row, dim=-1), chosen, top))

    def _processed_row(self, meta: SequenceGroupMetadata, seq_id: int, sample: int) -> torch.Tensor:
        """vLLM's order: logits processors (model_executor/layers/logits_processor.py), then min_tokens."""
        data = meta.seq_data[seq_id]
        params = meta.sampling_params
        # The sequence's own lists, as vLLM's _apply_logits_processors passes them.
        prompt, output = data.prompt_token_ids, data.output_token_ids
        row = self.fake_row(*_tail(data), sample)
        for processor in params.logits_processors or []:
            if len(inspect.signature(processor).parameters) == 3:
                row = processor(prompt, output, row)
            else:
                row = processor(output, row)
        if params.min_tokens > 0 and len(output) < params.min_tokens:
            for stop_id in params.all_stop_token_ids:
                if 0 <= stop_id < self.vocab_size:
                    row[stop_id] = -float("inf")
        return row

    def _known_logprobs(self, preferred: list[int], chosen: int, top: int) -> dict[int, Logprob]:
        """_logprobs of an unprocessed fake row, computed from its structure (top <= 3)."""
        lse = self._row_logsumexp
        if chosen in preferred:
            value, rank = PREFERRED_LOGITS[preferred.index(chosen)], preferred.index(chosen) + 1
        elif chosen in self.text_ids:
            value, rank = TEXT_LOGIT, len(preferred) + 1
        else:
            value, rank = OTHER_LOGIT, len(self.text_ids) + 1
        result = {chosen: Logprob(value - lse, rank)}
        for r, (token_id, logit) in enumerate(zip(preferred[:top], PREFERRED_LOGITS, strict=False), start=1):
            result[token_id] = Logprob(logit - lse, r)
        return result

    @staticmethod
    def _logprobs(logprobs: torch.Tensor, chosen: int, top: int) -> dict[int, Logprob]:
        """{chosen: Logprob(lp, rank)} plus the top `top` ids with ranks 1..top, as vLLM's sampler builds it."""
        value = float(logprobs[chosen])
        result = {chosen: Logprob(value, int((logprobs > value).sum()) + 1)}
        if top > 0:
            values, ids = torch.topk(logprobs, top)
            for rank, (tid, lp) in enumerate(zip(ids.tolist(), values.tolist(), strict=True), start=1):
                result[tid] = Logprob(lp, rank)
        return result

    def _prompt_logprobs(self, meta: SequenceGroupMetadata) -> list[dict[int, Logprob] | None]:
        """One dict per next prompt token of this chunk (vLLM's _get_next_prompt_tokens), from fake rows."""
        data = next(iter(meta.seq_data.values()))
        prompt = list(data.prompt_token_ids)
        computed = data.get_num_computed_tokens()
        end = min(computed + meta.token_chunk_size + 1, len(prompt))
        result: list[dict[int, Logprob] | None] = []
        top = meta.sampling_params.prompt_logprobs or 0
        for index in range(computed + 1, end):
            tail = list(prompt[max(0, index - 8) : index])
            if top <= len(PREFERRED_LOGITS):
                result.append(self._known_logprobs(self.preferred_ids(tail, index), prompt[index], top))
            else:
                logprobs = torch.log_softmax(self.fake_row(tail, index), dim=-1)
                result.append(self._logprobs(logprobs, prompt[index], top))
        return result

    def _group_output(self, meta: SequenceGroupMetadata) -> CompletionSequenceGroupOutput:
        params = meta.sampling_params
        if self.log_prompts and meta.is_prompt:
            data = next(iter(meta.seq_data.values()))
            ids = list(data.prompt_token_ids)
            logger.info("glmdeploy rehearsal: prompt of %s: %d ids %s", meta.request_id, len(ids), ids[:64])
        prompt_logprobs = None
        if meta.is_prompt and params.prompt_logprobs is not None:
            prompt_logprobs = self._prompt_logprobs(meta)
        if not meta.do_sample:  # a chunk of a prefill: nothing is sampled
            return CompletionSequenceGroupOutput([], prompt_logprobs)
        top = params.logprobs or 0
        samples: list[SequenceOutput] = []
        seq_ids = list(meta.seq_data)
        if params.use_beam_search:
            samples = self._beam_samples(meta, seq_ids, top)
        else:
            # Random sampling forks best_of children from the prompt (vLLM's _random_sample); greedy has one.
            fan_out = params.best_of if (meta.is_prompt and params.temperature > 0) else 1
            samples = [self._sample(meta, seq_id, j, top) for seq_id in seq_ids for j in range(fan_out)]
        return CompletionSequenceGroupOutput(samples, prompt_logprobs)

    def _beam_samples(self, meta: SequenceGroupMetadata, seq_ids: list[int], top: int) -> list[SequenceOutput]:
        """vLLM's _beam_search_sample: 2 x beam width candidates over all beams' cumulative logprobs."""
        width = 2 * meta.sampling_params.best_of
        rows = [torch.log_softmax(self._processed_row(meta, seq_id, 0), dim=-1) for seq_id in seq_ids]
        if meta.is_prompt:
            _, ids = torch.topk(rows[0], width)
            picks = [(seq_ids[0], int(t)) for t in ids.tolist()]
        else:
            scores = torch.stack(
                [row + meta.seq_data[s].cumulative_logprob for row, s in zip(rows, seq_ids, strict=True)]
            ).flatten()
            _, flat = torch.topk(scores, width)
            picks = [(seq_ids[i // self.vocab_size], i % self.vocab_size) for i in flat.tolist()]
        by_seq = dict(zip(seq_ids, rows, strict=True))
        return [SequenceOutput(s, t, self._logprobs(by_seq[s], t, top)) for s, t in picks]


def standin_for(vllm_class_name: str) -> type[StandinExecutorAsync]:
    """A stand-in subclass named after the vLLM executor it replaces (shows up in logs and reprs)."""
    return type(f"StandinFor{vllm_class_name}", (StandinExecutorAsync,), {"replaces": vllm_class_name})


def describe(engine: Any) -> dict[str, Any]:
    """What the stand-in inside a running AsyncLLMEngine recorded (for tests driving the engine in-process)."""
    executor = engine.engine.model_executor
    return {
        "class": type(executor).__name__,
        "replaces": executor.replaces,
        "num_gpu_blocks": executor.num_gpu_blocks,
        "num_cpu_blocks": executor.num_cpu_blocks,
        "steps": executor.steps,
    }
