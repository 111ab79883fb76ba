"""Fleet report for `make verify`: one table, a column per host, every difference marked.

Why: the anchors print versions per node and leave the comparing to people.
Here each host's fingerprint and smoke results (collected by the smoke role)
are checked against what the control node pinned (lock, model manifest,
tokenizer golden file, fp16) and against each other; the exit status says
whether the fleet is identical and right.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import glmdeploy_environment as environment

from glmdeploy_control import lock

FIELDS = (
    "os",
    "kernel",
    "driver",
    "driver_state",
    "cuda",
    "python",
    "profile",
    "release",
    "lock",
    "image",
    "packages",
    "apt",
    "model_manifest",
    "model_files",
    "tokenizer_golden",
    "outputs",
    "units",
    "dtype",
    "smoke",
)
# The node's exporters (roles/node_metrics, tasks_from: status): not held to the other hosts, a
# value that says down or not generating is a problem of its own.
EXPORTER_FIELDS = ("node exporter", "prober", "gpu exporter")
#: Installers of the apt packages a node's host has for another role than the node's (the balancer,
#: the monitoring host): left out of the apt row's value, still held to the lock.
HOST_ROLES = ("load_balancer", "nginx_exporter", "monitoring")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else "missing"


def _minor(fp: dict[str, Any]) -> str:
    """The node's Python as its lock is chosen: "3.11.2" and "3.11.9" share "3.11"."""
    return ".".join(str(fp.get("python")).split(".")[:2])


def _runtime(fp: dict[str, Any]) -> str:
    """container when the node runs its release from an image (the fingerprint names it), else venv."""
    return "venv" if str(fp.get("image", "none")) == "none" else "container"


def expected_for(fp: dict[str, Any], root: Path, model_root: Path) -> dict[str, str]:
    model = fp.get("model", "")
    return {
        "lock": _digest(lock.lock_path(fp["profile"], _minor(fp), root / "constraints" / "profiles.toml")),
        "model_manifest": _digest(model_root / model / "SHA256SUMS"),
        "tokenizer_golden": _digest(root / "smoke_tests" / "golden" / f"{model}.json"),
        "model_files": "match manifest",
        "dtype": "float16",
    }


def package_drift(fp: dict[str, Any], root: Path) -> list[str]:
    """The node's packages against its lock, phrased as the node-side check phrases them."""
    path = lock.lock_path(fp["profile"], _minor(fp), root / "constraints" / "profiles.toml")
    pinned = {n: v for n, (v, _) in lock.parse_lock(path).items()}
    found: list[str] = environment.drift(pinned, fp.get("_package_versions", {}))
    return found


def _apt(path: Path) -> tuple[str, str]:
    """The node's kit packages in one value (equal on identical nodes: how many, the release's
    repository named by its lock, a digest of each package's installed version), and the drift
    from the lock of every kit package on the host ("" none). The packages of the host's other
    roles (a balancer's nginx, a monitoring host's Prometheus) are checked, not compared."""
    if not path.exists():
        return "not checked", ""
    data = json.loads(path.read_text())
    packages = {n: e for n, e in data.get("packages", {}).items() if e.get("installer") not in HOST_ROLES}
    installed = "".join(f"{name}={entry.get('installed')}\n" for name, entry in sorted(packages.items()))
    digest = hashlib.sha256(installed.encode()).hexdigest()[:8]
    return f"{len(packages)} packages from {data.get('lock', '?')}, set {digest}", str(data.get("drift", ""))


def _driver(path: Path) -> tuple[str, list[str]]:
    """The driver's state (roles/nvidia_driver, tasks_from: status) and its findings, each with its fix."""
    if not path.exists():
        return "not checked", []
    data = json.loads(path.read_text())
    return str(data.get("summary", "?")), [str(f) for f in data.get("findings", [])]


def _failure(result: dict[str, Any]) -> str:
    """`test_name: the assertion's first line`, so the fleet report names what broke."""
    name = str(result.get("test", "")).split("::")[-1]
    lines = [ln.strip() for ln in str(result.get("message", "")).splitlines()]
    first = next((ln[2:].strip() for ln in lines if ln.startswith("E ")), lines[-1] if lines else "")
    return f"{name}: {first[:200]}"


def _outputs(results: list[dict[str, Any]]) -> str:
    """The output check's verdict from the smoke results: match, no recording (its skip reason), what
    changed (the first finding, which the check puts on its assertion's first line), or the error
    that kept it from running (an ImportError is not a change)."""
    found = [r for r in results if "test_outputs.py::" in str(r.get("test", ""))]
    if not found:
        return "not checked"
    result = found[0]
    if result.get("outcome") == "passed":
        return "match"
    if result.get("outcome") == "skipped":
        return str(result.get("reason", "skipped")).removeprefix("Skipped: ")
    first = _failure(result)
    marker = re.search(r"greedy outputs differ from \S+: ", first)
    if marker is None:
        return "could not run: " + first.split(": ", 1)[-1]
    return "changed: " + first[marker.end() :]


def build(reports: Path, root: Path, model_root: Path) -> dict[str, Any]:
    hosts: dict[str, dict[str, Any]] = {}
    for host_dir in sorted(p for p in reports.iterdir() if p.is_dir()):
        fp_file, smoke_file = host_dir / "fingerprint.json", host_dir / "smoke.json"
        if not fp_file.exists():
            continue
        fp = json.loads(fp_file.read_text())
        smoke = json.loads(smoke_file.read_text()) if smoke_file.exists() else {"counts": {}}
        c = smoke.get("counts", {})
        fp["smoke"] = f"{c.get('passed', 0)} passed, {c.get('failed', 0)} failed, {c.get('skipped', 0)} skipped"
        fp["_smoke_failures"] = [_failure(r) for r in smoke.get("results", []) if r.get("outcome") == "failed"]
        fp["outputs"] = _outputs(smoke.get("results", []))
        fp["apt"], fp["_apt_drift"] = _apt(host_dir / "apt.json")
        fp["driver_state"], fp["_driver_findings"] = _driver(host_dir / "driver.json")
        exporters_file = host_dir / "exporters.json"
        exporters = json.loads(exporters_file.read_text()) if exporters_file.exists() else {}
        for field in EXPORTER_FIELDS:
            fp[field] = exporters.get(field, "not checked")
        hosts[host_dir.name] = fp
    problems: list[str] = []
    marks: dict[str, dict[str, str]] = {h: {} for h in hosts}
    # Nodes are held to each other within a profile, Python and runtime: a mixed fleet (cpu and
    # gpu-cu121 nodes; a host running the image beside hosts running a venv) differs between the
    # groups by design, and each group against its lock.
    groups: dict[tuple[str, str, str], list[str]] = {}
    for host, fp in hosts.items():
        groups.setdefault((str(fp.get("profile")), _minor(fp), _runtime(fp)), []).append(host)
    for (profile, _, _), members in groups.items():
        for field in FIELDS:
            values = Counter(str(hosts[h].get(field)) for h in members)
            majority = values.most_common(1)[0][0] if values else ""
            for host in members:
                if len(values) > 1 and str(hosts[host].get(field)) != majority:
                    marks[host][field] = f"differs from other {profile} hosts"
    for host, fp in hosts.items():
        for field, want in expected_for(fp, root, model_root).items():
            if str(fp.get(field)) != want:
                marks[host][field] = f"{fp.get(field)} (expected {want})"
        drift = package_drift(fp, root)
        if drift:
            marks[host]["packages"] = "not the lock: " + "; ".join(drift[:8]) + (" ..." if len(drift) > 8 else "")
        if fp.get("_apt_drift"):
            marks[host]["apt"] = "not the apt lock: " + str(fp["_apt_drift"])
        if fp.get("_driver_findings"):
            marks[host]["driver_state"] = " | ".join(fp["_driver_findings"])
        if str(fp["outputs"]).startswith("changed"):
            marks[host]["outputs"] = "the greedy outputs differ from their recording (smoke_tests/outputs/)"
        elif str(fp["outputs"]).startswith("could not run"):
            marks[host]["outputs"] = f"the output check {fp['outputs']}"
        for field in EXPORTER_FIELDS:
            if str(fp[field]).startswith("down") or "NOT generating" in str(fp[field]) or "NVML" in str(fp[field]):
                marks[host][field] = str(fp[field])
        if " 0 failed" not in fp["smoke"]:
            marks[host]["smoke"] = "failed: " + " | ".join(fp.get("_smoke_failures") or ["see smoke.json"])
        problems += [f"{host}: {field}: {why}" for field, why in marks[host].items()]
    return {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hosts": hosts,
        "marks": marks,
        "problems": problems,
    }


def markdown(report: dict[str, Any]) -> str:
    hosts = list(report["hosts"])
    lines = ["| field | " + " | ".join(hosts) + " |", "|---|" + "---|" * len(hosts)]
    for field in (*FIELDS, *EXPORTER_FIELDS):
        cells = []
        for host in hosts:
            value = str(report["hosts"][host].get(field))
            cells.append(f"**{value}** (!)" if field in report["marks"][host] else value)
        lines.append(f"| {field} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"- (!) {p}" for p in report["problems"]] or ["All hosts identical and matching the lock."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy_control.fleet", description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=Path, required=True, help="per-host report directories (reports/smoke)")
    parser.add_argument("--root", type=Path, required=True, help="the kit checkout (locks, golden files)")
    parser.add_argument("--models", type=Path, required=True, help="model directories on the control node")
    parser.add_argument("--out", type=Path, required=True, help="where verify.md and verify.json are written")
    args = parser.parse_args(argv)
    if not args.reports.is_dir():
        print(f"ERROR: no reports in {args.reports}: run the smoke suite first (make verify does)", file=sys.stderr)
        return 2
    report = build(args.reports, args.root, args.models)
    if not report["hosts"]:
        print(f"ERROR: no host fingerprints in {args.reports}", file=sys.stderr)
        return 2
    text = markdown(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "verify.md").write_text(text)
    (args.out / "verify.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(text)
    print(f"report: {args.out / 'verify.md'} and verify.json")
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
