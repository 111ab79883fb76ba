"""The serving stack's tokenizer must give exactly the ids recorded in the model's golden file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glmdeploy.config import NodeConfig
from glmdeploy.golden import compare, record

GOLDEN_DIR = Path(__file__).with_name("golden")


def test_serving_tokenizer_matches_the_golden_file(node: NodeConfig) -> None:
    golden_file = GOLDEN_DIR / f"{Path(node.model_dir).name}.json"
    if not golden_file.exists():
        pytest.fail(f"no golden file for {Path(node.model_dir).name}: record one with `make tokenizer-lock`")
    config = json.loads(Path(node.model_dir, "config.json").read_text())
    current = record(node.model_dir, trust_remote_code=config.get("auto_map") is not None)
    drift = compare(json.loads(golden_file.read_text()), current, label="serving stack")
    assert not drift, "tokenizer drift against " + golden_file.name + ":\n" + "\n".join(drift)
