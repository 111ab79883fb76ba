"""Serve the control node's artifacts to the nodes for the length of one command (make deploy, rollout).

Nodes have no internet: they install from the control node's wheelhouse and environment packs
over HTTP (pip needs an HTTP find-links index for a remote node). A server the user starts by
hand is one more step to forget, stays open after the run and used to serve all of artifacts/,
the API key included. This one:

- starts only when the inventory has a node that is not this machine and has no
  ``glmdeploy_artifact_url`` of its own (a lab mirror);
- binds only the control node's address that each such node is routed to (``ip route get``),
  never every interface;
- serves ``wheelhouse/`` (pip's find-links) and ``apt/`` (the kit's signed apt repositories and
  their public key) over HTTP read-only, nothing else: ``secrets/`` and every other tree answer 404;
- tells the playbook each node's URL in ``GLMDEPLOY_ARTIFACT_URLS`` (a JSON map, read by the
  ``glmdeploy`` role's defaults); preflight checks every node reaches it before anything changes;
- serves artifacts/ through an rsync daemon (Debian's rsync) on the same addresses, to those
  nodes' addresses only, read-only, ``secrets/`` and dot-files excluded: the artifact stores
  (staged models, environment packs, image archives) resume a cut transfer, which plain HTTP
  from this server could not (``GLMDEPLOY_ARTIFACT_RSYNC``, read by the ``glmdeploy`` role's
  fan-out; the control node is every node's last source, after the nodes that hold a store);
- stops when the command ends, however it ends.

Usage: ``python -m glmdeploy_control.artifact_server --root artifacts --inventory INV -- COMMAND [ARG...]``
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from glmdeploy_control.wrapped import command_of, run_child, wrapper_parser

URLS_VAR = "GLMDEPLOY_ARTIFACT_URLS"
RSYNC_VAR = "GLMDEPLOY_ARTIFACT_RSYNC"
#: The trees a node fetches over HTTP: pip's find-links and the kit's apt repositories (artifact
#: stores come by rsync: serve_rsync).
SERVED = ("wheelhouse", "apt")
LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}
#: The hosts the kit installs on: nodes (wheels, packages, stores), balancers and monitoring hosts
#: (the kit's apt repository).
GROUPS = ("glmdeploy_nodes", "glmdeploy_lb", "glmdeploy_monitor")


class ArtifactError(Exception):
    """A problem the user fixes (named, with the fix)."""


def log(message: str) -> None:
    print(f"==> {message}", flush=True)


class Handler(SimpleHTTPRequestHandler):
    """Read-only files and listings under SERVED; everything else 404, no request log on stdout."""

    log_file: Any = None

    def send_head(self) -> Any:  # the one hook for both GET and HEAD
        # Judged on the path the base class would open (after %-decoding and `..`), never on the
        # request text: /wheelhouse/../secrets/api_key must not reach the key.
        root = Path(self.directory).resolve()
        target = Path(self.translate_path(self.path)).resolve()
        if not any(target == root / top or (root / top) in target.parents for top in SERVED):
            self.send_error(404, "not served")
            return None
        return super().send_head()

    def log_message(self, format: str, *args: Any) -> None:
        if self.log_file is not None:
            self.log_file.write(f"{self.address_string()} {format % args}\n")
            self.log_file.flush()


def inventory_nodes(inventory: str) -> dict[str, dict[str, Any]]:
    """hostvars of every host in the inventory (ansible-inventory --list: the inventory as Ansible reads it)."""
    out = subprocess.run(["ansible-inventory", "-i", inventory, "--list"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ArtifactError(f"cannot read the inventory {inventory}: {out.stderr.strip()[-500:]}")
    data = json.loads(out.stdout)
    hostvars: dict[str, dict[str, Any]] = data.get("_meta", {}).get("hostvars", {})
    hosts = set().union(*(_hosts_of(data, group) for group in GROUPS))
    return {h: hostvars.get(h, {}) for h in sorted(hosts)}


def _hosts_of(data: dict[str, Any], group: str) -> set[str]:
    entry = data.get(group, {})
    hosts = set(entry.get("hosts", []))
    for child in entry.get("children", []):
        hosts |= _hosts_of(data, child)
    return hosts


def needs_server(name: str, hostvars: dict[str, Any]) -> bool:
    if hostvars.get("ansible_connection") == "local" or name in LOCAL_NAMES:
        return False
    return not str(hostvars.get("glmdeploy_artifact_url", "")).strip()


def node_ip(name: str, address: str) -> str:
    """The node's IP address (its ansible_host resolved here)."""
    try:
        return str(ipaddress.ip_address(socket.getaddrinfo(address, None)[0][4][0]))
    except (socket.gaierror, ValueError) as err:
        raise ArtifactError(f"node {name}: cannot resolve its address {address!r} ({err}); fix: ansible_host") from err


def source_address(name: str, ip: str) -> str:
    """This machine's address on the route to the node at `ip`: where the node can reach us."""
    out = subprocess.run(["ip", "route", "get", str(ip)], capture_output=True, text=True, check=False)
    match = re.search(r"\bsrc (\S+)", out.stdout)
    if out.returncode != 0 or not match:
        raise ArtifactError(
            f"node {name} ({ip}): this control node has no route to it ({out.stderr.strip() or out.stdout.strip()}); "
            "fix: the node's ansible_host, or this machine's network"
        )
    return match.group(1)


def _sources(nodes: dict[str, dict[str, Any]]) -> tuple[dict[str, str], dict[str, str]]:
    """Each node's route source address and its IP (rsync's allow list); a node whose address
    this machine cannot resolve here (a templated ansible_host, an ssh_config alias) is left out
    and named: preflight then stops it, since it has no artifact URL, before anything changes."""
    sources, ips = {}, {}
    for name, hostvars in nodes.items():
        address = str(hostvars.get("ansible_host", name))
        if "{{" in address:
            print(f"==> node {name}: its ansible_host is a template ({address}); not served", flush=True)
            continue
        try:
            ip = node_ip(name, address)
            sources[name], ips[name] = source_address(name, ip), ip
        except ArtifactError as err:
            print(f"==> {err}; not served", flush=True)
    return sources, ips


def serve(root: Path, addresses: list[str], port: int, log_path: Path) -> tuple[list[ThreadingHTTPServer], int]:
    """One server per address, all on one port (the first bind picks it when port is 0)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    handler = type("BoundHandler", (Handler,), {"log_file": log_path.open("a")})
    servers: list[ThreadingHTTPServer] = []
    for address in addresses:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
        try:
            server = server_class((address, port), functools.partial(handler, directory=str(root)))
        except OSError as err:
            for started in servers:
                started.server_close()
            raise ArtifactError(
                f"cannot serve artifacts on {address}:{port} ({err.strerror}); "
                "fix: free that port or choose another with ARTIFACT_PORT=..."
            ) from err
        port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    return servers, port


def serve_rsync(
    root: Path, addresses: list[str], clients: list[str], workdir: Path, log_path: Path
) -> tuple[list[subprocess.Popen[bytes]], int]:
    """One rsync daemon per address, all on one free port: module ``artifacts`` read-only to clients."""
    if shutil.which("rsync") is None:
        raise ArtifactError(
            "rsync is not installed on this control node; fix: apt install rsync (nodes fetch artifact stores with it)"
        )
    conf = workdir / "rsyncd.conf"
    conf.write_text(
        f"use chroot = no\nuid = {os.getuid()}\ngid = {os.getgid()}\n"
        f"[artifacts]\n  path = {root}\n  read only = yes\n  list = no\n"
        f"  hosts allow = {' '.join(clients)}\n  hosts deny = *\n  exclude = /secrets/ .*\n",
        encoding="utf-8",
    )
    with socket.socket() as probe:
        probe.bind((addresses[0], 0))
        port = int(probe.getsockname()[1])
    procs = []
    for address in addresses:
        argv = ["rsync", "--daemon", "--no-detach", f"--config={conf}", f"--address={address}", f"--port={port}"]
        procs.append(subprocess.Popen([*argv, f"--log-file={log_path}"], stdin=subprocess.DEVNULL))
        if not _listening(address, port, procs[-1]):
            for proc in procs:
                proc.terminate()
            raise ArtifactError(f"rsync could not serve artifacts on {address}:{port} (see {log_path}); fix: that port")
    return procs, port


def _listening(address: str, port: int, proc: subprocess.Popen[bytes], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection((address, port), 0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def reports_dir() -> Path:
    """The run's reports directory: `make REPORTS=...` exports it (one per run going on at the same time)."""
    return Path(os.environ.get("GLMDEPLOY_REPORTS", "reports"))


def _url(address: str, port: int, scheme: str = "http") -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


def run(root: Path, inventory: str, port: int, command: list[str]) -> int:
    nodes = {name: hv for name, hv in inventory_nodes(inventory).items() if needs_server(name, hv)}
    env = dict(os.environ)
    servers: list[ThreadingHTTPServer] = []
    daemons: list[subprocess.Popen[bytes]] = []
    workdir = tempfile.TemporaryDirectory(prefix="glmdeploy-artifacts-")
    if nodes:
        if not root.is_dir():
            raise ArtifactError(f"{root} does not exist: nothing to serve; fix: run from the kit's checkout")
        sources, ips = _sources(nodes)
        servers, port = serve(root, sorted(set(sources.values())), port, reports_dir() / "artifact-server.log")
        urls = {name: _url(address, port) for name, address in sources.items()}
        env[URLS_VAR] = json.dumps(urls, sort_keys=True)
        where = ", ".join(sorted({_url(a, port) for a in sources.values()}))
        log(f"serving {root}/wheelhouse and {root}/apt to {len(urls)} host(s) at {where} for this run")
        clients = sorted(set(ips.values()))
        if sources:
            daemons, rport = serve_rsync(
                root,
                sorted(set(sources.values())),
                clients,
                Path(workdir.name),
                reports_dir() / "artifact-rsync.log",
            )
            rsync_urls = {n: _url(a, rport, "rsync") + "/artifacts" for n, a in sources.items()}
            env[RSYNC_VAR] = json.dumps(rsync_urls, sort_keys=True)
            what = f"the artifact stores under {root} (models, environment packs, image archives)"
            log(f"serving {what} over rsync on port {rport} to {', '.join(clients)}")
    try:
        return run_child(command, env=env)
    finally:
        for daemon in daemons:
            daemon.terminate()
            daemon.wait(timeout=10)
        workdir.cleanup()
        for server in servers:
            server.shutdown()
            server.server_close()
        if servers:
            log("artifact server stopped")


def main(argv: list[str] | None = None) -> int:
    parser = wrapper_parser(
        "python -m glmdeploy_control.artifact_server",
        "Run COMMAND while the nodes of INVENTORY can fetch ROOT's wheelhouse/ and releases/ "
        "over HTTP from this machine; the server stops when COMMAND ends.",
    )
    parser.add_argument("--root", type=Path, default=Path("artifacts"), help="artifacts directory (default artifacts)")
    parser.add_argument("--port", type=int, default=0, help="TCP port (default 0: a free one)")
    args = parser.parse_args(argv)
    command = command_of(parser, args)
    try:
        return run(args.root.resolve(), args.inventory, args.port, command)
    except ArtifactError as err:
        print(f"ERROR: {err}. Nothing was changed.", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
