"""The tokenizer the vLLM server loads: the model's own, with chat prompts built as ids.

Why: `/v1/chat/completions` renders the chat template to *text* and tokenizes that
text again. ChatGLM3's own tokenizer encodes text with plain SentencePiece, so the
role markers of a rendered template reach the model as the characters `<|user|>`
instead of id 64795 (the model answers badly, with no error); a tokenizer that maps
those characters to ids would also map what a user types (prompt injection). This
subclass answers `apply_chat_template(..., tokenize=False)` with a `ChatPrompt`: a
`str` holding the rendered text, for logs and reading, that also carries the ids
`glmdeploy.model.prompt.PromptBuilder` built (role markers as ids, message text as plain
text). When the server tokenizes that same object again, it gets those ids back.
Any other text is tokenized exactly as the model's tokenizer does.

The release's `tokenizer/` directory (roles/vllm_server) holds a two-line module that
applies `served_class_for` to the release's model, and a `tokenizer_config.json`: the
model's own, plus the kit's chat template and `auto_map` naming that module (the class
reads the model's `tokenizer.model` from the model directory). The server gets `--tokenizer <release>/tokenizer`.
If a server ever copied the text instead of passing the object on, the prompt would be
re-tokenized from text: the smoke suite compares the served prompt with the published
ChatGLM3 sequence and fails on that.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from glmdeploy.model import chatglm3
from glmdeploy.model.prompt import PromptBuilder


class ChatPrompt(str):
    """Rendered chat text that remembers the prompt ids built for it."""

    token_ids: tuple[int, ...]

    def __new__(cls, text: str, token_ids: Iterable[int]) -> ChatPrompt:
        obj = super().__new__(cls, text)
        obj.token_ids = tuple(token_ids)
        return obj

    def __reduce__(self) -> tuple[type[ChatPrompt], tuple[str, tuple[int, ...]]]:
        # vLLM copies sequences (deepcopy on fork: n > 1, best_of, beam search) and may pickle
        # them to other processes: the ids must travel with the text.
        return (ChatPrompt, (str(self), self.token_ids))


def _messages(conversation: Any) -> list[Mapping[str, str]]:
    """OpenAI-style messages; content given as parts (`[{"type": "text", ...}]`) is joined."""
    messages: list[Mapping[str, str]] = []
    for message in conversation:
        content = message.get("content") or ""
        if not isinstance(content, str):
            content = "".join(part.get("text", "") for part in content if part.get("type") == "text")
        messages.append({**message, "content": content})
    return messages


def served_class(base: type, vocab_file: str | None = None) -> type:
    """Subclass a ChatGLM3 tokenizer class so chat prompts keep their role ids through the server.

    vocab_file: the model's `tokenizer.model`, used when the loader passes none (transformers 5
    does not pass a `vocab_file` named in tokenizer_config.json; 4.40.2 does).
    """

    class GlmdeployServedTokenizer(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if not args and kwargs.get("vocab_file") is None and vocab_file is not None:
                kwargs["vocab_file"] = vocab_file
            super().__init__(*args, **kwargs)

        def apply_chat_template(
            self,
            conversation: Any,
            chat_template: str | None = None,
            add_generation_prompt: bool = False,
            tokenize: bool = True,
            **kwargs: Any,
        ) -> Any:
            messages = _messages(conversation)
            ids = PromptBuilder.from_tokenizer(self).chat_ids(messages, add_generation_prompt=add_generation_prompt)
            if tokenize:
                return ids
            text = super().apply_chat_template(
                messages,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **kwargs,
            )
            return ChatPrompt(text, ids)

        def tokenize(self, text: str, *args: Any, **kwargs: Any) -> list[str]:
            if isinstance(text, ChatPrompt):
                return list(self.convert_ids_to_tokens(list(text.token_ids)))
            return list(super().tokenize(text, *args, **kwargs))

        def build_inputs_with_special_tokens(self, ids: list[int], pair: list[int] | None = None) -> list[int]:
            # A ChatPrompt already starts with [gMASK] sop; servers ask for no special tokens then,
            # but a second prefix must never be added even if one does.
            if pair is None and ids[:2] == list(chatglm3.PREFIX_IDS):
                return ids
            return list(super().build_inputs_with_special_tokens(ids, pair))

    GlmdeployServedTokenizer.__name__ = GlmdeployServedTokenizer.__qualname__ = f"Glmdeploy{base.__name__}"
    return GlmdeployServedTokenizer


def model_tokenizer_class(model_dir: str | Path) -> type:
    """The model's own tokenizer class, from the file its `tokenizer_config.json` `auto_map` names."""
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    reference = ((config.get("auto_map") or {}).get("AutoTokenizer") or [None])[0]
    if not reference or "." not in reference:
        raise ValueError(f"{model_dir}/tokenizer_config.json names no remote-code tokenizer in auto_map.AutoTokenizer")
    module_name, class_name = reference.rsplit(".", 1)
    name = f"glmdeploy_model_{module_name}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, model_dir / f"{module_name}.py")
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {model_dir / (module_name + '.py')}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return getattr(sys.modules[name], class_name)  # type: ignore[no-any-return]


def served_class_for(model_dir: str | Path) -> type:
    """The served tokenizer class of a model directory (what the release's shim module exports)."""
    return served_class(model_tokenizer_class(model_dir), str(Path(model_dir) / "tokenizer.model"))
