"""`make weights`: stage the real model's files once, pinned to a commit, with a SHA256 manifest.

Why: nodes never talk to the model hub. A control node with internet access (or
with a lab mirror, or a directory someone copied in) stages one revision here;
every deploy then checks the files against the manifest written at staging
time, and the REVISION file says which commit they came from. A branch name is
refused: "main" moves, and the repo's tokenizer code and config did change over
time. Files are downloaded into a side directory and renamed into place only
when complete and checked, so an interrupted fetch never leaves a half-staged
model where deploys look.

Sources:
- the hub (huggingface_hub.snapshot_download at the commit; needs internet);
- `--mirror URL`: a lab HTTP mirror serving a staged directory (its SHA256SUMS is
  fetched first and every file is checked while it streams);
- `--from DIR`: a directory staged elsewhere (same files, same manifest).
The hub path has not run in this project's environment (no hub access); the
mirror and directory paths are covered by tests/unit/test_weights.py.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import sys
import urllib.parse
import urllib.request
from pathlib import Path

from glmdeploy.manifest import MANIFEST, check_manifest, read_manifest, write_manifest

DEFAULT_REPO = "THUDM/chatglm3-6b-32k"
REVISION_FILE = "REVISION"
# Safetensors only: the repo also carries the same weights as .bin shards.
DEFAULT_PATTERNS = ["*.json", "*.py", "tokenizer.model", "*.safetensors", "*.txt", "*.md"]


class WeightsError(RuntimeError):
    """A problem the admin can fix; the message says how."""


def check_revision(revision: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        raise WeightsError(
            f"revision {revision!r} is not a commit: pin the 40-hex commit of the model repo "
            "(the repo's 'Files and versions' history), not a branch or tag, which can move"
        )
    return revision


def fetch_hub(repo: str, revision: str, dest: Path, patterns: list[str]) -> None:
    """Download one commit of the repo into `dest` (internet access needed)."""
    from huggingface_hub import snapshot_download  # only the hub path needs it

    snapshot_download(repo_id=repo, revision=revision, local_dir=str(dest), allow_patterns=patterns)
    shutil.rmtree(dest / ".cache", ignore_errors=True)  # huggingface_hub's own bookkeeping
    if not any(dest.glob("*.safetensors")):
        raise WeightsError(
            f"{repo}@{revision} has no .safetensors files: pass --include '*.bin' to take the .bin shards"
        )


def fetch_mirror(url: str, dest: Path) -> None:
    """Copy a staged directory from an HTTP mirror, checking every file against the mirror's manifest."""
    base = url.rstrip("/") + "/"
    for name in (MANIFEST, REVISION_FILE):
        _download(base + name, dest / name, None)
    for name, digest in read_manifest(dest).items():
        _download(base + urllib.parse.quote(name), dest / name, digest)


def _download(url: str, out: Path, sha256: str | None) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, out.open("wb") as fh:
            for block in iter(lambda: resp.read(1 << 20), b""):
                digest.update(block)
                fh.write(block)
    except OSError as exc:
        raise WeightsError(f"cannot download {url}: {exc}") from exc
    if sha256 and digest.hexdigest() != sha256:
        raise WeightsError(f"{out.name} from {url} does not match the mirror's {MANIFEST}: the mirror copy is damaged")
    print(f"  {out.name}", flush=True)


def fetch_dir(src: Path, dest: Path) -> None:
    if not (src / MANIFEST).is_file():
        raise WeightsError(f"{src} has no {MANIFEST}: stage it with `make weights` first")
    shutil.copytree(src, dest, dirs_exist_ok=True)


def stage(args: argparse.Namespace) -> Path:
    """Fetch into a side directory, check, then rename into place (the old copy kept as .previous)."""
    revision = check_revision(args.revision)
    dest: Path = args.dest
    side = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    shutil.rmtree(side, ignore_errors=True)
    side.mkdir(parents=True)
    try:
        if args.mirror:
            fetch_mirror(args.mirror, side)
        elif args.from_dir:
            fetch_dir(args.from_dir, side)
        else:
            fetch_hub(args.repo, revision, side, args.include or DEFAULT_PATTERNS)
            (side / REVISION_FILE).write_text(f"{args.repo}@{revision}\n")
            write_manifest(side)
        staged = (side / REVISION_FILE).read_text().strip() if (side / REVISION_FILE).is_file() else ""
        if not staged.endswith("@" + revision):
            raise WeightsError(f"the source holds revision {staged or '(none)'}, not {revision}")
        problems = check_manifest(side)
        if problems:
            raise WeightsError("; ".join(problems))
    except BaseException:
        shutil.rmtree(side, ignore_errors=True)
        raise
    if dest.exists():
        previous = dest.with_name(dest.name + ".previous")
        shutil.rmtree(previous, ignore_errors=True)
        dest.rename(previous)
    side.rename(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glmdeploy_control.weights",
        description="Stage the real model's files for deploys: one pinned commit, checked, with a SHA256 manifest.",
    )
    parser.add_argument("--revision", required=True, help="40-hex commit of the model repo (a branch name is refused)")
    parser.add_argument("--dest", type=Path, required=True, help="directory deploys read (artifacts/models/<name>)")
    parser.add_argument("--repo", default=DEFAULT_REPO, help=f"model repo on the hub (default {DEFAULT_REPO})")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--mirror", metavar="URL", help="lab HTTP mirror serving a staged directory")
    source.add_argument("--from", dest="from_dir", type=Path, metavar="DIR", help="directory staged elsewhere")
    parser.add_argument("--include", action="append", metavar="GLOB", help="hub files to take (repeatable)")
    args = parser.parse_args(argv)
    try:
        dest = stage(args)
    except WeightsError as exc:
        print(f"error: {exc}\nnothing was changed in {args.dest}", file=sys.stderr)
        return 1
    files = read_manifest(dest)
    print(f"==> {dest}: {args.repo}@{args.revision}, {len(files)} files checked against {MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
