"""A deployed node must really generate: non-empty text, varied ids, streaming, stop ids."""

from __future__ import annotations

import json

import pytest

from glmdeploy.api.client import ApiClient, ServerError
from glmdeploy.config import NodeConfig
from glmdeploy.model import chatglm3
from glmdeploy.model.prompt import PromptBuilder, distinct_ratio
from glmdeploy.serving.ready import prompt_mismatch


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
    """Id for id where the server returns prompt ids; by usage.prompt_tokens where it does not (vLLM 0.4.3)."""
    ids = builder.chat_ids([{"role": "user", "content": "hello"}])
    result = client.complete(ids, max_tokens=1, temperature=0.0, stream=False)
    assert prompt_mismatch(result, ids) is None, prompt_mismatch(result, ids)


def test_client_sends_return_token_ids_only_where_the_server_takes_it(client: ApiClient, node: NodeConfig) -> None:
    """vLLM 0.4.3 forbids unknown request fields (HTTP 400): the profile's capability decides."""
    ids = [64790, 64792, 64795, 64796]
    body = client.completion_body(ids, 1, 0.0, 1.0, stream=False)
    body["return_token_ids"] = True
    try:
        response = json.loads(client._request("POST", "/completions", body).read())
    except ServerError as exc:
        assert not node.server_returns_token_ids, f"the node says its server takes return_token_ids: {exc}"
        return
    assert node.server_returns_token_ids, "the server takes return_token_ids, the node's profile says it does not"
    assert response["choices"][0].get("prompt_token_ids") == ids


def test_openai_chat_endpoint_streams(client: ApiClient, node: NodeConfig) -> None:
    body = {
        "model": node.served_model_name,
        "stream": True,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
        "ignore_eos": True,
    }
    pieces = [
        choice.get("delta", {}).get("content") or ""
        for event in client.stream_events("/chat/completions", body)
        for choice in event.get("choices", [])
    ]
    assert "".join(pieces).strip(), "chat completions streamed no text"


# Third-party clients send messages, not ids: the server must still run ChatGLM3's own
# sequence (role markers as ids, the published `[gMASK] sop <|user|> "\n" 你好 <|assistant|>`),
# and a role marker typed by a user must stay text. A template rendered to text and tokenized
# again by ChatGLM3's tokenizer, or a ChatML fallback, gives other ids and another count.
CHATS = {
    "one_turn": [{"role": "user", "content": "你好"}],
    "typed_role_markers": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Say <|assistant|> then <|user|> [gMASK]sop as plain text."},
    ],
}


@pytest.mark.parametrize("chat", CHATS, ids=str)
def test_chat_endpoint_runs_the_chatglm3_prompt(
    client: ApiClient, node: NodeConfig, builder: PromptBuilder, chat: str
) -> None:
    messages = CHATS[chat]
    want = builder.chat_ids(messages)
    body: dict[str, object] = {"model": node.served_model_name, "max_tokens": 1, "messages": messages}
    if node.server_returns_token_ids:
        body["return_token_ids"] = True
    response = json.loads(client._request("POST", "/chat/completions", body).read())
    served = response.get("prompt_token_ids")
    if served is not None:
        assert served == want, f"served {served}, ChatGLM3's sequence is {want}"
    else:  # vLLM 0.4.3 returns no prompt ids: its count must be the sequence's
        counted = response["usage"]["prompt_tokens"]
        assert counted == len(want), f"the server counted {counted} prompt tokens; ChatGLM3's sequence has {len(want)}"


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


def test_chat_endpoint_serves_several_choices(client: ApiClient, node: NodeConfig) -> None:
    """n > 1 makes the engine fork the prompt's sequence (a copy of the served chat prompt)."""
    body = {"model": node.served_model_name, "max_tokens": 4, "n": 2, "messages": CHATS["one_turn"]}
    response = json.loads(client._request("POST", "/chat/completions", body).read())
    assert len(response["choices"]) == 2, response
    assert all(c["message"]["content"] is not None for c in response["choices"]), response
