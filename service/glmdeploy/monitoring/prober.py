"""A real generation every few seconds on this node, exported for Prometheus: the liveness signal.

Why: a server's /health answers 200 while its engine is stuck or emits garbage (the readiness
check exists for the same reason). The prober runs the readiness generation itself
(glmdeploy.serving.ready.generate_once: the kit's chat prompt, 24 tokens, non-empty text, varied ids),
streamed so the first token's latency is measured, and serves on /metrics:

  glmdeploy_probe_success                 1 when the last probe generated properly, else 0
  glmdeploy_probe_first_token_seconds     the last successful probe's time to the first token
  glmdeploy_probe_duration_seconds        the last probe's end-to-end time (failed ones too)
  glmdeploy_probe_output_varied           1 when the last reply's ids varied (0: a stuck engine)
  glmdeploy_probe_last_success_timestamp_seconds
  glmdeploy_probe_in_flight_seconds       how long the probe now running has run (0: none running);
                                          a hung server shows here seconds before the probe's timeout
  glmdeploy_probes_total{result}          ok | unreachable | server_error | timeout | bad_output
  glmdeploy_probe_last_result{result}     1 for the last probe's result, 0 for the others

and, with each probe, what the alerts need that no other exporter has:

  glmdeploy_server_memory_bytes{measure}  the server's whole process tree (PSS; glmdeploy.tools.soak's
                                          measure, so the leak alert and the soak gate agree)
  glmdeploy_kit_disk_free_ratio           free space on the file system of the kit's root
  glmdeploy_baseline_ttft_p99_seconds{baseline}  the node's stored throughput baseline's TTFT p99
                                          (smoke_tests/baselines/<profile>-<class>.json; absent: none)

Alerts read these (roles/monitoring/files/rules/), and so does the balancer's health check
(glmdeploy.balancer.lb_health); the node's labels come from Prometheus.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from glmdeploy.api.client import ApiClient, ServerError, ServerUnavailable
from glmdeploy.config import NodeConfig
from glmdeploy.model.prompt import PromptBuilder, load_tokenizer
from glmdeploy.serving import nodefacts
from glmdeploy.serving.ready import generate_once

RESULTS = ("ok", "unreachable", "server_error", "timeout", "bad_output")


@dataclass
class ProbeMetrics:
    """The prober's series, in a registry of their own (no process or platform collectors)."""

    registry: CollectorRegistry
    success: Gauge
    first_token: Gauge
    duration: Gauge
    varied: Gauge
    last_success: Gauge
    in_flight: Gauge
    probes: Counter
    last_result: Gauge
    memory: Gauge
    disk_free: Gauge
    baseline_ttft: Gauge

    @classmethod
    def create(cls) -> ProbeMetrics:
        registry = CollectorRegistry()
        probes = Counter("glmdeploy_probes", "Probes by result", ["result"], registry=registry)
        last_result = Gauge(
            "glmdeploy_probe_last_result", "1 for the last probe's result", ["result"], registry=registry
        )
        for result in RESULTS:
            probes.labels(result)  # every result present from the start, at 0
            last_result.labels(result)
        return cls(
            registry=registry,
            success=Gauge("glmdeploy_probe_success", "1 when the last probe generated properly", registry=registry),
            first_token=Gauge(
                "glmdeploy_probe_first_token_seconds", "Last successful probe's time to first token", registry=registry
            ),
            duration=Gauge("glmdeploy_probe_duration_seconds", "Last probe's end-to-end time", registry=registry),
            varied=Gauge("glmdeploy_probe_output_varied", "1 when the last reply's ids varied", registry=registry),
            last_success=Gauge(
                "glmdeploy_probe_last_success_timestamp_seconds", "When a probe last succeeded", registry=registry
            ),
            in_flight=Gauge(
                "glmdeploy_probe_in_flight_seconds", "How long the running probe has run (0: none)", registry=registry
            ),
            probes=probes,
            last_result=last_result,
            memory=Gauge("glmdeploy_server_memory_bytes", "The server's process tree", ["measure"], registry=registry),
            disk_free=Gauge("glmdeploy_kit_disk_free_ratio", "Free fraction of the kit root's disk", registry=registry),
            baseline_ttft=Gauge(
                "glmdeploy_baseline_ttft_p99_seconds",
                "TTFT p99 of the node's stored baseline",
                ["baseline"],
                registry=registry,
            ),
        )

    def __post_init__(self) -> None:
        # Not measured yet is not a value: NaN until the first probe (a labelled gauge, where a value
        # may never come - no memory measure, no baseline - is absent until it does).
        # (success too: a prober that has not finished a probe yet has no verdict, which the
        # balancer must not take for a failure.)
        for gauge in (self.success, self.first_token, self.duration, self.varied):
            gauge.set(float("nan"))
        self.probe_started: float | None = None
        # Read at scrape time: a probe stuck on a hung server is seen while it waits.
        self.in_flight.set_function(self.waited_s)

    def waited_s(self) -> float:
        """How long the running probe has run (0: none); read once, the probe thread may end it meanwhile."""
        started = self.probe_started
        return 0.0 if started is None else time.monotonic() - started


@dataclass
class NodeFacts:
    """Where the node keeps what the per-probe gauges read."""

    kit_root: Path
    baselines: Path | None
    baseline_key: str = ""

    def baseline_ttft_p99_s(self) -> float | None:
        """The TTFT p99 of the baseline the smoke suite holds this node to (the same file it picks)."""
        if self.baselines is None or not self.baseline_key:
            return None
        path = self.baselines / f"{self.baseline_key}.json"
        try:
            return float(json.loads(path.read_text())["result"]["ttft_ms"]["p99"]) / 1000
        except (OSError, ValueError, KeyError, TypeError):
            return None


def update_node_gauges(facts: NodeFacts, metrics: ProbeMetrics) -> None:
    memory = nodefacts.service_memory_mb()
    if memory is not None:
        metrics.memory.labels("pss").set(memory * 2**20)
    try:
        usage = shutil.disk_usage(facts.kit_root)
        metrics.disk_free.set(usage.free / usage.total)
    except OSError as exc:
        # The probe is the liveness signal: a gauge it cannot read must not stop it (seen on the
        # H200 run, where the kit's root did not exist and the prober died at its first probe).
        metrics.disk_free.set(math.nan)
        print(f"kit disk gauge unknown: {exc}", file=sys.stderr, flush=True)
    baseline = facts.baseline_ttft_p99_s()
    if baseline is not None:
        metrics.baseline_ttft.labels(facts.baseline_key).set(baseline)


def classify(exc: BaseException) -> str:
    """The result label of a failed probe, from what the client raised."""
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "timeout"
    if isinstance(exc, ServerUnavailable):
        # The client wraps a read timeout as unavailable; its cause tells them apart.
        return "timeout" if isinstance(exc.__cause__, (TimeoutError, socket.timeout)) else "unreachable"
    if isinstance(exc, ServerError):
        return "server_error"
    return "unreachable" if isinstance(exc, OSError) else "server_error"


def probe_once(client: ApiClient, builder: PromptBuilder, metrics: ProbeMetrics) -> str:
    """Run one probe, set the gauges, count it; return its result label."""
    start = time.perf_counter()
    metrics.probe_started = time.monotonic()
    try:
        generation = generate_once(client, builder, stream=True)
    except (ServerUnavailable, ServerError, OSError) as exc:
        result, varied, first_token = classify(exc), None, None
        detail = str(exc)
    else:
        result = "bad_output" if generation.problems else "ok"
        varied, first_token = generation.varied, generation.first_token_s
        detail = "; ".join(generation.problems)
    metrics.probe_started = None
    metrics.duration.set(time.perf_counter() - start)
    metrics.probes.labels(result).inc()
    for name in RESULTS:
        metrics.last_result.labels(name).set(1 if name == result else 0)
    metrics.success.set(1 if result == "ok" else 0)
    if varied is not None:
        metrics.varied.set(1 if varied else 0)
    if result == "ok":
        metrics.first_token.set(first_token if first_token is not None else float("nan"))
        metrics.last_success.set(time.time())
    elif detail:
        print(f"probe {result}: {detail[:500]}", file=sys.stderr, flush=True)
    return result


def run(
    client: ApiClient,
    builder: PromptBuilder,
    metrics: ProbeMetrics,
    facts: NodeFacts,
    interval_s: float,
    stop: threading.Event,
) -> None:
    """Probe every interval (measured start to start) until stopped."""
    while not stop.is_set():
        began = time.monotonic()
        probe_once(client, builder, metrics)
        update_node_gauges(facts, metrics)
        stop.wait(max(0.0, interval_s - (time.monotonic() - began)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glmdeploy-prober", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="node config (default: $GLMDEPLOY_NODE_CONFIG or /etc/glmdeploy/node.json)")
    parser.add_argument("--listen", default="127.0.0.1", help="address /metrics listens on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, required=True, help="port /metrics listens on")
    parser.add_argument(
        "--interval", type=float, default=5.0, help="seconds from one probe's start to the next (default 5)"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds a probe may take before it failed (default 30)"
    )
    parser.add_argument("--kit-root", type=Path, default=Path("/opt/glmdeploy"), help="the kit's root on the node")
    parser.add_argument("--baselines", type=Path, help="the smoke suite's baselines/ on the node")
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.timeout <= 0:
        parser.error("--interval and --timeout must be positive seconds")
    node = NodeConfig.load(args.config)
    client = ApiClient.for_node(node, timeout_s=args.timeout)
    builder = PromptBuilder.from_tokenizer(load_tokenizer(node.model_dir, node.trust_remote_code))
    facts = NodeFacts(args.kit_root, args.baselines, f"{node.profile}-{nodefacts.node_hardware_class(node)}")
    metrics = ProbeMetrics.create()
    start_http_server(args.port, addr=args.listen, registry=metrics.registry)
    print(f"probing {client.base_url} every {args.interval:g}s; metrics on {args.listen}:{args.port}", flush=True)
    run(client, builder, metrics, facts, args.interval, threading.Event())
    return 0


if __name__ == "__main__":
    sys.exit(main())
