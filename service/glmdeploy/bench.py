"""Benchmark any OpenAI-compatible endpoint the way users load it: streamed requests over HTTP.

Why the kit has its own: the figures people quote (tok/s, P99) only mean
something with the exact workload, versions and hardware next to them, and the
node's throughput smoke test compares against a baseline recorded the same way.
Prompts are random token ids from a fixed seed and every request produces
exactly its output length (eos and stop ids ignored), so two runs compare.

    python -m glmdeploy.bench run --node-config /etc/glmdeploy/node.json \\
        --input-lens 512,2048 --output-lens 128 --concurrency 1,4,16 --json out.json --plots out/
    python -m glmdeploy.bench baseline --node-config /etc/glmdeploy/node.json --out baseline.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import re
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from glmdeploy import loadgen, nodefacts, sizing
from glmdeploy.client import ApiClient
from glmdeploy.config import NodeConfig

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
    #: How late the client's event loop ran (glmdeploy.loadgen.LoopLag): large values mean the
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
    requests, all from one event loop (glmdeploy.loadgen). Any failed request fails the level."""
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


#: Goodput's targets unless given (--slo-*): a first token within a second, then faster than
#: people read (10 tokens/s); no end-to-end target (it depends on the reply's length).
DEFAULT_SLO_MS = {"ttft": 1000.0, "tpot": 100.0}
#: Two-sided 95 % Student t quantiles by degrees of freedom (repeats - 1); more: the normal's.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
#: The server's own counters read per level from its /metrics, by the names of both vLLM
#: generations (0.4.3 first, then current: the monitoring's recording rules map the same pairs).
SERVER_GAUGES = {
    "kv_cache_usage": ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"),
    "waiting": ("vllm:num_requests_waiting",),
    "running": ("vllm:num_requests_running",),
}
SERVER_COUNTERS = {"preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions")}


def interval95(values: Sequence[float]) -> dict[str, float]:
    """Mean and the half-width of its 95 % confidence interval (Student t; 0 for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": round(mean, 3), "ci95": 0.0, "n": len(values)}
    t = T95.get(len(values) - 1, 1.96)
    return {
        "mean": round(mean, 3),
        "ci95": round(t * statistics.stdev(values) / len(values) ** 0.5, 3),
        "n": len(values),
    }


#: A sample line of Prometheus' text format: name, labels (optional), value.
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{.*\})?\s+(\S+)")


def metric_values(text: str) -> dict[str, float]:
    """Sums over label sets of each series in Prometheus' text format (enough for the server's
    gauges and counters; the reference environment, which runs the unit tests, has no parser)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE_LINE.match(line)
        if match:
            with contextlib.suppress(ValueError):
                values[match[1]] = values.get(match[1], 0.0) + float(match[2])
    return values


def first_of(values: dict[str, float], names: Sequence[str]) -> float | None:
    return next((values[n] for n in names if n in values), None)


class ServerWatch:
    """The server's gauges sampled each second during a level, its counters before and after."""

    def __init__(self, client: ApiClient) -> None:
        self.root = root_of(client, 5)
        self.samples: list[dict[str, float]] = []

    def read(self) -> dict[str, float]:
        try:
            return metric_values(self.root._request("GET", "/metrics").read().decode("utf-8", "replace"))
        except (OSError, RuntimeError, ValueError):
            return {}

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.samples.append(await asyncio.to_thread(self.read))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    def summary(self, before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for key, names in SERVER_GAUGES.items():
            seen = [v for v in (first_of(s, names) for s in self.samples) if v is not None]
            out[f"{key}_max"] = round(max(seen), 4) if seen else None
        for key, names in SERVER_COUNTERS.items():
            b, a = first_of(before, names), first_of(after, names)
            out[key] = round(a - b, 1) if a is not None and b is not None else None
        return out


@dataclass
class RateLevel:
    """One pass of the sweep at one offered rate."""

    rate: float
    arrival: str
    burstiness: float
    repeat: int
    requests: int
    completed: int
    failed: int
    incomplete: int
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    goodput_per_s: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]
    client_lag_ms: dict[str, float]
    server: dict[str, float | None]


def good(sample: loadgen.Sample, slo_ms: dict[str, float]) -> bool:
    """A completed request that met every target (vLLM's goodput: TPOT 0 for one token)."""
    got = {"ttft": sample.ttft_s * 1000, "tpot": sample.tpot_s * 1000, "e2e": sample.e2e_s * 1000}
    return sample.ok and all(got[k] <= v for k, v in slo_ms.items())


def summarize_rate(samples: list[loadgen.Sample], duration: float, slo_ms: dict[str, float]) -> dict[str, Any]:
    done = [s for s in samples if s.ok]
    return {
        "completed": len(done),
        "failed": sum(1 for s in samples if not s.ok and not s.incomplete),
        "incomplete": sum(1 for s in samples if s.incomplete),
        "duration_s": round(duration, 3),
        "requests_per_s": round(len(done) / duration, 3),
        "output_tokens_per_s": round(sum(s.output_tokens for s in done) / duration, 1),
        "goodput_per_s": round(sum(1 for s in done if good(s, slo_ms)) / duration, 3),
        **latencies(done),
    }


async def _rate_pass(
    client: ApiClient, bodies: list[dict[str, Any]], due: list[float], concurrency: int | None
) -> tuple[list[loadgen.Sample], dict[str, float], float, dict[str, float | None]]:
    watch, stop = ServerWatch(client), asyncio.Event()
    before = await asyncio.to_thread(watch.read)
    watcher = asyncio.get_running_loop().create_task(watch.watch(stop))
    samples, lag, duration = await loadgen.run(target_of(client), bodies, due, concurrency, client.timeout_s)
    stop.set()
    await watcher
    after = await asyncio.to_thread(watch.read)
    return samples, lag, duration, watch.summary(before, after)


def pass_size(rate: float, requests: int, pass_seconds: float | None) -> int:
    """Requests in one pass: `requests`, or `rate x pass_seconds` for a finite rate when given.
    A pass shorter than a request's own time measures the ramp, not the rate: on a fast server
    the high rates need more requests than the low ones to reach a steady state."""
    if pass_seconds is None or rate == float("inf"):
        return requests
    return max(1, math.ceil(rate * pass_seconds))


def run_sweep(
    client: ApiClient,
    rates: list[float],
    input_len: int,
    output_len: int,
    requests: int,
    repeats: int,
    slo_ms: dict[str, float],
    poisson: bool = True,
    burstiness: float = 1.0,
    concurrency: int | None = None,
    pass_seconds: float | None = None,
) -> list[RateLevel]:
    """Every rate `repeats` times, lowest first. Each rate's passes share their arrival times (the
    seed); each pass sends prompts no earlier pass sent (seeded by the pass's number), because a
    prompt sent again is served from the engine's prefix cache and would make repeats faster
    than the first pass: runs stay reproducible and no pass is measured on a warm cache."""
    one_request(client, make_prompts(1, input_len)[0], min(output_len, 8))  # warm-up, not counted
    levels: list[RateLevel] = []
    for rate in sorted(rates):
        count = pass_size(rate, requests, pass_seconds)
        due = loadgen.arrivals(count, rate, burstiness, SEED, poisson)
        for repeat in range(1, repeats + 1):
            bodies = level_bodies(client, make_prompts(count, input_len, SEED + 1 + len(levels)), output_len)
            label = "inf" if rate == float("inf") else f"{rate:g}"
            print(f"rate {label} req/s, pass {repeat}/{repeats}, {count} requests ...", end="", flush=True)
            samples, lag, duration, server = asyncio.run(_rate_pass(client, bodies, due, concurrency))
            row = summarize_rate(samples, duration, slo_ms)
            level = RateLevel(
                rate=rate,
                arrival="poisson" if poisson else "constant",
                burstiness=burstiness,
                repeat=repeat,
                requests=count,
                client_lag_ms=lag,
                server=server,
                **row,
            )
            print(
                f" {level.requests_per_s:.2f} req/s, goodput {level.goodput_per_s:.2f}, {level.output_tokens_per_s:.1f}"
                f" out tok/s, TTFT p99 {level.ttft_ms['p99']:.0f} ms, failed {level.failed + level.incomplete},"
                f" client lag p99 {lag['p99_ms']:.1f} ms",
                flush=True,
            )
            levels.append(level)
    return levels


def sweep_summary(levels: list[RateLevel]) -> list[dict[str, Any]]:
    """Per offered rate: each headline figure's mean and 95 % interval over the repeats."""
    out = []
    for rate in sorted({lv.rate for lv in levels}):
        passes = [lv for lv in levels if lv.rate == rate]
        out.append(
            {
                "rate": "inf" if rate == float("inf") else rate,
                "requests_per_s": interval95([p.requests_per_s for p in passes]),
                "goodput_per_s": interval95([p.goodput_per_s for p in passes]),
                "output_tokens_per_s": interval95([p.output_tokens_per_s for p in passes]),
                "ttft_p99_ms": interval95([p.ttft_ms["p99"] for p in passes]),
                "e2e_p99_ms": interval95([p.e2e_ms["p99"] for p in passes]),
                "failed": sum(p.failed + p.incomplete for p in passes),
            }
        )
    return out


def knee(summary: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The highest offered rate before the server falls behind: the last rate at which at least
    90 % of the completed requests met every target (SLO attainment, goodput over requests/s).

    Why not goodput against the offered rate: a pass's duration includes its last requests' own
    generation time, so a short pass completes fewer requests per second than were offered even on
    an idle server (150 requests at 20/s on an H200: 17.3/s), and every rate then looks saturated.
    A server that falls behind queues, and queued requests miss the TTFT target. An unbounded rate
    offers everything at once: it is never the knee."""
    best = None
    for row in summary:
        if row["rate"] == "inf":
            continue
        done = row["requests_per_s"]["mean"]
        if done > 0 and row["goodput_per_s"]["mean"] >= 0.9 * done:
            best = row
        else:
            break
    return best


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


def plot(results: list[dict[str, Any]], out_dir: Path, title: str) -> list[Path]:
    """Throughput and latency percentiles against concurrency, one line per (input, output) length."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed here: plots skipped (the control node's tool venv has it)", file=sys.stderr)
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    shapes = sorted({(r["input_len"], r["output_len"]) for r in results})
    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for inp, out in shapes:
        rows = sorted(
            (r for r in results if (r["input_len"], r["output_len"]) == (inp, out)), key=lambda r: r["concurrency"]
        )
        ax.plot(
            [r["concurrency"] for r in rows],
            [r["output_tokens_per_s"] for r in rows],
            marker="o",
            label=f"{inp} in / {out} out",
        )
    ax.set(xscale="log", xlabel="concurrent streams", ylabel="output tokens/s", title=f"Throughput - {title}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out_dir / "throughput.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    for ax, metric, label in zip(
        axes,
        ("ttft_ms", "itl_ms", "e2e_ms"),
        ("time to first token", "inter-token latency", "end-to-end latency"),
        strict=True,
    ):
        for inp, out in shapes:
            rows = sorted(
                (r for r in results if (r["input_len"], r["output_len"]) == (inp, out)), key=lambda r: r["concurrency"]
            )
            conc = [r["concurrency"] for r in rows]
            line = ax.plot(conc, [r[metric]["p50"] for r in rows], marker="o", label=f"{inp}/{out} p50")[0]
            ax.plot(
                conc, [r[metric]["p99"] for r in rows], linestyle="--", color=line.get_color(), label=f"{inp}/{out} p99"
            )
        ax.set(xscale="log", yscale="log", xlabel="concurrent streams", ylabel="ms", title=label)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Latency percentiles - {title}")
    fig.tight_layout()
    written.append(out_dir / "latency.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


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


def _client(args: argparse.Namespace) -> tuple[ApiClient, dict[str, Any]]:
    settings: dict[str, Any] = {}
    if args.node_config:
        node = NodeConfig.load(args.node_config)
        settings = node.public()
        url, model, key = node.api_url, node.served_model_name, node.api_key
    else:
        url, model, key = args.url, args.model, os.environ.get("GLMDEPLOY_API_KEY", "")
    if not url or not model:
        raise SystemExit("error: give --node-config, or --url and --model")
    return ApiClient(url, model, key, timeout_s=args.timeout), settings


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy.bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("run", "run a benchmark matrix"),
        ("multiturn", "first-token latency per turn of replayed multi-turn chats"),
        ("baseline", "record the smoke suite's throughput baseline"),
        ("sweep", "offered request rates up to saturation: throughput, latency and goodput per rate"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--node-config", help="read the endpoint from a node's node.json")
        p.add_argument("--url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
        p.add_argument("--model", help="served model name")
        p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
        p.add_argument("--label", default="", help="free text stored with the result (e.g. 'kit settings')")
    run = sub.choices["run"]
    run.add_argument("--input-lens", type=_ints, default=[512, 2048, 8192, 16384])
    run.add_argument("--output-lens", type=_ints, default=[128, 512])
    run.add_argument("--concurrency", type=_ints, default=[1, 4, 16, 64])
    run.add_argument("--requests", type=int, help="requests per level (default: 2 x concurrency, at least 4)")
    run.add_argument("--json", type=Path, required=True, help="where to write the results")
    run.add_argument("--plots", type=Path, help="directory for throughput.png and latency.png")
    multi = sub.choices["multiturn"]
    multi.add_argument("--conversations", type=int, default=8)
    multi.add_argument("--turns", type=int, default=5)
    multi.add_argument("--first-len", type=int, default=2048, help="tokens in the first prompt")
    multi.add_argument("--turn-len", type=int, default=256, help="new user tokens per later turn")
    multi.add_argument("--reply-len", type=int, default=128, help="tokens generated per turn")
    multi.add_argument("--json", type=Path, required=True)
    sw = sub.choices["sweep"]
    sw.add_argument("--rates", type=_rates, default=[0.5, 1, 2, 4, 8, float("inf")], help="req/s, `inf`: all at once")
    sw.add_argument("--input-len", type=int, default=128)
    sw.add_argument("--output-len", type=int, default=64)
    sw.add_argument("--requests", type=int, default=40, help="requests per rate and pass")
    sw.add_argument("--repeats", type=int, default=3, help="passes per rate (the 95 %% interval needs 2 or more)")
    sw.add_argument(
        "--pass-seconds",
        type=float,
        help="size each finite rate's pass to this many seconds of arrivals (requests = rate x seconds;"
        " default: --requests for every rate)",
    )
    sw.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    sw.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps: 1 Poisson, <1 burstier")
    sw.add_argument("--max-concurrency", type=int, help="at most this many requests running (default: no limit)")
    for key, default in DEFAULT_SLO_MS.items():
        sw.add_argument(f"--slo-{key}-ms", type=float, default=default, help=f"goodput's {key.upper()} target (ms)")
    sw.add_argument("--slo-e2e-ms", type=float, help="goodput's end-to-end target (ms; default none)")
    sw.add_argument("--json", type=Path, required=True, help="where to write the results")
    sw.add_argument("--plots", type=Path, help="directory for sweep.png")
    base = sub.choices["baseline"]
    base.add_argument("--out", type=Path, required=True, help="where to write the baseline JSON")
    base.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="allowed slowdown (0.15 = 15%%)")
    cmp = sub.add_parser(
        "compare",
        help="sweeps of different servers side by side, each rate's figures as a ratio to the first (no server needed)",
    )
    cmp.add_argument(
        "sweeps", type=Path, nargs="+", help="sweep JSONs (make bench / sweep --json); the first is the reference"
    )
    cmp.add_argument("--json", type=Path, help="also write the comparison here")
    args = parser.parse_args(argv)
    if args.command == "compare":
        return compare_command(args.sweeps, args.json)
    client, settings = _client(args)
    if not client.health():
        print(f"error: no server answers at {client.base_url} (is the node deployed and running?)", file=sys.stderr)
        return 2
    info = nodefacts.hardware()
    meta = {
        "command": shlex.join(["python", "-m", "glmdeploy.bench", *(argv if argv is not None else sys.argv[1:])]),
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "label": args.label,
        "endpoint": client.base_url,
        "model": client.model,
        "seed": SEED,
        "hardware": info,
        "hardware_class": nodefacts.hardware_class(
            info, sizing.classes_from(settings.get("gpu", {}).get("classes", {}))
        ),
        "versions": server_versions(client),
        "settings": settings,
    }
    if args.command == "multiturn":
        out = multiturn(client, args.conversations, args.turns, args.first_len, args.turn_len, args.reply_len)
        _write(args.json, {**meta, "multiturn": out})
        print(f"TTFT median per turn (ms): {out['ttft_ms_median_per_turn']}; last/first {out['last_over_first']}")
        return 0
    if args.command == "baseline":
        s = SMOKE_SCENARIO
        level = run_level(client, s["input_len"], s["output_len"], s["concurrency"], s["requests"])
        out = {
            **meta,
            "profile": settings.get("profile", ""),
            "scenario": s,
            "tolerance": args.tolerance,
            "result": asdict(level),
        }
        _write(args.out, out)
        print(f"baseline: {level.output_tokens_per_s:.1f} out tok/s ({meta['hardware_class']}) -> {args.out}")
        return 0
    if args.command == "sweep":
        return sweep_command(client, args, meta)
    max_len = settings.get("max_model_len")  # none: --url without a node.json
    levels = run_matrix(
        client, args.input_lens, args.output_lens, args.concurrency, args.requests, int(max_len) if max_len else None
    )
    results = [asdict(r) for r in levels]
    _write(args.json, {**meta, "results": results})
    print(f"results -> {args.json}")
    if args.plots:
        for path in plot(results, args.plots, args.label or client.model):
            print(f"plot -> {path}")
    return 0


def sweep_command(client: ApiClient, args: argparse.Namespace, meta: dict[str, Any]) -> int:
    slo = {k: getattr(args, f"slo_{k}_ms") for k in ("ttft", "tpot", "e2e") if getattr(args, f"slo_{k}_ms") is not None}
    levels = run_sweep(
        client,
        args.rates,
        args.input_len,
        args.output_len,
        args.requests,
        args.repeats,
        slo,
        args.arrival == "poisson",
        args.burstiness,
        args.max_concurrency,
        args.pass_seconds,
    )
    summary = sweep_summary(levels)
    best = knee(summary)
    workload = {
        k: getattr(args, k)
        for k in ("input_len", "output_len", "requests", "repeats", "pass_seconds", "arrival", "burstiness")
    }
    passes = [asdict(lv) | {"rate": "inf" if lv.rate == float("inf") else lv.rate} for lv in levels]
    out = {**meta, "workload": workload, "slo_ms": slo, "passes": passes, "summary": summary, "knee": best}
    _write(args.json, out)
    print(sweep_table(summary, slo))
    print(f"knee: {best['rate']} req/s" if best else "knee: none (goodput below 90 % of the lowest rate offered)")
    print(f"results -> {args.json}")
    if args.plots:
        path = plot_sweep(summary, best, args.plots, args.label or client.model, slo)
        if path:
            print(f"plot -> {path}")
    return 0


COMPARED = ("requests_per_s", "goodput_per_s", "output_tokens_per_s", "ttft_p99_ms")


def compare_sweeps(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per offered rate that every run swept: each run's means and their ratios to the first run's.

    Why a ratio per rate, not per run: the question is how much more a tuned server serves than
    another at the same offered load (the seeds asked "how much faster than one at a time");
    runs that swept different workloads are refused, their ratios would mean nothing."""
    first = runs[0]
    for run in runs[1:]:
        for key in ("input_len", "output_len", "arrival", "burstiness"):
            if run["workload"].get(key) != first["workload"].get(key):
                raise ValueError(
                    f"{run.get('label') or run['endpoint']}: workload {key} {run['workload'].get(key)!r}, the first"
                    f" sweep's is {first['workload'].get(key)!r}: compare sweeps of one workload"
                )
    by_rate = [{str(row["rate"]): row for row in run["summary"]} for run in runs]
    rates = [str(row["rate"]) for row in first["summary"] if all(str(row["rate"]) in r for r in by_rate)]
    out = []
    for rate in rates:
        ref = by_rate[0][rate]
        cells = []
        for run, rows in zip(runs, by_rate, strict=True):
            row = rows[rate]
            cells.append(
                {
                    "label": run.get("label") or run["endpoint"],
                    **{key: row[key]["mean"] for key in COMPARED},
                    "ratio": {
                        key: round(row[key]["mean"] / ref[key]["mean"], 3) if ref[key]["mean"] else None
                        for key in COMPARED
                    },
                }
            )
        out.append({"rate": rate, "runs": cells})
    return out


def compare_command(paths: list[Path], json_out: Path | None) -> int:
    try:
        runs = [json.loads(path.read_text()) for path in paths]
        missing = [str(p) for p, run in zip(paths, runs, strict=True) if "summary" not in run]
        if missing:
            raise ValueError(f"{', '.join(missing)}: not a sweep's JSON (make bench writes reports/bench/sweep.json)")
        rows = compare_sweeps(runs)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{'offered':>8} {'server':<24} {'req/s':>8} {'goodput':>8} {'out tok/s':>10} {'TTFT p99':>10} {'first x':>8}"
    )
    for row in rows:
        for cell in row["runs"]:
            # "first x": the first sweep's goodput over this one's, how many times more requests
            # the first served within the targets at this offered rate.
            ratio = cell["ratio"]["goodput_per_s"]
            figures = (
                f"{cell['requests_per_s']:>8.2f} {cell['goodput_per_s']:>8.2f} {cell['output_tokens_per_s']:>10.1f}"
            )
            ratio_text = "-" if not ratio else f"{1 / ratio:.2f}"
            print(f"{row['rate']:>8} {cell['label'][:24]:<24} {figures} {cell['ttft_p99_ms']:>10.0f} {ratio_text:>8}")
    if json_out:
        _write(json_out, {"sweeps": [str(p) for p in paths], "rates": rows})
        print(f"comparison -> {json_out}")
    return 0


def sweep_table(summary: list[dict[str, Any]], slo: dict[str, float]) -> str:
    """Per offered rate: the figures' means with their 95 % interval."""
    targets = ", ".join(f"{k.upper()} <= {v:g} ms" for k, v in slo.items())
    rows = [
        f"goodput: requests/s meeting {targets}",
        f"{'offered':>8} {'req/s':>14} {'goodput':>14} {'out tok/s':>16} {'TTFT p99 ms':>16} {'failed':>6}",
    ]
    for row in summary:
        rows.append(
            f"{row['rate']!s:>8} {_cell(row, 'requests_per_s'):>14} {_cell(row, 'goodput_per_s'):>14}"
            f" {_cell(row, 'output_tokens_per_s', 1):>16} {_cell(row, 'ttft_p99_ms', 0):>16} {row['failed']:>6}"
        )
    return "\n".join(rows)


def _cell(row: dict[str, Any], key: str, digits: int = 2) -> str:
    return f"{row[key]['mean']:.{digits}f} ±{row[key]['ci95']:.{digits}f}"


def plot_sweep(
    summary: list[dict[str, Any]], best: dict[str, Any] | None, out_dir: Path, title: str, slo: dict[str, float]
) -> Path | None:
    """Throughput against P99 latency, one point per offered rate, the knee marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed here: plot skipped (the control node's tool venv has it)", file=sys.stderr)
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = [r["output_tokens_per_s"]["mean"] for r in summary]
    for key, label in (("ttft_p99_ms", "TTFT p99"), ("e2e_p99_ms", "end-to-end p99")):
        y = [r[key]["mean"] for r in summary]
        ax.errorbar(x, y, yerr=[r[key]["ci95"] for r in summary], marker="o", capsize=3, label=label)
    for r, xi in zip(summary, x, strict=True):
        ax.annotate(
            f"{r['rate']}/s", (xi, r["ttft_p99_ms"]["mean"]), fontsize=7, textcoords="offset points", xytext=(4, 4)
        )
    if best:
        ax.axvline(
            best["output_tokens_per_s"]["mean"], color="red", linestyle="--", label=f"knee: {best['rate']} req/s"
        )
    if "ttft" in slo:
        ax.axhline(slo["ttft"], color="gray", linestyle=":", label=f"TTFT target {slo['ttft']:g} ms")
    ax.set(yscale="log", xlabel="output tokens/s", ylabel="ms (mean of the passes, 95 % interval)")
    ax.set_title(f"Rate sweep - {title}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "sweep.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _rates(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated rates (req/s) or inf, got {text!r}") from None


def _write(path: Path, data: dict[str, Any]) -> None:
    """Write next to the target, then rename: an interrupted run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    raise SystemExit(main())
