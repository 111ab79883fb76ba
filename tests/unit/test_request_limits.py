"""The bounds on one request (glmdeploy.serving.request_limits), as vLLM's API server runs them:
a pure ASGI middleware in front of an app that records what reached it. The same middleware in
front of vLLM 0.4.3's own server is tested on the rehearsal node (tests/e2e/test_fleet.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from glmdeploy.serving import request_limits

LIMITS = {"max_body_bytes": 4096, "max_n": 4, "max_best_of": 4, "max_logprobs": 5, "max_tokens": 32768}


def call(
    path: str, chunks: list[bytes], method: str = "POST", declared: int | None = None
) -> tuple[int, Any, list[bytes]]:
    """Send one request through the middleware; returns the status, the JSON answer, and the body
    chunks the app behind it received (empty: it was never called)."""
    reached: list[bytes] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            reached.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = json.dumps({"ok": True}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    pending = iter(messages)

    async def receive() -> dict[str, Any]:
        return next(pending, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    size = sum(len(c) for c in chunks) if declared is None else declared
    scope = {"type": "http", "method": method, "path": path, "headers": [(b"content-length", str(size).encode())]}
    asyncio.run(request_limits.RequestLimits(app, LIMITS)(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body), reached


def completion(**fields: Any) -> list[bytes]:
    return [json.dumps({"model": "chatglm3-6b-32k", "prompt": "hi", "max_tokens": 8, **fields}).encode()]


@pytest.mark.parametrize("prompt", ["", [], [""], [[]]])
def test_an_empty_prompt_gets_a_400_and_never_reaches_the_engine(prompt: Any) -> None:
    status, answer, reached = call("/v1/completions", completion(prompt=prompt))
    assert (status, answer["error"]["param"], reached) == (400, "prompt", [])
    assert "fix:" in answer["error"]["message"]


@pytest.mark.parametrize(
    ("field", "value"), [("best_of", 100), ("n", 50), ("logprobs", 20), ("max_tokens", 10**9), ("max_tokens", 0)]
)
def test_a_field_over_its_bound_gets_a_400_naming_field_and_bound(field: str, value: int) -> None:
    status, answer, reached = call("/v1/completions", completion(**{field: value}))
    assert (status, answer["error"]["param"], reached) == (400, field, [])
    assert answer["error"]["type"] == "invalid_request_error"
    assert str(value) in answer["error"]["message"]


@pytest.mark.parametrize(
    "fields",
    [
        {"guided_regex": "a+"},
        {"guided_json": {}},
        {"guided_choice": ["a"]},
        {"response_format": {"type": "json_object"}},
    ],
)
def test_guided_decoding_is_refused_on_chat(fields: dict[str, Any]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    status, answer, reached = call("/v1/chat/completions", [json.dumps(body).encode()])
    assert (status, reached) == (400, [])
    assert answer["error"]["param"] == next(iter(fields))


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_a_number_that_is_not_finite_gets_a_400(token: str) -> None:
    body = b'{"model": "m", "prompt": "hi", "temperature": ' + token.encode() + b"}"
    status, answer, reached = call("/v1/completions", [body])
    assert (status, answer["error"]["param"], reached) == (400, "temperature", [])


def test_a_body_over_the_bound_is_refused_before_it_is_read_whole() -> None:
    status, answer, reached = call("/v1/completions", [b"x" * 100], declared=10**7)
    assert (status, answer["error"]["param"], reached) == (400, "body", [])
    # Sent in chunks with no length: refused at the chunk that crosses the bound.
    status, answer, reached = call("/v1/completions", [b"x" * 3000, b"x" * 3000, b"x" * 3000], declared=-1)
    assert (status, answer["error"]["param"], reached) == (400, "body", [])


def test_a_request_within_the_bounds_reaches_the_engine_byte_for_byte() -> None:
    body = json.dumps({"model": "m", "prompt": "hi", "n": 4, "best_of": 4, "logprobs": 5, "max_tokens": 32768}).encode()
    chunks = [body[:10], body[10:]]
    status, answer, reached = call("/v1/completions", chunks)
    assert (status, answer, b"".join(reached)) == (200, {"ok": True}, body)


def test_other_routes_and_methods_pass_untouched() -> None:
    for method, path in (("GET", "/v1/models"), ("POST", "/tokenize"), ("GET", "/v1/completions")):
        status, _, reached = call(path, [json.dumps({"prompt": ""}).encode()], method=method)
        assert (status, reached) == (200, [b'{"prompt": ""}'])


def test_a_body_that_is_not_a_json_object_is_left_to_vllm() -> None:
    status, _, reached = call("/v1/completions", [b"not json"])
    assert (status, reached) == (200, [b"not json"])


def test_missing_or_malformed_limits_stop_the_server_start_naming_the_variable() -> None:
    for environ in ({}, {request_limits.ENV: "max_n=4"}, {request_limits.ENV: "max_n=four"}):
        with pytest.raises(RuntimeError, match=r"GLMDEPLOY_REQUEST_LIMITS.*fix: redeploy"):
            request_limits.load_limits(environ)
    # As the launcher's environment carries them (roles/vllm_server): name=value pairs, no quotes.
    given = ",".join(f"{k}={v}" for k, v in {**LIMITS, "max_header_bytes": 1}.items())
    assert request_limits.load_limits({request_limits.ENV: given}) == LIMITS
