"""Time each phase of `make test`, then print one table and keep a line per run.

Why: CI lands a change only when `make test` ends within 90 minutes on a 2-core machine, and
the suite grows with every capability. Each run therefore says where its time went (tool
bootstrap, lint, unit, lock check, each deploy, each end-to-end test over 20 s), writes it to
`reports/ci-phases.json` and `.txt`, and appends one line to `bench/ci/runs.jsonl` (commit,
machine state, phases, total) so runs can be compared. Standard library only: it runs before
any tool environment exists.

    python3 tests/ci/phases.py begin
    python3 tests/ci/phases.py run NAME -- COMMAND...
    python3 tests/ci/phases.py report
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "reports"
LOG = REPORTS / "ci-phases.jsonl"
#: Each end-to-end part (tests/e2e/conftest.py PART) writes its own; the table merges them.
E2E_DURATIONS = "e2e-durations-*.json"
E2E_FIGURES = "e2e-figures-*.json"
RUNS = ROOT / "bench" / "ci" / "runs.jsonl"
#: End-to-end tests shorter than this are summed, not listed.
LONG_TEST_S = 20.0
#: A 1-minute load average above this at the start means the machine was not idle.
IDLE_LOAD = 0.5
WHEEL_CACHE = Path(os.environ.get("GLMDEPLOY_WHEEL_CACHE", "/var/cache/glmdeploy/wheels"))


def _git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def machine_state() -> dict[str, object]:
    """What decides how long a run takes besides the code: load, cores, warm caches."""
    load1 = os.getloadavg()[0]
    wheels = sum(1 for _ in WHEEL_CACHE.glob("*.whl")) if WHEEL_CACHE.is_dir() else 0
    return {
        "host": platform.node(),
        "cores": os.cpu_count(),
        "load_1min": round(load1, 2),
        "idle": load1 < IDLE_LOAD,
        "wheel_cache_wheels": wheels,
        "ci": os.environ.get("CI") == "true",
    }


def _append(entry: dict[str, object]) -> None:
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def cmd_begin() -> int:
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text("", encoding="utf-8")
    for stale in [*REPORTS.glob(E2E_DURATIONS), *REPORTS.glob(E2E_FIGURES)]:
        stale.unlink(missing_ok=True)
    _append({"begin": time.time(), "commit": _git("rev-parse", "--short", "HEAD"), "machine": machine_state()})
    return 0


def cmd_run(name: str, command: list[str], beside: str = "") -> int:
    """Run one phase; `beside`: the phase it runs alongside (its time overlaps that one's)."""
    start = time.monotonic()
    rc = subprocess.run(command, check=False).returncode
    entry: dict[str, object] = {"phase": name, "seconds": round(time.monotonic() - start, 1), "rc": rc}
    if beside:
        entry["beside"] = beside
    _append(entry)
    return rc


def _table(rows: list[tuple[str, str, str]]) -> str:
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"  {a:<{width}}  {b:>9}  {c}" for a, b, c in rows)


def _label(phase: dict[str, object]) -> str:
    return f"{phase['phase']} (beside {phase['beside']})" if phase.get("beside") else str(phase["phase"])


def _merged(pattern: str) -> dict[str, Any]:
    """One dict from the parts' JSON files (their keys do not overlap: test ids, figure names)."""
    merged: dict[str, Any] = {}
    for path in sorted(REPORTS.glob(pattern)):
        merged |= json.loads(path.read_text(encoding="utf-8"))
    return merged


def cmd_report() -> int:
    entries = [json.loads(line) for line in LOG.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not entries or "begin" not in entries[0]:
        print("phases: no run recorded (python3 tests/ci/phases.py begin first)", file=sys.stderr)
        return 2
    head, phases = entries[0], [e for e in entries[1:] if "phase" in e]
    total = round(time.time() - float(head["begin"]), 1)
    e2e, figures = _merged(E2E_DURATIONS), _merged(E2E_FIGURES)
    long_tests = {k: v for k, v in sorted(e2e.items(), key=lambda kv: -kv[1]) if v >= LONG_TEST_S}
    deploys = {k: v for k, v in figures.items() if isinstance(v, int | float) and "deploy" in k.lower()}
    record = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime(float(head["begin"]))),
        "commit": head["commit"],
        "machine": head["machine"],
        "phases": {p["phase"]: p["seconds"] for p in phases},
        "beside": {p["phase"]: p["beside"] for p in phases if p.get("beside")},
        "failed": [p["phase"] for p in phases if p["rc"] != 0],
        "deploys_s": deploys,
        "e2e_tests_over_20s": long_tests,
        "e2e_tests_under_20s_s": round(sum(v for v in e2e.values() if v < LONG_TEST_S), 1),
        "total_s": total,
    }
    rows = [("phase", "seconds", "")]
    rows += [(_label(p), f"{p['seconds']:.1f}", "FAILED" if p["rc"] else "") for p in phases]
    rows += [(f"  deploy: {k}", f"{v:.1f}", "") for k, v in deploys.items()]
    rows += [(f"  e2e: {k.removeprefix('tests/e2e/')}", f"{v:.1f}", "") for k, v in long_tests.items()]
    if e2e:
        short = f"  e2e: {len(e2e) - len(long_tests)} tests under {LONG_TEST_S:.0f} s"
        rows.append((short, f"{record['e2e_tests_under_20s_s']:.1f}", ""))
    rows.append(("total", f"{total:.1f}", f"({total / 60:.1f} min; budget 25 min warm, 60 cold)"))
    machine = head["machine"]
    text = (
        f"==> make test, per phase (commit {head['commit']}, {machine['cores']} cores, load {machine['load_1min']} "
        f"at the start: {'idle' if machine['idle'] else 'NOT idle'}, {machine['wheel_cache_wheels']} wheels cached)\n"
        + _table(rows)
        + "\n"
    )
    print(text, end="")
    (REPORTS / "ci-phases.txt").write_text(text, encoding="utf-8")
    (REPORTS / "ci-phases.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    RUNS.parent.mkdir(parents=True, exist_ok=True)
    with RUNS.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests/ci/phases.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("begin", help="start a run: clear the phase log, note the machine's state")
    run = sub.add_parser("run", help="run a command as one named phase")
    run.add_argument("--beside", default="", metavar="PHASE", help="the phase this one runs alongside")
    run.add_argument("name")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    sub.add_parser("report", help="print and save the table; append a line to bench/ci/runs.jsonl")
    args = parser.parse_args(argv)
    if args.action == "begin":
        return cmd_begin()
    if args.action == "run":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("run NAME -- COMMAND...: no command given")
        return cmd_run(args.name, command, args.beside)
    return cmd_report()


if __name__ == "__main__":
    sys.exit(main())
