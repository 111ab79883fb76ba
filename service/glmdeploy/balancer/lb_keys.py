"""The balancer's API keys: a key per user or project, checked by nginx on every request.

Why a service: nginx can compare a header only with text written in its configuration, and the
keys must be stored only as SHA-256 digests (the balancer and the control node never hold a key
itself). nginx asks this service on every API request (`auth_request`): the presented bearer
key is hashed and looked up; the answer names the key (`X-Glmdeploy-Key`), which nginx then uses
for the per-key request-rate and concurrency limits (limit_req, limit_conn) and its access log.
A digest is looked up in a dict, not compared character by character: a timing difference could
at most tell a digest's prefix, which does not help to find a key.

The keys file (written by Ansible from the control node's store, root-only) is re-read when it
changes, checked on every request by one stat(): a revoked key is refused from the next request
on, and requests already running are not touched (nginx checked them when they began).

Endpoints on one port:
  /auth       (loopback only) 204 and the key's name, or 401
  /limited    (loopback only) the 429 answer for a key over its limits, with Retry-After
  /keys       each key's name, creation and last use (JSON; never a digest)
  /metrics    requests, refusals and limits per key name (never a key or digest)

It runs on the balancer with the distribution's Python and prometheus_client (Debian's
python3-prometheus-client), so it imports nothing else of the kit: the balancer need not be a node.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

KEY_HEADER = "X-Glmdeploy-Key"
# How often last-use times are written to disk (they survive a restart; nothing else is kept).
SAVE_EVERY_S = 10.0


def digest(key: str) -> str:
    """The form a key is stored in (here, on the control node and in the kit's tools)."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class Key:
    name: str
    sha256: str
    created: str


def load_keys(path: Path) -> dict[str, Key]:
    """The keys file: {"keys": {name: {"sha256": ..., "created": ...}}}, by digest."""
    raw = json.loads(path.read_text())
    keys = {}
    for name, entry in raw["keys"].items():
        keys[str(entry["sha256"])] = Key(name, str(entry["sha256"]), str(entry.get("created") or ""))
    return keys


class Keys:
    """The keys in force, re-read when the file changes; per-name counters and last use."""

    def __init__(self, path: Path, used_path: Path | None, registry: CollectorRegistry | None = None) -> None:
        self.path, self.used_path = path, used_path
        self.lock = threading.Lock()
        self.stamp: tuple[int, int, int] | None = None
        self.by_digest: dict[str, Key] = {}
        self.error = ""
        self.last_used: dict[str, float] = self.read_used()
        self.dirty = False
        self.registry = registry or CollectorRegistry()
        reg = self.registry
        self.requests = Counter("glmdeploy_lb_key_requests", "API requests let in, per key name", ["key"], registry=reg)
        self.refused = Counter("glmdeploy_lb_key_refused", "API requests with no key or an unknown key", registry=reg)
        self.limited = Counter(
            "glmdeploy_lb_key_limited",
            "Requests refused with 429, per key name and limit",
            ["key", "limit"],
            registry=reg,
        )
        self.count = Gauge("glmdeploy_lb_keys", "Keys in force (the deployment's own included)", registry=reg)
        self.file_error = Gauge("glmdeploy_lb_keys_file_error", "1: the keys file cannot be read", registry=reg)
        self.refresh()

    def read_used(self) -> dict[str, float]:
        if self.used_path is None or not self.used_path.exists():
            return {}
        try:
            return {str(k): float(v) for k, v in json.loads(self.used_path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def refresh(self) -> None:
        """Re-read the file if it changed. A file that cannot be read keeps the keys in force
        (the error is exported): a half-written file must not let everyone in or lock everyone out."""
        try:
            st = self.path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == self.stamp:
                return
            keys = load_keys(self.path)
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
            with self.lock:
                self.error = f"cannot read {self.path}: {exc}"
            self.file_error.set(1)
            return
        with self.lock:
            self.by_digest, self.stamp, self.error = keys, stamp, ""
        self.count.set(len(keys))
        self.file_error.set(0)

    def check(self, authorization: str) -> str | None:
        """The name of the key a request presents (`Authorization: Bearer <key>`), or None."""
        self.refresh()
        scheme, _, key = authorization.strip().partition(" ")
        found = self.by_digest.get(digest(key.strip())) if scheme.lower() == "bearer" and key.strip() else None
        if found is None:
            self.refused.inc()
            return None
        self.requests.labels(found.name).inc()
        with self.lock:
            self.last_used[found.name] = time.time()
            self.dirty = True
        return found.name

    def listing(self) -> dict[str, dict[str, object]]:
        with self.lock:
            return {
                key.name: {"created": key.created, "last_used": self.last_used.get(key.name)}
                for key in sorted(self.by_digest.values(), key=lambda k: k.name)
            }

    def save_used(self) -> None:
        """Written by rename: a crash never leaves half a file."""
        with self.lock:
            if not self.dirty or self.used_path is None:
                return
            text, self.dirty = json.dumps(self.last_used, sort_keys=True), False
        new = self.used_path.with_name(f".{self.used_path.name}.new")
        new.write_text(text)
        os.replace(new, self.used_path)


def error_body(message: str, kind: str, code: int) -> bytes:
    """OpenAI's error shape, as vLLM answers: clients show the message."""
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


def serve(keys: Keys, listen: str, port: int) -> ThreadingHTTPServer:
    """The endpoints, in a thread; HTTP/1.1 so nginx keeps its connections to us open."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def answer(
            self, code: int, body: bytes = b"", kind: str = "application/json", headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(code)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            local = self.client_address[0] in {"127.0.0.1", "::1"}
            if url.path == "/auth" and local:
                name = keys.check(self.headers.get("Authorization", ""))
                if name is None:
                    self.answer(401)
                else:
                    self.answer(204, headers={KEY_HEADER: name})
            elif url.path == "/limited" and local:
                self.limited(parse_qs(url.query))
            elif url.path == "/keys":
                keys.refresh()
                self.answer(200, json.dumps({"keys": keys.listing(), "error": keys.error}, indent=1).encode())
            elif url.path == "/metrics":
                self.answer(200, generate_latest(keys.registry), CONTENT_TYPE_LATEST)
            else:
                self.answer(404, error_body("/keys or /metrics", "not_found", 404))

        def limited(self, query: dict[str, list[str]]) -> None:
            """nginx's limit_req/limit_conn said REJECTED: which one, and when to come back."""
            name = query.get("key", [""])[0]
            rate = query.get("req", [""])[0] == "REJECTED"
            limit = "rate" if rate else "concurrency"
            retry = query.get("retry_after", ["1"])[0] if rate else "1"
            keys.limited.labels(name, limit).inc()
            what = "request rate" if rate else "concurrent requests"
            message = f"the key {name!r} is over its limit of {what}; retry after {retry} s, or ask for a higher limit"
            self.answer(429, error_body(message, "rate_limit_exceeded", 429), headers={"Retry-After": retry})

    server = ThreadingHTTPServer((listen, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glmdeploy-lb-keys", description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=Path, required=True, help="the keys file Ansible writes (JSON, digests)")
    parser.add_argument("--used", type=Path, help="where last-use times are kept across restarts")
    parser.add_argument("--listen", default="0.0.0.0", help="address the endpoints listen on")
    parser.add_argument("--port", type=int, required=True, help="port the endpoints listen on")
    args = parser.parse_args(argv)
    keys = Keys(args.keys, args.used)
    if keys.error:
        parser.error(f"{keys.error}; fix: run `make lb` (or `make keys`) to write it")
    serve(keys, args.listen, args.port)
    print(f"{len(keys.by_digest)} keys in force; listening on {args.listen}:{args.port}", flush=True)
    while True:
        time.sleep(SAVE_EVERY_S)
        keys.save_used()


if __name__ == "__main__":
    sys.exit(main())
