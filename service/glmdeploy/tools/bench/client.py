"""The benchmark's client side: fixed-seed prompts, one level of concurrent streamed requests
and its latencies, the multi-turn run, the baseline comparison the smoke suite makes.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from glmdeploy.api.client import ApiClient
from glmdeploy.tools import loadgen

# Prompt ids are drawn below ChatGLM3's special tokens (64789+), above the control ids 0-2.
PROMPT_ID_RANGE = (3, 64000)

SEED = 20261201

# The smoke suite's short run: small enough for < 60 s on a 2-core CPU node, long enough to batch.
SMOKE_SCENARIO = {"input_len": 128, "output_len": 32, "concurrency": 4, "requests": 8}

DEFAULT_TOLERANCE = 0.15


@dataclass
class RequestResult:
    ttft_s: float
    e2e_s: float
    itl_s: list[float]
    output_tokens: int


@dataclass
class LevelResult:
    input_len: int
    output_len: int
    concurrency: int
    requests: int
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]
    decode_tokens_per_s_per_stream: float
    #: How late the client's event loop ran (glmdeploy.tools.loadgen.LoopLag): large values mean the
    #: client, not the server, set the latencies.
    client_lag_ms: dict[str, float] = field(default_factory=dict)


def make_prompts(count: int, input_len: int, seed: int = SEED) -> list[list[int]]:
    """Same ids for the same (count, length, seed): runs on different days compare."""
    rng = random.Random(f"{seed}-{input_len}")
    return [[rng.randrange(*PROMPT_ID_RANGE) for _ in range(input_len)] for _ in range(count)]


def one_request(client: ApiClient, prompt: list[int], output_len: int) -> RequestResult:
    """One streamed request that must produce exactly output_len tokens."""
    (body,) = level_bodies(client, [prompt], output_len)
    start = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    finish = None
    for choice in client._stream_choices(body):
        stamps.append(time.perf_counter())
        tokens += len(choice.get("token_ids") or []) or 1
        finish = choice.get("finish_reason") or finish
    if finish != "length" or not stamps:
        raise RuntimeError(f"expected exactly {output_len} tokens, the server ended with {finish!r}")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return RequestResult(stamps[0] - start, stamps[-1] - start, gaps, max(tokens, output_len))


def percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "mean": 0.0}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000

    return {
        "p50": round(pick(0.50), 2),
        "p95": round(pick(0.95), 2),
        "p99": round(pick(0.99), 2),
        "mean": round(statistics.fmean(ordered) * 1000, 2),
    }


def latencies(samples: Sequence[loadgen.Sample]) -> dict[str, dict[str, float]]:
    """TTFT, TPOT (requests of more than one token), ITL and end-to-end percentiles of completed requests."""
    return {
        "ttft_ms": percentiles([s.ttft_s for s in samples]),
        "tpot_ms": percentiles([s.tpot_s for s in samples if s.output_tokens > 1]),
        "itl_ms": percentiles([g for s in samples for g in s.itl_s]),
        "e2e_ms": percentiles([s.e2e_s for s in samples]),
    }


def level_bodies(client: ApiClient, prompts: Sequence[list[int]], output_len: int) -> list[dict[str, Any]]:
    """Streamed requests that must each produce exactly output_len tokens."""
    bodies = []
    for prompt in prompts:
        body = client.completion_body(prompt, output_len, 0.0, 1.0, stream=True, ignore_eos=True)
        body["stop_token_ids"] = []  # exact lengths: random-weight models emit stop ids too
        bodies.append(body)
    return bodies


def root_of(client: ApiClient, timeout_s: float) -> ApiClient:
    """The same server without the API's `/v1` prefix: /version, /metrics."""
    return ApiClient(client.base_url.rsplit("/v1", 1)[0], client.model, client.api_key, timeout_s=timeout_s)


def target_of(client: ApiClient) -> loadgen.Target:
    return loadgen.Target(client.base_url, client.model, client.api_key)


def run_level(client: ApiClient, input_len: int, output_len: int, concurrency: int, requests: int) -> LevelResult:
    """Warm up with one request (not counted), then keep `concurrency` streams busy for `requests`
    requests, all from one event loop (glmdeploy.tools.loadgen). Any failed request fails the level."""
    prompts = make_prompts(requests + 1, input_len)
    one_request(client, prompts[0], min(output_len, 8))
    bodies = level_bodies(client, prompts[1:], output_len)
    results, lag, duration = asyncio.run(
        loadgen.run(
            target_of(client), bodies, [0.0] * requests, max_concurrency=concurrency, timeout_s=client.timeout_s
        )
    )
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of {requests} requests failed, the first: {failed[0].error or 'cut short'}")
    total_tokens = sum(r.output_tokens for r in results)
    latency = latencies(results)
    decode = [(r.output_tokens - 1) / (r.e2e_s - r.ttft_s) for r in results if r.e2e_s > r.ttft_s]
    return LevelResult(
        input_len=input_len,
        output_len=output_len,
        concurrency=concurrency,
        requests=requests,
        duration_s=round(duration, 3),
        requests_per_s=round(requests / duration, 3),
        output_tokens_per_s=round(total_tokens / duration, 1),
        ttft_ms=latency["ttft_ms"],
        itl_ms=latency["itl_ms"],
        e2e_ms=latency["e2e_ms"],
        decode_tokens_per_s_per_stream=round(statistics.median(decode), 1) if decode else 0.0,
        client_lag_ms=lag,
    )


def multiturn(
    client: ApiClient, conversations: int, turns: int, first_len: int, turn_len: int, reply_len: int
) -> dict[str, Any]:
    """Replay chats turn by turn, one request at a time, and report first-token latency per turn.

    Each turn's prompt is the whole history (first prompt, earlier replies, new user
    text), as a chat UI sends it: with prefix caching the engine re-uses the KV cache
    of the earlier turns and only prefills what is new; without it, every turn
    prefills the whole, growing history. Conversations use distinct random ids so
    they never share a prefix with each other.
    """
    rng = random.Random(f"{SEED}-multiturn")

    def ids(n: int) -> list[int]:
        return [rng.randrange(*PROMPT_ID_RANGE) for _ in range(n)]

    one_request(client, ids(64), 4)  # warm-up, not counted
    per_turn: list[list[float]] = [[] for _ in range(turns)]
    for _ in range(conversations):
        history = ids(first_len)
        for turn in range(turns):
            result = one_request(client, history, reply_len)
            per_turn[turn].append(result.ttft_s)
            history = history + ids(reply_len) + ids(turn_len)
    medians = [round(statistics.median(t) * 1000, 2) for t in per_turn]
    return {
        "conversations": conversations,
        "turns": turns,
        "first_len": first_len,
        "turn_len": turn_len,
        "reply_len": reply_len,
        "ttft_ms_median_per_turn": medians,
        "last_over_first": round(medians[-1] / medians[0], 2) if medians[0] else None,
    }


def server_versions(client: ApiClient) -> dict[str, Any]:
    try:
        return {"server": root_of(client, 10).get_json("/version")}
    except Exception:
        return {}


def run_matrix(
    client: ApiClient,
    input_lens: list[int],
    output_lens: list[int],
    concurrency: list[int],
    requests: int | None,
    max_model_len: int | None = None,
) -> list[LevelResult]:
    levels = [(i, o, c) for i in input_lens for o in output_lens for c in concurrency]
    if max_model_len:
        too_long = sorted({(i, o) for i, o, _ in levels if i + o > max_model_len})
        for i, o in too_long:
            print(f"skipping {i} in / {o} out: longer than the server's max_model_len {max_model_len}")
        levels = [(i, o, c) for i, o, c in levels if i + o <= max_model_len]
    results = []
    for n, (inp, out, conc) in enumerate(levels, 1):
        count = requests or max(2 * conc, 4)
        print(f"[{n:>2}/{len(levels)}] in={inp} out={out} concurrency={conc} requests={count} ...", end="", flush=True)
        level = run_level(client, inp, out, conc, count)
        print(
            f" {level.output_tokens_per_s:.1f} out tok/s, TTFT p50 {level.ttft_ms['p50']:.0f} ms,"
            f" ITL p50 {level.itl_ms['p50']:.1f} ms ({level.duration_s:.1f} s)",
            flush=True,
        )
        results.append(level)
    return results


def compare_with_baseline(baseline: dict[str, Any], measured: dict[str, Any]) -> list[str]:
    """Problems, empty when throughput is within the baseline's tolerance (slower only: faster is fine)."""
    tolerance = float(baseline.get("tolerance", DEFAULT_TOLERANCE))
    expected = float(baseline["result"]["output_tokens_per_s"])
    got = float(measured["output_tokens_per_s"])
    floor = expected * (1 - tolerance)
    if got < floor:
        return [
            f"throughput {got:.1f} out tok/s is below the baseline {expected:.1f} - {tolerance:.0%} = {floor:.1f} "
            f"({baseline.get('hardware_class')}, recorded {baseline.get('recorded')} by `{baseline.get('command')}`)"
        ]
    return []
