"""The serving stack's tokenizer must give exactly the ids recorded in the model's golden file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glmdeploy.config import NodeConfig
from glmdeploy.model.golden import compare, record

GOLDEN_DIR = Path(__file__).with_name("golden")


def test_serving_tokenizer_matches_the_golden_file(node: NodeConfig) -> None:
    golden_file = GOLDEN_DIR / f"{node.model_name}.json"
    if not golden_file.exists():
        pytest.fail(f"no golden file for {node.model_name}: record one with `make tokenizer-lock`")
    config = json.loads(Path(node.model_dir, "config.json").read_text())
    current = record(node.model_dir, trust_remote_code=config.get("auto_map") is not None)
    drift = compare(json.loads(golden_file.read_text()), current, label="serving stack")
    # First line names the first differences (the fleet table shows it); the rest follow one per line.
    assert not drift, (
        f"tokenizer drift against {golden_file.name}: {'; '.join(drift[:2])}\n"
        + "\n".join(drift)
        + "\nfix: if the new tokenizer is intended, re-record the golden file with `make tokenizer-lock`"
    )
