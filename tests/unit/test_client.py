"""The streaming client against a loopback server that answers like vLLM does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import node_json  # tests/support
import pytest

from glmdeploy.api import sse
from glmdeploy.api.client import ApiClient, Completion, ServerError
from glmdeploy.serving.ready import prompt_mismatch
from glmdeploy.tools.bench.client import one_request


class _Server(ThreadingHTTPServer):
    events: list[object]
    bodies: list[dict[str, object]]
    #: When set, the reply body as written, one flushed write per item (events and [DONE] unused).
    raw: list[bytes] | None = None


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        self.server.bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if self.server.raw is not None:
            for piece in self.server.raw:
                self.wfile.write(piece)
                self.wfile.flush()
            return
        for event in self.server.events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        if not getattr(self.server, "no_done", False):
            self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.events, srv.bodies = [], []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _client(server: _Server, returns_token_ids: bool = False) -> ApiClient:
    return ApiClient(f"http://127.0.0.1:{server.server_port}/v1", "m", returns_token_ids=returns_token_ids)


def test_error_event_in_a_stream_raises_instead_of_an_empty_reply(server: _Server) -> None:
    server.events = [{"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}}]
    with pytest.raises(ServerError, match="CUDA out of memory"):
        list(_client(server).stream_completion([1, 2, 3]))


def test_error_after_some_text_still_raises(server: _Server) -> None:
    server.events = [{"choices": [{"text": "Hel"}]}, {"error": "engine died"}]
    pieces = []
    with pytest.raises(ServerError, match="engine died"):
        for piece in _client(server).stream_completion([1]):
            pieces.append(piece)
    assert pieces == ["Hel"]


def test_return_token_ids_is_sent_only_to_servers_that_take_it(server: _Server) -> None:
    server.events = [{"choices": [{"text": "x", "finish_reason": "length"}]}]
    _client(server, returns_token_ids=False).complete([1, 2])
    _client(server, returns_token_ids=True).complete([1, 2])
    assert "return_token_ids" not in server.bodies[0]
    assert server.bodies[1]["return_token_ids"] is True


def test_streamed_usage_gives_the_prompt_count(server: _Server) -> None:
    server.events = [
        {"choices": [{"text": "a", "finish_reason": None}]},
        {"choices": [{"text": "b", "finish_reason": "length"}], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
    ]
    result = _client(server).complete([1, 2, 3, 4])
    assert (result.text, result.prompt_tokens, result.completion_tokens) == ("ab", 4, 2)


def test_prompt_check_compares_ids_where_served_and_counts_elsewhere() -> None:
    sent = [64790, 64792, 64795, 30910, 13, 100, 64796]
    assert prompt_mismatch(Completion(prompt_token_ids=list(sent)), sent) is None
    assert prompt_mismatch(Completion(prompt_token_ids=[1, *sent]), sent)
    assert prompt_mismatch(Completion(prompt_tokens=len(sent)), sent) is None
    # A template rendered to text and tokenized again has more tokens than the built ids.
    assert "counted 12" in str(prompt_mismatch(Completion(prompt_tokens=12), sent))
    assert prompt_mismatch(Completion(), sent) == "the server reported neither prompt ids nor usage.prompt_tokens"


def test_stream_cut_off_before_done_raises(server: _Server) -> None:
    server.events = [{"choices": [{"text": "partial"}]}]
    server.no_done = True
    with pytest.raises(ServerError, match="without \\[DONE\\]"):
        list(_client(server).stream_completion([1]))


# vLLM 0.4.3's bytes when generation fails mid-stream (serving_completion.py: the chunks so far,
# create_streaming_error_response, then [DONE]), with a keep-alive comment and CRLF line ends.
VLLM_043_FAILING_STREAM = [
    b": ping\r\n\r\n",
    b'data: {"choices": [{"index": 0, "text": "Hel", "finish_reason": null}]}\r\n\r\n',
    b'data: {"choices": [{"index": 0, "text": "lo", "finish_reason": null}]}\r\n\r\n',
    b'data: {"error": {"object": "error", "message": "CUDA out of memory", "type": "BadRequestError", '
    b'"param": null, "code": 400}}\r\n\r\n',
    b"data: [DONE]\r\n\r\n",
]


def test_client_raises_on_vllm_043_error_event_after_streamed_chunks(server: _Server) -> None:
    server.raw = VLLM_043_FAILING_STREAM
    pieces = []
    with pytest.raises(ServerError, match=r"CUDA out of memory \(code 400") as info:
        for piece in _client(server).stream_completion([1]):
            pieces.append(piece)
    assert pieces == ["Hel", "lo"]
    assert info.value.code == 400
    assert isinstance(info.value.__cause__, sse.ErrorEvent)


def test_complete_raises_instead_of_returning_the_text_before_the_error(server: _Server) -> None:
    server.raw = VLLM_043_FAILING_STREAM
    with pytest.raises(ServerError, match="CUDA out of memory"):
        _client(server).complete([1])


def test_chat_stream_error_in_the_bare_object_shape_raises(server: _Server) -> None:
    server.raw = [b'data: {"object": "error", "message": "bad request", "type": "x", "code": 400}\n\n']
    with pytest.raises(ServerError, match="bad request"):
        list(_client(server).stream_events("/chat/completions", {"stream": True}))


def test_bench_request_raises_on_an_error_event(server: _Server) -> None:
    server.raw = VLLM_043_FAILING_STREAM
    with pytest.raises(ServerError, match="CUDA out of memory"):
        one_request(_client(server), [5, 6, 7], 4)


def test_client_and_node_config_keep_the_api_key_out_of_their_repr(tmp_path) -> None:
    """A failing smoke test prints its fixtures (the client, the node's config) into the deploy's
    output: the key must not be in what they print."""
    from glmdeploy.config import NodeConfig

    key = "k3y-that-must-not-print"
    client = ApiClient("http://10.0.0.1:8000/v1", "chatglm3-6b-32k", key)
    node = NodeConfig.load(
        node_json.write(tmp_path / "node.json", "gpu-cu121", vllm_server_host="10.0.0.1", vllm_server_api_key=key)
    )
    assert node.api_key == key and client.api_key == key
    assert key not in repr(client) and key not in repr(node) and key not in str(node)
