"""glmdeploy.monitoring.prober against a loopback stand-in of an OpenAI completions server (named so: it
streams what a server streams, with no model behind it). What each failure is counted as, and
that a stuck engine (one token repeated) is not a success although it answers 200."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import generate_latest

from glmdeploy.api.client import ApiClient
from glmdeploy.model.prompt import PromptBuilder
from glmdeploy.monitoring import prober


class StandIn(BaseHTTPRequestHandler):
    """Streams /v1/completions as vLLM does (server-sent events, [DONE]); `mode` picks the behaviour."""

    mode = "ok"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.mode == "error":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b'{"error": "engine dead"}')
            return
        if self.mode == "hang":
            time.sleep(3)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        words = ["I", " am", " ChatGLM", ",", " a", " model"] * 4 if self.mode == "ok" else ["x"] * 24
        for word in words:
            event = {"choices": [{"text": word, "index": 0, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": 24}
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (StandIn,), {}))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


@pytest.fixture
def builder(tokenizer):
    return PromptBuilder.from_tokenizer(tokenizer)


def client_for(port: int, timeout_s: float = 5.0) -> ApiClient:
    return ApiClient(f"http://127.0.0.1:{port}/v1", "chatglm3-6b-32k", timeout_s=timeout_s)


def samples(metrics: prober.ProbeMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"}


def test_a_generating_server_is_a_success_with_its_first_token_latency(server, builder):
    metrics = prober.ProbeMetrics.create()
    assert prober.probe_once(client_for(server.server_port), builder, metrics) == "ok"
    got = samples(metrics)
    assert got["glmdeploy_probe_success"] == 1 and got["glmdeploy_probe_output_varied"] == 1
    assert 0 < got["glmdeploy_probe_first_token_seconds"] <= got["glmdeploy_probe_duration_seconds"]
    assert got['glmdeploy_probes_total{result="ok"}'] == 1 and got['glmdeploy_probes_total{result="timeout"}'] == 0
    assert abs(got["glmdeploy_probe_last_success_timestamp_seconds"] - time.time()) < 5


def test_a_stuck_engine_answering_200_is_bad_output_not_varied(server, builder):
    server.RequestHandlerClass.mode = "stuck"
    metrics = prober.ProbeMetrics.create()
    assert prober.probe_once(client_for(server.server_port), builder, metrics) == "bad_output"
    got = samples(metrics)
    assert got["glmdeploy_probe_success"] == 0 and got["glmdeploy_probe_output_varied"] == 0
    assert got["glmdeploy_probe_last_success_timestamp_seconds"] == 0


def test_an_http_error_is_a_server_error(server, builder):
    server.RequestHandlerClass.mode = "error"
    metrics = prober.ProbeMetrics.create()
    assert prober.probe_once(client_for(server.server_port), builder, metrics) == "server_error"
    assert samples(metrics)["glmdeploy_probe_success"] == 0


def test_a_server_that_never_answers_is_a_timeout_after_the_probe_timeout(server, builder):
    server.RequestHandlerClass.mode = "hang"
    metrics = prober.ProbeMetrics.create()
    assert prober.probe_once(client_for(server.server_port, timeout_s=0.5), builder, metrics) == "timeout"
    assert 0.5 <= samples(metrics)["glmdeploy_probe_duration_seconds"] < 3


def test_a_probe_waiting_on_a_hung_server_shows_its_wait_before_it_times_out(server, builder):
    """What the balancer's health check reads: the wait is visible while the probe still waits."""
    server.RequestHandlerClass.mode = "hang"
    metrics = prober.ProbeMetrics.create()
    assert samples(metrics)["glmdeploy_probe_in_flight_seconds"] == 0
    probe = threading.Thread(target=prober.probe_once, args=(client_for(server.server_port, 2.0), builder, metrics))
    probe.start()
    deadline, waited = time.monotonic() + 10, 0.0
    while probe.is_alive() and waited < 1.0 and time.monotonic() < deadline:
        waited = samples(metrics)["glmdeploy_probe_in_flight_seconds"]
        time.sleep(0.05)
    assert waited >= 1.0 and probe.is_alive(), "the wait of a running probe was not exported while it ran"
    probe.join()
    assert samples(metrics)["glmdeploy_probe_in_flight_seconds"] == 0


def test_a_closed_port_is_unreachable(builder):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    metrics = prober.ProbeMetrics.create()
    assert prober.probe_once(client_for(port), builder, metrics) == "unreachable"
    assert samples(metrics)['glmdeploy_probes_total{result="unreachable"}'] == 1


def test_the_prober_refuses_a_zero_interval_by_name(capsys):
    with pytest.raises(SystemExit):
        prober.main(["--port", "9", "--interval", "0"])
    assert "--interval and --timeout must be positive" in capsys.readouterr().err


def test_node_gauges_carry_the_stored_baseline_and_the_kit_disk(tmp_path):
    """The baseline is the file the throughput smoke test picks (<profile>-<class>.json)."""
    baselines = prober.Path(__file__).resolve().parents[2] / "smoke_tests" / "baselines"
    metrics = prober.ProbeMetrics.create()
    prober.update_node_gauges(prober.NodeFacts(tmp_path, baselines, "cpu-cpu2"), metrics)
    got = samples(metrics)
    stored = json.loads((baselines / "cpu-cpu2.json").read_text())["result"]["ttft_ms"]["p99"]
    assert got['glmdeploy_baseline_ttft_p99_seconds{baseline="cpu-cpu2"}'] == stored / 1000
    assert 0 < got["glmdeploy_kit_disk_free_ratio"] < 1


def test_a_node_without_a_baseline_exports_none_rather_than_zero(tmp_path):
    metrics = prober.ProbeMetrics.create()
    prober.update_node_gauges(prober.NodeFacts(tmp_path, tmp_path, "cpu-cpu64"), metrics)
    assert not [name for name in samples(metrics) if name.startswith("glmdeploy_baseline_ttft_p99_seconds")]


def test_a_missing_kit_root_leaves_the_disk_gauge_unknown_and_the_prober_running(tmp_path):
    metrics = prober.ProbeMetrics.create()
    prober.update_node_gauges(prober.NodeFacts(tmp_path / "absent", tmp_path, "cpu-cpu64"), metrics)
    assert math.isnan(samples(metrics)["glmdeploy_kit_disk_free_ratio"])
