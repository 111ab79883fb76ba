"""A small OpenAI-compatible client for the kit's vLLM server, streaming first.

Why not the `openai` package: the client must run in every profile's locked
environment and in the smoke tests with the same behaviour; the standard
library is enough for JSON over HTTP and server-sent events, and it sends the
vLLM extensions the kit depends on (prompt as token ids, stop token ids).
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from glmdeploy import chatglm3


class ServerUnavailable(ConnectionError):
    """The API server cannot be reached; the message says where we looked."""


class ServerError(RuntimeError):
    """The server answered with an HTTP error."""


@dataclass
class Completion:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    first_token_s: float | None = None
    chunks: int = 0
    completion_tokens: int | None = None


@dataclass
class ApiClient:
    base_url: str
    model: str
    api_key: str = ""
    timeout_s: float = 120.0

    def _connection(self) -> tuple[http.client.HTTPConnection, str]:
        parts = urlsplit(self.base_url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return cls(parts.hostname or "127.0.0.1", parts.port, timeout=self.timeout_s), parts.path.rstrip("/")

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> http.client.HTTPResponse:
        conn, prefix = self._connection()
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            conn.request(method, prefix + path, body=json.dumps(body) if body is not None else None, headers=headers)
            response = conn.getresponse()
        except OSError as exc:
            raise ServerUnavailable(f"cannot reach the model server at {self.base_url}: {exc}") from exc
        if response.status >= 400:
            detail = response.read().decode("utf-8", "replace")[:500]
            raise ServerError(f"{method} {path} -> HTTP {response.status}: {detail}")
        return response

    def get_json(self, path: str) -> Any:
        return json.loads(self._request("GET", path).read())

    def health(self) -> bool:
        """True when the server's /health answers 200 (the server is up, not that it can generate)."""
        parts = urlsplit(self.base_url)
        root = ApiClient(f"{parts.scheme}://{parts.netloc}", self.model, self.api_key, timeout_s=5)
        try:
            root._request("GET", "/health").read()
        except (ServerUnavailable, ServerError):
            return False
        return True

    def completion_body(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        temperature: float,
        top_p: float,
        stream: bool,
        ignore_eos: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "stream": stream,
            "stop_token_ids": list(chatglm3.STOP_TOKEN_IDS),
            "skip_special_tokens": True,
        }
        if ignore_eos:
            body["ignore_eos"] = True
        return body

    def stream_completion(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int = 256,
        temperature: float = 0.8,
        top_p: float = 0.8,
        ignore_eos: bool = False,
    ) -> Iterator[str]:
        """Yield text pieces as the server streams them."""
        for choice in self._stream_choices(
            self.completion_body(prompt_ids, max_tokens, temperature, top_p, True, ignore_eos)
        ):
            if choice.get("text"):
                yield choice["text"]

    def _stream_choices(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        response = self._request("POST", "/completions", body)
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            event = json.loads(data)
            yield from event.get("choices", [])

    def complete(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int = 64,
        temperature: float = 0.8,
        top_p: float = 0.8,
        stream: bool = True,
        ignore_eos: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> Completion:
        """Run one generation and collect text, token ids (where the server reports them) and timing.

        `extra` adds request fields (e.g. `logit_bias`, `seed`) without a parameter for each.
        """
        body = self.completion_body(prompt_ids, max_tokens, temperature, top_p, stream, ignore_eos)
        body["return_token_ids"] = True
        body.update(extra or {})
        result = Completion()
        start = time.perf_counter()
        if stream:
            choices = self._stream_choices(body)
        else:
            response = json.loads(self._request("POST", "/completions", body).read())
            result.completion_tokens = (response.get("usage") or {}).get("completion_tokens")
            choices = iter(response.get("choices", []))
        for choice in choices:
            if result.first_token_s is None and choice.get("text"):
                result.first_token_s = time.perf_counter() - start
            result.chunks += 1
            result.text += choice.get("text") or ""
            result.token_ids += choice.get("token_ids") or []
            result.finish_reason = choice.get("finish_reason") or result.finish_reason
        return result
