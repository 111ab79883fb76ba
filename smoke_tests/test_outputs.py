"""The served model must say what it said when its outputs were recorded: greedy, to a fixed prompt set.

An engine or library upgrade can change what the model answers while the tokenizer stays the same;
glmdeploy.tools.outputs says how outputs are compared (a near tie ends a prompt's comparison, any other
difference is a change). Recordings live in outputs/<model>/<profile>-<hardware class>.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from glmdeploy.api.client import ApiClient
from glmdeploy.config import NodeConfig
from glmdeploy.model.prompt import PromptBuilder
from glmdeploy.tools import outputs

RECORDINGS = Path(__file__).with_name("outputs")


def test_greedy_outputs_match_the_recording(client: ApiClient, node: NodeConfig, builder: PromptBuilder) -> None:
    if os.environ.get("SMOKE_OUTPUTS_CHECK", "true") == "false":
        pytest.skip("the output check is off for this run (smoke_outputs_check=false): record with `make output-lock`")
    path = outputs.recording_path(RECORDINGS, node)
    if not path.exists():
        pytest.skip(
            f"no output recording for {node.model_name} on {path.stem} (outputs/{node.model_name}/{path.name}): "
            "record one with `make output-lock`"
        )
    golden = json.loads(path.read_text(encoding="utf-8"))
    assert node.max_model_len >= golden["max_model_len"], (
        f"the node serves a context of {node.max_model_len} tokens, {path.name} was recorded at"
        f" {golden['max_model_len']} (its longest prompt needs it): serve that context again, or record anew"
        " with `make output-lock`"
    )
    found = outputs.compare(golden, outputs.record(node, client, builder, golden["max_model_len"]))
    # Short, first line first: the node's smoke report keeps the end of a failure's text, and the
    # fleet table shows this first line.
    names = [line.split(":", 1)[0] for line in found.changed]
    assert not found.changed, (
        f"greedy outputs differ from {node.model_name}/{path.name}: {found.changed[0]}\n"
        f"{len(names)} of {len(golden['outputs'])} prompts differ: {', '.join(names)}\n"
        "fix: find what changed (`make verify` lists the lock, model and tokenizer); if the new outputs are"
        " intended, record them with `make output-lock`"
    )
