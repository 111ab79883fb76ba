"""A deployed node must really generate: non-empty text, varied ids, streaming, stop ids."""

from __future__ import annotations

import json

import pytest

from glmdeploy import chatglm3
from glmdeploy.client import ApiClient
from glmdeploy.config import NodeConfig
from glmdeploy.prompt import PromptBuilder, distinct_ratio


def test_generation_returns_text_with_varied_ids(client: ApiClient, builder: PromptBuilder) -> None:
    result = client.complete(
        builder.chat_ids([{"role": "user", "content": "你好"}]), max_tokens=32, stream=False, ignore_eos=True
    )
    ids = result.token_ids or builder.text_ids(result.text)
    assert result.text.strip(), "the server returned empty text"
    assert distinct_ratio(ids) >= 0.2, f"generated ids barely vary: {ids}"


def test_streaming_delivers_tokens_in_several_chunks(client: ApiClient, builder: PromptBuilder) -> None:
    result = client.complete(
        builder.chat_ids([{"role": "user", "content": "Tell me a story."}]), max_tokens=24, stream=True, ignore_eos=True
    )
    assert result.chunks >= 5, f"expected a streamed reply, got {result.chunks} chunk(s)"
    assert result.first_token_s is not None and result.text.strip()


def test_server_receives_the_prompt_ids_the_kit_built(client: ApiClient, builder: PromptBuilder) -> None:
    ids = builder.chat_ids([{"role": "user", "content": "hello"}])
    body = client.completion_body(ids, 1, 0.0, 1.0, stream=False)
    body["return_token_ids"] = True
    response = json.loads(client._request("POST", "/completions", body).read())
    served = response["choices"][0].get("prompt_token_ids")
    if served is None:  # servers without return_token_ids (vLLM 0.4.x): nothing more to compare
        return
    assert served == ids


def test_openai_chat_endpoint_streams(client: ApiClient, node: NodeConfig) -> None:
    body = {
        "model": node.served_model_name,
        "stream": True,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
        "ignore_eos": True,
    }
    response = client._request("POST", "/chat/completions", body)
    pieces = []
    for raw in response:
        line = raw.decode().strip()
        if line.startswith("data:") and line != "data: [DONE]":
            for choice in json.loads(line[5:]).get("choices", []):
                pieces.append(choice.get("delta", {}).get("content") or "")
    assert "".join(pieces).strip(), "chat completions streamed no text"


def test_client_always_sends_chatglm3_stop_ids(client: ApiClient) -> None:
    body = client.completion_body([1], 1, 0.0, 1.0, stream=True)
    assert body["stop_token_ids"] == [chatglm3.EOS_ID, 64795, 64797]


# Forcing one token with a large logit bias makes the model emit it at the first step,
# whatever its weights: the reply must then end right there, because the kit sends
# ChatGLM3's stop ids. Without them the server would repeat the token up to max_tokens.
FORCE = 100.0


@pytest.mark.parametrize("stop_id", chatglm3.STOP_TOKEN_IDS, ids=lambda i: f"id{i}")
def test_generation_stops_at_chatglm3_stop_id(client: ApiClient, builder: PromptBuilder, stop_id: int) -> None:
    prompt = builder.chat_ids([{"role": "user", "content": "hi"}])
    result = client.complete(
        prompt, max_tokens=8, temperature=0.0, stream=False, extra={"logit_bias": {str(stop_id): FORCE}}
    )
    assert result.finish_reason == "stop", (
        f"forced stop id {stop_id}: finish_reason={result.finish_reason}, "
        f"{result.completion_tokens} tokens; the server does not stop at ChatGLM3's stop ids"
    )
    assert (result.completion_tokens or 0) <= 1, f"{result.completion_tokens} tokens generated after stop id {stop_id}"


def test_forced_plain_token_runs_to_max_tokens(client: ApiClient, builder: PromptBuilder) -> None:
    """The control for the stop test: the same forcing with an ordinary id does not stop early."""
    plain_id = builder.text_ids("hello")[-1]
    prompt = builder.chat_ids([{"role": "user", "content": "hi"}])
    result = client.complete(
        prompt, max_tokens=8, temperature=0.0, stream=False, extra={"logit_bias": {str(plain_id): FORCE}}
    )
    assert result.finish_reason == "length" and result.completion_tokens == 8, (
        f"forced plain id {plain_id}: finish_reason={result.finish_reason}, {result.completion_tokens} tokens"
    )


def test_models_endpoint_lists_the_served_model(client: ApiClient, node: NodeConfig) -> None:
    ids = [m["id"] for m in client.get_json("/models")["data"]]
    assert node.served_model_name in ids
