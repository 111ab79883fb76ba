"""ChatGLM3's tokenizer for the glmdeploy fixture model: the kit's own code, the real class's behaviour.

Shipped into the fixture's model directory by `glmdeploy_control.fixture` and loaded, like
the real ChatGLM3-6B-32k tokenizer, only with `trust_remote_code=True` (the class is named by
`auto_map` in tokenizer_config.json; transformers has no class of that name).

Written to behave like the real `tokenization_chatglm.py` wherever a kit check or vLLM can
observe it (read from the model's published file; none of its code is copied here):

- an `SPTokenizer` over `tokenizer.model` (SentencePiece); the nine special tokens get the
  ids after the SentencePiece vocabulary (64789-64797 for a 64789-piece model), so
  `vocab_size` is 64798;
- `convert_id_to_token` gives the empty string for eos, bos and pad/unk (ids 2, 1, 0), so
  `get_vocab()` holds one key for the three and **`len(tokenizer)` is 64796**, not 64798;
- eos `</s>` and pad/unk `<unk>` are properties of the class, not registered special tokens:
  `all_special_ids` is empty, so `decode(..., skip_special_tokens=True)` drops nothing but
  the empty strings of ids 0-2: `[gMASK]`, `sop` and the role tokens come back as text, and
  SentencePiece turns the word-start mark after a role token into a space;
- text is encoded with plain SentencePiece (typed `<|user|>` stays text); `encode(text)`
  prepends `[gMASK] sop`; `build_chat_input` puts role markers in as ids; left padding with
  `position_ids` among the model inputs.

Two shapes of the file, one source (`FILE_SHAPE`; glmdeploy_control.fixture renders each):

- "2023-10-26", the published chatglm3-6b-32k file: `import torch` at module level (loading
  the tokenizer fails without torch), no `encode_special_tokens` option, a `_pad` without the
  `padding_side` keyword (transformers >= 4.45 passes it and fails there), and
  `convert_id_to_token` of an id past the vocabulary raises (SentencePiece's error);
- "later", chatglm3-6b's later file: no torch import, `encode_special_tokens` (then only the
  nine special strings in text are mapped to their ids), `_pad` takes `padding_side`, ids past
  the vocabulary give the empty string. The cpu profile serves this shape on transformers 5.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

# glmdeploy-fixture: module imports of the 2023-10-26 shape go here
from sentencepiece import SentencePieceProcessor
from transformers import PreTrainedTokenizer
from transformers.utils import PaddingStrategy

#: In id order after the SentencePiece vocabulary, as the real tokenizer appends them.
SPECIAL_TOKENS = (
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "sop",
    "eop",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
)
ROLES = ("system", "user", "assistant", "observation")

#: Which published file this one behaves like: "later" or "2023-10-26" (set by the fixture generator).
FILE_SHAPE = "later"
PUBLISHED_2023 = FILE_SHAPE == "2023-10-26"
_ABSENT = "(not passed)"  # a value, not an object(): transformers may execute this module twice


class SPTokenizer:
    """SentencePiece plus the nine ChatGLM3 special tokens appended after its pieces."""

    def __init__(self, model_path: str) -> None:
        if not os.path.isfile(model_path):
            raise FileNotFoundError(f"SentencePiece model not found: {model_path}")
        self.sp_model = SentencePieceProcessor(model_file=model_path)
        self.n_sp = self.sp_model.vocab_size()
        self.bos_id = self.sp_model.bos_id()
        self.eos_id = self.sp_model.eos_id()
        self.pad_id = self.sp_model.unk_id()
        self.special_tokens = {token: self.n_sp + i for i, token in enumerate(SPECIAL_TOKENS)}
        self.index_special_tokens = {i: token for token, i in self.special_tokens.items()}
        self.n_words = self.n_sp + len(SPECIAL_TOKENS)
        self._special_pattern = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))
        self._vocab: dict[str, int] | None = None

    def tokenize(self, text: str, encode_special_tokens: bool = False) -> list[str]:
        if not encode_special_tokens or PUBLISHED_2023:
            return self.sp_model.encode(text, out_type=str)
        pieces: list[str] = []
        start = 0
        for match in self._special_pattern.finditer(text):
            if match.start() > start:
                pieces += self.sp_model.encode(text[start : match.start()], out_type=str)
            pieces.append(match.group())
            start = match.end()
        if start < len(text):
            pieces += self.sp_model.encode(text[start:], out_type=str)
        return pieces

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        ids = list(self.sp_model.encode(text))
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def decode(self, ids: list[int]) -> str:
        """Runs of SentencePiece ids decoded by SentencePiece, special ids as their text between them."""
        text, run = "", []
        for i in ids:
            if i in self.index_special_tokens:
                text += self.sp_model.decode_ids(run) if run else ""
                text, run = text + self.index_special_tokens[i], []
            else:
                run.append(i)
        return text + (self.sp_model.decode_ids(run) if run else "")

    def decode_tokens(self, tokens: list[str]) -> str:
        """All pieces through SentencePiece, special tokens included: it keeps a piece it does not know as text."""
        return str(self.sp_model.decode_pieces(tokens))

    def convert_token_to_id(self, token: str) -> int:
        if token in self.special_tokens:
            return self.special_tokens[token]
        return self.sp_model.piece_to_id(token)

    def convert_id_to_token(self, index: int) -> str:
        if index in self.index_special_tokens:
            return self.index_special_tokens[index]
        if index in (self.eos_id, self.bos_id, self.pad_id) or index < 0:
            return ""  # the real class's rule: get_vocab() then holds one key for ids 0-2
        if index >= self.n_sp and not PUBLISHED_2023:
            return ""  # the embedding's padding rows (64798..65023) are no token
        return str(self.sp_model.id_to_piece(index))  # past the vocabulary: SentencePiece raises

    def vocab(self) -> dict[str, int]:
        if self._vocab is None:
            self._vocab = {self.convert_id_to_token(i): i for i in range(self.n_words)}
        return dict(self._vocab)


class ChatGLMTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "tokenizer.model"}  # noqa: RUF012 (transformers reads it as is)
    model_input_names = ["input_ids", "attention_mask", "position_ids"]  # noqa: RUF012
    padding_side = "left"

    def __init__(
        self,
        vocab_file: str,
        padding_side: str = "left",
        clean_up_tokenization_spaces: bool = False,
        encode_special_tokens: bool = False,
        **kwargs: Any,
    ) -> None:
        self.name = "GLMTokenizer"
        self.vocab_file = vocab_file
        # Before the base class's __init__, which asks for the vocabulary.
        self.tokenizer = SPTokenizer(vocab_file)
        self.special_tokens = {
            "<bos>": self.tokenizer.bos_id,
            "<eos>": self.tokenizer.eos_id,
            "<pad>": self.tokenizer.pad_id,
        }
        if PUBLISHED_2023:
            # The 2023-10-26 file has no such option: a caller's value is only kept in init_kwargs.
            kwargs["encode_special_tokens"] = encode_special_tokens
        else:
            self.encode_special_tokens = encode_special_tokens
            kwargs["encode_special_tokens"] = encode_special_tokens
        super().__init__(
            padding_side=padding_side,
            clean_up_tokenization_spaces=clean_up_tokenization_spaces,
            **kwargs,
        )

    def get_command(self, token: str) -> int:
        """Id of `<bos>`/`<eos>`/`<pad>` or of one of the nine special tokens."""
        if token in self.special_tokens:
            return self.special_tokens[token]
        if token not in self.tokenizer.special_tokens:
            raise KeyError(f"{token} is not a special token for {self.name}")
        return self.tokenizer.special_tokens[token]

    # eos, pad and unk are answered by the class, not registered with transformers as special
    # tokens (the real class's way): all_special_ids stays empty, so skip_special_tokens drops
    # none of ChatGLM3's markers.
    @property
    def unk_token(self) -> str:  # type: ignore[override]
        return "<unk>"

    @property
    def pad_token(self) -> str:  # type: ignore[override]
        return "<unk>"

    @property
    def pad_token_id(self) -> int:  # type: ignore[override]
        return self.get_command("<pad>")

    @property
    def eos_token(self) -> str:  # type: ignore[override]
        return "</s>"

    @property
    def eos_token_id(self) -> int:  # type: ignore[override]
        return self.get_command("<eos>")

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.n_words

    def get_vocab(self) -> dict[str, int]:
        vocab = self.tokenizer.vocab()
        vocab.update(self.added_tokens_encoder)
        return vocab

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return self.tokenizer.tokenize(text, encode_special_tokens=getattr(self, "encode_special_tokens", False))

    def _convert_token_to_id(self, token: str) -> int:
        return self.tokenizer.convert_token_to_id(token)

    def _convert_id_to_token(self, index: int) -> str:
        return self.tokenizer.convert_id_to_token(index)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self.tokenizer.decode_tokens(tokens)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        name = (f"{filename_prefix}-" if filename_prefix else "") + self.vocab_files_names["vocab_file"]
        path = os.path.join(save_directory, name) if os.path.isdir(save_directory) else save_directory
        if os.path.abspath(path) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, path)
        return (path,)

    def get_prefix_tokens(self) -> list[int]:
        return [self.get_command("[gMASK]"), self.get_command("sop")]

    def build_single_message(self, role: str, metadata: str, message: str) -> list[int]:
        """`<|role|>` as an id, then `metadata + "\\n"` and the message as plain SentencePiece."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; ChatGLM3 roles are {', '.join(ROLES)}")
        role_tokens = [self.get_command(f"<|{role}|>"), *self.tokenizer.encode(f"{metadata}\n")]
        return role_tokens + self.tokenizer.encode(message)

    def build_chat_input(
        self,
        query: str,
        history: list[dict[str, Any]] | None = None,
        role: str = "user",
        return_tensors: str | None = "pt",
    ) -> Any:
        """The prompt of a chat as the model's own helper builds it: `[gMASK] sop`, the turns, `<|assistant|>`."""
        input_ids: list[int] = []
        for item in history or []:
            content = item["content"]
            if item["role"] == "system" and "tools" in item:
                content = content + "\n" + json.dumps(item["tools"], indent=4, ensure_ascii=False)
            input_ids += self.build_single_message(item["role"], item.get("metadata", ""), content)
        input_ids += self.build_single_message(role, "", query)
        input_ids.append(self.get_command("<|assistant|>"))
        batch = getattr(self, "batch_encode_plus", None)  # gone in transformers 5
        if batch is not None:
            return batch([input_ids], return_tensors=return_tensors, is_split_into_words=True)
        return self([input_ids], return_tensors=return_tensors, is_split_into_words=True)

    def build_inputs_with_special_tokens(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        ids = self.get_prefix_tokens() + token_ids_0
        if token_ids_1 is not None:
            ids = ids + token_ids_1 + [self.get_command("<eos>")]
        return ids

    def _pad(
        self,
        encoded_inputs: Any,
        max_length: int | None = None,
        padding_strategy: PaddingStrategy = PaddingStrategy.DO_NOT_PAD,
        pad_to_multiple_of: int | None = None,
        padding_side: Any = _ABSENT,
        return_attention_mask: bool | None = None,
    ) -> dict:
        """Left padding, with attention_mask and position_ids, as the real model's tokenizer pads.

        The 2023-10-26 file's `_pad` has no `padding_side` parameter: transformers >= 4.45 passes
        one and fails there, as it does here.
        """
        if PUBLISHED_2023 and padding_side != _ABSENT:
            raise TypeError("_pad() got an unexpected keyword argument 'padding_side'")
        side = self.padding_side if padding_side in (_ABSENT, None) else padding_side
        if side != "left":
            raise ValueError(f"ChatGLM3 pads on the left, not the {side}")
        required = encoded_inputs[self.model_input_names[0]]
        length = len(required)
        if padding_strategy == PaddingStrategy.LONGEST:
            max_length = length
        if max_length is not None and pad_to_multiple_of is not None and max_length % pad_to_multiple_of:
            max_length = (max_length // pad_to_multiple_of + 1) * pad_to_multiple_of
        if "attention_mask" not in encoded_inputs:
            encoded_inputs["attention_mask"] = [1] * length
        if "position_ids" not in encoded_inputs:
            encoded_inputs["position_ids"] = list(range(length))
        if padding_strategy != PaddingStrategy.DO_NOT_PAD and max_length is not None and length != max_length:
            pad = max_length - length
            encoded_inputs["attention_mask"] = [0] * pad + list(encoded_inputs["attention_mask"])
            encoded_inputs["position_ids"] = [0] * pad + list(encoded_inputs["position_ids"])
            encoded_inputs[self.model_input_names[0]] = [self.pad_token_id] * pad + list(required)
        return encoded_inputs
