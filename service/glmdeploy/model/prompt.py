"""Build ChatGLM3 prompt token ids from chat messages.

Why ids and not a rendered template: ChatGLM3's own tokenizer encodes text
with plain SentencePiece, so a template rendered to text and tokenized again
can send the model the *characters* `<|user|>` instead of id 64795 (the model
then answers badly, with no error). The reverse happens with fast tokenizers
that match special strings in text: a user who types `<|user|>` would inject a
real role marker. Building ids explicitly (role markers as ids, message text
as plain text) is correct for both, and mirrors the model's own
`build_chat_input`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from glmdeploy.model import chatglm3


class PromptInjectionError(ValueError):
    """Message text produced a structural token id; refusing to send it."""


class _Encoder(Protocol):
    def __call__(self, text: str) -> list[int]: ...


def plain_text_encoder(tokenizer: Any) -> _Encoder:
    """Return a function that encodes text with special strings treated as ordinary text.

    Fast tokenizers get a private copy of their backend with
    `encode_special_tokens` on (the shared tokenizer is left untouched);
    ChatGLM3's SentencePiece tokenizer already encodes text that way.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and getattr(tokenizer, "is_fast", False):
        private = copy.deepcopy(backend)
        private.encode_special_tokens = True

        def encode_fast(text: str) -> list[int]:
            return list(private.encode(text, add_special_tokens=False).ids)

        return encode_fast

    def encode_slow(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    return encode_slow


class PromptBuilder:
    """Turns `[{"role": ..., "content": ...}, ...]` into the id sequence ChatGLM3 was trained on."""

    def __init__(self, encode: _Encoder) -> None:
        self._encode = encode

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> PromptBuilder:
        return cls(plain_text_encoder(tokenizer))

    def text_ids(self, text: str) -> list[int]:
        ids = self._encode(text)
        leaked = sorted(set(ids) & chatglm3.STRUCTURAL_IDS)
        if leaked:
            raise PromptInjectionError(f"message text encoded to structural token ids {leaked}")
        return ids

    def message_ids(self, role: str, content: str, metadata: str = "") -> list[int]:
        if role not in chatglm3.ROLE_IDS:
            raise ValueError(f"unknown role {role!r}; ChatGLM3 roles are {', '.join(chatglm3.ROLES)}")
        return [chatglm3.ROLE_IDS[role], *self.text_ids(f"{metadata}\n"), *self.text_ids(content)]

    def chat_ids(self, messages: Iterable[Mapping[str, str]], add_generation_prompt: bool = True) -> list[int]:
        encoded = (self.message_ids(m["role"], m["content"], m.get("metadata", "")) for m in messages)
        return self.join(encoded, add_generation_prompt)

    @staticmethod
    def join(encoded: Iterable[Sequence[int]], add_generation_prompt: bool = True) -> list[int]:
        """A prompt from messages already encoded (message_ids): ChatGLM3's prefix, the messages in
        order, then the assistant marker. Callers that size a chat encode each message once."""
        ids = list(chatglm3.PREFIX_IDS)
        for message in encoded:
            ids += message
        if add_generation_prompt:
            ids.append(chatglm3.ROLE_IDS["assistant"])
        return ids


def load_tokenizer(model_dir: str, trust_remote_code: bool = False) -> Any:
    """Load the tokenizer shipped with the model, from local files only."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code, local_files_only=True)


def distinct_ratio(ids: Sequence[int]) -> float:
    """Share of distinct ids: a model stuck on one token (e.g. only id 0) scores near zero."""
    return len(set(ids)) / len(ids) if ids else 0.0
