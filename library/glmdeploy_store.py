#!/usr/bin/python
"""An artifact store on a node (a model, an environment pack, an image's archive): named by its
manifest, filled by rsync from any holder, checked once.

Why a module and not ``copy`` + ``sha256sum``: at real size (12.5 GB of weights) the copy module
hashed every source file on the control node once per node, and every re-run read every placed
file again with ``sha256sum`` (one full read per node per run). Here:

- a store that passed its manifest on arrival gets a stamp (each file's size and mtime); a re-run
  compares the stamp with ``stat`` and reads no weight at all. ``make verify`` re-hashes every
  file (glmdeploy.serving.fingerprint), which also catches a change that kept size and mtime
  (docs/decisions.md, "Real sizes");
- files arrive with rsync (Debian's package) from the first source that answers: a node that
  already holds the store, then the control node. A cut transfer is resumed
  (``--partial --append-verify``) into ``.<store>.incoming`` beside the store; the store's own name
  appears only after every file matched the manifest, by one rename, so a half file is never taken
  for a whole one;
- a store changed on the node is repaired from a hard-linked copy: only the files that differ are
  fetched, and nothing is ever appended to a file the running release still reads.

The control node's staged copy is hashed against its manifest once per run, by the deploy's
preflight (glmdeploy.manifest), not here.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glmdeploy_integrity import file_sha256, parse_sums

DOCUMENTATION = r"""
module: glmdeploy_store
short_description: Check a content-named artifact store, or fill it by rsync from the first source that answers
options:
  dest: {description: the store directory, type: path, required: true}
  manifest: {description: the control node's SHA256SUMS text (what the store must hold), type: str, required: true}
  state:
    description: >-
      checked (stat against the arrival stamp, no read) or present (checked, then filled from the
      sources when it is not complete)
    type: str
    choices: [checked, present]
    default: present
  sources:
    description: rsync sources tried in order (rsync:// URLs or local directories)
    type: list
    elements: str
    default: []
  repair: {description: replace files changed since placed; false fails naming them, type: bool, default: true}
  timeout: {description: seconds rsync waits for a connection or data before the next source, type: int, default: 30}
  bwlimit: {description: rsync --bwlimit (KiB/s; "" none), type: str, default: ""}
"""

RETURN = r"""
complete: {description: the store holds the manifest's files and passed its check, type: bool}
problems: {description: what differs (file and how), before any repair, type: list}
source: {description: the source that filled the store ("" when nothing was fetched), type: str}
tried: {description: sources that failed, each with rsync's exit code and last line, type: list}
bytes_hashed: {description: bytes this run read to hash, type: int}
bytes_received: {description: bytes rsync moved to this node (file data, rsync's own overhead included), type: int}
io: {description: this module's process and its children from /proc (rchar, read_bytes), type: dict}
seconds: {description: wall time, type: float}
"""

MANIFEST = "SHA256SUMS"
STAMP = ".glmdeploy-store.json"
RENAME_EXCHANGE = 2


def files_of(root: Path) -> set[str]:
    """Every file under root but hidden ones (the stamp, rsync's partials) and the manifest."""
    names = set()
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if path.is_file() and rel.as_posix() != MANIFEST and not any(p.startswith(".") for p in rel.parts):
            names.add(rel.as_posix())
    return names


def hash_check(root: Path, expected: dict[str, str]) -> tuple[list[str], int]:
    """(problems, bytes read): every file of the manifest hashed once; extra files named."""
    problems, read = [], 0
    for name, digest in sorted(expected.items()):
        path = root / name
        if not path.is_file():
            problems.append(f"{name}: missing")
            continue
        read += path.stat().st_size
        if file_sha256(path) != digest:
            problems.append(f"{name}: does not match its SHA256")
    problems += [f"{name}: not in {MANIFEST}" for name in sorted(files_of(root) - set(expected))]
    return problems, read


def stat_check(root: Path, manifest: str) -> list[str]:
    """What differs from the arrival stamp, by stat alone (no file is read)."""
    if not (root / MANIFEST).is_file():
        return ["store: absent"]
    if (root / MANIFEST).read_text(encoding="utf-8") != manifest:
        theirs = parse_sums((root / MANIFEST).read_text(encoding="utf-8"))
        ours = parse_sums(manifest)
        names = sorted(n for n in set(theirs) | set(ours) if theirs.get(n) != ours.get(n))
        return [f"{MANIFEST}: rewritten on the node (differs for {', '.join(names) or 'its layout'})"]
    try:
        stamp = json.loads((root / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [f"{STAMP}: missing (placed before stamps, or cut before its check)"]
    problems = []
    for name, (size, mtime_ns) in sorted(stamp["files"].items()):
        try:
            st = (root / name).stat()
        except FileNotFoundError:
            problems.append(f"{name}: missing")
            continue
        if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
            problems.append(f"{name}: changed since it was placed (size or mtime)")
    problems += [f"{name}: not in {MANIFEST}" for name in sorted(files_of(root) - set(stamp["files"]))]
    return problems


def own_io() -> dict[str, int]:
    """This process's I/O counters, reaped children included (the kernel adds them on wait)."""
    fields = {}
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            key, _, value = line.partition(":")
            fields[key] = int(value)
    except OSError:
        return {}
    return {k: fields.get(k, 0) for k in ("rchar", "read_bytes")}


def rsync(
    source: str, incoming: Path, names: list[str], timeout: int, bwlimit: str, append: bool
) -> tuple[int, str, int]:
    """(exit code, last line of its errors, bytes received) of one pull of names into incoming."""
    argv = ["rsync", "-rt", "--files-from=-", "--partial", "--stats", f"--timeout={timeout}", "--chmod=D0755,F0444"]
    argv += ["--append-verify"] if append else []
    argv += [f"--bwlimit={bwlimit}"] if bwlimit else []
    argv += [f"--contimeout={timeout}"] if source.startswith("rsync://") else []
    # The list is read relative to the daemon module's root (an rsync 3.5 daemon finds --files-from
    # names only from there) or the local store's parent, and --no-relative lands them flat.
    nested = re.match(r"(rsync://[^/]+/[^/]+)/(.+)$", source.rstrip("/"))
    if nested:
        base, store = nested.groups()
    else:
        base, _, store = source.rstrip("/").rpartition("/")
    argv += ["--no-relative", base or "/", str(incoming) + "/"]
    listing = "".join(f"{store}/{name}\n" for name in names)  # the manifest is the caller's, not the source's
    proc = subprocess.run(argv, input=listing, capture_output=True, text=True, check=False)
    # The file data crossed as the client's "received" from a daemon, as its "sent" in a local copy
    # (the client then runs the sending side).
    which = "received" if source.startswith("rsync://") else "sent"
    moved = re.search(rf"Total bytes {which}: ([\d,.]+)", proc.stdout)
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    return proc.returncode, last, int(re.sub(r"[,.]", "", moved.group(1))) if moved else 0


def exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (renameat2 RENAME_EXCHANGE); False where the kernel can't."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        return False
    at_fdcwd = -100
    rc = libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), RENAME_EXCHANGE)
    if rc != 0 and ctypes.get_errno() in (errno.ENOSYS, errno.EINVAL):
        return False
    if rc != 0:
        raise OSError(ctypes.get_errno(), f"renameat2 {a} {b}")
    return True


def install(incoming: Path, dest: Path) -> None:
    """The checked tree takes the store's name; a store it replaces goes after the swap."""
    if not dest.exists():
        incoming.rename(dest)
        return
    if exchange(incoming, dest):
        shutil.rmtree(incoming)
        return
    old = dest.with_name(f".{dest.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    dest.rename(old)
    incoming.rename(dest)
    shutil.rmtree(old)


def stamp(root: Path, expected: dict[str, str]) -> None:
    stats = {name: (root / name).stat() for name in expected}
    files = {name: [st.st_size, st.st_mtime_ns] for name, st in stats.items()}
    tmp = root / f"{STAMP}.tmp"
    tmp.write_text(json.dumps({"files": files}, sort_keys=True) + "\n", encoding="utf-8")
    tmp.chmod(0o444)
    tmp.replace(root / STAMP)


def prepare_incoming(dest: Path, incoming: Path, problems: list[str]) -> None:
    """A repair starts from hard links of the store minus the files that differ (those are
    fetched whole: an append would write through the link into the running release's file)."""
    if incoming.exists() or not dest.exists():
        incoming.mkdir(mode=0o755, parents=True, exist_ok=True)
        return
    shutil.copytree(dest, incoming, copy_function=os.link, symlinks=True)
    for line in problems:
        name = line.split(":", 1)[0]
        if name not in (MANIFEST, STAMP, "store"):
            (incoming / name).unlink(missing_ok=True)
    (incoming / STAMP).unlink(missing_ok=True)
    (incoming / MANIFEST).unlink(missing_ok=True)


def fill(module: AnsibleModule, dest: Path, expected: dict[str, str], result: dict) -> None:
    incoming = dest.with_name(f".{dest.name}.incoming")
    prepare_incoming(dest, incoming, result["problems"])
    for source in module.params["sources"]:
        for append in (True, False):  # a resumed file that fails its check is fetched again whole
            rc, last, received = rsync(
                source, incoming, sorted(expected), module.params["timeout"], module.params["bwlimit"], append
            )
            result["bytes_received"] += received
            if rc != 0:
                result["tried"].append(f"{source}: rsync exit {rc}: {last}")
                break
            problems, read = hash_check(incoming, expected)
            result["bytes_hashed"] += read
            for extra in files_of(incoming) - set(expected):  # left by an earlier, other manifest
                (incoming / extra).unlink()
            problems = [p for p in problems if not p.endswith(f"not in {MANIFEST}")]
            if not problems:
                result["source"] = source
                (incoming / MANIFEST).unlink(missing_ok=True)  # an earlier kit fetched the source's copy
                (incoming / MANIFEST).write_text(module.params["manifest"], encoding="utf-8")
                (incoming / MANIFEST).chmod(0o444)
                stamp(incoming, expected)
                install(incoming, dest)
                return
            for line in problems:
                (incoming / line.split(":", 1)[0]).unlink(missing_ok=True)
            result["tried"].append(f"{source}: {'; '.join(problems)}")
    module.fail_json(
        msg=f"no source could fill {dest}: {' | '.join(result['tried']) or 'no source given'}. What arrived stays in "
        f"{incoming} and the next run resumes it. fix: check that the sources are reachable (a holder's share "
        "port, the control node's artifact server) and that the control node's staged copy passes its manifest",
        **result,
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "manifest": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["checked", "present"], "default": "present"},
            "sources": {"type": "list", "elements": "str", "default": []},
            "repair": {"type": "bool", "default": True},
            "timeout": {"type": "int", "default": 30},
            "bwlimit": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    started, io_before = time.monotonic(), own_io()
    dest, manifest = Path(module.params["dest"]), module.params["manifest"]
    expected = parse_sums(manifest)
    if any("/" in name for name in expected):
        module.fail_json(
            msg=f"the manifest names files below a subdirectory ({', '.join(n for n in expected if '/' in n)}): "
            "a store is one flat directory (as the published model revision is). fix: stage a flat copy"
        )
    result: dict = {"changed": False, "problems": [], "source": "", "tried": [], "bytes_hashed": 0, "bytes_received": 0}

    def done(**extra: object) -> None:
        after = own_io()
        result["io"] = {k: after[k] - io_before.get(k, 0) for k in after}
        result["seconds"] = round(time.monotonic() - started, 3)
        result.update(extra)
        module.exit_json(**result)

    result["problems"] = stat_check(dest, manifest)
    if result["problems"] == [f"{STAMP}: missing (placed before stamps, or cut before its check)"]:
        # Placed by a kit without stamps: one full check, then the stamp (later runs read nothing).
        problems, result["bytes_hashed"] = hash_check(dest, expected)
        if not problems and not module.check_mode:
            stamp(dest, expected)
            result["problems"], result["changed"] = [], True
            done(complete=True)
        result["problems"] = problems or result["problems"]
    if not result["problems"]:
        done(complete=True)
    absent = result["problems"] == ["store: absent"]
    if module.params["state"] == "checked" or module.check_mode:
        done(complete=False, changed=module.check_mode and module.params["state"] == "present")
    if not absent and not module.params["repair"]:
        module.fail_json(msg=f"store {dest} differs from its manifest: {'; '.join(result['problems'])}", **result)
    result["changed"] = True
    fill(module, dest, expected, result)
    done(complete=True)


if __name__ == "__main__":
    main()
