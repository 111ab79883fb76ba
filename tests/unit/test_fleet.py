import hashlib
import json
import shutil
from pathlib import Path

import pytest

from glmdeploy_control import lock
from glmdeploy_control.fleet import build, main, markdown

ROOT = Path(__file__).resolve().parents[2]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


@pytest.fixture
def fleet(tmp_path, fixture_dir):
    """Two hosts whose fingerprints match the control node's lock, manifest and golden file."""
    models = tmp_path / "models"
    shutil.copytree(fixture_dir, models / "chatglm3-fixture")
    pins = {n: v for n, (v, _) in lock.parse_lock(lock.lock_path("cpu", "3.11")).items()}
    base = {
        "os": "Debian GNU/Linux 12 (bookworm)",
        "kernel": "6.1",
        "driver": "none",
        "cuda": "none",
        "python": "3.11.2",
        "profile": "cpu",
        "release": "cpu-py311-abc",
        "model": "chatglm3-fixture",
        "lock": digest(ROOT / "constraints" / "cpu-py311.txt"),
        "packages": "p1",
        "units": "u1",
        "dtype": "float16",
        "model_manifest": digest(fixture_dir / "SHA256SUMS"),
        "model_files": "match manifest",
        "tokenizer_golden": digest(ROOT / "smoke_tests" / "golden" / "chatglm3-fixture.json"),
        "_package_versions": dict(pins, pip="23.0"),
    }
    reports = tmp_path / "reports"
    for host in ("node1", "node2"):
        (reports / host).mkdir(parents=True)
        (reports / host / "fingerprint.json").write_text(json.dumps(base))
        (reports / host / "smoke.json").write_text(json.dumps({"counts": {"passed": 20, "failed": 0}}))
    return reports, models


def edit(reports, host, **changes):
    path = reports / host / "fingerprint.json"
    fp = json.loads(path.read_text())
    fp.update(changes)
    path.write_text(json.dumps(fp))


def test_clean_fleet_has_no_problems(fleet):
    reports, models = fleet
    report = build(reports, ROOT, models)
    assert report["problems"] == []
    assert "All hosts identical" in markdown(report)


def test_package_changed_on_one_host_names_host_field_and_package(fleet):
    reports, models = fleet
    fp = json.loads((reports / "node2" / "fingerprint.json").read_text())
    edit(reports, "node2", packages="p2", _package_versions=dict(fp["_package_versions"], streamlit="0.1"))
    problems = build(reports, ROOT, models)["problems"]
    assert any(p.startswith("node2: packages: not the lock: streamlit 0.1 (lock ") for p in problems)
    assert not any(p.startswith("node1") for p in problems)


def test_float32_model_and_changed_model_file_are_named(fleet):
    reports, models = fleet
    edit(reports, "node1", dtype="float32")
    edit(reports, "node2", model_manifest="0000000000000000")
    edit(reports, "node1", model_files="model file changed: tokenizer.json does not match its SHA256 in SHA256SUMS")
    problems = build(reports, ROOT, models)["problems"]
    assert "node1: dtype: float32 (expected float16)" in problems
    assert any(p.startswith("node2: model_manifest: 0000000000000000 (expected ") for p in problems)
    assert (
        "node1: model_files: model file changed: tokenizer.json does not match its SHA256 in SHA256SUMS"
        " (expected match manifest)" in problems
    )


def test_failed_smoke_and_changed_tokenizer_golden_fail_verify(fleet, tmp_path):
    reports, models = fleet
    failure = {
        "test": "test_golden.py::test_serving_tokenizer_matches_the_golden_file",
        "outcome": "failed",
        "message": "def test...\n>   assert not drift\n"
        "E   AssertionError: tokenizer drift: special_ids[<|user|>]\nE   more",
    }
    (reports / "node1" / "smoke.json").write_text(
        json.dumps({"counts": {"passed": 19, "failed": 1}, "results": [failure]})
    )
    edit(reports, "node2", tokenizer_golden="ffff")
    assert (
        main(["--reports", str(reports), "--root", str(ROOT), "--models", str(models), "--out", str(tmp_path / "out")])
        == 1
    )
    text = (tmp_path / "out" / "verify.md").read_text()
    assert (
        "node1: smoke: failed: test_serving_tokenizer_matches_the_golden_file: "
        "AssertionError: tokenizer drift: special_ids[<|user|>]" in text
    )
    assert "node2: tokenizer_golden: ffff (expected" in text


def test_mixed_fleet_holds_each_profile_to_its_own_lock(fleet):
    """A cpu node beside a gpu-cu121 node is no drift; a second gpu node that differs is."""
    reports, models = fleet
    gpu_pins = {n: v for n, (v, _) in lock.parse_lock(lock.lock_path("gpu-cu121", "3.11")).items()}
    gpu = {
        "profile": "gpu-cu121",
        "release": "gpu-cu121-py311-def",
        "lock": digest(ROOT / "constraints" / "gpu-cu121-py311.txt"),
        "packages": "g1",
        "units": "g-units",
        "_package_versions": dict(gpu_pins, pip="23.0"),
    }
    edit(reports, "node2", **gpu)
    report = build(reports, ROOT, models)
    assert report["problems"] == []
    (reports / "node3").mkdir()
    shutil.copy(reports / "node2" / "fingerprint.json", reports / "node3" / "fingerprint.json")
    shutil.copy(reports / "node2" / "smoke.json", reports / "node3" / "smoke.json")
    (reports / "node4").mkdir()
    shutil.copy(reports / "node2" / "fingerprint.json", reports / "node4" / "fingerprint.json")
    shutil.copy(reports / "node2" / "smoke.json", reports / "node4" / "smoke.json")
    edit(reports, "node4", units="g-units-edited")
    assert build(reports, ROOT, models)["problems"] == ["node4: units: differs from other gpu-cu121 hosts"]


def _smoke(reports, host, outcome, **extra):
    test = "smoke_tests/test_outputs.py::test_greedy_outputs_match_the_recording"
    result = {"test": test, "outcome": outcome, **extra}
    counts = {"passed": 20, "failed": int(outcome == "failed"), "skipped": int(outcome == "skipped")}
    (reports / host / "smoke.json").write_text(json.dumps({"counts": counts, "results": [result]}))


def test_changed_greedy_output_on_one_host_is_named_and_the_others_match(fleet):
    reports, models = fleet
    _smoke(reports, "node1", "passed")
    message = (
        "def test_greedy_outputs_match_the_recording(...):\n"
        "E   AssertionError: greedy outputs differ from chatglm3-fixture/cpu-cpu2.json: plain_en: greedy output"
        " differs from token 3: recorded ' a b', now ' c d'\nE   assert not [...]"
    )
    _smoke(reports, "node2", "failed", message=message)
    report = build(reports, ROOT, models)
    assert report["hosts"]["node1"]["outputs"] == "match"
    assert report["hosts"]["node2"]["outputs"] == (
        "changed: plain_en: greedy output differs from token 3: recorded ' a b', now ' c d'"
    )
    assert [p.split(":")[:2] for p in report["problems"]] == [["node2", " outputs"], ["node2", " smoke"]]


def test_an_output_check_that_could_not_run_is_an_error_not_a_change(fleet):
    reports, models = fleet
    _smoke(reports, "node1", "passed")
    message = "def test_greedy_outputs_match_the_recording(...):\nE   ImportError: cannot import name 'record' from 'x'"
    _smoke(reports, "node2", "failed", message=message)
    report = build(reports, ROOT, models)
    error = "could not run: ImportError: cannot import name 'record' from 'x'"
    assert report["hosts"]["node2"]["outputs"] == error
    assert f"node2: outputs: the output check {error}" in report["problems"]


def test_a_class_without_recording_is_said_in_the_table_without_failing_verify(fleet):
    reports, models = fleet
    for host in ("node1", "node2"):
        _smoke(reports, host, "skipped", reason="Skipped: no output recording for chatglm3-fixture on cpu-a10x1")
    report = build(reports, ROOT, models)
    assert report["hosts"]["node1"]["outputs"] == "no output recording for chatglm3-fixture on cpu-a10x1"
    assert report["problems"] == []


def test_an_exporter_down_or_a_node_not_generating_is_a_problem_of_that_host(fleet):
    reports, models = fleet
    (reports / "node1" / "exporters.json").write_text(
        json.dumps({"node exporter": "up", "prober": "up, generating", "gpu exporter": "not run: cpu node (no GPU)"})
    )
    (reports / "node2" / "exporters.json").write_text(
        json.dumps(
            {
                "node exporter": "down: connection refused",
                "prober": "up, NOT generating",
                "gpu exporter": "not run: cpu node (no GPU)",
            }
        )
    )
    report = build(reports, ROOT, models)
    assert report["problems"] == [
        "node2: node exporter: down: connection refused",
        "node2: prober: up, NOT generating",
    ]
    table = markdown(report)
    assert "| prober | up, generating | **up, NOT generating** (!) |" in table
    assert "| gpu exporter | not run: cpu node (no GPU) | not run: cpu node (no GPU) |" in table


def test_a_fleet_without_exporter_reports_says_not_checked_without_a_problem(fleet):
    reports, models = fleet
    report = build(reports, ROOT, models)
    assert report["problems"] == [] and report["hosts"]["node1"]["prober"] == "not checked"


def _apt_report(reports, host, nginx="1.22.1-9+deb12u12", drift="", nftables="1.0.6-2+deb12u2"):
    (reports / host / "apt.json").write_text(
        json.dumps(
            {
                "release": "debian-12",
                "lock": "debian-12-4e46d9bebee3",
                "packages": {
                    "nftables": {
                        "installed": nftables,
                        "locked": "1.0.6-2+deb12u2",
                        "installer": "node_firewall",
                    },
                    "nginx": {"installed": nginx, "locked": "1.22.1-9+deb12u12", "installer": "load_balancer"},
                },
                "drift": drift,
            }
        )
    )


def test_identical_nodes_show_one_apt_value_and_a_package_changed_in_place_names_host_package_and_versions(fleet):
    reports, models = fleet
    _apt_report(reports, "node1")
    _apt_report(reports, "node2")
    report = build(reports, ROOT, models)
    assert report["problems"] == []
    row = next(line for line in markdown(report).splitlines() if line.startswith("| apt |"))
    cells = [cell.strip() for cell in row.split("|")[2:4]]
    assert cells[0] == cells[1] and cells[0].startswith("1 packages from debian-12-4e46d9bebee3, set "), row
    _apt_report(reports, "node2", nftables="1.0.6-2", drift="nftables installed 1.0.6-2, locked 1.0.6-2+deb12u2")
    report = build(reports, ROOT, models)
    assert report["problems"] == ["node2: apt: not the apt lock: nftables installed 1.0.6-2, locked 1.0.6-2+deb12u2"]
    assert report["hosts"]["node1"]["apt"] != report["hosts"]["node2"]["apt"], (
        "the changed version is in the row's value"
    )


def test_a_node_without_an_apt_report_says_not_checked(fleet):
    reports, models = fleet
    report = build(reports, ROOT, models)
    assert report["hosts"]["node1"]["apt"] == "not checked" and report["problems"] == []


def test_a_node_that_is_also_the_balancer_shares_the_apt_value_of_its_profile(fleet):
    reports, models = fleet
    _apt_report(reports, "node1")
    data = json.loads((reports / "node1" / "apt.json").read_text())
    del data["packages"]["nginx"]
    (reports / "node2" / "apt.json").write_text(json.dumps(data))
    report = build(reports, ROOT, models)
    assert report["hosts"]["node1"]["apt"] == report["hosts"]["node2"]["apt"] and report["problems"] == []
    assert report["hosts"]["node1"]["apt"].startswith("1 packages from ")


def test_a_balancer_package_changed_in_place_is_named_though_left_out_of_the_compared_value(fleet):
    reports, models = fleet
    _apt_report(
        reports, "node1", nginx="1.22.1-9+deb12u9", drift="nginx installed 1.22.1-9+deb12u9, locked 1.22.1-9+deb12u12"
    )
    _apt_report(reports, "node2")
    problems = build(reports, ROOT, models)["problems"]
    assert problems == ["node1: apt: not the apt lock: nginx installed 1.22.1-9+deb12u9, locked 1.22.1-9+deb12u12"]


def _driver_report(reports, host, findings=()):
    summary = "loaded 535.261.03, libraries 535.261.03, next boot 6.1.0-41-amd64 module installed; Secure Boot off"
    (reports / host / "driver.json").write_text(
        json.dumps({"present": True, "summary": summary, "findings": list(findings)})
    )


def test_a_node_whose_next_boot_has_no_module_is_named_with_its_fix_and_identical_nodes_share_the_driver_row(fleet):
    reports, models = fleet
    _driver_report(reports, "node1")
    _driver_report(reports, "node2")
    report = build(reports, ROOT, models)
    assert report["problems"] == []
    assert report["hosts"]["node1"]["driver_state"] == report["hosts"]["node2"]["driver_state"]
    finding = "the kernel the node boots next, 6.1.0-42-amd64, has no installed NVIDIA module ... fix: make driver"
    _driver_report(reports, "node2", [finding])
    assert build(reports, ROOT, models)["problems"] == [f"node2: driver_state: {finding}"]
