"""A recorded advisory snapshot served on loopback in OSV's query protocol: the stand-in of the
OSV service for control nodes without internet and for CI.

`make audit` points pip-audit (`--osv-url`) at this server, so an offline audit goes through the
same client code, request and answer shapes as an online one (`POST /v1/query` with a package
and a version; the answer `{"vulns": [records]}`, or `{}` when none). What it does not prove: that
OSV's live data still says the same (the snapshot has a date; `make audit-refresh` renews it where
OSV is reachable), nor OSV's own version matching, which this module re-implements below for the
PyPI ecosystem. Written here rather than taken from a library: no maintained Python package
serves OSV records over OSV's API (osv.dev's own server is a Go service over a datastore).

    python -m glmdeploy_control.osv_snapshot SNAPSHOT [--port N]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from packaging.version import InvalidVersion, Version


def canonical(name: str) -> str:
    """PEP 503's normalised name (what OSV's PyPI records and pip-audit's queries use)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _in_range(events: list[dict[str, str]], version: Version) -> bool:
    """OSV's ECOSYSTEM range: affected from an `introduced` up to (not including) the next `fixed`,
    or up to and including a `last_affected`; events are in the order OSV lists them. An event
    whose version PEP 440 cannot read (a build tag such as "2.6.0-cu124") is skipped."""
    affected = False
    for event in events:
        (kind, value), *_ = event.items()
        try:
            bound = Version(value)
        except InvalidVersion:
            continue
        if kind == "introduced" and version >= bound:
            affected = True
        elif (kind == "fixed" and version >= bound) or (kind == "last_affected" and version > bound):
            affected = False
    return affected


def affects(record: dict[str, Any], name: str, version: str) -> bool:
    """Whether an OSV record says this PyPI package version is affected (explicit `versions`, or an
    ECOSYSTEM range); withdrawn records affect nothing."""
    if record.get("withdrawn"):
        return False
    try:
        wanted = Version(version)
    except InvalidVersion:
        return False
    for entry in record.get("affected", []):
        package = entry.get("package", {})
        if package.get("ecosystem") != "PyPI" or canonical(package.get("name", "")) != canonical(name):
            continue
        if version in entry.get("versions", []):
            return True
        if any(_in_range(r.get("events", []), wanted) for r in entry.get("ranges", []) if r.get("type") == "ECOSYSTEM"):
            return True
    return False


def load(path: Path) -> list[dict[str, Any]]:
    """The snapshot's records; a file that is not one is refused with the fix."""
    try:
        data = json.loads(path.read_text())
        records: list[dict[str, Any]] = data["records"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"error: {path}: not an advisory snapshot ({exc}); fix: name constraints/advisories/osv-snapshot.json "
            "or a file `python -m glmdeploy_control.audit refresh` wrote"
        ) from exc
    return records


class _Handler(BaseHTTPRequestHandler):
    records: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/query":
            self._send(404, {"code": 5, "message": f"{self.path}: this stand-in answers POST /v1/query only"})
            return
        try:
            query = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            name, version = query["package"]["name"], query["version"]
        except (ValueError, KeyError, TypeError):
            self._send(400, {"code": 3, "message": "expected {package: {name, ecosystem}, version}"})
            return
        vulns = [r for r in self.records if affects(r, name, version)]
        self._send(200, {"vulns": vulns} if vulns else {})

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: pip-audit sends one request per package."""


@contextmanager
def serve(records: list[dict[str, Any]], port: int = 0) -> Iterator[str]:
    """Serve the records on 127.0.0.1 in a thread; yields the query URL pip-audit takes."""
    handler = type("Handler", (_Handler,), {"records": records})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/query"
    finally:
        server.shutdown()
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glmdeploy-osv-snapshot", description=__doc__.split("\n\n")[0])
    parser.add_argument("snapshot", type=Path, help="the snapshot (constraints/advisories/osv-snapshot.json)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    args = parser.parse_args(argv)
    records = load(args.snapshot)
    with serve(records, args.port) as url:
        print(f"serving {len(records)} advisories from {args.snapshot} at {url} (Ctrl-C stops)", flush=True)
        with suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
