"""The node is as fast as the baseline recorded for its hardware class and profile.

A short fixed run (glmdeploy.tools.bench.client.SMOKE_SCENARIO: random prompt ids from a
fixed seed, exact output lengths, a few concurrent streams) is compared with
baselines/<profile>-<class>.json, which records the command, versions and
hardware it came from. Slower than the baseline minus its tolerance fails.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from glmdeploy.api.client import ApiClient
from glmdeploy.config import NodeConfig
from glmdeploy.serving import nodefacts
from glmdeploy.tools.bench.client import compare_with_baseline, run_level

BASELINES = Path(__file__).with_name("baselines")


def test_throughput_is_within_the_baseline(client: ApiClient, node: NodeConfig, record_property) -> None:  # noqa: ANN001
    key = f"{node.profile}-{nodefacts.node_hardware_class(node)}"
    path = BASELINES / f"{key}.json"
    if not path.exists():
        pytest.skip(f"no throughput baseline for {key} in {BASELINES.name}/: record one with `make baseline`")
    baseline = json.loads(path.read_text())
    s = baseline["scenario"]
    measured = asdict(run_level(client, s["input_len"], s["output_len"], s["concurrency"], s["requests"]))
    record_property("output_tokens_per_s", measured["output_tokens_per_s"])
    record_property("baseline_output_tokens_per_s", baseline["result"]["output_tokens_per_s"])
    problems = compare_with_baseline(baseline, measured)
    assert not problems, problems[0]
