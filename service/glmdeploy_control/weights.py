"""`make weights`: stage the real model's files once, pinned to a commit, checked, with a SHA256 manifest.

Why: nodes never talk to the model hub. A control node with internet access (or
with a lab mirror, or a directory someone copied in) stages one revision here;
every deploy then checks the files against the manifest written at staging
time, and the REVISION file says which commit they came from. A branch name is
refused: "main" moves, and the repo's tokenizer code and config did change over
time.

Sources:
- the hub (the default; `HF_ENDPOINT` or `--endpoint` for a lab's hub mirror): the
  revision's file list is read from the hub, every file the kit needs is downloaded
  (config, tokenizer, code, documents, and one checkpoint: safetensors when the
  revision has them, else the `.bin` shards), and each is checked against the size and
  hash the hub lists for it;
- `--from DIR`: a plain copy of the repo (checked for a whole checkpoint, provenance
  recorded as given), or a directory staged by this command elsewhere (its SHA256SUMS
  and REVISION are checked);
- `--mirror URL`: a lab HTTP mirror serving a directory staged by this command (its
  SHA256SUMS is fetched first and every file is checked while it streams).

A revision that ships only `.bin` shards (the published ChatGLM3-6B-32k does) is
converted once, here, to safetensors (glmdeploy_control.checkpoint): nodes never
unpickle. The published files' hashes are kept in SOURCE.json beside the served
files. Everything is fetched and converted in a work directory outside the models
directory and renamed into place only when complete and checked, so a refused or
interrupted run leaves nothing half-written where deploys look.

A hub download that stops (a cut link, a timeout, Ctrl-C) is not started over: the files
received so far, and the part of the file that was cut, are kept in the work directory
per repo and commit (`kept_dir`), and the next run checks them again and fetches only the
rest, continuing the cut file where it stopped: huggingface_hub 0.23 does that itself for a
`local_dir` download (it keeps the part it wrote as `.incomplete` and asks for the rest with
a Range request), so the kit only keeps the directory and checks what it holds. The library
writes in 10 MiB pieces (`constants.DOWNLOAD_CHUNK_SIZE`) and drops the piece a cut interrupts:
a rerun sends that much of the cut file again, besides what was never received.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from glmdeploy.manifest import MANIFEST, check_manifest, file_sha256, read_manifest, write_manifest
from glmdeploy_control import checkpoint

DEFAULT_REPO = "THUDM/chatglm3-6b-32k"
REVISION_FILE = "REVISION"
SOURCE_FILE = "SOURCE.json"
#: What every staging takes besides the weights: config, tokenizer, remote code, documents.
ALWAYS = ["*.json", "*.py", "tokenizer.model", "*.txt", "*.md", "*LICENSE*"]
_WEIGHTS = re.compile(r"\.(safetensors|bin)$")
#: Seconds a lab mirror (MIRROR=) may send nothing before the kit gives up on a file.
MIRROR_TIMEOUT = 60.0
#: Under the work directory: hub downloads of one repo@commit, kept across a failed run (`kept_dir`).
KEPT = "kept"
#: huggingface_hub's bookkeeping in a local_dir (0.23: .huggingface; later versions: .cache/huggingface).
HF_BOOKKEEPING = (".cache", ".huggingface")


class WeightsError(RuntimeError):
    """A problem the admin can fix; the message says how."""


def check_revision(revision: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        raise WeightsError(
            f"revision {revision!r} is not a commit: pin the 40-hex commit of the model repo "
            "(the repo's 'Files and versions' history), not a branch or tag, which can move"
        )
    return revision


# ---------------------------------------------------------------------------------------- sources


def choose_files(listing: dict[str, dict[str, Any]], include: Iterable[str] = ()) -> list[str]:
    """The files to take from a revision's listing: ALWAYS and `include`, plus one checkpoint.

    Safetensors when the revision has them (what loaders prefer), else the `.bin` shards;
    both only when `include` asks for the other.
    """
    patterns = [*ALWAYS, *include]
    names = sorted(listing)
    wanted = {n for n in names if not _WEIGHTS.search(n) and any(fnmatch.fnmatch(n, p) for p in patterns)}
    for kind in ("safetensors", "bin"):
        shards = [n for n in names if n.endswith("." + kind)]
        if shards:
            wanted |= set(shards)
            break
    else:
        raise WeightsError("the revision lists no .safetensors or .bin weights: is it the model repo?")
    wanted |= {n for n in names if _WEIGHTS.search(n) and any(fnmatch.fnmatch(n, p) for p in include)}
    return sorted(wanted)


def fetch_hub(repo: str, revision: str, dest: Path, include: list[str], endpoint: str | None) -> dict[str, Any]:
    """Download one commit's files into `dest`, each checked against the hub's listing; returns provenance."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    api = HfApi(endpoint=endpoint)
    where = api.endpoint
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True)
    except RepositoryNotFoundError as exc:
        raise WeightsError(
            f"{where}: no repo named {repo}; fix: check the name (--repo), or point HF_ENDPOINT at a hub that has it"
        ) from exc
    except RevisionNotFoundError as exc:
        raise WeightsError(
            f"{where}: {repo} has no commit {revision}; fix: pin a commit from the repo's history on the hub "
            "(a hub mirror named by HF_ENDPOINT may not have it yet)"
        ) from exc
    except HfHubHTTPError as exc:
        raise WeightsError(f"{where}: cannot list {repo}@{revision}: {_first_line(exc)}") from exc
    except OSError as exc:
        raise WeightsError(f"cannot reach the hub at {where}: {exc}; fix: check the network or HF_ENDPOINT") from exc
    if info.sha != revision:
        raise WeightsError(f"{where} answered for commit {info.sha}, not {revision}")
    listing = {s.rfilename: _listed(s) for s in info.siblings or []}
    names = choose_files(listing, include)
    total = sum(_size(listing[n]) for n in names)
    print(f"==> {repo}@{revision} from {where}: {len(names)} files, {total / 2**30:.2f} GiB", flush=True)
    dest.mkdir(parents=True, exist_ok=True)
    for name in keep_checked(dest, names, listing):
        print(f"  {name} ({_size(listing[name]) / 2**20:.1f} MiB{_resuming(dest, name, listing[name])})", flush=True)
        hub_download(repo, name, revision, dest, endpoint, where)
        try:
            check_listed(dest / name, listing[name])
        except WeightsError:
            (dest / name).unlink()  # not kept: the next run fetches it whole
            raise
    for name in names:  # the hub lists a SHA256 for LFS files only; the others were checked by git blob id
        listing[name]["sha256"] = listing[name]["sha256"] or file_sha256(dest / name)
    for extra in HF_BOOKKEEPING:
        shutil.rmtree(dest / extra, ignore_errors=True)
    # The route, not its address: the manifest covers SOURCE.json, and a model's identity (its
    # releases, what nodes hold) must not change with the mirror's host, port or path.
    return {"source": "hub", "published": {n: listing[n] for n in names}}


def _size(listed: dict[str, Any]) -> int:
    return int(listed.get("size") or 0)


def kept_dir(work_root: Path, repo: str, revision: str) -> Path:
    """Where the hub download of repo@revision is received, and kept when a run stops before the end.

    Under the work directory (artifacts/staging), never under artifacts/models: deploys do
    not read it, and the models directory changes only by the final rename. One directory
    per repo and commit: a run for another revision starts its own and never takes these
    files. Why it is safe to reuse: nothing in it is trusted as it lies. Before a run uses a
    kept file, it checks it again against the hub's listing of this run (size, then SHA256
    or git blob id: `keep_checked`) and fetches it again if it differs; a partial download
    continues only under the name huggingface_hub gave it, which carries the content's hash
    (the ETag), and the finished file is checked like any other. Removed once the revision is
    staged.
    """
    return work_root / KEPT / f"{repo.replace('/', '--')}@{revision}"


def keep_checked(dest: Path, names: list[str], listing: dict[str, dict[str, Any]]) -> list[str]:
    """The files still to fetch: those in `dest` that match the listing are kept, any other file is removed.

    A file this run does not take (another --include) is removed too, so that `dest` holds
    the chosen files only: everything in it is served.
    """
    _drop_unchosen(dest, set(names))
    kept: list[str] = []
    for name in names:
        path = dest / name
        if not path.is_file():
            continue
        mismatch = listing_mismatch(path, listing[name])
        if mismatch is None:
            kept.append(name)
        else:
            print(f"  {name}: the kept copy differs from the hub's listing ({mismatch[0]}); fetching it again")
            path.unlink()
    todo = [n for n in names if n not in kept]
    if kept:
        size = sum(_size(listing[n]) for n in kept)
        print(
            f"==> kept {len(kept)} of {len(names)} files ({size / 2**30:.2f} GiB) from a run that stopped, each "
            f"checked against the listing again; fetching {len(todo)}",
            flush=True,
        )
    return todo


def _drop_unchosen(dest: Path, names: set[str]) -> None:
    for path in sorted(dest.rglob("*"), reverse=True):
        rel = path.relative_to(dest)
        if rel.parts[0] in HF_BOOKKEEPING or rel.as_posix() in names:
            continue
        if path.is_dir():
            if not any(path.iterdir()):
                path.rmdir()
        else:
            path.unlink()


def partial_download(dest: Path, name: str, listed: dict[str, Any]) -> Path:
    """Where huggingface_hub 0.23 keeps the part received of `name` (`_local_folder.LocalDownloadFilePaths`).

    Its name carries the ETag the hub answered, which is the listed SHA256 for LFS files and
    the git blob id for the others: a part of other content never matches it.
    """
    etag = listed.get("sha256") or listed.get("git_blob") or ""
    return dest / ".huggingface" / "download" / f"{name}.{etag}.incomplete"


def _resuming(dest: Path, name: str, listed: dict[str, Any]) -> str:
    """Where the download of `name` continues, for the progress line; drops parts that cannot be continued.

    A part as long as the file or longer was not cut: a server that ignored the Range
    request and sent the whole file again after the part would leave one, and continuing
    it would fail again. A part under another ETag is of other content. Both are removed,
    so the file is fetched whole.
    """
    part = partial_download(dest, name, listed)
    ours = re.compile(re.escape(Path(name).name) + r"\.[0-9a-f]+\.incomplete")
    parts = part.parent.iterdir() if part.parent.is_dir() else iter(())
    for other in [p for p in parts if ours.fullmatch(p.name)]:
        if other != part or other.stat().st_size >= _size(listed):
            other.unlink()
    if not part.is_file() or part.stat().st_size == 0:
        return ""
    return f", continuing from {part.stat().st_size / 2**20:.1f} MiB received by a run that stopped"


def hub_download(repo: str, name: str, revision: str, dest: Path, endpoint: str | None, where: str) -> None:
    """One file through huggingface_hub into `dest`; its failures as the kit's errors, each with a fix.

    A timeout is told apart from a missing file or a cut connection: huggingface_hub reports a
    metadata request that timed out as "An error happened while trying to locate the file",
    and a stalled download as a connection error, neither of which names the limit to raise.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    started = time.monotonic()
    try:
        hf_hub_download(repo, name, revision=revision, local_dir=str(dest), endpoint=endpoint)
    except OSError as exc:  # huggingface_hub's HTTP errors are requests' errors, which are OSErrors
        if timed_out(exc):
            raise WeightsError(hub_timeout_message(name, where, exc, time.monotonic() - started)) from exc
        if isinstance(exc, EntryNotFoundError) and not isinstance(exc, LocalEntryNotFoundError):
            raise WeightsError(
                f"{name}: {where} lists it at {revision} but answers 404 for it; fix: run make weights again "
                "later, or point HF_ENDPOINT at a hub mirror that holds the whole revision"
            ) from exc
        if isinstance(exc, HfHubHTTPError):
            raise WeightsError(f"{name}: download failed: {_first_line(exc)}") from exc
        raise WeightsError(
            f"{name}: the download was cut short ({_first_line(exc)}); fix: run make weights again"
        ) from exc


def timed_out(exc: BaseException) -> bool:
    """Whether a timeout caused the error: requests and urllib3 wrap the socket's, huggingface_hub wraps theirs."""
    import requests
    import urllib3

    kinds = (TimeoutError, requests.exceptions.Timeout, urllib3.exceptions.TimeoutError)
    return any(isinstance(e, kinds) for e in _chain(exc))


def _chain(exc: BaseException) -> list[BaseException]:
    """The error, its causes and contexts, and exceptions carried as arguments (requests' way of wrapping)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop()
        if any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [x for x in (e.__cause__, e.__context__, *e.args) if isinstance(x, BaseException)]
    return seen


def hub_timeout_message(name: str, where: str, exc: BaseException, elapsed: float) -> str:
    """Which request timed out, the limit it waited, and the huggingface_hub setting that raises it.

    huggingface_hub 0.23 reads both limits from the environment once, at import: the
    metadata request (HEAD) waits HF_HUB_ETAG_TIMEOUT seconds, the download (GET) waits
    HF_HUB_DOWNLOAD_TIMEOUT seconds for each answer (and retries a stalled one five times).
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import HfHubHTTPError

    methods = [getattr(getattr(e, "request", None), "method", None) for e in _chain(exc)]
    if "HEAD" in methods or ("GET" not in methods and isinstance(exc, HfHubHTTPError)):
        what, setting, limit = "metadata request (HEAD)", "HF_HUB_ETAG_TIMEOUT", constants.HF_HUB_ETAG_TIMEOUT
    else:
        what, setting, limit = "download (GET)", "HF_HUB_DOWNLOAD_TIMEOUT", constants.HF_HUB_DOWNLOAD_TIMEOUT
    return (
        f"{name}: timed out: {where} did not answer the {what} within {limit} s "
        f"({elapsed:.0f} s on this file in all): a slow hub or mirror, not a missing file; "
        f"fix: run make weights again with {setting}={max(60, 6 * int(limit))} in its environment "
        f"(huggingface_hub's limit in seconds, now {limit})"
    )


def _listed(sibling: Any) -> dict[str, Any]:
    lfs = getattr(sibling, "lfs", None)
    return {
        "size": getattr(sibling, "size", None),
        "sha256": getattr(lfs, "sha256", None) if lfs else None,
        "git_blob": getattr(sibling, "blob_id", None),
    }


def git_blob_sha1(path: Path) -> str:
    """The git object id of a file: the hub lists this for files stored without LFS."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_listed(path: Path, listed: dict[str, Any]) -> None:
    """A downloaded file against the hub's size and hash for it: a truncated or altered file stops here."""
    mismatch = listing_mismatch(path, listed)
    if mismatch:
        raise WeightsError(f"{path.name}: {mismatch[0]}: {mismatch[1]}; fix: run make weights again")


def listing_mismatch(path: Path, listed: dict[str, Any]) -> tuple[str, str] | None:
    """What differs between a file and the hub's listing, and what that means for a download; None: nothing.

    The size first: a cut file is told without reading it.
    """
    size = path.stat().st_size
    if listed.get("size") is not None and size != int(listed["size"]):
        return f"downloaded {size} bytes, the hub lists {listed['size']}", "the download was cut short"
    if listed.get("sha256"):
        if file_sha256(path) != listed["sha256"]:
            return "SHA256 differs from the hub's listing", "the file was altered in transit"
    elif listed.get("git_blob") and git_blob_sha1(path) != listed["git_blob"]:
        return "content differs from the hub's git object", "the file was altered in transit"
    return None


def fetch_mirror(url: str, dest: Path, timeout: float = MIRROR_TIMEOUT) -> None:
    """Copy a staged directory from an HTTP mirror, checking every file against the mirror's manifest."""
    base = url.rstrip("/") + "/"
    for name in (MANIFEST, REVISION_FILE):
        _download(base + name, dest / name, None, timeout)
    for name, digest in read_manifest(dest).items():
        _download(base + urllib.parse.quote(name), dest / name, digest, timeout)


def _download(url: str, out: Path, sha256: str | None, timeout: float) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, out.open("wb") as fh:
            for block in iter(lambda: resp.read(1 << 20), b""):
                digest.update(block)
                fh.write(block)
    except OSError as exc:
        if timed_out(exc):
            raise WeightsError(
                f"{out.name}: timed out: {url} sent nothing for {timeout:g} s (the kit's limit for each answer "
                "from a mirror; no setting raises it); fix: check the mirror and the link (curl -I the URL), "
                "then run make weights again"
            ) from exc
        raise WeightsError(f"cannot download {url}: {exc}") from exc
    if sha256 and digest.hexdigest() != sha256:
        raise WeightsError(f"{out.name} from {url} does not match the mirror's {MANIFEST}: the mirror copy is damaged")
    print(f"  {out.name}", flush=True)


def is_staged(src: Path) -> bool:
    """A directory this command wrote: it has a manifest and a REVISION file."""
    return (src / MANIFEST).is_file() and (src / REVISION_FILE).is_file()


def fetch_dir(src: Path, dest: Path, include: list[str]) -> dict[str, Any] | None:
    """Copy a staged directory whole, or the kit's files of a plain copy of the repo.

    Returns provenance for a plain copy; None for a staged directory (it brings its own).
    """
    if not src.is_dir():
        raise WeightsError(f"{src} is not a directory; fix: FROM=<a copy of the model repo at the revision>")
    if is_staged(src):
        shutil.copytree(src, dest, dirs_exist_ok=True)
        return None
    if (src / MANIFEST).is_file() or (src / REVISION_FILE).is_file():
        have, lacks = (MANIFEST, REVISION_FILE) if (src / MANIFEST).is_file() else (REVISION_FILE, MANIFEST)
        raise WeightsError(
            f"{src} has {have} but no {lacks}: a staged directory has both; fix: use the whole staged "
            f"directory, or remove {have} to stage it as a plain copy of the repo"
        )
    listing: dict[str, dict[str, Any]] = {
        p.relative_to(src).as_posix(): {"size": p.stat().st_size}
        for p in sorted(src.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(src).parts)
    }
    names = choose_files(listing, include)
    print(f"==> {src}: a plain copy, {len(names)} files; its checkpoint checked before the copy", flush=True)
    try:
        check_checkpoint(src)
    except WeightsError as exc:
        raise WeightsError(f"{src}: {exc}") from exc
    for name in names:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / name, dest / name)
        listing[name]["sha256"] = file_sha256(dest / name)
    return {"source": "directory", "published": {n: listing[n] for n in names}}


# ---------------------------------------------------------------------------------------- staging


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_checkpoint(model_dir: Path) -> tuple[dict[str, Any], checkpoint.Layout]:
    """config.json, the index and every shard's tensor names, shapes and dtypes: seconds at any size.

    Why first: converting (or copying) 12.5 GB takes minutes; a checkpoint that cannot be
    served is refused before that, with every shard's metadata in hand.
    """
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise WeightsError(f"config.json: {exc}; fix: stage the whole revision") from exc
    try:
        layout = checkpoint.read_layout(model_dir)
        if layout.kind == "bin":
            checkpoint.check_bin(model_dir, layout, config)
        else:
            checkpoint.check_safetensors(model_dir, layout, config)
    except checkpoint.CheckpointError as exc:
        raise WeightsError(str(exc)) from exc
    return config, layout


def serve_ready(published: Path, served: Path, provenance: dict[str, Any], repo: str, revision: str) -> None:
    """Turn a revision's published files into the served directory: checked, `.bin` converted, manifest.

    The served directory holds the published files except any `.bin` shards, the
    safetensors (published or converted), REVISION, SOURCE.json (every published file's
    size and hash, and what was converted) and SHA256SUMS over all of it.
    """
    config, layout = check_checkpoint(published)
    try:
        served.mkdir(parents=True, exist_ok=True)
        for p in sorted(published.rglob("*")):
            rel = p.relative_to(published).as_posix()
            if p.is_file() and not (p.name.endswith(".bin") or rel == checkpoint.BIN_INDEX):
                (served / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, served / rel)
        if layout.kind == "bin":
            print(
                f"==> converting {len(layout.shards) or 1} .bin shards to safetensors (read weights-only; "
                "every shard was checked against the index and config.json first)",
                flush=True,
            )
            converted = checkpoint.convert_bin(published, served, layout, config, checked=True)
            provenance["converted"] = {"from": layout.index or "pytorch_model.bin", "to": converted}
    except checkpoint.CheckpointError as exc:
        raise WeightsError(str(exc)) from exc
    (served / REVISION_FILE).write_text(f"{repo}@{revision}\n")
    record = {"repo": repo, "revision": revision, **provenance}
    (served / SOURCE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_manifest(served)


def stage(args: argparse.Namespace) -> Path:
    """Fetch into a work directory, check (and convert), then rename into place (the old copy kept as .previous).

    A hub download is received in its kept directory (`kept_dir`), which outlives a failed
    run and is removed once the revision is staged.
    """
    revision = check_revision(args.revision)
    dest: Path = args.dest.resolve()
    work_root: Path = (args.work or dest.parent.parent / "staging").resolve()
    work = work_root / f"{dest.name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "published").mkdir(parents=True)
    kept = None if args.mirror or args.from_dir else kept_dir(work_root, args.repo, revision)
    try:
        with holding(kept):
            fetch(args, revision, work / "published", work / "served", kept)
            place(work / "served", dest, revision)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for empty in (work_root / KEPT, work_root):
            if empty.is_dir() and not any(empty.iterdir()):
                empty.rmdir()
    return dest


def fetch(args: argparse.Namespace, revision: str, published: Path, served: Path, kept: Path | None) -> None:
    """The revision's served directory, from the source the arguments name (the hub: through `kept`)."""
    include = args.include or []
    if args.mirror:
        fetch_mirror(args.mirror, served)
    elif args.from_dir:
        provenance = fetch_dir(args.from_dir, published, include)
        if provenance is None:
            published.rename(served)
        else:
            serve_ready(published, served, provenance, args.repo, revision)
    elif kept:
        provenance = fetch_hub(args.repo, revision, kept, include, args.endpoint)
        serve_ready(kept, served, provenance, args.repo, revision)


def place(served: Path, dest: Path, revision: str) -> None:
    """The served directory checked against its manifest and revision, then renamed to `dest`."""
    staged = (served / REVISION_FILE).read_text().strip() if (served / REVISION_FILE).is_file() else ""
    if not staged.endswith("@" + revision):
        raise WeightsError(f"the source holds revision {staged or '(none)'}, not {revision}")
    problems = check_manifest(served)
    if problems:
        raise WeightsError("; ".join(problems))
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        previous = dest.with_name(dest.name + ".previous")
        shutil.rmtree(previous, ignore_errors=True)
        dest.rename(previous)
    served.rename(dest)


@contextlib.contextmanager
def holding(kept: Path | None) -> Iterator[None]:
    """This run's hold on the kept directory: locked while it runs, removed if it stages, told of if it stops.

    One run at a time: two would write the same files, and one would remove them under the
    other. The lock is a file beside the directory (flock, released when the process ends,
    however it ends), removed after: a run that opened it in the instant before the removal
    could still start beside a later one; each still checks every file against the listing.
    """
    if kept is None:
        yield
        return
    kept.parent.mkdir(parents=True, exist_ok=True)
    lock = kept.with_name(kept.name + ".lock")
    with lock.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise WeightsError(
                f"another make weights is fetching this revision into {kept}; fix: wait for it to end, then run "
                "make weights again"
            ) from exc
        try:
            yield
        except BaseException:  # a refusal, a cut, Ctrl-C: what was received stays for the next run
            if kept.is_dir():
                tell_kept(kept)
            raise
        else:
            shutil.rmtree(kept, ignore_errors=True)
        finally:
            lock.unlink(missing_ok=True)


def tell_kept(kept: Path) -> None:
    """After a run that stopped: what it kept for the next run, and where; a directory with nothing worth it goes."""
    files = [p for p in kept.rglob("*") if p.is_file() and p.relative_to(kept).parts[0] not in HF_BOOKKEEPING]
    parts = [p for p in kept.rglob("*.incomplete") if p.is_file() and p.stat().st_size]
    if not files and not parts:
        shutil.rmtree(kept)
        return
    size = sum(p.stat().st_size for p in files + parts)
    cut = f" and part of {len(parts)} more" if parts else ""
    print(
        f"==> kept {len(files)} files{cut} ({size / 2**30:.2f} GiB) in {kept}: the next run fetches only the rest "
        f"(rm -r {kept} to start over)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glmdeploy_control.weights",
        description="Stage the real model's files for deploys: one pinned commit, checked, with a SHA256 manifest.",
    )
    parser.add_argument("--revision", required=True, help="40-hex commit of the model repo (a branch name is refused)")
    parser.add_argument("--dest", type=Path, required=True, help="directory deploys read (artifacts/models/<name>)")
    parser.add_argument("--repo", default=DEFAULT_REPO, help=f"model repo on the hub (default {DEFAULT_REPO})")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--mirror", metavar="URL", help="lab HTTP mirror serving a directory staged by this command")
    source.add_argument(
        "--from", dest="from_dir", type=Path, metavar="DIR", help="a plain copy of the repo, or a staged directory"
    )
    parser.add_argument(
        "--endpoint", help="hub address (default: HF_ENDPOINT, else the public hub); a lab's hub mirror"
    )
    parser.add_argument(
        "--include",
        action="append",
        metavar="GLOB",
        help="more files to take, besides config, tokenizer, code and one checkpoint",
    )
    parser.add_argument("--work", type=Path, help="work directory (default: artifacts/staging beside models/)")
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
