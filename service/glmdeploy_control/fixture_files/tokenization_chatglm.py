"""ChatGLM3's tokenizer for the glmdeploy fixture model: the kit's own code, the real model's contract.

Shipped into the fixture's model directory by `glmdeploy.fixture` and loaded, like the
real ChatGLM3-6B-32k tokenizer, only with `trust_remote_code=True` (the class is named by
`auto_map` in tokenizer_config.json; transformers has no class of that name).

The contract it keeps with the real `tokenization_chatglm.py`:

- an `SPTokenizer` over `tokenizer.model` (SentencePiece); the nine special tokens get the
  ids after the SentencePiece vocabulary, in the order of `SPECIAL_TOKENS` (64789-64797 for
  a 64789-piece model); `vocab_size` and `len(tokenizer)` are 64798;
- text is encoded with plain SentencePiece: the special strings typed in text (`<|user|>`,
  `[gMASK]`, `</s>`, ...) stay text unless `encode_special_tokens` is on, and then only the
  nine special strings are mapped to their ids;
- `encode(text)` prepends `[gMASK] sop`; `build_single_message` and `build_chat_input` put
  role markers in as ids; eos `</s>` (2), pad and unk `<unk>` (0); padding on the left,
  with `position_ids` among the model inputs.

Where it differs, on purpose: `_pad` accepts the `padding_side` keyword that transformers
4.45 and later pass (the real file of the pinned revision fails there with "unexpected
keyword argument 'padding_side'"), so the fixture also loads on the cpu profile's
transformers 5. Not checked against the real file: `decode(..., skip_special_tokens=True)`
here drops the nine special tokens as well as eos/pad/bos (how the real one decodes them
has varied with the transformers version; the fixture's weights never generate them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

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
        if not encode_special_tokens:
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

    def _join(self, items: list[Any], is_special: Any, decode_run: Any) -> str:
        """Decode runs of SentencePiece items with SentencePiece, special tokens as their text."""
        text, run = "", []
        for item in items:
            special = is_special(item)
            if special is None:
                run.append(item)
                continue
            if run:
                text += decode_run(run)
                run = []
            text += special
        return text + (decode_run(run) if run else "")

    def decode(self, ids: list[int]) -> str:
        return self._join(ids, self.index_special_tokens.get, self.sp_model.decode_ids)

    def decode_tokens(self, tokens: list[str]) -> str:
        return self._join(tokens, lambda t: t if t in self.special_tokens else None, self.sp_model.decode_pieces)

    def convert_token_to_id(self, token: str) -> int:
        if token in self.special_tokens:
            return self.special_tokens[token]
        return self.sp_model.piece_to_id(token)

    def convert_id_to_token(self, index: int) -> str:
        if index in self.index_special_tokens:
            return self.index_special_tokens[index]
        if 0 <= index < self.n_sp:
            return self.sp_model.id_to_piece(index)
        return ""  # the embedding's padding rows (64798..65023) are no token

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
        self.encode_special_tokens = encode_special_tokens
        kwargs.setdefault("eos_token", "</s>")
        kwargs.setdefault("unk_token", "<unk>")
        kwargs.setdefault("pad_token", "<unk>")
        super().__init__(
            padding_side=padding_side,
            clean_up_tokenization_spaces=clean_up_tokenization_spaces,
            encode_special_tokens=encode_special_tokens,
            **kwargs,
        )

    def get_command(self, token: str) -> int:
        """Id of `<bos>`/`<eos>`/`<pad>` or of one of the nine special tokens."""
        if token in self.special_tokens:
            return self.special_tokens[token]
        if token not in self.tokenizer.special_tokens:
            raise KeyError(f"{token} is not a special token for {self.name}")
        return self.tokenizer.special_tokens[token]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.n_words

    def get_vocab(self) -> dict[str, int]:
        vocab = self.tokenizer.vocab()
        vocab.update(self.added_tokens_encoder)
        return vocab

    def tokenize(self, text: str, **kwargs: Any) -> list[str]:
        """Plain SentencePiece: no added-token matching on the text (see `encode_special_tokens`)."""
        return self._tokenize(text)

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return self.tokenizer.tokenize(text, encode_special_tokens=self.encode_special_tokens)

    def _convert_token_to_id(self, token: str) -> int:
        return self.tokenizer.convert_token_to_id(token)

    def _convert_id_to_token(self, index: int) -> str:
        return self.tokenizer.convert_id_to_token(index)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self.tokenizer.decode_tokens(tokens)

    def _decode(
        self,
        token_ids: int | list[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **kwargs: Any,
    ) -> str:
        ids = [int(token_ids)] if isinstance(token_ids, int) else [int(i) for i in token_ids]
        if skip_special_tokens:
            skip = {*self.tokenizer.index_special_tokens, *self.all_special_ids, self.tokenizer.bos_id}
            ids = [i for i in ids if i not in skip]
        text = self.tokenizer.decode(ids)
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        return self.clean_up_tokenization(text) if clean_up_tokenization_spaces else text

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
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
    ) -> dict:
        """Left padding, with attention_mask and position_ids, as the real model's tokenizer pads."""
        side = padding_side or self.padding_side
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
