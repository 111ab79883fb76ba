"""The balancer's view of each node follows a real generation: a hung node leaves the rotation in seconds.

Why: nginx's open-source build has only passive checks (a refused or failed connection), and a
hung GPU server still accepts connections: requests sent to it waited until the read timeout,
and nothing took it out. Each node's prober (glmdeploy.monitoring.prober) runs the readiness generation
every few seconds and exports how long the probe now running has waited; this service, on the
balancer, reads every node's prober each second and marks a node `down` in nginx's
configuration when

  - a probe has run longer than --hang seconds with no reply (hung: it accepts connections but
    does not generate), or its last probe failed (timeout, server error, bad output, refused), or
  - its prober does not answer at all (the host is gone or stuck).

A node comes back by itself after --rise successful probes. A prober that refuses the connection
(not running: no monitoring host, or stopped) leaves the node to nginx's passive checks, and if
every node not drained by hand is out, all of them stay in (fail open: a fleet-wide prober fault
must not take the service down; the status says so).

The configuration Ansible renders (--config's `source`: drains applied, `down` on drained nodes)
stays the only description of the balancer; this service writes nginx's copy of it (`target`)
with `down` added to the server lines of the nodes out of rotation (lines end with `# <node>`),
checks it with `nginx -t` (the previous copy is put back if it fails) and reloads nginx, which
lets in-flight requests finish on the old workers. It reads `source` and the settings every
round (two small files: a drain or a new node takes effect within a second, with no signal to
send), and serves /status (JSON: each node, in rotation or not and why, and the digest of
the source it applied: what Ansible waits for) and /metrics.

It runs on the balancer with the distribution's Python and prometheus_client (Debian's
python3-prometheus-client), so it imports nothing else of the kit: the balancer need not be a node.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

# A server line of the rendered configuration: `server ADDR[ params];  # node`.
SERVER_LINE = re.compile(r"^(?P<head>\s*server\s+\S+)(?P<params>[^;#]*);(?P<tail>\s*#\s*(?P<node>\S+)\s*)$")


@dataclass(frozen=True)
class Settings:
    """What Ansible writes to the --config file (roles/load_balancer)."""

    source: Path
    target: Path
    probers: dict[str, str]
    interval_s: float = 1.0
    hang_s: float = 6.0
    rise: int = 2
    read_timeout_s: float = 2.0
    test_command: tuple[str, ...] = ("nginx", "-t", "-q")
    reload_command: tuple[str, ...] = ("systemctl", "reload", "nginx")

    @classmethod
    def load(cls, path: Path) -> Settings:
        raw = json.loads(path.read_text())
        return cls(
            source=Path(raw["source"]),
            target=Path(raw["target"]),
            probers=dict(raw["probers"]),
            interval_s=float(raw.get("interval_s", 1.0)),
            hang_s=float(raw.get("hang_s", 6.0)),
            rise=int(raw.get("rise", 2)),
            read_timeout_s=float(raw.get("read_timeout_s", 2.0)),
            test_command=tuple(raw.get("test_command", cls.test_command)),
            reload_command=tuple(raw.get("reload_command", cls.reload_command)),
        )


@dataclass(frozen=True)
class Reading:
    """One read of a node's prober: generating (True/False, None: unknown) and why."""

    generating: bool | None
    reason: str
    ok_probes: float | None = None  # the prober's count of good probes (None: it did not answer)


def parse_reading(text: str, hang_s: float) -> Reading:
    """What a prober's /metrics says about its node."""
    samples: dict[str, float] = {}
    last: str | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "glmdeploy_probe_last_result" and sample.value == 1:
                last = sample.labels.get("result")
            elif sample.name == "glmdeploy_probes_total" and sample.labels.get("result") == "ok":
                samples["ok"] = sample.value
            elif not sample.labels:
                samples[sample.name] = sample.value
    ok = samples.get("ok", 0.0)
    waited = samples.get("glmdeploy_probe_in_flight_seconds", 0.0)
    if waited >= hang_s:
        return Reading(False, f"hung: a generation has waited {waited:.0f} s with no reply (connections accepted)", ok)
    success = samples.get("glmdeploy_probe_success", math.nan)
    if success == 1:
        return Reading(True, "generating", ok)
    if math.isnan(success) or "glmdeploy_probe_success" not in samples:
        return Reading(None, "its prober has no probe result yet", ok)
    if last == "timeout":
        return Reading(False, "hung: its last generation got no reply before the probe's timeout", ok)
    return Reading(False, f"not generating: its last probe failed ({last or 'unknown'})", ok)


def read_prober(url: str, timeout_s: float, hang_s: float) -> Reading:
    """Read one node's prober; a refused connection is unknown (no prober), anything else not generating."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return parse_reading(response.read().decode(), hang_s)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            return Reading(None, "unwatched: its prober refuses connections (not running)")
        return Reading(False, f"its prober does not answer ({exc.reason})")
    except (OSError, ValueError) as exc:  # a read timeout, a reset, a cut-off or malformed reply
        return Reading(False, f"its prober does not answer properly ({exc})")


@dataclass
class NodeState:
    """A node's place in the rotation. `ok_when_out`: its prober's count of good probes at its last
    failed reading while out; it comes back after `rise` good probes counted from there."""

    in_rotation: bool = True
    generating: bool | None = None
    reason: str = "not read yet"
    since: float = field(default_factory=time.time)
    ok_when_out: float = 0.0
    ok_seen: float = 0.0

    def step(self, reading: Reading, rise: int) -> bool:
        """Apply one reading; True when the node entered or left the rotation."""
        self.generating, self.reason = reading.generating, reading.reason
        if reading.ok_probes is not None:
            self.ok_seen = reading.ok_probes
        if reading.generating is False:
            self.ok_when_out = self.ok_seen  # good probes are counted in a row, from the last failure
            if self.in_rotation:
                self.in_rotation, self.since = False, time.time()
                return True
            return False
        back = reading.generating is None or self.ok_seen - self.ok_when_out >= rise
        if not self.in_rotation and back:
            self.in_rotation, self.since = True, time.time()
            return True
        return False


def drained_in(source: str) -> set[str]:
    """Nodes the rendered configuration already marks `down` (drained by hand)."""
    drained = set()
    for line in source.splitlines():
        match = SERVER_LINE.match(line)
        if match and re.search(r"\bdown\b", match["params"]):
            drained.add(match["node"])
    return drained


def render(source: str, out: set[str]) -> str:
    """The source with `down` added to the server lines of the nodes in `out`."""
    lines = []
    for line in source.splitlines(keepends=True):
        match = SERVER_LINE.match(line.rstrip("\n"))
        if match and match["node"] in out and not re.search(r"\bdown\b", match["params"]):
            end = "\n" if line.endswith("\n") else ""
            line = f"{match['head']}{match['params']} down;{match['tail']}{end}"
        lines.append(line)
    return "".join(lines)


def replace(path: Path, text: str) -> None:
    """Write by rename, so nginx (a reload from elsewhere) never reads half a file. The temporary
    name does not end in .conf: nginx's conf.d include never picks it up."""
    new = path.with_name(f".{path.name}.new")
    new.write_text(text)
    os.replace(new, path)


class Balancer:
    """The loop: read the probers, move nodes in and out, write and apply nginx's copy."""

    def __init__(self, config: Path, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.settings = Settings.load(config)
        self.nodes: dict[str, NodeState] = {}
        self.lock = threading.Lock()
        self.applied_sha256 = ""
        self.applied_text: str | None = None
        self.error = ""
        self.error_sha256 = ""
        self.fail_open = False
        self.registry = registry or CollectorRegistry()
        reg, node = self.registry, ["node"]
        self.in_rotation = Gauge("glmdeploy_lb_node_in_rotation", "1: the node gets new requests", node, registry=reg)
        self.generating = Gauge("glmdeploy_lb_node_generating", "1: generating (NaN: unknown)", node, registry=reg)
        self.drained = Gauge("glmdeploy_lb_node_drained", "1: drained by hand", node, registry=reg)
        self.moves = Counter("glmdeploy_lb_rotation_changes", "Nodes in/out of rotation", ["node", "to"], registry=reg)
        self.config_error = Gauge("glmdeploy_lb_config_error", "1: nginx -t or reload failed", registry=reg)

    def poll(self) -> None:
        """One round: every node's prober read at once, then the configuration applied if it changed."""
        settings = self.settings = Settings.load(self.config)
        names = sorted(settings.probers)
        with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            readings = list(
                pool.map(lambda n: read_prober(settings.probers[n], settings.read_timeout_s, settings.hang_s), names)
            )
        source = settings.source.read_text()
        drained = drained_in(source)
        with self.lock:
            for name in set(self.nodes) - set(names):
                del self.nodes[name]
                for gauge in (self.in_rotation, self.generating, self.drained):
                    gauge.remove(name)
            for name, reading in zip(names, readings, strict=True):
                state = self.nodes.setdefault(name, NodeState())
                if state.step(reading, settings.rise):
                    where = "back in rotation" if state.in_rotation else "out of rotation"
                    print(f"{name}: {where}: {state.reason}", flush=True)
                    self.moves.labels(name, "in" if state.in_rotation else "out").inc()
            out = {name for name, state in self.nodes.items() if not state.in_rotation}
            # Fail open: never take out the last nodes that are not drained by hand.
            self.fail_open = bool(out) and not (set(names) - drained - out)
            if self.fail_open:
                out = set()
            self.export(drained, out)
        self.apply(source, out)

    def export(self, drained: set[str], out: set[str]) -> None:
        for name, state in self.nodes.items():
            self.in_rotation.labels(name).set(0 if name in out or name in drained else 1)
            self.generating.labels(name).set(math.nan if state.generating is None else float(state.generating))
            self.drained.labels(name).set(1 if name in drained else 0)

    def apply(self, source: str, out: set[str]) -> None:
        """Write nginx's copy and reload nginx when it differs from what nginx last loaded (kept
        in memory: a file written but not loaded is not taken for applied); a copy nginx -t
        refuses, or whose reload fails, is replaced by the file that was there."""
        wanted = render(source, out)
        digest = hashlib.sha256(source.encode()).hexdigest()
        if wanted != self.applied_text:
            target = self.settings.target
            before = target.read_text() if target.exists() else None
            replace(target, wanted)
            for what, command in (
                ("nginx -t refused", self.settings.test_command),
                ("reloading nginx failed", self.settings.reload_command),
            ):
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    if before is None:
                        target.unlink()
                    else:
                        replace(target, before)
                    self.fail(f"{what}: {(done.stderr or done.stdout).strip()[-500:]}", digest)
                    return
            self.applied_text = wanted
        self.error, self.error_sha256 = "", ""
        self.config_error.set(0)
        self.applied_sha256 = digest

    def fail(self, message: str, digest: str = "") -> None:
        if message != self.error:
            print(message, file=sys.stderr, flush=True)
        self.error, self.error_sha256 = message, digest
        self.config_error.set(1)

    def status(self) -> dict[str, object]:
        """What /status serves (and `make verify` and Ansible read)."""
        with self.lock:
            nodes = {name: asdict(state) for name, state in sorted(self.nodes.items())}
        for row in nodes.values():
            del row["ok_when_out"]
        return {
            "nodes": nodes,
            "fail_open": self.fail_open,
            "source_sha256": self.applied_sha256,
            "error": self.error,
            # the rendered source the error is about ("" for an error of a whole round)
            "error_source_sha256": self.error_sha256,
        }


def serve(balancer: Balancer, listen: str, port: int) -> ThreadingHTTPServer:
    """/status (JSON) and /metrics, in a thread."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/status":
                body, kind = json.dumps(balancer.status(), indent=1).encode(), "application/json"
            elif self.path.split("?")[0] == "/metrics":
                body, kind = generate_latest(balancer.registry), CONTENT_TYPE_LATEST
            else:
                self.send_error(404, "/status or /metrics")
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((listen, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glmdeploy-lb-health", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the settings Ansible writes (JSON)")
    parser.add_argument("--listen", default="0.0.0.0", help="address /status and /metrics listen on")
    parser.add_argument("--port", type=int, required=True, help="port /status and /metrics listen on")
    args = parser.parse_args(argv)
    try:
        balancer = Balancer(args.config)
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"cannot read the settings {args.config}: {exc}; fix: run `make lb` to write them")
    serve(balancer, args.listen, args.port)
    print(f"watching {len(balancer.settings.probers)} nodes; status on {args.listen}:{args.port}", flush=True)
    while True:
        began = time.monotonic()
        try:
            balancer.poll()
        except (OSError, ValueError, KeyError) as exc:
            balancer.fail(f"round failed: {exc}")
        time.sleep(max(0.0, balancer.settings.interval_s - (time.monotonic() - began)))


if __name__ == "__main__":
    sys.exit(main())
