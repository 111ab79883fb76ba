"""Bounds on what one request may ask of the engine, enforced in vLLM's own API server
(`--middleware glmdeploy.serving.request_limits.RequestLimits`), where every request enters a
node whether or not a balancer stands in front of it.

Why here and not in the engine: the pinned vLLM 0.4.3 has published weaknesses its own checks do
not stop (constraints/advisories/triage.toml): an empty prompt kills the API server
(CVE-2024-8768), a large `best_of` or `n` exhausts it (CVE-2024-8939, CVE-2026-34756), a NaN
temperature reaches the sampler (CVE-2026-54235), guided decoding goes
through outlines' cache (CVE-2025-29770) and compiles user regexes. A request over a bound gets
HTTP 400 in OpenAI's error shape naming the field, the bound and the fix, before vLLM parses it;
the server keeps serving. Pure ASGI and the standard library: it runs inside whichever vLLM the
profile pins (0.4.3's FastAPI/Starlette, or a newer one) without importing either.

The bounds come from the registry's `[kit.request_limits]` (plus the profile's context length as
`max_tokens`), passed by the launcher's environment in `GLMDEPLOY_REQUEST_LIMITS` as `name=value`
pairs joined by commas (no quotes: systemd's `Environment=` would take them out).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

ENV = "GLMDEPLOY_REQUEST_LIMITS"
#: The routes that generate (the others carry no user text to the engine).
GENERATING = ("/v1/completions", "/v1/chat/completions")
#: Request fields that turn on guided decoding (vLLM's extensions; OpenAI's response_format
#: other than "text" does too): the kit serves no guided decoding.
GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend")
#: The bounds, by name (their values: the registry, through the launcher).
KEYS = ("max_body_bytes", "max_n", "max_best_of", "max_logprobs", "max_tokens")


def load_limits(environ: MutableMapping[str, str] | None = None) -> dict[str, int]:
    """The bounds from the launcher's environment; a missing or malformed value stops the server's
    start with the variable named (a server that silently ran without bounds would look protected)."""
    raw = (os.environ if environ is None else environ).get(ENV, "")
    try:
        given = dict(pair.split("=", 1) for pair in raw.split(","))
        limits = {k: int(given[k]) for k in KEYS}
    except (ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(
            f"{ENV}={raw!r}: not the kit's request limits ({exc}); fix: redeploy (make deploy) so the launcher sets it"
        ) from exc
    return limits


class Refusal(Exception):
    """A request over a bound: the field and the message the client gets."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


def _empty(prompt: Any) -> bool:
    """An empty completions prompt in any of the shapes OpenAI allows: "", [], [""], [[]]."""
    if prompt in ("", []):
        return True
    return isinstance(prompt, list) and any(p in ("", []) for p in prompt)


def _int(body: dict[str, Any], field: str) -> int | None:
    value = body.get(field)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check(path: str, body: dict[str, Any], limits: dict[str, int]) -> None:
    """Raise Refusal for the first field over its bound."""
    for field, value in body.items():
        if isinstance(value, float) and not math.isfinite(value):
            # JSON has no NaN or Infinity, but Python's parser (vLLM's) takes them, and 0.4.3 passes
            # a NaN temperature on to the sampler (CVE-2026-54235).
            raise Refusal(field, f"{field}={value}: not a finite number; fix: send a number")
    if path == "/v1/completions" and "prompt" in body and _empty(body["prompt"]):
        raise Refusal("prompt", "prompt is empty; fix: send at least one token of prompt")
    for field, bound in (("n", limits["max_n"]), ("best_of", limits["max_best_of"])):
        value = _int(body, field)
        if value is not None and value > bound:
            raise Refusal(
                field, f"{field}={value} is over this server's limit of {bound}; fix: ask for {bound} or fewer"
            )
    tokens = _int(body, "max_tokens")
    if tokens is not None and not 0 < tokens <= limits["max_tokens"]:
        raise Refusal(
            "max_tokens",
            f"max_tokens={tokens} is outside 1..{limits['max_tokens']} (the context); fix: ask for fewer tokens",
        )
    for field in ("logprobs", "top_logprobs", "prompt_logprobs"):
        value = _int(body, field)
        if value is not None and value > limits["max_logprobs"]:
            raise Refusal(
                field, f"{field}={value} is over this server's limit of {limits['max_logprobs']}; fix: ask for fewer"
            )
    for field in GUIDED:
        if body.get(field) is not None:
            raise Refusal(field, f"{field}: guided decoding is not served by this deployment; fix: leave it out")
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type", "text") != "text":
        raise Refusal(
            "response_format", "response_format other than text (guided decoding) is not served; fix: leave it out"
        )


def error_body(param: str, message: str) -> bytes:
    """OpenAI's error shape."""
    return json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": 400}}
    ).encode()


class RequestLimits:
    """The ASGI middleware vLLM adds with `--middleware` (a class: `app.add_middleware(RequestLimits)`)."""

    def __init__(self, app: App, limits: dict[str, int] | None = None) -> None:
        self.app = app
        self.limits = limits if limits is not None else load_limits()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].rstrip("/") not in GENERATING:
            await self.app(scope, receive, send)
            return
        body, messages, refusal = await self._read(scope, receive)
        if refusal is None and body is not None:
            try:
                check(scope["path"].rstrip("/"), body, self.limits)
            except Refusal as exc:
                refusal = exc
        if refusal is not None:
            await _respond(send, error_body(refusal.param, refusal.message))
            return
        replay = iter(messages)

        async def again() -> Message:
            """The body as it came, then whatever the client sends next (a disconnect)."""
            return next(replay, None) or await receive()

        await self.app(scope, again, send)

    async def _read(
        self, scope: Scope, receive: Receive
    ) -> tuple[dict[str, Any] | None, list[Message], Refusal | None]:
        """The whole body (bounded): its JSON (None: not an object, vLLM answers that), the messages
        to hand on, or the refusal of a body over the bound (read no further)."""
        bound = self.limits["max_body_bytes"]
        declared = dict(scope.get("headers") or []).get(b"content-length", b"0")
        too_big = Refusal("body", f"the request body is over this server's limit of {bound} bytes; fix: send less")
        if declared.isdigit() and int(declared) > bound:
            return None, [], too_big
        messages, size, chunks = [], 0, []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return None, messages, None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > bound:
                return None, [], too_big
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        try:
            body = json.loads(b"".join(chunks))
        except ValueError:
            return None, messages, None
        return (body if isinstance(body, dict) else None), messages, None


async def _respond(send: Send, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})
