"""The bench's event-loop client (glmdeploy.tools.loadgen) and rate sweep (glmdeploy.tools.bench), against a
stand-in of vLLM's streaming protocol on loopback that sends each token at a known time: what
the client measures must be what the server did, not the client's own scheduling."""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import statistics
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from glmdeploy.api.client import ApiClient
from glmdeploy.tools import loadgen
from glmdeploy.tools.bench.cli import main
from glmdeploy.tools.bench.report import sweep_table
from glmdeploy.tools.bench.sweep import (
    COMPARED,
    compare_sweeps,
    good,
    interval95,
    knee,
    pass_size,
    run_sweep,
    summarize_rate,
    sweep_summary,
)

TTFT_S, ITL_S = 0.05, 0.02


class StandIn(BaseHTTPRequestHandler):
    """vLLM's /v1/completions stream (chunked, `data:` events, `[DONE]`) with fixed timing, and a
    /metrics whose preemption counter grows by one per request."""

    protocol_version = "HTTP/1.1"
    served = 0
    mode = "ok"
    #: Where each request's chunk send times go (CLOCK_MONOTONIC, the clock of the client's perf_counter).
    log = ""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = (
            "# TYPE vllm:num_preemptions_total counter\n"
            f'vllm:num_preemptions_total{{model_name="m"}} {StandIn.served}\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25\nvllm:num_requests_waiting{model_name="m"} 2\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StandIn.served += 1
        if StandIn.mode == "reject":
            body = b'{"error": {"message": "too long", "code": 400}}'
            self.send_response(400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        time.sleep(TTFT_S)
        tokens, sent = int(request["max_tokens"]), []
        for n in range(tokens):
            if StandIn.mode == "error" and n == 2:
                self.chunk(b'data: {"error": {"message": "CUDA out of memory", "code": 500}}\n\n')
                break
            last = n == tokens - 1
            choice = {"index": 0, "text": "x", "token_ids": [5], "finish_reason": "length" if last else None}
            sent.append(time.monotonic())  # before the write: the client cannot have it earlier
            self.chunk(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            if not last:
                time.sleep(ITL_S)
        if StandIn.log:  # before [DONE]: once the client has the whole stream the test may kill us
            with open(StandIn.log, "a") as out:
                out.write(json.dumps({"prompt": request["prompt"], "sent": sent}) + "\n")
        self.chunk(b"data: [DONE]\n\n")
        self.chunk(b"")


class Server(ThreadingHTTPServer):
    request_queue_size = 128  # 32 connections at once: the default backlog (5) would delay some by a second
    daemon_threads = True


@pytest.fixture
def standin() -> Iterator[str]:
    StandIn.mode, StandIn.served = "ok", 0
    server = Server(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def bodies(count: int, tokens: int) -> list[dict]:
    return [{"model": "m", "prompt": [5, 6], "max_tokens": tokens, "stream": True} for _ in range(count)]


def serve_apart(log: str, ports: multiprocessing.Queue) -> None:
    """The stand-in in a process of its own: its threads do not share the client's interpreter."""
    StandIn.log = log
    server = Server(("127.0.0.1", 0), StandIn)
    ports.put(server.server_address[1])
    server.serve_forever()


def test_each_token_is_stamped_when_it_arrives_not_when_the_client_gets_to_it_with_32_streams(tmp_path):
    """The stand-in logs when it sent each chunk, on the clock the client stamps with: the gap
    between the two is what the client adds to every figure."""
    ports: multiprocessing.Queue = multiprocessing.Queue()
    log = tmp_path / "sent.jsonl"
    server = multiprocessing.Process(target=serve_apart, args=(str(log), ports), daemon=True)
    server.start()
    try:
        target = loadgen.Target(f"http://127.0.0.1:{ports.get(timeout=30)}/v1", "m")
        requests = [{"model": "m", "prompt": [i], "max_tokens": 16, "stream": True} for i in range(32)]
        samples, lag, _ = asyncio.run(loadgen.run(target, requests, [0.0] * 32))
    finally:
        server.kill()
    assert all(s.ok and s.output_tokens == 16 for s in samples), [s.error for s in samples if not s.ok]
    sent = {tuple(row["prompt"]): row["sent"] for row in map(json.loads, log.read_text().splitlines())}
    delays = []
    for i, sample in enumerate(samples):
        start = sample.sent_at
        stamps = [start + sample.ttft_s] + [start + sample.ttft_s + sum(sample.itl_s[:k]) for k in range(1, 16)]
        delays += [got - when for got, when in zip(stamps, sent[(i,)], strict=True)]
    assert min(delays) > -0.001, "a token stamped before the server sent it: the clocks differ"
    assert statistics.median(delays) < 0.01, f"tokens stamped {statistics.median(delays) * 1000:.1f} ms late (median)"
    assert set(lag) == {"p50_ms", "p99_ms", "max_ms"} and lag["p50_ms"] >= 0


def test_arrivals_are_poisson_at_exactly_the_rate_asked_and_the_seed_repeats_them():
    due = loadgen.arrivals(4000, 10.0, seed=7)
    gaps = [b - a for a, b in itertools.pairwise([0.0, *due])]
    assert due[-1] == pytest.approx(400.0), "the last request is due at count / rate, as vLLM's client has it"
    assert abs(statistics.fmean(gaps) - 0.1) < 1e-9 and abs(statistics.stdev(gaps) - 0.1) < 0.01, "exponential gaps"
    assert due == loadgen.arrivals(4000, 10.0, seed=7) and due != loadgen.arrivals(4000, 10.0, seed=8)
    bursty = [b - a for a, b in itertools.pairwise(loadgen.arrivals(4000, 10.0, burstiness=0.25, seed=7))]
    assert statistics.stdev(bursty) > 1.5 * statistics.stdev(gaps), "burstiness below 1 must spread the gaps"
    assert loadgen.arrivals(3, 4.0, poisson=False) == [0.25, 0.5, 0.75]
    assert loadgen.arrivals(3, float("inf")) == [0.0, 0.0, 0.0]


def test_a_rejected_request_and_an_error_mid_stream_are_recorded_not_raised(standin):
    target = loadgen.Target(standin, "m")
    StandIn.mode = "reject"
    (rejected,), _, _ = asyncio.run(loadgen.run(target, bodies(1, 4), [0.0]))
    assert not rejected.ok and not rejected.incomplete and rejected.error.startswith("HTTP 400")
    StandIn.mode = "error"
    (cut,), _, _ = asyncio.run(loadgen.run(target, bodies(1, 8), [0.0]))
    assert not cut.ok and cut.incomplete and "CUDA out of memory" in cut.error and cut.output_tokens == 2


def test_goodput_counts_completed_requests_within_every_target():
    fast = loadgen.Sample(due_s=0, ok=True, ttft_s=0.2, e2e_s=1.2, output_tokens=11)  # TPOT 100 ms
    slow_start = loadgen.Sample(due_s=0, ok=True, ttft_s=1.5, e2e_s=2.0, output_tokens=11)
    failed = loadgen.Sample(due_s=0, ok=False, ttft_s=0.1, e2e_s=0.2, output_tokens=3)
    slo = {"ttft": 1000.0, "tpot": 100.0}
    assert [good(s, slo) for s in (fast, slow_start, failed)] == [True, False, False]
    assert not good(fast, slo | {"tpot": 99.0}) and not good(fast, slo | {"e2e": 1000.0})
    row = summarize_rate([fast, slow_start, failed], 2.0, slo)
    assert (row["completed"], row["failed"], row["goodput_per_s"], row["requests_per_s"]) == (2, 1, 0.5, 1.0)


def test_the_knee_is_the_last_rate_at_which_nine_in_ten_requests_met_their_targets():
    def row(rate: float | str, done: float, goodput: float) -> dict:
        return {
            "rate": rate,
            "requests_per_s": {"mean": done, "ci95": 0.0, "n": 3},
            "goodput_per_s": {"mean": goodput, "ci95": 0.0, "n": 3},
        }

    # A short pass completes fewer requests per second than were offered (its last requests' own
    # time is in its duration): 0.87 of 1/s with every request on target is not a shortfall.
    summary = [row(1.0, 0.87, 0.87), row(2.0, 1.7, 1.6), row(4.0, 3.0, 2.0), row(8.0, 4.0, 3.9), row("inf", 3.1, 3.1)]
    assert knee(summary)["rate"] == 2.0, "a rate after the first shortfall does not count"
    assert knee([row(1.0, 1.0, 0.5)]) is None


def _sweep(label: str, workload: dict, rows: dict) -> dict:
    def cell(value: float) -> dict:
        return {"mean": value, "ci95": 0.0, "n": 3}

    summary = [
        {
            "rate": rate,
            **{key: cell(v) for key, v in zip(COMPARED, values, strict=True)},
        }
        for rate, values in rows.items()
    ]
    return {"label": label, "endpoint": "http://127.0.0.1:1/v1", "workload": workload, "summary": summary}


def test_compare_gives_each_rate_as_a_ratio_to_the_first_sweep_and_refuses_other_workloads(tmp_path, capsys):
    work = {"input_len": 128, "output_len": 64, "arrival": "poisson", "burstiness": 1.0}
    kit = _sweep(
        "kit", work, {1.0: (1.0, 1.0, 64.0, 300.0), 4.0: (3.8, 3.6, 240.0, 900.0), "inf": (5.0, 1.0, 320.0, 9e3)}
    )
    one = _sweep("one at a time", work, {1.0: (0.9, 0.5, 58.0, 1500.0), 4.0: (0.95, 0.0, 60.0, 6e4)})
    rows = compare_sweeps([kit, one])
    assert [row["rate"] for row in rows] == ["1.0", "4.0"], "only rates both swept"
    assert (
        rows[1]["runs"][1]["ratio"]["output_tokens_per_s"] == 0.25 and rows[1]["runs"][0]["ratio"]["goodput_per_s"] == 1
    )
    paths = []
    for run in (kit, one, {**one, "workload": {**work, "input_len": 512}}):
        paths.append(tmp_path / f"{len(paths)}.json")
        paths[-1].write_text(json.dumps(run))
    assert main(["compare", str(paths[0]), str(paths[1]), "--json", str(tmp_path / "c.json")]) == 0
    assert "one at a time" in capsys.readouterr().out and json.loads((tmp_path / "c.json").read_text())["rates"]
    assert main(["compare", str(paths[0]), str(paths[2])]) == 2
    assert "workload input_len 512, the first sweep's is 128" in capsys.readouterr().err


def test_the_interval_is_students_t_over_the_repeats():
    got = interval95([10.0, 12.0, 14.0])
    assert got["mean"] == 12.0 and got["ci95"] == pytest.approx(4.303 * 2.0 / 3**0.5, abs=1e-3)
    assert interval95([5.0])["ci95"] == 0.0


def test_a_sweep_reports_each_rate_with_its_interval_goodput_and_the_servers_counters(standin):
    client = ApiClient(standin, "m", timeout_s=30)
    levels = run_sweep(client, [20.0, float("inf")], 8, 4, requests=6, repeats=2, slo_ms={"ttft": 1000.0})
    assert [(lv.rate, lv.repeat) for lv in levels] == [(20.0, 1), (20.0, 2), (float("inf"), 1), (float("inf"), 2)]
    assert all(lv.completed == 6 and lv.failed == 0 and lv.goodput_per_s == lv.requests_per_s for lv in levels)
    assert all(lv.server["preemptions"] == 6 and lv.server["kv_cache_usage_max"] == 0.25 for lv in levels)
    paced, burst = levels[0], levels[2]
    assert paced.duration_s > burst.duration_s, "requests at 20/s must take longer than all at once"
    summary = sweep_summary(levels)
    assert [r["rate"] for r in summary] == [20.0, "inf"] and summary[0]["requests_per_s"]["n"] == 2
    assert "goodput" in sweep_table(summary, {"ttft": 1000.0})


def test_each_sweep_pass_sends_prompts_no_earlier_pass_sent(standin, monkeypatch):
    """A prompt sent again comes from the engine's prefix cache: a repeat must not be a warm rerun."""
    sent: list[list[tuple[int, ...]]] = []
    real = loadgen.run

    async def recording(target, bodies, due, concurrency, timeout_s):
        sent.append([tuple(b["prompt"]) for b in bodies])
        return await real(target, bodies, due, concurrency, timeout_s)

    monkeypatch.setattr(loadgen, "run", recording)
    client = ApiClient(standin, "m", timeout_s=30)
    run_sweep(client, [20.0, 40.0], 8, 4, requests=3, repeats=2, slo_ms={"ttft": 1000.0})
    prompts = [p for one_pass in sent for p in one_pass]
    assert len(sent) == 4 and len(set(prompts)) == len(prompts) == 12
    first_run = list(sent)
    sent.clear()
    run_sweep(client, [20.0, 40.0], 8, 4, requests=3, repeats=2, slo_ms={"ttft": 1000.0})
    assert sent == first_run, "the same sweep sends the same prompts: runs on different days compare"


def test_pass_seconds_sizes_each_finite_rate_and_leaves_the_unbounded_one_at_its_count():
    assert [pass_size(rate, 40, 10.0) for rate in (2.5, 40.0, float("inf"))] == [25, 400, 40]
    assert pass_size(40.0, 40, None) == 40
