"""`make image`: a profile's pinned stack as a container image, built offline and reproducibly.

Why a script of its own and not a bare `podman build` in the Makefile: no image registry is
reachable, so the base is made here from a debootstrapped rootfs; the image must come out with
the same ID from the same inputs (fixed timestamps, a deterministic base tar, no build-time
randomness), and a rebuild costs minutes, so the result is kept by the digest of its inputs in a
store outside any checkout and reused while they do not change.

The image ID (the digest of its configuration, which names every layer's digest) is the identity
the kit checks: it survives `podman save`/`load` in either archive format, where the manifest
digest does not. Podman runs with the kit's own configuration (images/containers.conf) and
store (`--root` under the cache), never the machine's defaults.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from glmdeploy.manifest import file_sha256
from glmdeploy_control import apt_sources, registry

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
CACHE = Path(os.environ.get("GLMDEPLOY_IMAGE_CACHE", "/var/cache/glmdeploy/images"))
#: Every file time in the base tar and the image's layers, and the image's creation time: a
#: constant, so a build next year gives the same ID (2024-07-01, the gpu-cu121 lock's date).
EPOCH = 1719792000
#: Packages of every image's base besides the registry's (the kit's and the profile's).
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
#: Bump to rebuild every base (a change in how it is made that its package list does not show).
BASE_REVISION = "1"


class ImageError(RuntimeError):
    """A problem the user can fix; printed without a traceback."""


def log(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def podman(*args: str, capture: bool = True, check: bool = True) -> subprocess.CompletedProcess[str]:
    """podman on the kit's store and configuration (never a pull: nothing is reachable)."""
    if not shutil.which("podman"):
        raise ImageError("podman is not installed: apt install podman buildah runc (as root)")
    env = {**os.environ, **_podman_env()}
    Path(env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([*podman_command(CACHE), *args], env=env, text=True, capture_output=capture, check=False)
    if check and proc.returncode != 0:
        raise ImageError(f"podman {' '.join(args[:2])} failed:\n{(proc.stderr or '')[-3000:]}")
    return proc


def podman_command(cache: Path) -> list[str]:
    """podman on the store kept in `cache`; its run-time state lives under /run (podman refuses a
    runroot path longer than 50 characters)."""
    runroot = Path("/run/glmdeploy-images") / digest_of(str(cache.resolve()))[:12]
    store = cache / "store"
    return [
        "podman",
        "--root",
        str(store / "root"),
        "--runroot",
        str(runroot),
        "--tmpdir",
        str(store / "tmp"),
        "--storage-driver",
        "overlay",
    ]


def digest_of(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def image_id(name: str) -> str | None:
    proc = podman("image", "inspect", "--format", "{{.Id}}", name, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


# ---------------------------------------------------------------- base
def base_packages(reg: registry.Registry, profile: str) -> list[str]:
    return sorted({*BASE_PACKAGES, *reg.kit.packages, *reg.profile(profile).packages})


def ensure_base(reg: registry.Registry, profile: str) -> str:
    """The base image for `profile` (debootstrap minbase + its packages), made once; its name."""
    packages = base_packages(reg, profile)
    suite = reg.kit.image.suite
    key = digest_of(BASE_REVISION, suite, *packages)[:12]
    name = f"localhost/glmdeploy-base:{key}"
    if image_id(name):
        return name
    tar = CACHE / f"base-{key}.tar"
    if not tar.exists():
        _debootstrap(suite, packages, tar)
    log(f"importing the base {tar.name} ({tar.stat().st_size >> 20} MiB, sha256 {file_sha256(tar)[:12]})")
    podman("import", "--change", 'CMD ["/bin/bash"]', str(tar), name)
    return name


def _debootstrap(suite: str, packages: list[str], tar: Path) -> None:
    if not shutil.which("debootstrap"):
        raise ImageError("debootstrap is not installed: apt install debootstrap (as root)")
    mirror = apt_sources.debian_mirror(suite)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=".base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"debootstrapping the base ({suite} minbase + {', '.join(packages)}; about two minutes, kept)")
        proc = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(rootfs), mirror],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise ImageError(f"debootstrap failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        _strip(rootfs)
        part = tar.with_suffix(".tar.partial")
        # Sorted names, one time for every file, numeric owners, no atime/ctime: the same rootfs
        # gives the same bytes, and podman import takes the tar's own time as the image's.
        subprocess.run(
            [
                "tar",
                "--sort=name",
                f"--mtime=@{EPOCH}",
                "--clamp-mtime",
                "--numeric-owner",
                "--xattrs",
                "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
                "-C",
                str(rootfs),
                "-cf",
                str(part),
                ".",
            ],
            check=True,
        )
        os.utime(part, (EPOCH, EPOCH))
        part.rename(tar)


def _strip(rootfs: Path) -> None:
    """What differs between two debootstraps and no container needs: logs, caches, the machine id."""
    for rel in ("var/cache/apt", "var/lib/apt/lists", "var/log", "var/cache/debconf"):
        path = rootfs / rel
        if path.is_dir():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    (rootfs / "etc/machine-id").write_text("")
    for rel in ("var/lib/dbus/machine-id", "etc/hostname", "etc/resolv.conf"):
        (rootfs / rel).unlink(missing_ok=True)


# ---------------------------------------------------------------- image
def kit_wheel(out: Path) -> Path:
    """The kit's wheel built from this checkout (uv's build backend: same sources, same bytes)."""
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    subprocess.run(
        [uv, "build", "--wheel", "--offline", "--quiet", "--out-dir", str(out), str(ROOT / "service")], check=True
    )
    wheels = sorted(out.glob("glmdeploy-*.whl"))
    if len(wheels) != 1:
        raise ImageError(f"expected one kit wheel in {out}, found {[w.name for w in wheels]}")
    return wheels[0]


def build(profile: str, python: str, wheelhouse: Path, force: bool = False) -> dict[str, str]:
    """Build (or find) the image of `profile` for `python`; returns its name, ID and labels."""
    reg = registry.load()
    reg.profile(profile)
    if python not in reg.profile(profile).python:
        raise ImageError(f"profile {profile} has no lock for Python {python} (it has {reg.profile(profile).python})")
    lock = ROOT / "constraints" / reg.lock_name(profile, python)
    if not any(wheelhouse.glob("*.whl")):
        raise ImageError(f"no wheelhouse at {wheelhouse}: run `make wheelhouse PROFILE={profile}` first")
    CACHE.mkdir(parents=True, exist_ok=True)
    base = ensure_base(reg, profile)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=".ctx-") as tmp:
        ctx = Path(tmp)
        wheel = kit_wheel(ctx)
        shutil.copy2(lock, ctx / lock.name)
        shutil.copytree(ROOT / "smoke_tests", ctx / "smoke_tests", ignore=shutil.ignore_patterns("__pycache__"))
        inputs = {
            "containerfile": file_sha256(IMAGES / "Containerfile"),
            "lock": file_sha256(lock),
            "kit_wheel": file_sha256(wheel),
            "smoke_tests": _tree_digest(ctx / "smoke_tests"),
            "base": image_id(base) or "",
            "epoch": str(EPOCH),
            "podman": podman("--version").stdout.strip(),
        }
        key = digest_of(*(f"{k}={v}" for k, v in sorted(inputs.items())))[:16]
        name = f"localhost/glmdeploy-{reg.wheelhouse_name(profile, python)}:{key}"
        labels = {
            "org.glmdeploy.profile": profile,
            "org.glmdeploy.lock": lock.name,
            "org.glmdeploy.lock-sha256": inputs["lock"],
            "org.glmdeploy.kit-wheel": wheel.name,
            "org.glmdeploy.kit-wheel-sha256": inputs["kit_wheel"],
            "org.glmdeploy.base": inputs["base"],
            "org.glmdeploy.inputs": key,
        }
        found = image_id(name)
        if found and not force:
            log(f"{name} is built already ({found[:12]}): its inputs have not changed")
            return {"name": name, "id": found, **labels}
        log(f"building {name} from {lock.name} and {wheelhouse} (offline; a few minutes)")
        start = time.monotonic()
        args = [
            "build",
            "--pull=never",
            "--network",
            "none",
            "--timestamp",
            str(EPOCH),
            "--layers=false",
            "--identity-label=false",
            "--volume",
            f"{wheelhouse.resolve()}:/wheels:ro",
            "--build-arg",
            f"BASE={base}",
            "--build-arg",
            f"LOCK={lock.name}",
            "--build-arg",
            f"KIT_WHEEL={wheel.name}",
            "--build-arg",
            f"EPOCH={EPOCH}",
            *(arg for k, v in labels.items() for arg in ("--label", f"{k}={v}")),
            "--file",
            str(IMAGES / "Containerfile"),
            "--tag",
            name,
            str(ctx),
        ]
        podman(*args, capture=False)
    built = image_id(name) or ""
    log(f"built {name}: ID {built[:12]} in {time.monotonic() - start:.0f} s")
    return {"name": name, "id": built, **labels}


# ---------------------------------------------------------------- archive
def save(name: str, out: Path) -> dict[str, str]:
    """The image as a file for nodes (no registry anywhere): an OCI archive, zstd-compressed, with
    its SHA256 and the image ID it holds beside it, made once per image. The node checks both
    (library/glmdeploy_image.py): the archive's SHA256 on arrival, the ID after `podman load`."""
    found = image_id(name)
    if not found:
        raise ImageError(f"no image {name} in {CACHE / 'store'}: run `make image` first")
    stem = name.rsplit("/", 1)[-1].replace(":", "-")
    archive, meta = out / f"{stem}.oci.tar.zst", out / f"{stem}.json"
    if meta.is_file() and archive.is_file():
        known = json.loads(meta.read_text())
        if known.get("id") == found and known.get("sha256") == file_sha256(archive):
            log(f"{archive} holds {found[:12]} already")
            return dict(known)
    out.mkdir(parents=True, exist_ok=True)
    log(f"saving {name} ({found[:12]}) to {archive} (OCI archive, zstd; about a minute)")
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=".save-") as tmp:
        tar = Path(tmp) / "image.tar"
        podman("save", "--format", "oci-archive", "--output", str(tar), name)
        part = archive.with_name(archive.name + ".partial")
        subprocess.run(["zstd", "-q", "-f", "-T0", "-3", str(tar), "-o", str(part)], check=True)
        part.rename(archive)
    result = {"name": name, "id": found, "archive": archive.name, "sha256": file_sha256(archive)}
    meta.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


# ---------------------------------------------------------------- smoke
#: The user the image's programs run as here: the control node has no service user, and the
#: launcher runs its container as a host user's ids, as on a node.
SMOKE_USER = "nobody"


def smoke(
    name: str, profile: str, model: Path, port: int, timeout_s: int, reports: Path, throughput: bool = True
) -> dict[str, object]:
    """Run the image as a node would and prove it: a container-runtime release rendered by the
    roles (playbooks/image_smoke.yml), its launcher started, the kit's readiness check (a real
    generation) and the smoke suite the image carries run through the release's bin/run, and the
    node's fingerprint checked to name the image."""
    model = model.resolve()
    found = image_id(name)
    if not found:
        raise ImageError(f"no image {name} in {CACHE / 'store'}: run `make image PROFILE={profile}` first")
    if not (model / "config.json").is_file():
        raise ImageError(f"no model at {model}: run `make model PROFILE={profile}` first")
    reports.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=".smoke-") as tmp:
        layout = _smoke_layout(Path(tmp))
        _render_release(layout, found, profile, model, port)
        server_env = json.loads((layout["release"].parent / "server-env.json").read_text())
        env = {**os.environ, **_podman_env(), **server_env}
        # The launcher's output as a unit would keep it; the server's log file is podman's (k8s-file).
        log_file = layout["log"] / "launcher.log"
        log(f"starting {name} ({found[:12]}) as a node's launcher would, on port {port}")
        with log_file.open("wb") as out:
            server = subprocess.Popen([str(layout["release"] / "bin/vllm_server")], env=env, stdout=out, stderr=out)
        try:
            _wait_ready(layout, server, timeout_s, log_file)
            result = _run_suite(layout, throughput)
            fingerprint = json.loads((layout["reports"] / "fingerprint.json").read_text())
        finally:
            _stop(server)
            shutil.copy2(log_file, reports / f"image-smoke-{profile}-launcher.log")
        for file in ("smoke.xml", "smoke.json", "fingerprint.json"):
            shutil.copy2(layout["reports"] / file, reports / f"image-smoke-{profile}-{file}")
    if fingerprint.get("image") != found:
        raise ImageError(f"the fingerprint names image {fingerprint.get('image')!r}, not {found}")
    # The mounted model, re-hashed from inside the image against its manifest.
    if fingerprint.get("model_files") != "match manifest":
        raise ImageError(f"the mounted model does not match its manifest: {fingerprint.get('model_files')}")
    if result["rc"] != 0:
        raise ImageError(f"the smoke suite failed in {name}:\n{result['tail']}")
    return {"image": name, "id": found, "smoke": result["summary"], "seconds": round(time.monotonic() - start)}


def _smoke_layout(tmp: Path) -> dict[str, Path]:
    """A node's directories in miniature; the container's user writes state and reports."""
    layout = {key: tmp / key for key in ("release", "etc", "log", "state", "reports")}
    for path in layout.values():
        path.mkdir(mode=0o755)
    (layout["state"] / "tmp").mkdir()
    user = pwd.getpwnam(SMOKE_USER)  # its ids and primary group, as the launcher's `id -u`/`id -g` give them
    for path in (layout["state"], layout["state"] / "tmp", layout["reports"]):
        os.chown(path, user.pw_uid, user.pw_gid)
    tmp.chmod(0o755)
    return layout


def _podman_env() -> dict[str, str]:
    """The kit's podman configuration and temporary directory (beside its store), for every podman it runs."""
    return {"CONTAINERS_CONF": str(IMAGES / "containers.conf"), "TMPDIR": str(CACHE / "store" / "tmp")}


def _render_release(layout: dict[str, Path], found: str, profile: str, model: Path, port: int) -> None:
    """The roles render the release (the same templates as a deploy), with this layout's paths."""
    extra = {
        "ansible_python_interpreter": sys.executable,
        "glmdeploy_profile": profile,
        "glmdeploy_image": found,
        "glmdeploy_podman": podman_command(CACHE),
        "glmdeploy_user": SMOKE_USER,
        "glmdeploy_etc_dir": str(layout["etc"]),
        "glmdeploy_log_dir": str(layout["log"]),
        "glmdeploy_state_dir": str(layout["state"]),
        "image_smoke_release": str(layout["release"]),
        "model_dir": str(model),
        "model_source_dir": str(model),
        "vllm_server_port": port,
        "vllm_server_log_file": str(layout["log"] / "vllm_server.log"),
        "python_env_run_volumes": [
            f"{layout['log']}:{layout['log']}:ro",
            f"{layout['state']}:{layout['state']}",
            f"{layout['reports']}:{layout['reports']}",
        ],
    }
    playbook = Path(sys.executable).with_name("ansible-playbook")
    proc = subprocess.run(
        [str(playbook), "-i", "localhost,", str(ROOT / "playbooks/image_smoke.yml"), "-e", json.dumps(extra)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ImageError(f"rendering the release failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")


def _wait_ready(layout: dict[str, Path], server: subprocess.Popen[bytes], timeout_s: int, log_file: Path) -> None:
    """The kit's readiness check, in the image; stops at once when the launcher exits."""
    node = layout["release"] / "node.json"
    log(f"waiting for a real generation (up to {timeout_s} s)")
    argv = [str(layout["release"] / "bin/run"), "glmdeploy-ready", "--config", str(node)]
    ready = subprocess.Popen(
        [*argv, "--timeout", str(timeout_s), "--log", str(log_file)], env={**os.environ, **_podman_env()}
    )
    while ready.poll() is None:
        if server.poll() is not None:
            ready.kill()
            ready.wait()
            tail = log_file.read_text(errors="replace")[-3000:]
            raise ImageError(f"the image's server exited ({server.returncode}) before it was ready:\n{tail}")
        time.sleep(1)
    if ready.returncode != 0:
        raise ImageError(f"the image's server did not become ready:\n{log_file.read_text(errors='replace')[-3000:]}")


def _run_suite(layout: dict[str, Path], throughput: bool) -> dict[str, object]:
    """The smoke suite the image carries, then the fingerprint, both through the release's bin/run."""
    run = str(layout["release"] / "bin/run")
    node = str(layout["release"] / "node.json")
    env = {
        **os.environ,
        **_podman_env(),
        "GLMDEPLOY_NODE_CONFIG": node,
        "SMOKE_JSON": str(layout["reports"] / "smoke.json"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    log("running the smoke suite in the image")
    suite = "/opt/glmdeploy/smoke_tests"
    argv = [run, "python", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", suite]
    argv += [] if throughput else [f"--ignore={suite}/test_throughput.py"]
    proc = subprocess.run(
        [*argv, f"--junitxml={layout['reports']}/smoke.xml"], env=env, capture_output=True, text=True, check=False
    )
    print(proc.stdout[-4000:], end="", flush=True)
    fp = [run, "glmdeploy-fingerprint", "--config", node, "--release", str(layout["release"])]
    fp += ["--golden-dir", f"{suite}/golden", "--output", str(layout["reports"] / "fingerprint.json")]
    subprocess.run(fp, env=env, check=True)
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    return {"rc": proc.returncode, "summary": last[0], "tail": (proc.stdout + proc.stderr)[-3000:]}


def _stop(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM as a unit's stop sends it (podman passes it on; --init ends the server's group);
    then no container of the launcher's name may be left."""
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    name = registry.load().unit_name("vllm_server")  # the launcher's --name (roles/vllm_server)
    if podman("container", "exists", name, check=False).returncode == 0:
        podman("rm", "--force", "--time", "10", name)
        raise ImageError(f"container {name} outlived its launcher's SIGTERM (removed now)")


def _tree_digest(path: Path) -> str:
    parts = [f"{p.relative_to(path)}:{file_sha256(p)}" for p in sorted(path.rglob("*")) if p.is_file()]
    return digest_of(*parts)


def _image_name(value: str) -> str:
    """An image name, or the `name` of the JSON file `make image` wrote."""
    path = Path(value)
    return str(json.loads(path.read_text())["name"]) if value.endswith(".json") and path.is_file() else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy_control.image", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="build (or find, by its inputs' digest) a profile's image")
    p.add_argument("--profile", required=True)
    p.add_argument("--python", help="the image's Python minor version (default: the registry's [kit.image] python)")
    p.add_argument("--wheelhouse", type=Path, required=True, help="the profile's wheelhouse (make wheelhouse)")
    p.add_argument("--force", action="store_true", help="build again although an image of these inputs exists")
    p.add_argument("--archive", type=Path, help="also write its archive for nodes into this directory (see save)")
    p.add_argument("--json", type=Path, help="write the image's name, ID and labels here")
    q = sub.add_parser("smoke", help="run a built image as a node would and pass the smoke suite in it")
    q.add_argument("--profile", required=True)
    q.add_argument("--image", required=True, help="the image's name or ID (make image writes it to its --json)")
    q.add_argument("--model", type=Path, required=True, help="the model directory to mount read-only")
    q.add_argument("--port", type=int, default=18000, help="the server's port here (default %(default)s)")
    q.add_argument("--timeout", type=int, default=900, help="seconds to wait for a real generation")
    q.add_argument("--reports", type=Path, required=True, help="where the suite's reports and fingerprint go")
    q.add_argument("--no-throughput", action="store_true", help="leave the throughput check out (a busy machine)")
    q.add_argument("--json", type=Path, help="write the summary here")
    v = sub.add_parser("save", help="write an image as a zstd OCI archive with its SHA256 and ID (for nodes)")
    v.add_argument("--image", required=True, help="the image's name or ID (or the --json of make image)")
    v.add_argument("--out", type=Path, required=True, help="directory of the archives (artifacts/images)")
    v.add_argument("--json", type=Path, help="write the archive's name, SHA256 and image ID here")
    args = parser.parse_args(argv)
    result: dict[str, object]
    try:
        if args.command == "save":
            result = dict(save(_image_name(args.image), args.out))
        elif args.command == "smoke":
            result = smoke(
                _image_name(args.image),
                args.profile,
                args.model,
                args.port,
                args.timeout,
                args.reports,
                throughput=not args.no_throughput,
            )
        else:
            python = args.python or registry.load().kit.image.python
            result = dict(build(args.profile, python, args.wheelhouse, args.force))
            if args.archive:
                result["archive"] = save(str(result["name"]), args.archive)
    except (ImageError, registry.RegistryError, apt_sources.NoMirror) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
