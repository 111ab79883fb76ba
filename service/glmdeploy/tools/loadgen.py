"""Load on an OpenAI-compatible server from one event loop: many streams, each chunk timed as it arrives.

Why not a thread per stream (the bench's first client): on a loaded 2-core machine, or with 256
streams on a GPU node, threads wait for the interpreter and for a core, and the waiting was
measured as the server's latency (an ITL p50 of 0.0 ms and a TTFT of 79 ms where vLLM's own
client saw a 5.2 ms TPOT and 18.8 ms). Here one asyncio loop reads every socket and stamps each
chunk when it is read; a ticker measures how late the loop itself runs (`LoopLag`), and the
figures carry it, so a run whose client fell behind says so instead of blaming the server.

Why asyncio streams and hand-written HTTP/1.1 (one connection per request, `Connection:
close`, chunked or sized bodies), although the node locks carry async HTTP clients: the same
reasons as glmdeploy.api.client (httpx 0.27 on gpu-cu121, httpx 0.28 and httpx2 on cpu, aiohttp in
two major versions: code on them would meet two APIs), and this runs where no node lock is
installed too: the control node's tool environment (`make bench` against a URL) and the
reference environment (the unit tests). The events are decoded by glmdeploy.api.sse, the kit's one
decoder, chunk by chunk in arrival order, so each event gets the time of the chunk that
completed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import ssl
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from glmdeploy.api import sse

#: How often the loop-lag ticker wakes (s): late wakes are the client's own delay.
TICK_S = 0.005


@dataclass(frozen=True)
class Target:
    """Where requests go: the API's base URL (…/v1), the served model name and the key."""

    base_url: str
    model: str
    api_key: str = field(default="", repr=False)

    def address(self) -> tuple[str, int, bool, str]:
        parts = urlsplit(self.base_url)
        tls = parts.scheme == "https"
        return parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80), tls, parts.path.rstrip("/")


@dataclass
class Sample:
    """One request: when it was due and sent (s from the run's start), and what came back."""

    due_s: float
    sent_s: float = 0.0
    #: time.perf_counter() when it was sent (CLOCK_MONOTONIC on Linux: comparable across processes).
    sent_at: float = 0.0
    ok: bool = False
    #: The stream ended before its last token (finish reason other than `length`, or cut off).
    incomplete: bool = False
    error: str = ""
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first (vLLM's definition: (e2e - ttft) / (tokens - 1))."""
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


class LoopLag:
    """How late the event loop wakes a task that asked to sleep TICK_S: the client's own delay."""

    def __init__(self) -> None:
        self.late_s: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(TICK_S)
            self.late_s.append(max(0.0, time.perf_counter() - before - TICK_S))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def summary(self) -> dict[str, float]:
        if not self.late_s:
            return {"p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
        ordered = sorted(self.late_s)
        pick = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        return {
            "p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p99_ms": round(pick * 1000, 2),
            "max_ms": round(ordered[-1] * 1000, 2),
        }


def arrivals(count: int, rate: float, burstiness: float = 1.0, seed: int = 0, poisson: bool = True) -> list[float]:
    """When each request is due (s from the start), as vLLM's own client draws them (its
    benchmarks/serve.py), so the two compare: a gap before every request, from a gamma
    distribution of shape `burstiness` and mean 1/rate (1 is Poisson; below 1 burstier), then all
    times scaled so the last is due at count/rate: the run offers exactly the rate asked (the sum
    of a few dozen random gaps is otherwise off by several percent, and so is every throughput).
    `poisson` False: a constant gap of 1/rate. `rate` inf: all at once (a concurrency limit paces
    them). The same seed gives the same times."""
    if rate == float("inf"):
        return [0.0] * count
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        now += rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) if poisson else 1.0 / rate
        times.append(now)
    scale = count / rate / times[-1] if times and times[-1] > 0 else 1.0
    return [t * scale for t in times]


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> Iterator[tuple[float, bytes]]:
    """The response body as (arrival time, bytes) pieces: HTTP/1.1 chunks, else whatever arrives."""
    pieces: list[tuple[float, bytes]] = []
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                break
            data = await reader.readexactly(size)
            pieces.append((time.perf_counter(), data))
            await reader.readexactly(2)
    else:
        while data := await reader.read(65536):
            pieces.append((time.perf_counter(), data))
    return iter(pieces)


async def _exchange(target: Target, path: str, body: dict[str, Any]) -> tuple[int, Iterator[tuple[float, bytes]]]:
    host, port, tls, prefix = target.address()
    reader, writer = await asyncio.open_connection(host, port, ssl=ssl.create_default_context() if tls else None)
    try:
        payload = json.dumps(body).encode()
        head = [
            f"POST {prefix}{path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Content-Type: application/json",
            "Accept: text/event-stream",
            f"Content-Length: {len(payload)}",
            "Connection: close",
        ]
        if target.api_key:
            head.append(f"Authorization: Bearer {target.api_key}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, await _read_body(reader, headers)
    finally:
        writer.close()


async def stream_one(target: Target, body: dict[str, Any], sample: Sample, timeout_s: float, t0: float) -> Sample:
    """Send one streamed completion and fill `sample`; errors are recorded, never raised."""
    start = sample.sent_at = time.perf_counter()
    sample.sent_s = start - t0
    try:
        status, pieces = await asyncio.wait_for(_exchange(target, "/completions", body), timeout_s)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
        sample.error = f"{type(exc).__name__}: {exc}"[:300]
        return sample
    if status != 200:
        sample.error = f"HTTP {status}: {b''.join(p for _, p in pieces).decode('utf-8', 'replace')[:300]}"
        return sample
    arrived = [start]

    def tagged() -> Iterator[bytes]:
        for when, data in pieces:
            arrived[0] = when
            yield data

    stamps: list[float] = []
    finish = None
    try:
        for event in sse.iter_json(tagged()):
            for choice in event.get("choices", []) if isinstance(event, dict) else []:
                stamps.append(arrived[0])
                sample.output_tokens += len(choice.get("token_ids") or []) or 1
                finish = choice.get("finish_reason") or finish
            if isinstance(event, dict) and (event.get("usage") or {}).get("completion_tokens"):
                sample.output_tokens = int(event["usage"]["completion_tokens"])
    except sse.StreamError as exc:
        sample.error, sample.incomplete = str(exc)[:300], True
    if stamps:
        sample.ttft_s, sample.e2e_s = stamps[0] - start, stamps[-1] - start
        sample.itl_s = [b - a for a, b in itertools.pairwise(stamps)]
    sample.ok = not sample.error and finish == "length"
    sample.incomplete = sample.incomplete or (not sample.error and finish != "length")
    return sample


async def run(
    target: Target,
    bodies: Sequence[dict[str, Any]],
    due: Sequence[float],
    max_concurrency: int | None = None,
    timeout_s: float = 600.0,
) -> tuple[list[Sample], dict[str, float], float]:
    """Send bodies[i] at due[i] (s from the start; at most max_concurrency running): the samples,
    the loop's lag and the run's duration (first send to last answer)."""
    lag, gate = LoopLag(), asyncio.Semaphore(max_concurrency or len(bodies) or 1)
    t0 = time.perf_counter()

    async def one(body: dict[str, Any], when: float) -> Sample:
        await asyncio.sleep(max(0.0, when - (time.perf_counter() - t0)))
        async with gate:
            return await stream_one(target, body, Sample(due_s=when), timeout_s, t0)

    lag.start()
    samples = await asyncio.gather(*(one(b, w) for b, w in zip(bodies, due, strict=True)))
    duration = time.perf_counter() - t0
    await lag.stop()
    return list(samples), lag.summary(), duration
