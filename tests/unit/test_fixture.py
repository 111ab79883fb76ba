import io
import json
import os
import pickle
import subprocess
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import ClassVar

import pytest
from fixture_model import CONFIG, generate  # tests/support/, on sys.path through conftest.py

from glmdeploy.manifest import read_manifest
from glmdeploy.model import chatglm3
from glmdeploy.model.prompt import PromptBuilder, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
#: A venv with the cpu profile's transformers (5.19.0, tokenizers 0.23.3, sentencepiece 0.2.2).
SERVING_PYTHON = Path(os.environ.get("GLMDEPLOY_SERVING_PYTHON", "/tmp/tf5/bin/python"))

REAL_CONFIG_FIELDS = {
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "kv_channels",
    "multi_query_attention",
    "multi_query_group_num",
    "padded_vocab_size",
    "seq_length",
    "rope_ratio",
    "layernorm_epsilon",
    "rmsnorm",
    "add_qkv_bias",
    "add_bias_linear",
    "torch_dtype",
    "eos_token_id",
    "pad_token_id",
    "original_rope",
    "post_layer_norm",
}
#: The files of a real chatglm3-6b-32k revision that the fixture has (weights: two shards here, seven there).
FIXTURE_FILES = {
    "SHA256SUMS",
    "config.json",
    "configuration_chatglm.py",
    "tokenization_chatglm.py",
    "tokenizer.model",
    "tokenizer_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
}
#: What the real revision lacks (or what only a Hugging Face fast tokenizer would bring).
NOT_IN_THE_REAL_REVISION = {
    "tokenizer.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
}


@pytest.fixture(scope="module")
def tokenizer(fixture_dir):
    return load_tokenizer(str(fixture_dir), trust_remote_code=True)


@pytest.fixture(scope="module")
def sp_model(fixture_dir):
    from sentencepiece import SentencePieceProcessor

    return SentencePieceProcessor(model_file=str(fixture_dir / "tokenizer.model"))


def test_fixture_is_byte_identical_across_runs(tmp_path, fixture_dir):
    generate(tmp_path / "one")
    generate(tmp_path / "two")
    assert (tmp_path / "one" / "SHA256SUMS").read_bytes() == (tmp_path / "two" / "SHA256SUMS").read_bytes()
    assert read_manifest(tmp_path / "one") == read_manifest(fixture_dir), (
        "artifacts/models/chatglm3-fixture is stale: rm -rf it and run `make fixture`"
    )
    assert {os.stat(p).st_mtime for p in (tmp_path / "one").iterdir()} == {0}


def test_fixture_has_the_real_revisions_files_and_nothing_it_lacks(fixture_dir):
    names = {p.name for p in fixture_dir.iterdir()}
    assert names == FIXTURE_FILES
    assert not names & NOT_IN_THE_REAL_REVISION


def test_later_shape_fixture_has_no_chat_template(fixture_dir, tokenizer):
    assert not (fixture_dir / "chat_template.jinja").exists()
    assert "chat_template" not in json.loads((fixture_dir / "tokenizer_config.json").read_text())
    assert getattr(tokenizer, "chat_template", None) is None


def test_fixture_keeps_chatglm3_32k_config_fields(fixture_dir):
    config = json.loads((fixture_dir / "config.json").read_text())
    assert set(config) >= REAL_CONFIG_FIELDS
    assert config["padded_vocab_size"] == 65024 and config["rope_ratio"] == 50 and config["seq_length"] == 32768
    assert config["hidden_size"] // config["num_attention_heads"] >= 32, "CPU attention needs head size >= 32"
    assert config["torch_dtype"] == "float16"
    assert config["architectures"] == ["ChatGLMModel"]
    assert config["auto_map"]["AutoConfig"] == "configuration_chatglm.ChatGLMConfig"
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_chatglm.ChatGLMForConditionalGeneration"


def test_fixture_config_loads_through_auto_map_only_with_remote_code(fixture_dir):
    from transformers import AutoConfig

    with pytest.raises(ValueError):
        AutoConfig.from_pretrained(str(fixture_dir), trust_remote_code=False, local_files_only=True)
    config = AutoConfig.from_pretrained(str(fixture_dir), trust_remote_code=True, local_files_only=True)
    assert type(config).__name__ == "ChatGLMConfig" and config.model_type == "chatglm"
    assert (config.rope_ratio, config.seq_length, config.padded_vocab_size) == (50, 32768, 65024)
    assert (config.multi_query_attention, config.multi_query_group_num, config.kv_channels) == (True, 2, 32)


def test_fixture_weights_are_sharded_with_an_index_under_the_checkpoint_names(fixture_dir):
    from safetensors import safe_open

    index = json.loads((fixture_dir / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    tensors, total = {}, 0
    for shard in sorted(set(weight_map.values())):
        with safe_open(str(fixture_dir / shard), "np") as f:
            assert set(f.keys()) == {n for n, s in weight_map.items() if s == shard}
            assert f.metadata() == {"format": "pt"}
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                tensors[name] = f.get_tensor(name)
                total += tensors[name].nbytes
    assert index["metadata"]["total_size"] == total
    qkv = tensors["transformer.encoder.layers.0.self_attention.query_key_value.weight"]
    emb = tensors["transformer.embedding.word_embeddings.weight"]
    heads, groups, kv = CONFIG["num_attention_heads"], CONFIG["multi_query_group_num"], CONFIG["kv_channels"]
    assert qkv.shape == ((heads + 2 * groups) * kv, CONFIG["hidden_size"])
    assert emb.shape[0] == chatglm3.PADDED_VOCAB_SIZE and str(emb.dtype) == "float16"
    for i in range(CONFIG["num_layers"]):
        assert f"transformer.encoder.layers.{i}.mlp.dense_h_to_4h.weight" in tensors
    assert {"transformer.output_layer.weight", "transformer.encoder.final_layernorm.weight"} <= set(tensors)


class _TorchStub(pickle.Unpickler):
    """Reads torch.save's data.pkl without torch: tensors come back as (storage key, dtype, shape, stride)."""

    ALLOWED: ClassVar[dict] = {
        ("collections", "OrderedDict"): OrderedDict,
        ("torch._utils", "_rebuild_tensor_v2"): lambda storage, offset, size, stride, grad, hooks: (
            storage,
            offset,
            size,
            stride,
        ),
        ("torch", "HalfStorage"): "float16",
    }

    def find_class(self, module, name):
        return self.ALLOWED[(module, name)]  # anything else is a KeyError: not what torch.save writes

    def persistent_load(self, pid):
        kind, dtype, key, location, numel = pid
        assert kind == "storage" and location == "cpu"
        return key, dtype, numel


#: The published ChatGLM3-6B-32k revision's file list (shared reference notes).
PUBLISHED_FILES = {
    "config.json",
    "configuration_chatglm.py",
    "modeling_chatglm.py",
    "quantization.py",
    "tokenization_chatglm.py",
    "tokenizer.model",
    "tokenizer_config.json",
    "pytorch_model.bin.index.json",
    *(f"pytorch_model-{k:05d}-of-00007.bin" for k in range(1, 8)),
    "MODEL_LICENSE",
    "README.md",
}


@pytest.fixture(scope="module")
def published_dir(tmp_path_factory):
    """The fixture in the published revision's shape: a plain copy of the repo."""
    path = tmp_path_factory.mktemp("published") / "chatglm3-published"
    generate(path, shape="published")
    return path


def test_published_shape_has_the_published_file_list_and_no_manifest(published_dir):
    assert {p.name for p in published_dir.iterdir()} == PUBLISHED_FILES
    config = json.loads((published_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"].startswith("{% for message in messages %}{% if loop.first %}[gMASK]sop<|")


def test_published_shape_writes_torch_zip_shards_with_an_index(published_dir, fixture_dir):
    import numpy as np
    from safetensors.numpy import load_file

    index = json.loads((published_dir / "pytorch_model.bin.index.json").read_text())
    st_index = json.loads((fixture_dir / "model.safetensors.index.json").read_text())
    assert index["metadata"] == st_index["metadata"]
    assert len(set(index["weight_map"].values())) == 7
    expected = {}
    for st_shard in sorted(set(st_index["weight_map"].values())):
        expected |= load_file(str(fixture_dir / st_shard))
    for shard in sorted(set(index["weight_map"].values())):
        archive = shard.removesuffix(".bin")
        with zipfile.ZipFile(published_dir / shard) as zf:
            assert zf.read(f"{archive}/version") == b"3\n" and zf.read(f"{archive}/byteorder") == b"little"
            for info in zf.infolist():  # torch's writer aligns every record's data to 64 bytes
                assert (info.header_offset + 30 + len(info.filename) + len(info.extra)) % 64 == 0
            state = _TorchStub(io.BytesIO(zf.read(f"{archive}/data.pkl"))).load()
            assert isinstance(state, OrderedDict)
            assert set(state) == {n for n, s in index["weight_map"].items() if s == shard}
            for name, ((key, dtype, numel), offset, size, _stride) in state.items():
                data = np.frombuffer(zf.read(f"{archive}/data/{key}"), dtype=dtype)
                assert offset == 0 and data.size == numel
                assert np.array_equal(data.reshape(size), expected[name]), name


def test_published_shape_shards_load_weights_only_in_torch(published_dir):
    import torch

    index = json.loads((published_dir / "pytorch_model.bin.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    state = torch.load(str(published_dir / shard), weights_only=True)
    assert set(state) == {n for n, s in index["weight_map"].items() if s == shard}
    assert all(t.dtype == torch.float16 for t in state.values())


def test_published_shape_is_byte_identical_across_runs(tmp_path, published_dir):
    generate(tmp_path / "again", shape="published")
    for path in published_dir.iterdir():
        assert (tmp_path / "again" / path.name).read_bytes() == path.read_bytes(), path.name


def test_fixture_full_size_has_the_real_widths_and_no_weights(tmp_path):
    generate(tmp_path / "full", full_size=True)
    config = json.loads((tmp_path / "full" / "config.json").read_text())
    assert (config["num_layers"], config["hidden_size"], config["kv_channels"]) == (28, 4096, 128)
    assert not [p for p in (tmp_path / "full").iterdir() if "model" in p.name and p.name != "tokenizer.model"]


def test_fixture_sentencepiece_model_has_the_real_piece_layout(sp_model):
    assert sp_model.vocab_size() == 64789
    assert (sp_model.unk_id(), sp_model.bos_id(), sp_model.eos_id(), sp_model.pad_id()) == (0, 1, 2, -1)
    assert [sp_model.id_to_piece(i) for i in (0, 1, 2)] == ["<unk>", "<s>", "</s>"]
    assert all(sp_model.is_byte(i) for i in range(3, 259)) and not sp_model.is_byte(259)
    assert sp_model.id_to_piece(13) == "<0x0A>" and sp_model.id_to_piece(30910) == "\u2581"
    assert sp_model.id_to_piece(64788) == "\u2581attr"


def test_fixture_sentencepiece_model_round_trips_english_and_chinese(sp_model):
    for text in ["The quick brown fox.\nSecond line\n", "晚上睡不着应该怎么办\n你好！", "a  b\t\tc  ", "部署成功 🎉"]:  # noqa: RUF001
        assert sp_model.decode(sp_model.encode(text)) == text
    assert sp_model.encode("\n") == [30910, 13]
    assert sp_model.encode("晚上睡不着应该怎么办")[0] == 30910


def test_fixture_special_ids_come_after_64789_sentencepiece_pieces(tokenizer, sp_model):
    order = ["[MASK]", "[gMASK]", "[sMASK]", "sop", "eop", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in order} == {
        t: sp_model.vocab_size() + i for i, t in enumerate(order)
    }
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in chatglm3.SPECIAL_TOKENS} == chatglm3.SPECIAL_TOKENS
    assert tokenizer.vocab_size == chatglm3.VOCAB_SIZE and len(tokenizer) == chatglm3.TOKENIZER_LEN
    assert tokenizer.convert_tokens_to_ids("<|user|>") == 64795
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("</s>", 2)
    # Answered by properties, not registered: unk_token_id is None, as with the real class.
    assert (tokenizer.pad_token, tokenizer.pad_token_id, tokenizer.unk_token_id) == ("<unk>", 0, None)
    assert tokenizer.padding_side == "left"


def test_fixture_tokenizer_needs_trust_remote_code(fixture_dir, tokenizer):
    from transformers import AutoTokenizer

    assert json.loads((fixture_dir / "tokenizer_config.json").read_text())["auto_map"] == {
        "AutoTokenizer": ["tokenization_chatglm.ChatGLMTokenizer", None]
    }
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoTokenizer.from_pretrained(str(fixture_dir), trust_remote_code=False, local_files_only=True)
    assert type(tokenizer).__name__ == "ChatGLMTokenizer" and not tokenizer.is_fast


def test_typed_role_markers_stay_plain_text_on_fixture(fixture_dir, tokenizer):
    typed = "<|user|> <|assistant|> [gMASK]sop <|observation|> </s>"
    ids = tokenizer.encode(typed, add_special_tokens=False)
    assert not set(ids) & (chatglm3.STRUCTURAL_IDS | {chatglm3.EOS_ID})
    assert tokenizer.decode(ids) == typed
    # Only with the flag on does the text map to the ids (the real tokenizer's encode_special_tokens).
    flagged = load_tokenizer(str(fixture_dir), trust_remote_code=True)
    flagged.encode_special_tokens = True
    assert flagged.encode("<|user|>hi", add_special_tokens=False)[0] == 64795


def test_fixture_tokenizer_prefixes_gmask_sop_and_round_trips(tokenizer):
    for text in ["晚上睡不着应该怎么办", "def f(x):\n    return x  # 🙂", "spaced   out  "]:
        ids = tokenizer.encode(text)
        assert ids[:2] == [64790, 64792]
        # Nothing is registered as special: [gMASK] and sop stay, as with the real class.
        assert tokenizer.decode(ids, skip_special_tokens=True) == "[gMASK]sop " + text
    assert tokenizer.encode("晚上睡不着应该怎么办")[:3] == [64790, 64792, 30910]


def test_fixture_chat_input_has_the_published_one_turn_shape(tokenizer):
    hello = tokenizer.encode("你好", add_special_tokens=False)
    want = [64790, 64792, 64795, 30910, 13, *hello, 64796]
    assert tokenizer.build_chat_input("你好", return_tensors=None)["input_ids"] == [want]
    assert PromptBuilder.from_tokenizer(tokenizer).chat_ids([{"role": "user", "content": "你好"}]) == want
    assert tokenizer.build_single_message("user", "", "你好") == want[2:-1]
    assert tokenizer.get_command("<|assistant|>") == 64796 and tokenizer.get_command("<eos>") == 2


def test_fixture_tokenizer_pads_on_the_left_and_takes_padding_side(tokenizer):
    from transformers.utils import PaddingStrategy

    batch = tokenizer(["hi", "hello world model"], padding=True)
    short = len(tokenizer.encode("hi"))
    pad = len(batch["input_ids"][1]) - short
    assert batch["input_ids"][0][:pad] == [0] * pad and batch["attention_mask"][0][:pad] == [0] * pad
    assert batch["position_ids"][0] == [0] * pad + list(range(short))
    # transformers >= 4.45 passes padding_side to _pad (the real revision's _pad fails there)
    out = tokenizer._pad({"input_ids": [5, 6]}, 4, PaddingStrategy.MAX_LENGTH, padding_side="left")
    assert out["input_ids"] == [0, 0, 5, 6] and out["attention_mask"] == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="left"):
        tokenizer._pad({"input_ids": [5]}, 2, PaddingStrategy.MAX_LENGTH, padding_side="right")


# ------------------------------------------------ the real class's observable behaviours, both shapes
# What the real tokenization_chatglm.py does under transformers 4.40.2 (the shared reference notes,
# read from the published file): a fixture that is kinder than this passes checks the real model fails.


@pytest.fixture(scope="module", params=["later", "published"])
def shaped(request, fixture_dir, published_dir):
    model_dir = fixture_dir if request.param == "later" else published_dir
    return request.param, model_dir, load_tokenizer(str(model_dir), trust_remote_code=True)


def test_len_is_64796_because_ids_0_to_2_are_named_the_empty_string(shaped):
    _, _, tok = shaped
    assert (tok.vocab_size, len(tok)) == (64798, 64796)
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["", "", ""]
    assert tok.get_vocab()[""] == 2 and "</s>" not in tok.get_vocab()


def test_nothing_is_registered_as_special_so_skip_special_tokens_keeps_the_markers(shaped):
    _, _, tok = shaped
    assert tok.all_special_ids == [] and tok.all_special_tokens == []
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token, tok.pad_token_id) == ("</s>", 2, "<unk>", 0)
    ids = PromptBuilder.from_tokenizer(tok).chat_ids([{"role": "user", "content": "你好"}])
    want = "[gMASK]sop<|user|> \n 你好<|assistant|>"  # the word-start mark after a marker is a space
    assert tok.decode(ids) == tok.decode(ids, skip_special_tokens=True) == want
    assert tok.decode([*ids, 2, 0], skip_special_tokens=True) == want


def test_published_shape_imports_torch_and_fails_to_load_without_it(published_dir, tmp_path):
    import ast

    tree = ast.parse((published_dir / "tokenization_chatglm.py").read_text())
    assert any(isinstance(n, ast.Import) and n.names[0].name == "torch" for n in tree.body)
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from transformers import AutoTokenizer\n"
        f"AutoTokenizer.from_pretrained({str(published_dir)!r}, trust_remote_code=True, local_files_only=True)\n"
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "torch" in proc.stderr.splitlines()[-1], proc.stderr[-500:]


def test_published_shape_has_no_encode_special_tokens_and_a_pad_without_padding_side(published_dir):
    from transformers.utils import PaddingStrategy

    tok = load_tokenizer(str(published_dir), trust_remote_code=True)
    assert not hasattr(tok, "encode_special_tokens")
    tok.encode_special_tokens = True  # the 2023 file has no such switch: text stays text
    assert 64795 not in tok.encode("<|user|>hi", add_special_tokens=False)
    with pytest.raises(TypeError, match="padding_side"):
        tok._pad({"input_ids": [5]}, 2, PaddingStrategy.MAX_LENGTH, padding_side="left")
    with pytest.raises(IndexError):
        tok.convert_ids_to_tokens([64800])  # past the vocabulary: SentencePiece's own error


def test_later_shape_names_ids_past_the_vocabulary_the_empty_string(tokenizer):
    assert tokenizer.convert_ids_to_tokens([64800, 65023]) == ["", ""]
    import ast

    tree = ast.parse(Path(tokenizer.vocab_file).with_name("tokenization_chatglm.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import) and n.names[0].name == "torch"]


#: Everything the kit reads from the tokenizer, printed as JSON: run on both transformers versions.
BEHAVIOUR = """
import json, sys
from transformers import AutoConfig
from glmdeploy.model.golden import record
from glmdeploy.model.prompt import load_tokenizer
import transformers
d = sys.argv[1]
tok = load_tokenizer(d, trust_remote_code=True)
cfg = AutoConfig.from_pretrained(d, trust_remote_code=True, local_files_only=True)
texts = ["晚上睡不着应该怎么办", "Hello\\n  world 🎉", "<|user|>x"]
print(json.dumps({
    "transformers": transformers.__version__,
    "record": record(d, trust_remote_code=True),
    "class": type(tok).__name__,
    "config": [type(cfg).__name__, cfg.rope_ratio, cfg.seq_length, cfg.padded_vocab_size],
    "chat_input": tok.build_chat_input("你好", return_tensors=None)["input_ids"],
    "decoded": [tok.decode(tok.encode(t), skip_special_tokens=True) for t in texts],
    "decoded_raw": tok.decode(tok.encode("hi")),
    "tokens_to_string": tok.convert_tokens_to_string(tok.convert_ids_to_tokens(tok.encode("a\\nb"))),
    "padded": dict(tok(["hi", "hello world"], padding=True)),
    "vocab": len(tok.get_vocab()),
}, ensure_ascii=False, sort_keys=True))
"""


def _behaviour(python: Path, model_dir: Path, home: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "service"), "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [str(python), "-c", BEHAVIOUR, str(model_dir)], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    not SERVING_PYTHON.exists(),
    reason=f"no serving-stack venv at {SERVING_PYTHON} (python3 -m venv /tmp/tf5 && /tmp/tf5/bin/pip install "
    "transformers==5.19.0 tokenizers==0.23.3 sentencepiece==0.2.2 protobuf; or set GLMDEPLOY_SERVING_PYTHON)",
)
def test_fixture_loads_on_serving_transformers(tmp_path, fixture_dir):
    reference = _behaviour(Path(sys.executable), fixture_dir, tmp_path / "ref")
    serving = _behaviour(SERVING_PYTHON, fixture_dir, tmp_path / "serving")
    assert reference.pop("transformers") == "4.40.2"
    assert serving.pop("transformers").startswith("5.")
    assert serving == reference
