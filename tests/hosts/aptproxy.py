"""A small caching HTTP proxy for apt, bound to the test-host bridge only.

Why: test hosts have no route out. They reach the controller's bridge address
and nothing else; this proxy forwards their apt requests, and only to the
mirror hosts named in the controller's own apt sources (passed with --allow),
caching package files so a second host or a second run downloads nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

CACHEABLE = (".deb", ".udeb")


class Proxy(http.server.BaseHTTPRequestHandler):
    allowed: frozenset[str] = frozenset()
    cache_dir: Path = Path(".")

    def do_GET(self) -> None:
        url = self.path
        host = urlsplit(url).hostname or ""
        if host not in self.allowed:
            self.send_error(403, f"{host or 'relative URL'} is not an allowed mirror")
            return
        cached = self.cache_dir / hashlib.sha256(url.encode()).hexdigest()
        if url.endswith(CACHEABLE) and cached.exists():
            self._send_file(cached)
            return
        try:
            upstream = urllib.request.urlopen(url, timeout=60)
        except urllib.error.HTTPError as exc:
            self.send_error(exc.code, exc.reason)
            return
        except OSError as exc:
            self.send_error(502, str(exc))
            return
        with upstream:
            if url.endswith(CACHEABLE):
                tmp = cached.with_suffix(".part")
                with tmp.open("wb") as fh:
                    shutil.copyfileobj(upstream, fh)
                tmp.replace(cached)
                self._send_file(cached)
                return
            body = upstream.read()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Type", upstream.headers.get("Content-Type", "application/octet-stream"))
            self.end_headers()
            self.wfile.write(body)

    def _send_file(self, path: Path) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(path.stat().st_size))
        self.send_header("Content-Type", "application/vnd.debian.binary-package")
        self.end_headers()
        with path.open("rb") as fh:
            shutil.copyfileobj(fh, self.wfile)

    def log_message(self, fmt: str, *args: object) -> None:
        sys.stderr.write("aptproxy: " + fmt % args + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, default=3142)
    parser.add_argument("--allow", action="append", required=True, help="mirror host name (repeatable)")
    parser.add_argument("--cache-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    Proxy.allowed = frozenset(args.allow)
    Proxy.cache_dir = args.cache_dir
    http.server.ThreadingHTTPServer((args.bind, args.port), Proxy).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
