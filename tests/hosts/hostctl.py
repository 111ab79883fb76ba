#!/usr/bin/env python3
"""Fresh Debian 12 (and Debian 13) test hosts booting systemd, each in its own network namespace.

Why: "make deploy to a fresh server" is a claim about machines that are not the
control node. Without a Docker engine, each host here is an overlay on a cached
debootstrapped rootfs, booted by systemd-nspawn inside its own network
namespace on a private bridge, reached by Ansible over SSH. Hosts are air-gapped: no
default route and no apt proxy; they reach only the controller's bridge address, where
`make deploy` serves its artifacts for the run (the kit's apt repository among them: every
distribution package a deploy installs comes from there). Their root filesystem is the
release's minimal base plus what the kit asks of a node before it runs (BASE_PACKAGES: systemd,
SSH, sudo, Python), debootstrapped on the controller from its own mirror, and nothing of the
kit's. Everything is torn down by recorded PID.

Debian 13 hosts (`up N --debian13 K`: the last K) run Python 3.13, which the kit's locks do not
support: they run their releases from the kit's image (glmdeploy_runtime=container in the
inventory). Two things of the test harness, not of the kit, let podman run inside nspawn there: a
containers.conf drop-in (no session keyring, no cgroups of its own: nspawn gives neither) and the
kit's image store on a directory of this machine bound in (overlay cannot stack on the host's
overlay root). Each host gets CAP_NET_ADMIN (nspawn grants it only with a network namespace of
its own making): the kit's node firewall loads nftables rules there, in the host's own network
namespace.

Usage (root): hostctl.py up N [--debian13 K] | down | status | golden | reboot NAME [--power-cut]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from glmdeploy_control import apt_sources

ROOT = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("GLMDEPLOY_HOSTS_STATE", "/var/lib/glmdeploy-hosts"))
CACHE = Path(os.environ.get("GLMDEPLOY_HOSTS_CACHE", "/var/cache/glmdeploy-hosts"))
BRIDGE = "glmbr0"
SUBNET = "10.77.0"
CONTROLLER = f"{SUBNET}.1"
#: What a node has before the kit runs (the README's "each node needs SSH, sudo and Python"), on
#: debootstrap's minimal base: the kit installs everything else from its apt repository.
#: iproute2 and procps are the harness's own (its waits and the drills read them).
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "sudo",
    "python3",
    "iproute2",
    "procps",
    "ca-certificates",
)
CGROUP_HIERARCHIES = ("systemd", "unified")
# Bumped whenever finish_golden() changes what a golden rootfs contains (a new cache key).
GOLDEN_REVISION = "3"
#: The Debian suites a test host can run, by name (the first is the default).
SUITES = {"bookworm": "Debian 12", "trixie": "Debian 13"}
#: Podman inside an nspawn host: no session keyring and no cgroups of its own (nspawn allows
#: neither); the test harness's setting, never the kit's (a real server has both).
NSPAWN_CONTAINERS_CONF = '[containers]\nkeyring = false\ncgroups = "disabled"\n'
#: Where the kit keeps its image store on a node (glmdeploy_podman's --root): bound from this
#: machine's disk, since overlay cannot stack on the host's overlay root.
IMAGE_STORE = "/opt/glmdeploy/images"


#: Who made the hosts up: the test session's PID and start time (the end-to-end tests set
#: GLMDEPLOY_HOSTS_OWNER to their own PID), or none for `make hosts` by hand. Hosts whose session
#: has ended were left by a run killed before its teardown: the next `up` removes them.
OWNER = STATE / "owner.json"


class HostError(RuntimeError):
    """A failure with a message for the person running the harness."""


def run(*cmd: str, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, text=True, capture_output=True, **kw)  # type: ignore[call-overload]


def log(msg: str) -> None:
    print(f"[hosts] {msg}", flush=True)


# ---------------------------------------------------------------- mirrors
def debian_mirror() -> str:
    """The Debian archive this machine uses (for bookworm): the same archive carries every
    release, so a Debian 13 host is made from it too."""
    try:
        return apt_sources.debian_mirror("bookworm")
    except apt_sources.NoMirror as exc:
        raise HostError(str(exc)) from exc


# ---------------------------------------------------------------- golden rootfs
def golden_dir(suite: str = "bookworm") -> Path:
    key = hashlib.sha256(" ".join([GOLDEN_REVISION, *sorted(PACKAGES)]).encode()).hexdigest()[:12]
    return CACHE / f"golden-{suite}-{key}"


def ensure_golden(suite: str = "bookworm") -> Path:
    """Build the golden rootfs once; a second caller (CI prefetches it in the background) waits for the first."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".golden.lock").open("w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        return _build_golden(suite)


def _build_golden(suite: str) -> Path:
    golden = golden_dir(suite)
    rootfs = golden / "rootfs"
    if (golden / "ready").exists():
        return rootfs
    if not shutil.which("debootstrap") or not shutil.which("systemd-nspawn"):
        raise HostError("debootstrap and systemd-nspawn are needed: apt install debootstrap systemd-container")
    shutil.rmtree(golden, ignore_errors=True)
    golden.mkdir(parents=True)
    log(f"building the golden {SUITES[suite]} rootfs in {rootfs} (about a minute, cached afterwards)")
    start = time.monotonic()
    proc = run(
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        suite,
        str(rootfs),
        debian_mirror(),
        check=False,
    )
    if proc.returncode != 0:
        raise HostError(f"debootstrap failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    finish_golden(rootfs, suite)
    (golden / "ready").write_text(f"{time.monotonic() - start:.1f}\n")
    log(f"golden rootfs ready in {time.monotonic() - start:.0f}s")
    return rootfs


def finish_golden(rootfs: Path, suite: str = "bookworm") -> None:
    """Make the rootfs a template: no identity of its own, and apt sources no host can reach."""
    for key in rootfs.glob("etc/ssh/ssh_host_*"):
        key.unlink()
    (rootfs / "etc/machine-id").write_text("")
    # The controller's Debian suites (release, updates, security), as a real server has them;
    # roles add components (the driver's non-free) to these same suites.
    # A Debian 13 host takes the same archives' trixie suites.
    suites = sorted(
        {
            (uri, name.replace("bookworm", suite))
            for uri, name in apt_sources.apt_mirrors()
            if name.split("-")[0] == "bookworm"
        }
    )
    (rootfs / "etc/apt/sources.list").write_text("".join(f"deb {uri} {name} main\n" for uri, name in suites))
    if suite == "trixie":  # the container runtime's hosts
        conf = rootfs / "etc/containers/containers.conf.d/50-nspawn-test-host.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(NSPAWN_CONTAINERS_CONF)
    # No TTY on the console pipe: a getty there would respawn forever.
    wants = rootfs / "etc/systemd/system/getty.target.wants"
    shutil.rmtree(wants, ignore_errors=True)
    run("chroot", str(rootfs), "apt-get", "clean")


# ---------------------------------------------------------------- network and servers
def ensure_bridge() -> None:
    if run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{CONTROLLER}/24", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")


def start_server(name: str, argv: list[str]) -> None:
    pidfile = STATE / f"{name}.pid"
    if pidfile.exists() and Path(f"/proc/{pidfile.read_text().strip()}").exists():
        return
    logf = (STATE / f"{name}.log").open("ab")
    proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    pidfile.write_text(str(proc.pid))


def wait_port(host: str, port: int, timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            with socket.create_connection((host, port), timeout=1):
                return time.monotonic() - start
        except OSError:
            time.sleep(0.1)
    raise HostError(f"{what} did not answer on {host}:{port} within {timeout:.0f}s")


# ---------------------------------------------------------------- hosts
def host_names(count: int) -> list[str]:
    return [f"testhost{i}" for i in range(1, count + 1)]


def host_ip(name: str) -> str:
    return f"{SUBNET}.{10 + int(name.removeprefix('testhost'))}"


def ensure_key() -> Path:
    key = STATE / "id_ed25519"
    if not key.exists():
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "glmdeploy-test-hosts", "-f", str(key))
    return key


def prepare_root(name: str, golden: Path, key: Path) -> Path:
    hdir = STATE / name
    for sub in ("upper", "work", "merged"):
        (hdir / sub).mkdir(parents=True, exist_ok=True)
    merged = hdir / "merged"
    run(
        "mount",
        "-t",
        "overlay",
        "overlay",
        "-o",
        f"lowerdir={golden},upperdir={hdir / 'upper'},workdir={hdir / 'work'}",
        str(merged),
    )
    (merged / "etc/machine-id").write_text(run("systemd-id128", "new").stdout)
    (merged / "etc/hostname").write_text(name + "\n")
    (merged / "etc/hosts").write_text(f"127.0.0.1 localhost\n{host_ip(name)} {name}\n{CONTROLLER} controller\n")
    run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(merged / "etc/ssh/ssh_host_ed25519_key"))
    ssh = merged / "root/.ssh"
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    (ssh / "authorized_keys").chmod(0o600)
    return merged


def setup_netns(name: str) -> None:
    ns, veth = f"glm-{name}", f"v{name}"
    run("ip", "netns", "add", ns)
    run("ip", "link", "add", veth, "type", "veth", "peer", "name", "host0", "netns", ns)
    run("ip", "link", "set", veth, "master", BRIDGE, "up")
    run("ip", "-n", ns, "addr", "add", f"{host_ip(name)}/24", "dev", "host0")
    run("ip", "-n", ns, "link", "set", "host0", "up")
    run("ip", "-n", ns, "link", "set", "lo", "up")


def boot(name: str, merged: Path, binds: tuple[str, ...] = ()) -> int:
    """Start systemd-nspawn in a private mount namespace and its own cgroup; return the launcher PID."""
    cgroups = [Path("/sys/fs/cgroup") / h / f"glmdeploy-{name}" for h in CGROUP_HIERARCHIES]
    for cg in cgroups:
        if cg.parent.exists():
            cg.mkdir(exist_ok=True)
    join = " ".join(f"echo $$ > {cg}/cgroup.procs;" for cg in cgroups if cg.exists())
    script = (
        f"{join} mkdir -p /run/systemd/nspawn && mount -t tmpfs tmpfs /run/systemd/nspawn && "
        f"exec systemd-nspawn -q -D {merged} -M {name} -b --register=no --keep-unit "
        f"--network-namespace-path=/run/netns/glm-{name} --capability=CAP_NET_ADMIN "
        "--resolv-conf=off --timezone=off --console=pipe" + "".join(f" --bind={bind}" for bind in binds)
    )
    logf = (STATE / name / "console.log").open("ab")
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=logf,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    (STATE / name / "pid").write_text(str(proc.pid))
    return proc.pid


def write_inventory(names: list[str], key: Path, suites: dict[str, str] | None = None) -> Path:
    suites = suites or {}
    lines = [
        "# Written by tests/hosts/hostctl.py: throwaway test hosts, removed by `make hosts-down`.",
        "# Debian 13 hosts run Python 3.13, which no lock supports: their releases run the kit's image.",
        "[glmdeploy_nodes]",
    ]
    lines += [
        f"{n} ansible_host={host_ip(n)}" + (" glmdeploy_runtime=container" if suites.get(n) == "trixie" else "")
        for n in names
    ]
    lines += [
        "",
        "[glmdeploy_nodes:vars]",
        "ansible_user=root",
        f"ansible_ssh_private_key_file={key}",
        "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR'",
        "ansible_python_interpreter=/usr/bin/python3",
        "# The hosts share this machine's CPUs: one throughput check at a time, and vLLM's CPU",
        "# workers not pinned (each host would pin its worker to core 0: three workers on one core).",
        "smoke_throttle=1",
        'vllm_server_extra_env="{{ glmdeploy_registry.profiles[glmdeploy_profile].runtime.extra_env'
        " | combine({'VLLM_CPU_OMP_THREADS_BIND': 'nobind'}) }}\"",
        "# Served on the bridge, behind the balancer on the first host: the API then requires the key.",
        "vllm_server_host={{ ansible_host }}",
        "chat_ui_host={{ ansible_host }}",
        "",
        "[glmdeploy_lb]",
        names[0],
    ]
    inventory = STATE / "inventory.ini"
    inventory.write_text("\n".join(lines) + "\n")
    return inventory


def started(pid: int) -> str | None:
    """A live process's start time (field 22 of /proc/PID/stat: a PID alone may have been reused);
    None for one that has ended (a zombie too: nothing may reap it where PID 1 is not an init)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def record_owner() -> None:
    pid = os.environ.get("GLMDEPLOY_HOSTS_OWNER", "")
    owner = {"pid": int(pid), "started": started(int(pid))} if pid.isdigit() else {"pid": None}
    OWNER.write_text(json.dumps(owner) + "\n")


def remove_leftovers() -> None:
    """Remove hosts that a test session left behind when it was killed before its teardown; refuse
    to touch hosts made by hand or in use by a session that still runs."""
    hosts = sorted(p.name for p in STATE.glob("testhost*") if p.is_dir())
    if not hosts:
        return
    owner = json.loads(OWNER.read_text()) if OWNER.exists() else {}
    pid = owner.get("pid")
    if "pid" in owner and pid is None:
        raise HostError(f"{', '.join(hosts)} (made by `make hosts`) are up: run `make hosts-down` first")
    if pid is not None and started(pid) == owner.get("started"):
        raise HostError(
            f"{', '.join(hosts)} are in use by a test run that is still going (PID {pid}): "
            "wait for it to end, or stop it and run `make hosts-down`"
        )
    why = f"its run (PID {pid}) has ended" if pid is not None else "no run is recorded as their owner"
    log(f"removing {', '.join(hosts)}, left up by an earlier run: {why}")
    down()


def up(count: int, debian13: int = 0) -> dict[str, object]:
    """`count` hosts; the last `debian13` of them run Debian 13 (the others Debian 12)."""
    if os.geteuid() != 0:
        raise HostError("test hosts need root (network namespaces, overlay mounts, nspawn)")
    if not 0 <= debian13 <= count:
        raise HostError(f"--debian13 must be between 0 and N ({count})")
    start = time.monotonic()
    STATE.mkdir(parents=True, exist_ok=True)
    names = host_names(count)
    suites = {name: ("trixie" if i >= count - debian13 else "bookworm") for i, name in enumerate(names)}
    goldens = {suite: ensure_golden(suite) for suite in sorted(set(suites.values()))}
    golden_s = time.monotonic() - start
    remove_leftovers()
    key = ensure_key()
    ensure_bridge()
    record_owner()
    t0 = time.monotonic()
    for name in names:
        if (STATE / name / "pid").exists():
            raise HostError(f"{name} already exists: run `make hosts-down` first")
        merged = prepare_root(name, goldens[suites[name]], key)
        setup_netns(name)
        store = STATE / name / "images"
        store.mkdir(exist_ok=True)
        boot(name, merged, binds=(f"{store}:{IMAGE_STORE}",) if suites[name] == "trixie" else ())
    for name in names:
        wait_port(host_ip(name), 22, 60, f"sshd on {name}")
    for name in names:
        wait_running(name, key)
    created_s = time.monotonic() - t0
    inventory = write_inventory(names, key, suites)
    report = {
        "hosts": names,
        "suites": suites,
        "inventory": str(inventory),
        "golden_s": round(golden_s, 1),
        "create_s": round(created_s, 1),
    }
    (STATE / "hosts.json").write_text(json.dumps(report, indent=2))
    log(f"{count} host(s) up in {created_s:.1f}s (golden rootfs {golden_s:.1f}s); inventory: {inventory}")
    return report


def host_binds(name: str) -> tuple[str, ...]:
    """What `up` bound into the host: the kit's image store, on Debian 13 hosts only."""
    suites = json.loads((STATE / "hosts.json").read_text()).get("suites", {}) if (STATE / "hosts.json").exists() else {}
    return (f"{STATE / name / 'images'}:{IMAGE_STORE}",) if suites.get(name) == "trixie" else ()


def wait_gone(pid: int, timeout: float) -> bool:
    """Until the launcher `pid` has ended (reaped here when this process started it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if started(pid) is None:
            return True
        time.sleep(0.1)
    return False


def reboot(name: str, power_cut: bool = False, timeout: float = 120) -> float:
    """Reboot one host and return the monotonic time its systemd was started again.

    A clean reboot is the host's own `systemctl reboot` (nspawn exits when its systemd asks for a
    reboot, so this starts it again, as firmware would). A power cut is every process of the host
    killed at once (SIGKILL through its cgroups, no shutdown). What the stand-in does not prove: the
    host shares this machine's kernel, so writes that were not yet on disk survive the "power cut"
    in the page cache; a real one loses them (the kit's own writes are whole-file renames).
    """
    hdir = STATE / name
    if not (hdir / "pid").exists():
        raise HostError(f"{name} is not up: run `make hosts N=...` first")
    pid = int((hdir / "pid").read_text().strip())
    if power_cut:
        kill_cgroups([name])
    else:
        ssh(name, ensure_key(), "systemctl reboot")
    if not wait_gone(pid, timeout):
        raise HostError(f"{name}: its systemd had not stopped {timeout:.0f}s after the reboot was asked for")
    kill_cgroups([name])  # a clean reboot leaves nothing; make sure before the next boot
    booted = time.monotonic()
    boot(name, hdir / "merged", binds=host_binds(name))
    log(f"{name}: {'power cut' if power_cut else 'rebooted'}, booting again")
    return booted


def ssh(name: str, key: Path, command: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return run(
        "ssh",
        "-i",
        str(key),
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "BatchMode=yes",
        f"root@{host_ip(name)}",
        command,
        check=check,
    )


def wait_running(name: str, key: Path, timeout: float = 60) -> None:
    start, state = time.monotonic(), ""
    while time.monotonic() - start < timeout:
        state = ssh(name, key, "systemctl is-system-running").stdout.strip()
        if state in ("running", "degraded"):
            if state == "degraded":
                failed = ssh(name, key, "systemctl --failed --no-legend --plain").stdout.strip()
                log(f"{name}: systemd degraded: {failed}")
            return
        time.sleep(0.3)
    raise HostError(f"{name}: systemd did not reach running within {timeout:.0f}s (last state: {state!r})")


def stop_pids(pidfiles: list[Path], timeout: float = 30) -> None:
    """SIGTERM every recorded process group at once (nspawn powers its host off), SIGKILL what is left."""
    pids = {}
    for pidfile in pidfiles:
        if pidfile.exists():
            pid = int(pidfile.read_text().strip())
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
                pids[pidfile] = pid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids.values()):
        for pid in pids.values():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    for pid in pids.values():
        if Path(f"/proc/{pid}").exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    for pidfile in pidfiles:
        pidfile.unlink(missing_ok=True)


def down() -> None:
    if not STATE.exists():
        log("no test hosts")
        return
    hosts = sorted(p for p in STATE.glob("testhost*") if p.is_dir())
    start = time.monotonic()
    # Throwaway hosts: 3 s to power off, then every process left in each host's cgroups is
    # killed (killing nspawn alone leaves the host's systemd and services running, and a
    # graceful stop of vLLM can take 30 s).
    stop_pids([hdir / "pid" for hdir in hosts], timeout=3)
    log(f"hosts powered off or signalled ({time.monotonic() - start:.1f}s)")
    kill_cgroups([hdir.name for hdir in hosts])
    log(f"no process left in the hosts' cgroups ({time.monotonic() - start:.1f}s)")
    for hdir in hosts:
        name = hdir.name
        run("umount", "-l", str(hdir / "merged"), check=False)
        run("ip", "link", "del", f"v{name}", check=False)
        run("ip", "netns", "del", f"glm-{name}", check=False)
        for h in CGROUP_HIERARCHIES:
            cg = Path("/sys/fs/cgroup") / h / f"glmdeploy-{name}"
            if cg.exists():
                remove_cgroup(cg)
        # The overlay's upper dir holds GBs of small files: move it aside and delete it in the background.
        trash = STATE / f".trash-{name}-{time.time_ns()}"
        hdir.rename(trash)
        # Not holding the caller's output pipes: `make hosts-down` returns without waiting for the rm.
        subprocess.Popen(
            ["rm", "-rf", str(trash)], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        log(f"{name} removed ({time.monotonic() - start:.1f}s)")
    log(f"controller services stopped ({time.monotonic() - start:.1f}s)")
    run("ip", "link", "del", BRIDGE, check=False)
    for leftover in [*STATE.glob("inventory*.ini"), STATE / "hosts.json", OWNER]:
        leftover.unlink(missing_ok=True)


def kill_cgroups(names: list[str], timeout: float = 10) -> None:
    """SIGKILL every process of these hosts (cgroup.kill where the kernel has it), then wait until none is left.

    All hosts are killed first and waited for together: a vLLM host takes seconds to release its memory.
    """
    groups = {name: [Path("/sys/fs/cgroup") / h / f"glmdeploy-{name}" for h in CGROUP_HIERARCHIES] for name in names}
    groups = {name: [cg for cg in cgs if cg.exists()] for name, cgs in groups.items()}
    for cg in (cg for cgs in groups.values() for cg in cgs):
        if (cg / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (cg / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + timeout
    while True:
        left = {
            name: {int(p) for cg in cgs for f in cg.rglob("cgroup.procs") for p in _read_pids(f)}
            for name, cgs in groups.items()
        }
        left = {name: pids for name, pids in left.items() if pids}
        if not left or time.monotonic() > deadline:
            break
        for pid in (pid for pids in left.values() for pid in pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for name, pids in left.items():
        log(f"{name}: processes {sorted(pids)} survived SIGKILL")


def _read_pids(procs: Path) -> list[str]:
    try:
        return procs.read_text().split()
    except OSError:
        return []


def remove_cgroup(cg: Path) -> None:
    for child in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            child.rmdir()
    try:
        cg.rmdir()
    except OSError as exc:
        log(f"could not remove {cg}: {exc}")


def status() -> None:
    for hdir in sorted(p for p in STATE.glob("testhost*") if p.is_dir()):
        pid = (hdir / "pid").read_text().strip() if (hdir / "pid").exists() else "?"
        alive = Path(f"/proc/{pid}").exists()
        print(f"{hdir.name}\t{host_ip(hdir.name)}\tpid {pid}\t{'up' if alive else 'DEAD'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("up", help="create N fresh hosts and write an inventory")
    p.add_argument("count", type=int)
    p.add_argument("--debian13", type=int, default=0, help="the last K hosts run Debian 13 (container runtime)")
    sub.add_parser("down", help="destroy every test host and the controller-side servers")
    sub.add_parser("status", help="list the hosts")
    sub.add_parser("golden", help="build (or reuse) the cached golden rootfs")
    p = sub.add_parser("reboot", help="reboot one host, or cut its power (--power-cut), and boot it again")
    p.add_argument("name")
    p.add_argument("--power-cut", action="store_true", help="kill every process of the host instead of a clean reboot")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "up":
            if not 1 <= args.count <= 20:
                raise HostError("N must be between 1 and 20")
            up(args.count, args.debian13)
        elif args.cmd == "down":
            down()
        elif args.cmd == "status":
            status()
        elif args.cmd == "reboot":
            reboot(args.name, args.power_cut)
            wait_port(host_ip(args.name), 22, 60, f"sshd on {args.name}")
            wait_running(args.name, ensure_key())
        else:
            ensure_golden()
    except HostError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"ERROR: {' '.join(exc.cmd)} failed: {exc.stderr.strip()}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
