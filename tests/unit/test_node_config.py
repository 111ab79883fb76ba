"""node.json: the vllm_server role's template (the writer) and NodeConfig (the one reader) agree."""

from __future__ import annotations

import json

import node_json  # tests/support
import pytest

from glmdeploy.config import NodeConfig, NodeConfigError
from glmdeploy_control import registry


@pytest.mark.parametrize("profile", list(registry.load().profiles))
def test_what_the_role_writes_for_each_profile_the_reader_takes_whole(profile):
    data = node_json.render(profile)
    node = NodeConfig.from_dict(data)
    assert node.public() | {"api_key": node.api_key} == data
    spec = registry.load().profile(profile)
    assert spec.runtime is not None
    assert node.max_model_len == spec.runtime.max_model_len and node.model_name == spec.model
    assert bool(node.gpu) == (spec.gpu is not None)


def test_a_wildcard_bind_gives_loopback_urls_for_the_api_and_the_ui():
    node = NodeConfig.from_dict(node_json.render("cpu", vllm_server_host="0.0.0.0", chat_ui_host="::"))
    assert node.api_url == "http://127.0.0.1:8000/v1" and node.ui_url == "http://127.0.0.1:8501"


def test_unknown_missing_and_mistyped_keys_are_refused_by_name(tmp_path):
    data = node_json.render("cpu")
    with pytest.raises(NodeConfigError, match=r"unknown key 'max_len'.*fix: deploy the node again"):
        NodeConfig.from_dict(data | {"max_len": 1})
    del data["model_name"]
    path = tmp_path / "node.json"
    path.write_text(json.dumps(data))
    with pytest.raises(NodeConfigError, match=rf"{path}: missing key 'model_name'"):
        NodeConfig.load(path)
    with pytest.raises(NodeConfigError, match=r"max_model_len must be int, not '4096'"):
        NodeConfig.from_dict(node_json.render("cpu") | {"max_model_len": "4096"})


def test_public_settings_leave_the_api_key_out():
    node = NodeConfig.from_dict(node_json.render("cpu", vllm_server_host="10.0.0.1", vllm_server_api_key="s3cret"))
    assert node.api_key == "s3cret" and "s3cret" not in json.dumps(node.public())
