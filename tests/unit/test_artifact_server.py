"""glmdeploy_control.artifact_server: artifacts reach the nodes for one run, and only what nodes fetch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from glmdeploy_control import artifact_server

# The command run under the server: fetches what a node would, and what it must not get.
PROBE = textwrap.dedent(
    """
    import json, os, urllib.request, urllib.error
    url = json.loads(os.environ["GLMDEPLOY_ARTIFACT_URLS"])["node1"]
    codes = {}
    wheel = "/wheelhouse/cpu-py311/a-1.0-py3-none-any.whl"
    sneaky = ("/wheelhouse/../secrets/api_key", "/wheelhouse/%2e%2e/secrets/api_key", "/releases/..%2fsecrets/api_key")
    for path in ("/wheelhouse/cpu-py311/", wheel, "/secrets/api_key", "/models/", *sneaky):
        try:
            with urllib.request.urlopen(url + path, timeout=10) as resp:
                codes[path] = [resp.status, resp.read().decode()[:2000]]
        except urllib.error.HTTPError as err:
            codes[path] = [err.code, ""]
    print(json.dumps({"url": url, "codes": codes}))
    """
)

needs_ansible = pytest.mark.skipif(not shutil.which("ansible-inventory"), reason="ansible-inventory not on PATH")


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    root = tmp_path / "artifacts"
    (root / "wheelhouse" / "cpu-py311").mkdir(parents=True)
    (root / "wheelhouse" / "cpu-py311" / "a-1.0-py3-none-any.whl").write_bytes(b"wheel")
    (root / "secrets").mkdir()
    (root / "secrets" / "api_key").write_text("secret")
    (root / "models").mkdir()
    return root


def inventory(tmp_path: Path, line: str) -> str:
    path = tmp_path / "inventory.ini"
    path.write_text(f"[glmdeploy_nodes]\n{line}\n")
    return str(path)


@needs_ansible
def test_remote_node_gets_wheelhouse_but_never_secrets_or_models(tmp_path, artifacts, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inv = inventory(tmp_path, "node1 ansible_host=127.0.0.2")
    code = artifact_server.run(artifacts, inv, 0, [sys.executable, "-c", PROBE])
    out = capfd.readouterr().out
    assert code == 0
    result = json.loads(out.strip().splitlines()[-2])  # the last line is "artifact server stopped"
    assert result["url"].startswith("http://127.0.0.1:"), "not bound where the node is routed to"
    codes = result["codes"]
    assert codes["/wheelhouse/cpu-py311/"][0] == 200 and "a-1.0-py3-none-any.whl" in codes["/wheelhouse/cpu-py311/"][1]
    assert codes["/wheelhouse/cpu-py311/a-1.0-py3-none-any.whl"] == [200, "wheel"]
    assert codes["/secrets/api_key"][0] == 404 and codes["/models/"][0] == 404
    escapes = {path: code for path, (code, _) in codes.items() if "secrets" in path and code != 404}
    assert not escapes, f"the key was reachable through {escapes}"
    assert "artifact server stopped" in out


@needs_ansible
def test_local_or_mirrored_nodes_start_no_server(tmp_path, artifacts, capfd):
    for line in (
        "localhost ansible_connection=local",
        "node1 ansible_host=127.0.0.2 glmdeploy_artifact_url=http://mirror",
    ):
        probe = "import os; print('URLS=' + os.environ.get('GLMDEPLOY_ARTIFACT_URLS', 'unset'))"
        assert artifact_server.run(artifacts, inventory(tmp_path, line), 0, [sys.executable, "-c", probe]) == 0
        assert "URLS=unset" in capfd.readouterr().out


@needs_ansible
def test_the_commands_exit_status_is_returned(tmp_path, artifacts, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inv = inventory(tmp_path, "node1 ansible_host=127.0.0.2")
    assert artifact_server.run(artifacts, inv, 0, [sys.executable, "-c", "raise SystemExit(3)"]) == 3


def test_node_without_a_route_is_named_with_the_fix(monkeypatch):
    # This machine routes everything (a default route): stand in for `ip route get` on one without.
    failed = subprocess.CompletedProcess([], 2, "", "RTNETLINK answers: Network is unreachable")
    monkeypatch.setattr(artifact_server.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(artifact_server.ArtifactError, match=r"node far \(192.0.2.7\): .*unreachable.*fix: the node"):
        artifact_server.source_address("far", "192.0.2.7")
