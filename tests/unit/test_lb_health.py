"""glmdeploy.balancer.lb_health: which nodes the balancer sends requests to, from what their probers say.

The probers are the kit's own metrics (glmdeploy.monitoring.prober.ProbeMetrics) served on loopback; nginx
is replaced by two commands (`true` for `nginx -t`, a line appended to a file for the reload):
these tests prove the decisions and the file written, the fleet test (tests/e2e/test_fleet.py)
proves them against nginx on the test hosts.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import start_http_server

from glmdeploy.balancer import lb_health
from glmdeploy.monitoring import prober

SOURCE = """upstream glmdeploy_api {
    least_conn;
    server 10.0.0.1:8000 max_fails=1 fail_timeout=10s;  # node1
    server 10.0.0.2:8000 max_fails=1 fail_timeout=10s;  # node2
    server 10.0.0.3:8000 max_fails=1 fail_timeout=10s down;  # node3
}
upstream glmdeploy_ui {
    ip_hash;
    server 10.0.0.1:8501 max_fails=1 fail_timeout=10s;  # node1
    server 10.0.0.2:8501 max_fails=1 fail_timeout=10s;  # node2
    server 10.0.0.3:8501 max_fails=1 fail_timeout=10s down;  # node3
}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Fleet:
    """Three nodes' prober metrics on loopback, and the balancer's files in tmp_path."""

    def __init__(self, tmp_path: Path) -> None:
        self.metrics = {name: prober.ProbeMetrics.create() for name in ("node1", "node2", "node3")}
        ports = {}
        for name, metrics in self.metrics.items():
            ports[name] = free_port()
            start_http_server(ports[name], addr="127.0.0.1", registry=metrics.registry)
        self.source, self.target = tmp_path / "source.conf", tmp_path / "glmdeploy.conf"
        self.reloads, self.config = tmp_path / "reloads", tmp_path / "lb-health.json"
        self.source.write_text(SOURCE)
        self.settings = {
            "source": str(self.source),
            "target": str(self.target),
            "probers": {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()},
            "hang_s": 1.0,
            "rise": 2,
            "test_command": ["true"],
            "reload_command": ["sh", "-c", f"echo reload >> {self.reloads}"],
        }
        self.write()
        self.balancer = lb_health.Balancer(self.config)

    def write(self) -> None:
        self.config.write_text(json.dumps(self.settings))

    def failing(self, command: str, message: str) -> None:
        """nginx's check or reload (`test_command`, `reload_command`) failing with this message."""
        self.settings[command] = ["sh", "-c", f"echo '{message}' >&2; exit 1"]
        self.write()

    def probe(self, name: str, result: str) -> None:
        """What the node's prober records after a probe with this result."""
        metrics = self.metrics[name]
        metrics.probes.labels(result).inc()
        metrics.success.set(1 if result == "ok" else 0)
        for other in prober.RESULTS:
            metrics.last_result.labels(other).set(1 if other == result else 0)

    def rounds(self, name: str, *results: str) -> None:
        """One probe of the node with each result, each followed by one round of the balancer."""
        for result in results:
            self.probe(name, result)
            self.balancer.poll()

    def down_in_target(self) -> set[str]:
        return lb_health.drained_in(self.target.read_text())


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path)
    for name in fleet.metrics:
        fleet.probe(name, "ok")
    yield fleet


def test_a_hung_node_leaves_the_rotation_and_comes_back_after_good_probes(fleet):
    fleet.balancer.poll()
    assert fleet.down_in_target() == {"node3"}, "only the drained node is down at first"
    fleet.metrics["node2"].probe_started = time.monotonic() - 5  # a probe waiting 5 s (hang_s is 1)
    fleet.balancer.poll()
    assert fleet.down_in_target() == {"node2", "node3"}
    status = fleet.balancer.status()["nodes"]["node2"]
    assert status["in_rotation"] is False and status["reason"].startswith("hung:"), status
    fleet.metrics["node2"].probe_started = None
    fleet.probe("node2", "ok")
    fleet.balancer.poll()
    assert "node2" in fleet.down_in_target(), "one good probe brought a hung node back (rise is 2)"
    fleet.probe("node2", "ok")
    fleet.balancer.poll()
    assert fleet.down_in_target() == {"node3"}
    assert fleet.reloads.read_text().count("reload") == 3, "nginx was reloaded other than on each change"


def test_a_failed_probe_takes_the_node_out_and_names_the_result(fleet):
    fleet.probe("node1", "server_error")
    fleet.balancer.poll()
    assert fleet.down_in_target() == {"node1", "node3"}
    assert "server_error" in fleet.balancer.status()["nodes"]["node1"]["reason"]
    fleet.probe("node1", "timeout")
    fleet.balancer.poll()
    assert fleet.balancer.status()["nodes"]["node1"]["reason"].startswith("hung:")


def test_a_node_drained_by_hand_stays_drained_whatever_its_prober_says(fleet):
    fleet.probe("node3", "ok")
    fleet.probe("node3", "ok")
    fleet.balancer.poll()
    fleet.balancer.poll()
    assert "node3" in fleet.down_in_target()
    rendered = fleet.target.read_text()
    assert rendered.count("down") == 2, "a drained server line got a second `down`"


def test_every_node_out_keeps_them_all_in_and_says_so(fleet):
    fleet.probe("node1", "bad_output")
    fleet.probe("node2", "bad_output")
    fleet.balancer.poll()
    assert fleet.down_in_target() == {"node3"}, "the last nodes not drained were taken out"
    assert fleet.balancer.status()["fail_open"] is True


def test_a_prober_that_refuses_connections_leaves_the_node_to_nginx(fleet):
    fleet.settings["probers"]["node1"] = f"http://127.0.0.1:{free_port()}/metrics"
    fleet.write()
    fleet.balancer.poll()
    assert fleet.down_in_target() == {"node3"}
    assert fleet.balancer.status()["nodes"]["node1"]["reason"].startswith("unwatched")


def test_a_configuration_nginx_refuses_is_put_back_and_reported(fleet):
    fleet.balancer.poll()
    good = fleet.target.read_text()
    fleet.failing("test_command", "unknown directive")
    fleet.probe("node1", "server_error")
    fleet.balancer.poll()
    assert fleet.target.read_text() == good, "a configuration nginx refused was left in place"
    status = fleet.balancer.status()
    assert "unknown directive" in status["error"], status
    # Ansible's wait ends on an error only when it is about the file it rendered.
    assert status["error_source_sha256"] == status["source_sha256"] == hashlib.sha256(SOURCE.encode()).hexdigest()


def test_the_applied_source_digest_follows_the_source(fleet):
    """What Ansible waits for after it rewrites the source (a drain, a new node)."""
    fleet.balancer.poll()
    first = fleet.balancer.status()["source_sha256"]
    fleet.source.write_text(SOURCE.replace("fail_timeout=10s;  # node1", "fail_timeout=10s down;  # node1"))
    fleet.balancer.poll()
    assert fleet.balancer.status()["source_sha256"] not in ("", first)
    assert fleet.down_in_target() == {"node1", "node3"}


def test_good_probes_are_counted_in_a_row_from_the_last_failure(fleet):
    fleet.rounds("node1", "timeout", "ok", "server_error", "ok")
    assert "node1" in fleet.down_in_target(), "good, failed, good brought the node back (rise is 2 in a row)"
    fleet.rounds("node1", "ok")
    assert fleet.down_in_target() == {"node3"}


def test_a_reload_that_fails_is_not_reported_applied_and_is_tried_again(fleet):
    fleet.balancer.poll()
    good = fleet.target.read_text()
    fleet.failing("reload_command", "nginx.service is not active")
    fleet.probe("node1", "server_error")
    fleet.balancer.poll()
    fleet.balancer.poll()
    assert fleet.target.read_text() == good, "a copy nginx did not load was left as if it had"
    assert "not active" in fleet.balancer.status()["error"]
    fleet.settings["reload_command"] = ["sh", "-c", f"echo reload >> {fleet.reloads}"]
    fleet.write()
    fleet.balancer.poll()
    assert fleet.down_in_target() == {"node1", "node3"} and fleet.balancer.status()["error"] == ""


def test_a_malformed_prober_reply_takes_that_node_out_and_the_others_are_still_read(fleet, tmp_path):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "metrics").write_text("glmdeploy_probe_success{ this is not the exposition format\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(junk)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        fleet.settings["probers"]["node1"] = f"http://127.0.0.1:{server.server_port}/metrics"
        fleet.write()
        fleet.balancer.poll()
    finally:
        server.shutdown()
    assert fleet.down_in_target() == {"node1", "node3"}, "the round stopped at the malformed reply"
    assert "does not answer properly" in fleet.balancer.status()["nodes"]["node1"]["reason"]


def test_a_prober_that_has_not_finished_a_probe_gives_no_verdict(fleet):
    fleet.metrics["node1"] = fresh = prober.ProbeMetrics.create()
    port = free_port()
    start_http_server(port, addr="127.0.0.1", registry=fresh.registry)
    fleet.settings["probers"]["node1"] = f"http://127.0.0.1:{port}/metrics"
    fleet.write()
    fleet.balancer.poll()
    node1 = fleet.balancer.status()["nodes"]["node1"]
    assert node1["in_rotation"] is True and node1["generating"] is None, node1
