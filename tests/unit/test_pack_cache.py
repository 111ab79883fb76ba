"""library/glmdeploy_pack_cache.py: a lock's environment pack is built once per control node.

The module runs as Ansible runs it (the tool environment's Python, its arguments in a file), so
what is tested is what the role calls.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from local_play import module_argv, run_module

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "library" / "glmdeploy_pack_cache.py"
TOOLS_PY = ROOT / ".venv" / "tools" / "bin" / "python"
NAME = "env-cpu-py311-0123456789ab-x86_64.tar.zst"

pytestmark = pytest.mark.skipif(not TOOLS_PY.exists(), reason="needs the tool environment: make tools")


def run(tmp_path: Path, check: bool = False, **args: object) -> dict:
    out = run_module(MODULE, args, check)
    result = json.loads(out.stdout)
    assert not result.get("failed"), result
    return result


def warnings(result: dict) -> list[str]:
    """Warning texts (ansible-core 2.19 wraps each in a summary object)."""
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]


def publish(where: Path, name: str = NAME, data: bytes = b"pack bytes") -> None:
    where.mkdir(parents=True, exist_ok=True)
    (where / name).write_bytes(data)
    (where / f"{name}.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {name}\n")


def test_a_cached_pack_is_restored_into_a_fresh_checkout_by_hard_link(tmp_path):
    cache, packs = tmp_path / "cache", tmp_path / "checkout" / "releases"
    publish(cache)
    result = run(tmp_path, names=[NAME], pack_dir=str(packs), cache_dir=str(cache), state="restored")
    assert result["changed"] and result["restored"] == [NAME]
    assert (packs / NAME).read_bytes() == b"pack bytes"
    assert os.stat(packs / NAME).st_ino == os.stat(cache / NAME).st_ino  # no copy of gigabytes
    again = run(tmp_path, names=[NAME], pack_dir=str(packs), cache_dir=str(cache), state="restored")
    assert not again["changed"], again


def test_a_cached_pack_that_fails_its_sha256_is_removed_and_not_restored(tmp_path):
    cache, packs = tmp_path / "cache", tmp_path / "releases"
    publish(cache)
    (cache / NAME).write_bytes(b"pack bytez")
    result = run(tmp_path, names=[NAME], pack_dir=str(packs), cache_dir=str(cache), state="restored")
    assert result["restored"] == [] and result["pruned"] == [NAME]
    assert any("did not match its SHA256" in w for w in warnings(result)), result
    assert not (packs / NAME).exists() and not (cache / NAME).exists()


def test_check_mode_reports_a_restore_and_writes_nothing(tmp_path):
    cache, packs = tmp_path / "cache", tmp_path / "releases"
    publish(cache)
    result = run(tmp_path, check=True, names=[NAME], pack_dir=str(packs), cache_dir=str(cache), state="restored")
    assert result["changed"] and result["restored"] == [NAME]
    assert not packs.exists()


def test_a_published_pack_is_stored_and_the_least_recently_used_beyond_keep_go(tmp_path):
    cache, packs = tmp_path / "cache", tmp_path / "releases"
    old = [f"env-old{i}-x86_64.tar.zst" for i in range(3)]
    for i, name in enumerate(old):
        publish(cache, name, data=name.encode())
        os.utime(cache / name, (1000 + i, 1000 + i))
    publish(packs)
    result = run(tmp_path, names=[NAME], pack_dir=str(packs), cache_dir=str(cache), state="stored", keep=2)
    assert result["stored"] == [NAME]
    assert sorted(result["pruned"]) == sorted(old[:2]), result  # the newest old one stays
    assert sorted(p.name for p in cache.glob("*.tar.zst")) == sorted([NAME, old[2]])
    assert not (cache / f"{old[0]}.sha256").exists()


def test_no_cache_directory_turns_the_cache_off(tmp_path):
    result = run(tmp_path, names=[NAME], pack_dir=str(tmp_path / "releases"), cache_dir="", state="restored")
    assert result == {**result, "changed": False, "restored": []}


def test_a_cache_that_cannot_be_written_is_a_warning_not_a_failed_deploy(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    publish(tmp_path / "releases")
    result = run(tmp_path, names=[NAME], pack_dir=str(tmp_path / "releases"), cache_dir=str(blocker), state="stored")
    assert not result["changed"]
    assert any("was not used" in w and "PACK_CACHE" in w for w in warnings(result)), result


def test_a_pack_brought_from_a_node_is_published_with_its_sha256(tmp_path):
    packs = tmp_path / "releases"
    packs.mkdir()
    partial = packs / f".{NAME}.node1.partial"
    partial.write_bytes(b"node1 bytes")
    dry = run(tmp_path, check=True, names=[NAME], pack_dir=str(packs), partial=str(partial), state="published")
    assert dry["changed"] and not (packs / NAME).exists(), "check mode published the pack"
    result = run(tmp_path, names=[NAME], pack_dir=str(packs), partial=str(partial), state="published")
    assert result["changed"] and result["published"] == [NAME]
    assert (packs / NAME).read_bytes() == b"node1 bytes" and not partial.exists()
    recorded = (packs / f"{NAME}.sha256").read_text().split()
    assert recorded == [hashlib.sha256(b"node1 bytes").hexdigest(), NAME]


def test_two_runs_publishing_the_same_pack_at_once_leave_one_pack_that_matches_its_sha256(tmp_path):
    """Two deploys from one checkout (this machine and the test hosts) built the same pack: the
    pack directory ends with one of them whole and its own SHA256, never a mix."""
    packs = tmp_path / "releases"
    packs.mkdir()
    procs = []
    for node in ("node1", "node2"):
        partial = packs / f".{NAME}.{node}.partial"
        partial.write_bytes(node.encode() * 4_000_000)  # big enough that the two overlap
        spec = tmp_path / f"args-{node}.json"
        args = {"names": [NAME], "pack_dir": str(packs), "partial": str(partial), "state": "published"}
        procs.append(subprocess.Popen(module_argv(MODULE, spec, args), stdout=subprocess.PIPE, text=True))
    results = [json.loads(p.communicate()[0]) for p in procs]
    assert sorted(len(r["published"]) for r in results) == [0, 1], results
    data = (packs / NAME).read_bytes()
    assert (packs / f"{NAME}.sha256").read_text().split()[0] == hashlib.sha256(data).hexdigest()
    assert not list(packs.glob("*.partial")), "a run's partial copy was left behind"
