"""The hub stand-in answers from its hash cache, and a slow hub or mirror is named as a timeout.

The stand-in (tests/hub/hub_standin.py) is the hub on loopback; a stalled answer is one of
its faults (`stall-head`, `stall-get`, `stall-body`). `make weights` runs as a process here,
so that huggingface_hub reads its timeouts from the environment as it does for an admin.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import importlib.util
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixture_model import generate  # tests/support/, on sys.path through conftest.py

from glmdeploy_control import weights

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "THUDM/chatglm3-6b-32k"
DEST_NAME = "chatglm3-6b-32k"
SHARD = "pytorch_model-00001-of-00007.bin"


def _load_standin():
    spec = importlib.util.spec_from_file_location("hub_standin", ROOT / "tests" / "hub" / "hub_standin.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


standin = _load_standin()


@pytest.fixture(scope="module")
def published_src(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("published") / DEST_NAME
    generate(path, shape="published")
    return path


def _get(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    with opener.open(request, timeout=30) as resp:
        return resp.status, resp.read()


# ------------------------------------------------------------------------------------ the stand-in


def test_the_hub_standin_hashes_each_file_once(published_src):
    """Listings, HEADs, GETs and ranged GETs, each twice: every file hashed once in all."""
    revision = standin.Revision(published_src, REPO, COMMIT)
    with standin.serve(revision) as endpoint:
        for _ in range(2):
            _get(f"{endpoint}/api/models/{REPO}/revision/{COMMIT}?blobs=True")
            for name in revision.files:
                url = f"{endpoint}/{REPO}/resolve/{COMMIT}/{name}"
                _get(url, "HEAD")
                assert _get(url)[1] == (published_src / name).read_bytes(), name
                assert _get(url, headers={"Range": "bytes=7-"}) == (206, (published_src / name).read_bytes()[7:])
    assert len(revision.requests) == 2 * (1 + 3 * len(revision.files))
    assert collections.Counter(revision.hashed) == dict.fromkeys(revision.files, 1)


def test_the_hub_standin_hashes_a_file_changed_on_disk_again(published_src, tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "config.json").write_text("{}\n")
    revision = standin.Revision(root, REPO, COMMIT)
    with standin.serve(revision) as endpoint:
        url = f"{endpoint}/{REPO}/resolve/{COMMIT}/config.json"
        first = _get(url, "HEAD")
        (root / "config.json").write_text('{"changed": true}\n')
        assert _get(url)[1] == b'{"changed": true}\n'
    assert first[0] == 200
    assert revision.hashed == ["config.json", "config.json"]


def test_the_hub_standin_serves_its_faults_from_disk(published_src):
    """`corrupt` flips the last byte at the full length; `truncate` sends half under the full length."""
    data = (published_src / SHARD).read_bytes()
    revision = standin.Revision(published_src, REPO, COMMIT, {SHARD: "corrupt"})
    with standin.serve(revision) as endpoint:
        _, body = _get(f"{endpoint}/{REPO}/resolve/{COMMIT}/{SHARD}")
    assert len(body) == len(data) and body[:-1] == data[:-1] and body[-1] == data[-1] ^ 0xFF


def test_the_hub_standin_cuts_a_file_once_and_sends_the_rest_for_a_range(published_src):
    """`cut` stops the first download at `cut_at` under the full length; a ranged GET then gets the rest (206)."""
    data = (published_src / SHARD).read_bytes()
    revision = standin.Revision(published_src, REPO, COMMIT, {SHARD: "cut"}, cut_at=1000)
    with standin.serve(revision) as endpoint:
        url = f"{endpoint}/{REPO}/resolve/{COMMIT}/{SHARD}"
        with pytest.raises(http.client.IncompleteRead) as cut:
            _get(url)
        status, rest = _get(url, headers={"Range": "bytes=1000-"})
        assert _get(url)[1] == data  # the cut was once
    assert cut.value.partial == data[:1000] and (status, rest) == (206, data[1000:])
    assert revision.gets == [(SHARD, 0), (SHARD, 1000), (SHARD, 0)]
    assert revision.sent == {SHARD: 1000 + (len(data) - 1000) + len(data)}


# ------------------------------------------------------------------------------------ timeouts


def _make_weights(
    endpoint: str, tmp_path: Path, revision: str = COMMIT, **env: str
) -> subprocess.CompletedProcess[str]:
    """`python -m glmdeploy_control.weights` as `make weights` runs it, with `env` added."""
    dest = tmp_path / "models" / DEST_NAME
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k not in {"NO_PROXY", "no_proxy"}} | {
        "PYTHONPATH": str(ROOT / "service"),
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        **env,
    }
    argv = ["--revision", revision, "--dest", str(dest), "--work", str(tmp_path / "staging"), "--endpoint", endpoint]
    return subprocess.run(
        [sys.executable, "-m", "glmdeploy_control.weights", *argv],
        env=environ,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _refusal(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
    return lines[0].removeprefix("error: ")


#: fault -> (the setting that raises its limit, the request the message names)
STALLS = {
    "stall-head": ("HF_HUB_ETAG_TIMEOUT", "metadata request (HEAD)"),
    "stall-get": ("HF_HUB_DOWNLOAD_TIMEOUT", "download (GET)"),
    "stall-body": ("HF_HUB_DOWNLOAD_TIMEOUT", "download (GET)"),
}


@pytest.mark.parametrize("fault", list(STALLS))
def test_a_hub_timeout_names_the_file_the_wait_and_the_setting(fault, published_src, tmp_path):
    """A shard's answer stalls 4 s; with the named setting at 1 s, the refusal says which file, 1 s, and the setting."""
    setting, request = STALLS[fault]
    revision = standin.Revision(published_src, REPO, COMMIT, {SHARD: fault}, stall=4.0)
    with standin.serve(revision) as endpoint:
        done = _make_weights(endpoint, tmp_path, **{setting: "1"})
    message = _refusal(done)
    assert message.startswith(f"{SHARD}: timed out: {endpoint} did not answer the {request} within 1 s"), message
    assert "not a missing file" in message and "locate the file" not in message
    assert message.endswith(
        f"fix: run make weights again with {setting}=60 in its environment (huggingface_hub's limit in seconds, now 1)"
    ), message
    assert not (tmp_path / "models").exists()
    staging = tmp_path / "staging"
    kept = weights.kept_dir(staging, REPO, COMMIT)  # what came before the shard, kept for the next run
    assert list(staging.iterdir()) == [kept.parent] and list(kept.parent.iterdir()) == [kept]
    assert not (kept / SHARD).exists()


@pytest.mark.parametrize("fault", ["stall-head", "stall-get"])
def test_raising_the_setting_a_timeout_names_lets_the_same_slow_hub_stage(fault, published_src, tmp_path):
    """The named setting is the one that helps: the same 3 s stall, the limit at 10 s, and the revision stages."""
    setting, _ = STALLS[fault]
    revision = standin.Revision(published_src, REPO, COMMIT, {SHARD: fault}, stall=3.0)
    with standin.serve(revision) as endpoint:
        done = _make_weights(endpoint, tmp_path, **{setting: "10"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "models" / DEST_NAME / "SHA256SUMS").is_file()


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A loopback TCP server that accepts connections and never answers (a hung mirror)."""
    sock = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(sock.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    sock.close()


def test_a_mirror_timeout_names_the_file_and_the_wait(silent_server, tmp_path, monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with pytest.raises(weights.WeightsError) as refused:
        weights.fetch_mirror(silent_server, tmp_path / "served", timeout=1)
    message = str(refused.value)
    assert message.startswith(f"SHA256SUMS: timed out: {silent_server}SHA256SUMS sent nothing for 1 s"), message
    assert "\n" not in message and "; fix: " in message
