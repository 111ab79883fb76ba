import json

from glmdeploy import chatglm3
from glmdeploy.fixture import CONFIG, generate
from glmdeploy.manifest import read_manifest

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


def test_fixture_generation_is_byte_identical_across_runs(tmp_path, fixture_dir):
    generate(tmp_path / "again")
    assert read_manifest(tmp_path / "again") == read_manifest(fixture_dir)


def test_fixture_keeps_chatglm3_32k_config_fields(fixture_dir):
    config = json.loads((fixture_dir / "config.json").read_text())
    assert set(config) >= REAL_CONFIG_FIELDS
    assert config["padded_vocab_size"] == 65024 and config["rope_ratio"] == 50 and config["seq_length"] == 32768
    assert config["hidden_size"] // config["num_attention_heads"] >= 32, "CPU attention needs head size >= 32"
    assert config["torch_dtype"] == "float16"


def test_fixture_weights_use_the_checkpoint_parameter_names(fixture_dir):
    from safetensors import safe_open

    with safe_open(str(fixture_dir / "model.safetensors"), "np") as f:
        names = set(f.keys())
        qkv = f.get_tensor("transformer.encoder.layers.0.self_attention.query_key_value.weight")
        emb = f.get_tensor("transformer.embedding.word_embeddings.weight")
    heads, groups, kv = CONFIG["num_attention_heads"], CONFIG["multi_query_group_num"], CONFIG["kv_channels"]
    assert qkv.shape == ((heads + 2 * groups) * kv, CONFIG["hidden_size"])
    assert emb.shape[0] == chatglm3.PADDED_VOCAB_SIZE and str(emb.dtype) == "float16"
    for i in range(CONFIG["num_layers"]):
        assert f"transformer.encoder.layers.{i}.mlp.dense_h_to_4h.weight" in names
    assert {"transformer.output_layer.weight", "transformer.encoder.final_layernorm.weight"} <= names


def test_fixture_tokenizer_has_real_special_ids(tokenizer):
    assert len(tokenizer) == chatglm3.TOKENIZER_SIZE
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in chatglm3.SPECIAL_TOKENS} == chatglm3.SPECIAL_TOKENS
    assert tokenizer.eos_token_id == 2 and tokenizer.pad_token_id == 0 and tokenizer.padding_side == "left"


def test_fixture_tokenizer_prefixes_gmask_sop_and_round_trips(tokenizer):
    for text in ["晚上睡不着应该怎么办", "def f(x):\n    return x  # 🙂", "spaced   out  "]:
        ids = tokenizer.encode(text)
        assert ids[:2] == [64790, 64792]
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
