"""A deployed node must really generate: non-empty text, varied ids, streaming, stop ids."""

from __future__ import annotations

import json

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


def test_models_endpoint_lists_the_served_model(client: ApiClient, node: NodeConfig) -> None:
    ids = [m["id"] for m in client.get_json("/models")["data"]]
    assert node.served_model_name in ids
