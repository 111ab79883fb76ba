"""The full deploy on three fresh systemd hosts: converge, idempotence, real verification.

Hosts come from tests/hosts/hostctl.py (`make hosts N=3`): Debian 12 booting
systemd in their own network namespaces, reaching only the controller's apt
proxy and artifact server. Runs after test_deploy.py (file order), so the
localhost deployment is gone and the memory is free.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import FIGURES, ROOT, make

sys.path.insert(0, str(ROOT / "tests" / "hosts"))
import hostctl

STATE = hostctl.STATE
KEY = STATE / "id_ed25519"
HOSTS = ["testhost1", "testhost2", "testhost3"]


def on_host(host: str, command: str) -> subprocess.CompletedProcess[str]:
    return hostctl.ssh(host, KEY, command)


def recap(output: str) -> dict[str, dict[str, int]]:
    rows = {}
    for host, fields in re.findall(r"^(testhost\d+)\s*:\s*(ok=.*)$", output, re.M):
        rows[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", fields)}
    return rows


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
            time.sleep(0.5)


@pytest.fixture(scope="module")
def fleet():
    peak = MemoryPeak()
    peak.start()
    created = make("hosts", "N=3")
    assert created.returncode == 0, "make hosts failed"
    inventory = json.loads((STATE / "hosts.json").read_text())["inventory"]
    timings = {"create_s": json.loads((STATE / "hosts.json").read_text())["create_s"]}
    try:
        yield {"inventory": inventory, "timings": timings, "peak": peak}
    finally:
        peak.stop.set()
        FIGURES["3-host fleet (s)"] = timings
        FIGURES["peak memory used during the fleet test (MiB)"] = round(peak.peak_mib)
        make("hosts-down")


def test_full_deploy_converges_on_three_hosts(fleet):
    proc = make("deploy", f"INVENTORY={fleet['inventory']}", timeout=1500)
    fleet["timings"]["converge_s"] = round(proc.elapsed, 1)
    rows = recap(proc.stdout)
    assert proc.returncode == 0 and sorted(rows) == HOSTS
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in rows.values()), rows
    assert proc.stdout.count("smoke:  ") == 3 and " failed" not in re.sub(
        r"failed=0", "", proc.stdout.split("PLAY RECAP")[-1]
    )


def test_second_deploy_reports_no_change_on_any_host(fleet):
    proc = make("deploy", f"INVENTORY={fleet['inventory']}", timeout=900)
    fleet["timings"]["idempotent_rerun_s"] = round(proc.elapsed, 1)
    rows = recap(proc.stdout)
    assert proc.returncode == 0
    assert {h: r["changed"] for h, r in rows.items()} == dict.fromkeys(HOSTS, 0)


def test_verify_prints_one_table_for_the_identical_fleet(fleet):
    proc = make("verify", f"INVENTORY={fleet['inventory']}", timeout=600)
    fleet["timings"]["verify_3_hosts_s"] = round(proc.elapsed, 1)
    assert proc.returncode == 0, "make verify found differences on a freshly deployed fleet"
    assert "| field | testhost1 | testhost2 | testhost3 |" in proc.stdout


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
        "cd /tmp && PYTHONPATH=/opt/glmdeploy/current/app HF_HUB_OFFLINE=1 "
        "/opt/glmdeploy/current/venv/bin/python -m glmdeploy.chat --max-tokens 16 hello",
    )
    assert out.returncode == 0, out.stderr
    reply = out.stdout.split("assistant> ", 1)[1].strip()
    assert reply, "empty reply"


@pytest.mark.parametrize("host", HOSTS)
def test_hosts_have_no_route_out(fleet, host):
    out = on_host(host, "ip route show default; ip route")
    assert "default" not in out.stdout and "10.77.0.0/24" in out.stdout


# The balancer runs on testhost1 (hostctl's inventory puts it in glmdeploy_lb); the nodes
# listen on their bridge addresses, so the API requires the deployment's key.
LB_API = f"http://{hostctl.host_ip('testhost1')}:9000/v1"
KEY_FILE = ROOT / "artifacts" / "secrets" / "api_key"


def lb_generate(key: str | None, max_tokens: int = 8, timeout: float = 120) -> tuple[int, str]:
    """One streamed completion through the balancer: (HTTP status, text); status 0 on a broken stream."""
    body = {"model": "chatglm3-6b-32k", "prompt": [64790, 64792, 64795, 259, 13, 259, 1028, 3617, 64796]}
    body |= {"max_tokens": max_tokens, "stream": True}
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    req = urllib.request.Request(LB_API + "/completions", data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text, done = "", False
            for raw in resp:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    text += json.loads(line[6:])["choices"][0]["text"]
            return (resp.status if done else 0), text
    except urllib.error.HTTPError as err:
        return err.code, ""
    except (OSError, ValueError):
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
        "testhost2",
        "stat -c '%U %a' /etc/glmdeploy/vllm_server.env; stat -L -c '%U %G %a' /etc/glmdeploy/node.json; "
        "grep -c VLLM_API_KEY /etc/systemd/system/glmdeploy-vllm_server.service || true",
    )
    assert out.stdout.split() == ["root", "600", "root", "glmdeploy", "640", "0"], out.stdout
    leaked = [log.name for log in (ROOT / "reports" / "e2e-logs").glob("*.log") if key in log.read_text()]
    assert not leaked, f"the API key appears in {leaked}"


def test_drained_node_gets_no_requests_until_undrained(fleet):
    key = KEY_FILE.read_text().strip()
    drained = make("drain", f"INVENTORY={fleet['inventory']}", "HOST=testhost2")
    assert drained.returncode == 0, drained.stdout[-2000:]
    before = completions_served("testhost2")
    assert all(lb_generate(key, max_tokens=2)[0] == 200 for _ in range(9))
    assert completions_served("testhost2") == before, "a drained node was sent requests"
    back = make("undrain", f"INVENTORY={fleet['inventory']}", "HOST=testhost2")
    assert back.returncode == 0, back.stdout[-2000:]
    assert all(lb_generate(key, max_tokens=2)[0] == 200 for _ in range(9))
    assert completions_served("testhost2") > before, "an undrained node got no requests"
    refused = make("drain", f"INVENTORY={fleet['inventory']}", "HOST=nosuchhost")
    assert refused.returncode != 0 and "is not in the inventory group" in refused.stdout


def test_ui_behind_the_balancer_can_require_basic_auth(fleet, tmp_path):
    users = tmp_path / "users.json"  # a file, as an admin would keep it (never on a command line)
    users.write_text('{"load_balancer_ui_users": [{"name": "lab", "password": "drill-only"}]}')
    applied = make("lb", f"INVENTORY={fleet['inventory']}", f"ANSIBLE_ARGS=-e @{users}")
    assert applied.returncode == 0, applied.stdout[-2000:]
    assert "drill-only" not in applied.stdout, "a UI password was printed"
    ui = f"http://{hostctl.host_ip('testhost1')}:9501/"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(ui, timeout=30)
    assert refused.value.code == 401
    auth = {"Authorization": "Basic " + base64.b64encode(b"lab:drill-only").decode()}
    with urllib.request.urlopen(urllib.request.Request(ui, headers=auth), timeout=30) as page:
        assert page.status == 200 and b"streamlit" in page.read().lower()


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
        time.sleep(3)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(3)
        self.stop.set()
        for t in self.threads:
            t.join(timeout=150)

    @property
    def sent(self) -> int:
        return len(self.results)

    @property
    def failed(self) -> int:
        return sum(1 for status in self.results if status != 200)


def releases_of(host: str) -> dict:
    out = on_host(host, "PYTHONPATH=/opt/glmdeploy/current/app python3 -m glmdeploy.release status")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def drained_nodes() -> list[str]:
    return json.loads(on_host("testhost1", "cat /etc/glmdeploy/lb-drained.json").stdout)


def node_generates(host: str) -> bool:
    out = on_host(
        host,
        "cd /tmp && PYTHONPATH=/opt/glmdeploy/current/app /opt/glmdeploy/current/venv/bin/python -m glmdeploy.ready "
        "--config /etc/glmdeploy/node.json --timeout 300",
    )
    return out.returncode == 0


@pytest.mark.drill
def test_killed_vllm_is_restarted_while_the_balancer_routes_around_it(fleet):
    """Fault drill: two streams of chats through the balancer while one node's vLLM gets kill -9.

    The node has no route out (test_hosts_have_no_route_out): its restart also shows that a node
    cut off from the outside starts and serves, since nothing is fetched at run time.
    """
    assert "default" not in on_host("testhost3", "ip route show default").stdout
    with Load(KEY_FILE.read_text().strip()) as load:
        killed = on_host("testhost3", "kill -9 $(systemctl show -p MainPID --value glmdeploy-vllm_server)")
        assert killed.returncode == 0, killed.stderr
        start = time.monotonic()
        ready = node_generates("testhost3")
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
    "vllm_server_extra_args": ["--enforce-eager", "--distributed-executor-backend", "uni", "--max-num-seqs", "32"],
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
    before = {host: releases_of(host)["current"] for host in HOSTS}
    with Load(KEY_FILE.read_text().strip()) as load:
        proc = rollout(fleet, tmp_path)
    FIGURES["good rollout drill: requests sent / failed / rollout (s)"] = [load.sent, load.failed, round(proc.elapsed)]
    assert proc.returncode == 0, proc.stdout[-3000:]
    after = {host: releases_of(host) for host in HOSTS}
    assert all(after[h]["current"] != before[h] and after[h]["previous"] == before[h] for h in HOSTS), after
    # The id's last part digests each node's own config (its address); the rest is shared.
    assert len({after[h]["current"].rsplit("-", 1)[0] for h in HOSTS}) == 1, "the nodes ended on different releases"
    assert "releases per node" in proc.stdout and all(f"{h} " in proc.stdout for h in HOSTS)
    assert drained_nodes() == [], "a node was left out of the balancer"
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
    inventory.write_text(text.replace("testhost2 ansible_host=", f"testhost2 model_source_dir={bad} ansible_host="))
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
    gate = "failed its health gate on testhost2"
    assert gate in proc.stdout and "keeps failing to start" in proc.stdout, proc.stdout[-3000:]
    assert "the node is back on release " + before["testhost2"]["current"] in proc.stdout
    after = {host: releases_of(host) for host in HOSTS}
    assert after["testhost2"]["current"] == before["testhost2"]["current"]
    assert after["testhost2"]["previous"] == before["testhost2"]["previous"]
    known = {r["id"] for r in before["testhost2"]["releases"]}
    assert [r["state"] for r in after["testhost2"]["releases"] if r["id"] not in known] == ["failed"]
    assert after["testhost3"] == before["testhost3"], "the rollout went on past the failed node"
    assert not re.search(r"^testhost3\s*:", proc.stdout.split("PLAY RECAP")[1], re.M), "testhost3 was touched"
    assert drained_nodes() == [], "the rolled-back node was left out of the balancer"
    assert node_generates("testhost2")
    assert load.failed == 0, f"{load.failed} of {load.sent} user requests failed during the failed rollout"


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
def test_rollback_returns_the_fleet_to_the_previous_release_under_load(fleet):
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


# Each host gets its own breakage, made in place on the node the way drift happens in a lab
# (a hand edit, a stray upgrade, a corrupted copy). Backups are restored afterwards.
DRIFT = {
    "testhost1": """
p = '/opt/glmdeploy/current/model/tokenization_chatglm.py'
code = open(p).read()
swapped = code.replace('"<|user|>",', '"@@",', 1).replace('"<|assistant|>",', '"<|user|>",', 1)
swapped = swapped.replace('"@@",', '"<|assistant|>",', 1)
assert swapped != code
open(p, 'w').write(swapped)
""",
    "testhost2": """
import glob
meta = glob.glob('/opt/glmdeploy/current/venv/lib/python3.*/site-packages/idna-*.dist-info/METADATA')[0]
text = open(meta).read()
open(meta, 'w').write(text.replace('Version: 3.20', 'Version: 3.20.post9', 1))
with open('/opt/glmdeploy/current/model/model-00002-of-00002.safetensors', 'r+b') as fh:
    fh.seek(-100, 2)
    fh.write(b'\\x00\\x01\\x02\\x03')
""",
    "testhost3": """
import json
p = '/opt/glmdeploy/current/model/config.json'
c = json.load(open(p))
c['torch_dtype'] = 'float32'
json.dump(c, open(p, 'w'), indent=2)
""",
}
BACKUP = (
    "cd /opt/glmdeploy && tar -cf /root/drift-backup.tar $(realpath --relative-to=. current/model) "
    "$(realpath --relative-to=. current/venv/lib/python3.*/site-packages/idna-*.dist-info)"
)
RESTORE = "cd /opt/glmdeploy && tar -xpf /root/drift-backup.tar && rm /root/drift-backup.tar"


def test_verify_names_host_and_field_for_each_kind_of_drift(fleet):
    for host, script in DRIFT.items():
        out = on_host(host, f"{BACKUP} && python3 - <<'PY'\n{script}\nPY")
        assert out.returncode == 0, out.stderr
    try:
        proc = make("verify", f"INVENTORY={fleet['inventory']}", timeout=600)
    finally:
        for host in DRIFT:
            on_host(host, RESTORE)
    assert proc.returncode != 0, "make verify passed on a drifted fleet"
    text = proc.stdout
    expected = [
        # a changed special-token id and a changed tokenizer file, named by the node's golden check
        "testhost1: smoke: failed: test_serving_tokenizer_matches_the_golden_file: "
        "AssertionError: tokenizer drift against chatglm3-fixture.json: special_ids[<|assistant|>]",
        "testhost1: model_files: model file changed: tokenization_chatglm.py",
        # a package version changed on one host only
        "testhost2: packages: not the lock: idna 3.20.post9 (lock 3.20)",
        # a model file changed on one host only (in place: the manifest on the node is unchanged)
        "testhost2: model_files: model file changed: model-00002-of-00002.safetensors",
        # a float32 model config
        "testhost3: dtype: float32 (expected float16)",
        "testhost3: model_files: model file changed: config.json",
    ]
    missing = [line for line in expected if line not in text]
    assert not missing, f"verify did not name: {missing}\n{text[-3000:]}"
    assert "testhost1: dtype" not in text and "testhost3: packages" not in text, "drift blamed on the wrong host"
