"""Generate the tiny ChatGLM3-architecture fixture model, byte for byte the same every run.

Why: real weights cannot be fetched on CI or on this kind of dev box, but the
kit's loading, serving and checking code must run for real. The fixture keeps
ChatGLM3-6B-32k's config fields, checkpoint parameter names, padded vocabulary
(65024 rows) and tokenizer special-token ids (64789-64797, eos 2, pad 0), and
shrinks only the widths. Head size is 32 because vLLM's CPU attention rejects
smaller heads at generation time (while still answering /health).

Run with the pinned reference stack (tokenizers 0.19.1): a tokenizer.json
written by tokenizers 0.2x cannot be read by 0.19.1, the reverse works.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from glmdeploy import chatglm3
from glmdeploy.manifest import write_manifest

SEED = 20240607

#: ChatGLM3-6B-32k's config with the sizes shrunk; every field name is the real one.
CONFIG: dict[str, object] = {
    "_name_or_path": "glmdeploy/chatglm3-fixture",
    "model_type": "chatglm",
    "architectures": ["ChatGLMModel"],
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

CHAT_TEMPLATE = (
    "[gMASK]sop{% for message in messages %}<|{{ message['role'] }}|>\n {{ message['content'] }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_WORDS = tuple(
    " ".join(
        (
            "the of and to in is you that it he was for on are as with his they at be this have from or one",
            "had by word but not what all were we when your can said there use an each which she do how their",
            "if will up other about out many then them these so some her would make like him into time has",
            "look two more write go see number no way could people my than first water been call who oil",
            "its now find long down day did get come made may part hello world model token server python",
            "def return import class print deploy node chat sleep night",
        )
    ).split()
)


def tokenizer_pieces() -> list[tuple[str, float]]:
    """SentencePiece-like vocabulary: unk/bos/eos, 256 byte pieces, then text pieces up to id 64788."""
    pieces: list[tuple[str, float]] = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)]
    pieces += [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    seen = {p for p, _ in pieces}

    def add(piece: str, score: float) -> None:
        if piece not in seen and len(pieces) < chatglm3.SPECIAL_TOKENS["[MASK]"]:
            seen.add(piece)
            pieces.append((piece, score))

    add("\u2581", -3.0)
    for word in _WORDS:
        add("\u2581" + word, -6.0)
        add(word, -7.0)
    for code in range(0x21, 0x7F):
        add(chr(code), -9.0)
        add("\u2581" + chr(code), -9.5)
    for code in range(0x4E00, 0x9FA6):  # CJK unified ideographs
        add(chr(code), -10.0)
    n = 0
    while len(pieces) < chatglm3.SPECIAL_TOKENS["[MASK]"]:
        add(f"\u2581glm{n}", -12.0)
        n += 1
    return pieces


def build_tokenizer() -> object:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tok = Tokenizer(models.Unigram(tokenizer_pieces(), unk_id=chatglm3.UNK_ID, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = sorted(chatglm3.SPECIAL_TOKENS.items(), key=lambda kv: kv[1])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, _ in specials])
    for text, want in specials:
        got = tok.token_to_id(text)
        if got != want:
            raise RuntimeError(f"special token {text} landed at id {got}, expected {want}")
    gmask, sop = chatglm3.PREFIX_IDS
    tok.post_processor = processors.TemplateProcessing(
        single="[gMASK] sop $A",
        pair="[gMASK] sop $A $B",
        special_tokens=[("[gMASK]", gmask), ("sop", sop)],
    )
    return tok


def tokenizer_config() -> dict[str, object]:
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t, i in [("<unk>", 0), ("<s>", 1), ("</s>", 2), *chatglm3.SPECIAL_TOKENS.items()]
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": list(chatglm3.SPECIAL_TOKENS),
        "bos_token": None,
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<unk>",
        "padding_side": "left",
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def build_weights() -> dict[str, object]:
    """Random fp16 weights under the real checkpoint's parameter names.

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
    hidden, ffn = int(CONFIG["hidden_size"]), int(CONFIG["ffn_hidden_size"])
    heads, groups, kv = (int(CONFIG[k]) for k in ("num_attention_heads", "multi_query_group_num", "kv_channels"))
    vocab = chatglm3.PADDED_VOCAB_SIZE

    def normal(shape: tuple[int, ...], std: float) -> object:
        return (rng.standard_normal(shape) * std).astype(np.float16)

    emb = normal((vocab, hidden), 0.5)
    emb[:, 0] = 4.0
    out = normal((vocab, hidden), 0.15)
    out[:, 0] = 0.0
    not_text = [*range(0, 3), *range(chatglm3.SPECIAL_TOKENS["[MASK]"], vocab)]
    out[not_text, 0] = -3.0
    w: dict[str, object] = {"transformer.embedding.word_embeddings.weight": emb}
    qkv_rows = (heads + 2 * groups) * kv
    for i in range(int(CONFIG["num_layers"])):
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
    half = kv // 2
    base = 10000 * float(CONFIG["rope_ratio"])  # type: ignore[arg-type]
    w["transformer.rotary_pos_emb.inv_freq"] = (1.0 / base ** (np.arange(0, half, 2, dtype=np.float32) / half)).astype(
        np.float16
    )
    return w


#: The real ChatGLM3-6B-32k sizes (shared/reference), for runs with random weights made by the engine
#: itself (vLLM `--load-format dummy`): the GPU smoke checks and benchmarks of the architecture.
FULL_SIZE: dict[str, object] = {
    "_name_or_path": "glmdeploy/chatglm3-6b-32k-architecture",
    "ffn_hidden_size": 13696,
    "hidden_size": 4096,
    "kv_channels": 128,
    "num_attention_heads": 32,
    "num_layers": 28,
}


def _dump(path: Path, data: dict[str, object]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def generate(dest: Path, full_size: bool = False) -> None:
    """Write the fixture into a scratch dir, then rename: a crash never leaves half a model.

    full_size: the real model's sizes and no weight file (the engine makes random ones).
    """
    from safetensors.numpy import save_file

    dest = dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as tmp:
        work = Path(tmp)
        print("==> writing tokenizer (64798 ids, ChatGLM3 special tokens at 64789-64797)", flush=True)
        build_tokenizer().save(str(work / "tokenizer.json"))  # type: ignore[attr-defined]
        _dump(work / "tokenizer_config.json", tokenizer_config())
        _dump(
            work / "special_tokens_map.json",
            {
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<unk>",
                "additional_special_tokens": list(chatglm3.SPECIAL_TOKENS),
            },
        )
        if not full_size:
            print("==> writing random fp16 weights", flush=True)
            save_file(build_weights(), str(work / "model.safetensors"), metadata={"format": "pt"})  # type: ignore[arg-type]
        _dump(work / "config.json", {**CONFIG, **FULL_SIZE} if full_size else CONFIG)
        _dump(
            work / "generation_config.json",
            {
                "eos_token_id": list(chatglm3.STOP_TOKEN_IDS),
                "pad_token_id": chatglm3.PAD_ID,
            },
        )
        (work / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
        write_manifest(work)
        work.chmod(0o755)
        for f in work.iterdir():
            os.utime(f, (0, 0))
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old")
            dest.rename(old)
            work.rename(dest)
            import shutil

            shutil.rmtree(old)
        else:
            work.rename(dest)
        work.mkdir()  # TemporaryDirectory cleanup expects it
    print(f"==> fixture model ready in {dest}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glmdeploy.fixture",
        description="Generate the deterministic tiny ChatGLM3-architecture fixture model.",
    )
    parser.add_argument("dest", type=Path, help="directory to write (replaced atomically if present)")
    parser.add_argument(
        "--full-size",
        action="store_true",
        help="ChatGLM3-6B-32k's real sizes, no weights: for GPU runs with vLLM --load-format dummy",
    )
    args = parser.parse_args(argv)
    generate(args.dest, full_size=args.full_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
