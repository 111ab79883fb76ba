"""`make weights` at ChatGLM3-6B-32k's real size through the hub stand-in: a clean staging, then a
run cut at about half of the revision's bytes and its rerun. Prints the seconds and the bytes the
stand-in sent for each run.

The source is `make fixture-full`'s model in the published revision's shape (seven .bin shards,
12.5 GB of random fp16; tests/support/fixture_model/full_size.py), served on loopback by
tests/hub/hub_standin.py (a stand-in of the hub's protocol, not the hub: no CDN, no rate limits,
no network between). The cut closes the connection once, mid-shard, at the byte where half the
revision's bytes have been sent in the order the kit fetches them.

Usage (the checkout's root, about 30 minutes and 40 GB free on this machine):
    PYTHONPATH=service:tests/support:tests/hub .venv/tokenizer-ref/bin/python bench/weights/real_size.py
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import hub_standin
from fixture_model import full_size

from glmdeploy_control import weights

ROOT = Path(__file__).resolve().parents[2]
REPO, COMMIT = "THUDM/chatglm3-6b-32k", "f0ee0a1e0a1e0a1e0a1e0a1e0a1e0a1e0a1e0a1e"
WORK = ROOT / "artifacts" / "bench-weights"


def run(endpoint: str, dest: Path) -> tuple[float, int, str]:
    """One `make weights` (its Python module, as the Makefile runs it): seconds, exit status, last line."""
    env = {**os.environ, "HF_ENDPOINT": endpoint, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    argv = [sys.executable, "-m", "glmdeploy_control.weights", "--revision", COMMIT, "--dest", str(dest),
            "--work", str(WORK / "staging"), "--repo", REPO]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return time.monotonic() - start, proc.returncode, lines[-1] if lines else ""


def fetch_order(src: Path) -> list[tuple[str, int]]:
    """The revision's files in the order the kit fetches them, with their sizes."""
    names = weights.choose_files({p.name: {"size": p.stat().st_size} for p in src.iterdir() if p.is_file()})
    return [(n, (src / n).stat().st_size) for n in names]


def half_way(order: list[tuple[str, int]]) -> tuple[str, int]:
    """The file and byte at which half of the revision's bytes have been sent."""
    goal, seen = sum(size for _, size in order) // 2, 0
    for name, size in order:
        if seen + size > goal:
            return name, goal - seen
        seen += size
    raise AssertionError("empty revision")


def main() -> int:
    src = full_size.ensure(full_size.DEFAULT_CACHE)
    order = fetch_order(src)
    total = sum(size for _, size in order)
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"source: {src} ({len(order)} files, {total / 1e9:.2f} GB), served by the hub stand-in on loopback")
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    clean = hub_standin.Revision(src, REPO, COMMIT)
    with hub_standin.serve(clean) as endpoint:
        seconds, rc, last = run(endpoint, WORK / "clean")
    print(f"clean staging: {seconds:.1f} s, exit {rc}, {sum(clean.sent.values()) / 1e9:.2f} GB sent; {last}")
    shutil.rmtree(WORK / "clean", ignore_errors=True)
    name, at = half_way(order)
    cut = hub_standin.Revision(src, REPO, COMMIT, {name: "cut"}, cut_at=at)
    with hub_standin.serve(cut) as endpoint:
        seconds, rc, last = run(endpoint, WORK / "resumed")
        first = sum(cut.sent.values())
        print(f"cut run ({name} cut at byte {at}): {seconds:.1f} s, exit {rc}, {first / 1e9:.2f} GB sent; {last}")
        seconds, rc, last = run(endpoint, WORK / "resumed")
        again = sum(cut.sent.values()) - first
        print(
            f"rerun: {seconds:.1f} s, exit {rc}, {again / 1e9:.2f} GB sent ({again / total:.1%} of the revision); "
            f"{last}"
        )
    shutil.rmtree(WORK, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
