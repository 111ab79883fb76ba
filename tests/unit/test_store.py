"""library/glmdeploy_store.py: a model store is filled once, resumed when cut, and a re-run reads nothing.

The module runs as Ansible runs it (the tool environment's Python, its arguments in a file), with
the real rsync: from a local directory (this machine's node) and from an rsync daemon on loopback
(what a holder node and the control node's artifact server run).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from local_play import module_argv, run_module

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "library" / "glmdeploy_store.py"
TOOLS_PY = ROOT / ".venv" / "tools" / "bin" / "python"
STAMP = ".glmdeploy-store.json"

pytestmark = [
    pytest.mark.skipif(not TOOLS_PY.exists(), reason="needs the tool environment: make tools"),
    pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync: make test-packages"),
]


def run(tmp_path: Path, check: bool = False, fail: bool = False, **args: object) -> dict:
    out = run_module(MODULE, args, check)
    assert out.stdout.strip(), out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert bool(result.get("failed")) == fail, result
    return result


def staged(where: Path, sizes: dict[str, int]) -> str:
    """A staged model: random files, a REVISION beside them (as make weights leaves), SHA256SUMS."""
    where.mkdir(parents=True)
    lines = []
    for name, size in sizes.items():
        data = os.urandom(size)
        (where / name).write_bytes(data)
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {name}")
    (where / "REVISION").write_text("0123abc\n")
    manifest = "\n".join(lines) + "\n"
    (where / "SHA256SUMS").write_text(manifest)
    return manifest


SIZES = {"config.json": 300, "pytorch_model-00001-of-00002.bin": 3 << 20, "pytorch_model-00002-of-00002.bin": 2 << 20}


def test_first_fill_checks_every_file_and_a_rerun_reads_no_weight(tmp_path):
    manifest = staged(tmp_path / "src", SIZES)
    store = tmp_path / "node" / "models" / "m-0123"
    first = run(tmp_path, dest=str(store), manifest=manifest, sources=[str(tmp_path / "src")])
    assert first["changed"] and first["complete"] and first["source"] == str(tmp_path / "src")
    assert first["bytes_hashed"] == sum(SIZES.values())  # the arrival check: one read
    assert sum(SIZES.values()) <= first["bytes_received"] < sum(SIZES.values()) * 1.05
    assert sorted(p.name for p in store.iterdir()) == sorted([*SIZES, "SHA256SUMS", STAMP])  # no REVISION
    assert all((store / n).stat().st_mode & 0o777 == 0o444 for n in SIZES)
    assert not (store.parent / ".m-0123.incoming").exists()
    again = run(tmp_path, dest=str(store), manifest=manifest, sources=[str(tmp_path / "src")])
    assert not again["changed"] and again["bytes_hashed"] == 0 and again["bytes_received"] == 0
    assert again["io"]["rchar"] < 1 << 20, again["io"]  # the stamp and directory listings, not the weights


def test_check_mode_reports_an_absent_store_and_writes_nothing(tmp_path):
    manifest = staged(tmp_path / "src", SIZES)
    store = tmp_path / "models" / "m"
    result = run(tmp_path, check=True, dest=str(store), manifest=manifest, sources=[str(tmp_path / "src")])
    assert result["changed"] and result["problems"] == ["store: absent"]
    assert not store.exists() and not (tmp_path / "models").exists()


def test_a_file_changed_on_the_node_is_named_and_only_it_is_fetched_again(tmp_path):
    manifest = staged(tmp_path / "src", SIZES)
    store = tmp_path / "models" / "m"
    run(tmp_path, dest=str(store), manifest=manifest, sources=[str(tmp_path / "src")])
    shard = store / "pytorch_model-00002-of-00002.bin"
    held_open = shard.open("rb")  # the running server's view of the file
    shard.chmod(0o644)
    with shard.open("r+b") as fh:
        fh.write(b"\0" * 16)
    refused = run(
        tmp_path, fail=True, dest=str(store), manifest=manifest, sources=[str(tmp_path / "src")], repair=False
    )
    assert "pytorch_model-00002-of-00002.bin: changed since it was placed" in refused["msg"]
    repaired = run(tmp_path, dest=str(store), manifest=manifest, sources=[str(tmp_path / "src")])
    assert repaired["changed"] and repaired["problems"] == [
        "pytorch_model-00002-of-00002.bin: changed since it was placed (size or mtime)"
    ]
    assert repaired["bytes_received"] < (3 << 20), repaired  # the unchanged 3 MiB shard was not sent again
    assert hashlib.sha256(shard.read_bytes()).hexdigest() in manifest
    # A new file took the name: nothing was written into the inode the server holds open.
    assert os.fstat(held_open.fileno()).st_ino != shard.stat().st_ino
    held_open.close()


def test_a_rewritten_manifest_on_the_node_is_named(tmp_path):
    manifest = staged(tmp_path / "src", SIZES)
    store = tmp_path / "models" / "m"
    run(tmp_path, dest=str(store), manifest=manifest, sources=[str(tmp_path / "src")])
    (store / "SHA256SUMS").chmod(0o644)
    (store / "SHA256SUMS").write_text(manifest.replace(manifest[:8], "00000000", 1))
    result = run(tmp_path, check=True, state="checked", dest=str(store), manifest=manifest)
    assert result["problems"] == ["SHA256SUMS: rewritten on the node (differs for config.json)"], result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def daemon(tmp_path):
    """An rsync daemon on loopback serving tmp_path/share read-only, as a holder's share does."""
    share, port = tmp_path / "share", free_port()
    share.mkdir()
    conf = tmp_path / "rsyncd.conf"
    # uid root: tmp_path is root's own 0700 directory (a node's share reads its 0755 store as nobody)
    conf.write_text(
        f"use chroot = no\nuid = root\ngid = root\n"
        f"[models]\n  path = {share}\n  read only = yes\n  hosts allow = 127.0.0.1\n"
    )
    proc = subprocess.Popen(
        ["rsync", "--daemon", "--no-detach", f"--config={conf}", "--address=127.0.0.1", f"--port={port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    yield share, f"rsync://127.0.0.1:{port}/models"
    proc.terminate()
    proc.wait(timeout=10)


def test_a_transfer_cut_halfway_resumes_and_no_half_file_is_taken(tmp_path, daemon):
    share, url = daemon
    big = {"pytorch_model-00001-of-00001.bin": 24 << 20, "config.json": 100}
    manifest = staged(share / "m", big)
    store = tmp_path / "node" / "m"
    incoming = store.with_name(".m.incoming")
    spec = tmp_path / "cut.json"
    args = {"dest": str(store), "manifest": manifest, "sources": [f"{url}/m"], "bwlimit": "4096"}
    cut = subprocess.Popen(module_argv(MODULE, spec, args), start_new_session=True, stdout=subprocess.DEVNULL)
    partial = incoming / "pytorch_model-00001-of-00001.bin"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not partial.exists() or partial.stat().st_size < 4 << 20):
        time.sleep(0.05)
    os.killpg(cut.pid, signal.SIGKILL)  # the module and its rsync, as a lost connection or a ^C would
    cut.wait()
    assert not store.exists(), "a cut transfer must leave no store under the manifest's name"
    # --append-verify writes in place, so what arrived lies under the file's own name, inside
    # .m.incoming: never in the store, whose name appears only after the manifest check
    arrived = sum(p.stat().st_size for p in incoming.rglob("*") if p.is_file())
    assert arrived >= 4 << 20, arrived
    resumed = run(tmp_path, dest=str(store), manifest=manifest, sources=[f"{url}/m"])
    assert resumed["complete"] and not incoming.exists()
    assert resumed["bytes_received"] < (24 << 20) - (arrived // 2), "the cut transfer started again from nothing"
    assert not list(store.glob(".*.bin*")) and sorted(p.name for p in store.iterdir()) == sorted(
        [*big, "SHA256SUMS", STAMP]
    )
    assert hashlib.sha256((store / "pytorch_model-00001-of-00001.bin").read_bytes()).hexdigest() in manifest


def test_an_unreachable_holder_falls_back_to_the_next_source(tmp_path, daemon):
    share, url = daemon
    manifest = staged(share / "drill" / "m", SIZES)  # a store below the module's root
    dead = f"rsync://127.0.0.1:{free_port()}/models/m"
    store = tmp_path / "node" / "m"
    result = run(tmp_path, dest=str(store), manifest=manifest, sources=[dead, f"{url}/drill/m"], timeout=5)
    assert result["complete"] and result["source"] == f"{url}/drill/m"
    assert len(result["tried"]) == 1 and result["tried"][0].startswith(dead), result["tried"]


def test_no_source_answering_fails_naming_each_and_keeps_what_arrived(tmp_path):
    manifest = staged(tmp_path / "src", SIZES)
    dead = f"rsync://127.0.0.1:{free_port()}/models/m"
    result = run(tmp_path, fail=True, dest=str(tmp_path / "m"), manifest=manifest, sources=[dead], timeout=5)
    assert dead in result["msg"] and "the next run resumes it" in result["msg"] and "fix:" in result["msg"]
    assert not (tmp_path / "m").exists()
