"""Request-rate sweeps: open-loop levels with the server's own gauges sampled, goodput against
targets, the knee where the server saturates, sweeps compared with confidence intervals.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from glmdeploy.api.client import ApiClient
from glmdeploy.tools import loadgen
from glmdeploy.tools.bench.client import SEED, latencies, level_bodies, make_prompts, one_request, root_of, target_of

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
    gauges and counters). Not prometheus_client's parser: `make bench` runs from the control
    node's tool environment, which does not have it (the nodes' environments do)."""
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
