"""A stand-in for the Hugging Face hub on loopback: the HTTP endpoints `huggingface_hub` uses for a pinned revision.

Stand-in, named as such: the model hub is out of reach from this machine and from CI. It
serves one revision of one repo from a local directory (a plain copy of the repo) with the
protocol huggingface_hub 0.23.4 speaks (read from its source: hf_api.model_info,
file_download.get_hf_file_metadata and http_get):

- `GET /api/models/<repo>/revision/<commit>[?blobs=True]`: the repo info JSON (`id`, `sha`,
  `siblings[].rfilename`; with blobs, each file's `size`, `blobId` and, for files the hub keeps
  in LFS (weights, tokenizer.model), `lfs.{sha256,size,pointerSize}`);
- `HEAD|GET /<repo>/resolve/<commit>/<path>`: the file, with `X-Repo-Commit`, `ETag` (the git
  blob id, or `X-Linked-Etag` with the SHA256 for LFS files), `Content-Length`, and `Range`
  (206) for resumed downloads;
- errors as the hub sends them: 404 with `X-Error-Code` `RepoNotFound`, `RevisionNotFound` or
  `EntryNotFound`.

Each file's hashes (SHA256, git blob id) are computed once, when the server starts, and kept
per path, size and mtime (a file changed on disk is hashed again); bodies are sent from disk
with sendfile. A full-size shard is answered as fast as the disk allows, so a real-size test
measures the kit, not the stand-in (hashing per request took 12-18 s for one shard).

What it does not prove: authentication, gated repos, the hub's redirects of LFS files to its
CDN, and rate limits. Faults for tests (`faults`): `truncate` (half the bytes under the full
length, every time), `cut` (the first download of the file stops at byte `Revision.cut_at`,
half the file unless set, under the full length; later ones, ranged or not, are whole: a
link cut once), `corrupt` (one byte changed, same length), `missing` (listed but 404 on
download), and a slow answer of `Revision.stall` seconds: `stall-head` (the metadata
request, HEAD), `stall-get` (the download's first answer), `stall-body` (headers sent, then
no byte). `Revision.sent` counts the body bytes sent per file and `Revision.gets` each
download's file and first byte, so that a test can tell what a resumed run transferred.

Run alone: `python tests/hub/hub_standin.py --root DIR --repo THUDM/chatglm3-6b-32k --revision <40-hex>`
prints the endpoint (`HF_ENDPOINT=...`) and serves until interrupted.
"""

from __future__ import annotations

import argparse
import collections
import copy
import hashlib
import http.server
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

LFS_SUFFIXES = (".bin", ".safetensors", ".model")


def _git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _file_hashes(path: Path, size: int) -> tuple[str, str]:
    """SHA256 and git blob id of a file, read once in blocks (a full-size shard is not held in memory)."""
    sha256 = hashlib.sha256()
    blob = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            sha256.update(block)
            blob.update(block)
    return sha256.hexdigest(), blob.hexdigest()


class Revision:
    """One revision's files, as the hub lists them."""

    def __init__(
        self,
        root: Path,
        repo: str,
        commit: str,
        faults: dict[str, str] | None = None,
        stall: float = 30.0,
        cut_at: int | None = None,
    ) -> None:
        self.root, self.repo, self.commit, self.faults = root, repo, commit, dict(faults or {})
        self.stall = stall  # seconds a `stall-*` fault waits
        self.cut_at = cut_at  # the byte a `cut` fault stops at (None: half the file)
        self.sent: collections.Counter[str] = collections.Counter()  # body bytes sent, per file
        self.gets: list[tuple[str, int]] = []  # each download (GET): the file and the first byte asked for
        self._cut_done: set[str] = set()
        self.files = sorted(
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
        )
        self.requests: list[str] = []
        self.hashed: list[str] = []  # each time a file's hashes were computed: tests count them
        self._entries: dict[tuple[str, int, int], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def sibling(self, name: str) -> dict[str, Any]:
        """The file's listing entry, from the cache while its size and mtime are unchanged."""
        st = (self.root / name).stat()
        key = (name, st.st_size, st.st_mtime_ns)
        with self._lock:  # one thread hashes; the others wait for its answer rather than hash again
            if key not in self._entries:
                self._entries[key] = self._entry(name, st.st_size)
            return copy.deepcopy(self._entries[key])

    def _entry(self, name: str, size: int) -> dict[str, Any]:
        self.hashed.append(name)
        sha, blob = _file_hashes(self.root / name, size)
        entry: dict[str, Any] = {"rfilename": name, "size": size, "blobId": blob}
        if name.endswith(LFS_SUFFIXES):
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n".encode()
            entry |= {"blobId": _git_blob(pointer), "lfs": {"sha256": sha, "size": size, "pointerSize": len(pointer)}}
        return entry

    def cut_count(self, name: str, size: int, start: int) -> int | None:
        """Bytes the first download of a `cut` file sends before the connection closes; None: no cut."""
        with self._lock:
            if self.faults.get(name) != "cut" or name in self._cut_done:
                return None
            self._cut_done.add(name)
        return max(0, (size // 2 if self.cut_at is None else self.cut_at) - start)

    def count_sent(self, name: str, start: int, count: int) -> None:
        with self._lock:
            self.gets.append((name, start))
            self.sent[name] += count

    def warm(self) -> None:
        """Hash every file now, so that no request waits for it."""
        for name in self.files:
            self.sibling(name)

    def info(self, blobs: bool) -> dict[str, Any]:
        siblings = [self.sibling(n) if blobs else {"rfilename": n} for n in self.files]
        return {
            "id": self.repo,
            "modelId": self.repo,
            "sha": self.commit,
            "private": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
        }


class Handler(http.server.BaseHTTPRequestHandler):
    revision: Revision  # set on the subclass made per server

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: tests read `requests` instead
        self.revision.requests.append(f"{self.command} {self.path}")

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _error(self, status: int, code: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _answer(self, body: bool) -> None:
        rev = self.revision
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        api = f"/api/models/{rev.repo}/revision/"
        resolve = f"/{rev.repo}/resolve/"
        if path.startswith(api):
            if path[len(api) :] != rev.commit:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {path[len(api) :]}")
            query = urllib.parse.parse_qs(url.query)
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            return self._send(200, json.dumps(rev.info(blobs)).encode(), {"Content-Type": "application/json"}, body)
        if path.startswith(resolve):
            commit, _, name = path[len(resolve) :].partition("/")
            if commit != rev.commit:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {commit}")
            if name not in rev.files or rev.faults.get(name) == "missing":
                return self._error(404, "EntryNotFound", f"{name} does not exist at {commit}")
            return self._file(name, body)
        if path.startswith("/api/models/") or path.count("/") >= 3:
            return self._error(404, "RepoNotFound", "Repository not found")
        return self._error(404, "EntryNotFound", path)

    def _file(self, name: str, body: bool) -> None:
        rev = self.revision
        entry, fault = rev.sibling(name), rev.faults.get(name, "")
        size = (rev.root / name).stat().st_size  # what is served, whatever the listing says
        headers = {"X-Repo-Commit": rev.commit, "Content-Type": "application/octet-stream"}
        if "lfs" in entry:
            headers |= {
                "X-Linked-Etag": f'"{entry["lfs"]["sha256"]}"',
                "X-Linked-Size": str(size),
                "ETag": f'"{entry["blobId"]}"',
            }
        else:
            headers["ETag"] = f'"{entry["blobId"]}"'
        start = 0
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes=") and ranged.endswith("-"):
            start = int(ranged[6:-1])
        if fault == ("stall-get" if body else "stall-head"):
            time.sleep(rev.stall)
        if start:  # a resumed download: the rest of the file, as a server that allows ranges answers
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        self.send_response(206 if start else 200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(size - start))
        self.end_headers()
        if not body:
            return
        if fault == "stall-body":
            time.sleep(rev.stall)
        # `truncate` and `cut`: the full length is announced and fewer bytes are sent, a connection cut mid-file.
        cut = rev.cut_count(name, size, start) if fault == "cut" else None
        count = size - start
        if fault == "truncate":
            count //= 2
        elif cut is not None:
            count = cut
        sent = self._send_file(rev.root / name, start, count, corrupt_last=fault == "corrupt" and start + count == size)
        rev.count_sent(name, start, sent)
        if fault == "truncate" or cut is not None:
            self.close_connection = True

    def _send_file(self, path: Path, start: int, count: int, corrupt_last: bool) -> int:
        """Bytes [start, start+count) from disk by sendfile (the last flipped if `corrupt_last`); the bytes sent."""
        sent = 0
        try:
            with path.open("rb") as fh:
                plain = count - 1 if corrupt_last else count
                if plain > 0:  # socket.sendfile reads a count of 0 as "to the end"
                    sent += self.connection.sendfile(fh, start, plain)
                if corrupt_last:
                    fh.seek(start + count - 1)
                    self.wfile.write(bytes([fh.read(1)[0] ^ 0xFF]))
                    sent += 1
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test, a cut)
            self.close_connection = True
        return sent

    def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


@contextmanager
def serve(revision: Revision, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve on loopback in a thread; yields the endpoint (what HF_ENDPOINT would be)."""
    revision.warm()
    handler = type("RevisionHandler", (Handler,), {"revision": revision})
    server = http.server.ThreadingHTTPServer((host, port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="a plain copy of the repo at the revision")
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", required=True, help="the 40-hex commit it answers for")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with serve(Revision(args.root, args.repo, args.revision), port=args.port) as endpoint:
        print(f"HF_ENDPOINT={endpoint}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
