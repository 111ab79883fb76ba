"""What of a chat goes to the model: the newest turns that fit the node's context window.

Why here and not in the UI: the whole history is sent every turn, so a chat that grows past
`max_model_len` (or one pasted document) would fail every later message with the server's
HTTP 400. The window is counted with the same prompt builder that makes the ids, so the count
is the server's count; a message that cannot fit even alone is refused before anything is sent.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass

from glmdeploy.api.client import ApiClient
from glmdeploy.model.prompt import PromptBuilder


class MessageTooLong(ValueError):
    """The newest message (with the system prompt and the reply's budget) exceeds the window."""

    def __init__(self, message_tokens: int, max_model_len: int, reply_tokens: int) -> None:
        super().__init__(
            f"the message is {message_tokens:,} tokens; this node takes {max_model_len:,} with the reply's"
            f" {reply_tokens:,}"
        )
        self.message_tokens = message_tokens
        self.max_model_len = max_model_len
        self.reply_tokens = reply_tokens


@dataclass(frozen=True)
class Window:
    """The ids to send, how many earlier messages were left out, and the prompt's size."""

    ids: list[int]
    dropped: int
    prompt_tokens: int


def fit(
    builder: PromptBuilder,
    history: Sequence[Mapping[str, str]],
    max_model_len: int,
    reply_tokens: int,
    system: str = "",
) -> Window:
    """The newest whole turns that leave `reply_tokens` free; the system prompt is always kept.

    A window starts at a user message, so no reply is sent without its question. Each message is
    encoded once and the prompt joined from those ids (PromptBuilder.join), so sizes add up.
    """
    if not any(m["role"] == "user" for m in history):
        raise ValueError("a chat to send needs a user message")
    budget = max_model_len - reply_tokens
    head = [builder.message_ids("system", system)] if system.strip() else []
    fixed = len(builder.join(head))  # prefix, system prompt, assistant marker
    encoded = [builder.message_ids(m["role"], m["content"], m.get("metadata", "")) for m in history]
    total = fixed
    start = len(history)
    for index in range(len(history) - 1, -1, -1):
        total += len(encoded[index])
        if total > budget:
            break
        if history[index]["role"] == "user":
            start = index
    if start == len(history):
        last_user = max(i for i, m in enumerate(history) if m["role"] == "user")
        alone = fixed + sum(len(ids) for ids in encoded[last_user:])
        raise MessageTooLong(alone, max_model_len, reply_tokens)
    ids = builder.join([*head, *encoded[start:]])
    return Window(ids=ids, dropped=start, prompt_tokens=len(ids))


@dataclass
class Reply:
    """One streamed reply as it arrives: its text, tokens and timing (for the line under it)."""

    text: str = ""
    tokens: int = 0
    first_token_s: float | None = None
    elapsed_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decode speed after the first token (the first waits on the prompt's prefill)."""
        decode_s = self.elapsed_s - (self.first_token_s or 0.0)
        return (self.tokens - 1) / decode_s if self.tokens > 1 and decode_s > 0 else 0.0


def stream_reply(
    client: ApiClient, ids: Sequence[int], max_tokens: int, temperature: float, top_p: float, reply: Reply
) -> Generator[str, None, None]:
    """Yield the reply's text pieces, filling `reply` as they come.

    Closing this generator (a Stop, a page that went away) closes the connection, and the server
    aborts the request: nothing keeps generating for a reader who left. Tokens are the server's
    ids where it returns them, else one per streamed choice (vLLM sends one token per event).
    """
    body = client.completion_body(ids, max_tokens, temperature, top_p, stream=True)
    if client.returns_token_ids:
        body["return_token_ids"] = True
    start = time.monotonic()
    with contextlib.closing(client.stream_events("/completions", body)) as events:
        for event in events:
            for choice in event.get("choices", []):
                reply.tokens += len(choice.get("token_ids") or []) or 1
                reply.elapsed_s = time.monotonic() - start
                if reply.first_token_s is None:
                    reply.first_token_s = reply.elapsed_s
                if choice.get("text"):
                    reply.text += choice["text"]
                    yield choice["text"]
