"""Fixtures for the node smoke suite: the deployed node config, API client and tokenizer.

The suite runs on the node, from the deployed environment, against the
deployed server: it proves this node, not the control node. A JSON summary is
written beside the JUnit XML (SMOKE_JSON) for the control node to collect.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from glmdeploy.api.client import ApiClient
from glmdeploy.config import NodeConfig
from glmdeploy.model.prompt import PromptBuilder, load_tokenizer

_RESULTS: list[dict[str, object]] = []


@pytest.fixture(scope="session")
def node() -> NodeConfig:
    return NodeConfig.load()


@pytest.fixture(scope="session")
def client(node: NodeConfig) -> ApiClient:
    return ApiClient.for_node(node, timeout_s=60)


@pytest.fixture(scope="session")
def tokenizer(node: NodeConfig) -> object:
    return load_tokenizer(node.model_dir, node.trust_remote_code)


@pytest.fixture(scope="session")
def builder(tokenizer: object) -> PromptBuilder:
    return PromptBuilder.from_tokenizer(tokenizer)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        entry: dict[str, object] = {
            "test": report.nodeid,
            "outcome": report.outcome,
            "seconds": round(report.duration, 3),
        }
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            entry["reason"] = report.longrepr[2]
        elif report.outcome == "failed":
            entry["message"] = str(report.longrepr)[-2000:]
        _RESULTS.append(entry)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("SMOKE_JSON")
    if not target:
        return
    results, status = list(_RESULTS), int(exitstatus)
    if os.environ.get("SMOKE_JSON_MERGE") == "1" and Path(target).is_file():
        # A second run on the same node (the throughput check, run apart where nodes share
        # CPUs) adds to the first run's report instead of replacing it.
        earlier = json.loads(Path(target).read_text())
        results = list(earlier.get("results", [])) + results
        status = max(status, int(earlier.get("exit_status", 0)))
    counts = {k: sum(1 for r in results if r["outcome"] == k) for k in ("passed", "failed", "skipped")}
    Path(target).write_text(
        json.dumps(
            {
                "host": socket.gethostname(),
                "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "exit_status": status,
                "counts": counts,
                "results": results,
            },
            indent=2,
        )
    )
