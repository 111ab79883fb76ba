import dataclasses
import json

import pytest

from glmdeploy.serving import sizing
from glmdeploy_control import registry

REGISTRY = registry.load()
#: The registry's classes and the GPU profile's context length: what a GPU node's plan carries.
CLASSES = REGISTRY.kit.gpu_classes
MAX_MODEL_LEN = REGISTRY.profile(REGISTRY.kit.auto.gpu).runtime.max_model_len


def for_class(gpu_class, tensor_parallel=1):
    return sizing.for_class(gpu_class, CLASSES, MAX_MODEL_LEN, tensor_parallel)


def test_rtx_4090_settings_match_hand_arithmetic():
    # 24,564 MiB x 0.90 = 23,181,498,777.6 B
    # - 12,487,168,000 B fp16 weights (6,243,584,000 parameters x 2)
    # - 3,355,443,200 B activations (32,768 batched tokens x 100 KiB; vLLM 0.4.3 cannot chunk prefills)
    # - 1,073,741,824 B CUDA context and graphs
    # = 6,265,145,753.6 B of KV cache / 28,672 B per token (28 layers x K,V x 2 groups x 128 x 2 B)
    # = 218,510 tokens: 6 contexts of 32k, 53 of 4k, 213 of 1k; 218,510 / 2,048 = 106 -> 64 sequences.
    s = for_class("rtx-4090")
    assert sizing.KV_BYTES_PER_TOKEN == 28_672
    assert s.kv_cache_tokens == 218_510
    assert (s.contexts_32k, s.contexts_4k, s.contexts_1k) == (6, 53, 213)
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.gpu_memory_utilization) == (64, 32_768, 0.90)


def test_h200_kv_cache_matches_the_anchor_measurement():
    # vLLM reported 112 GiB of KV cache (~4.2 M tokens) on the H200 at utilisation 0.9 with 16,384-token
    # batches (the maintainers' GPU anchor run, and 112.22 / 112.27 GiB in the kit's later H200 runs:
    # docs/reference/gpu-settings.md, "The figures behind the formula").
    s = sizing.settings_for("h200", 143_771, chunked_prefill=True, max_model_len=MAX_MODEL_LEN)
    assert s.max_num_batched_tokens == 16_384
    assert s.kv_cache_gib == pytest.approx(112, abs=0.5)
    assert s.kv_cache_tokens == pytest.approx(4.2e6, rel=0.01)


def test_h200_leaves_batch_sizes_to_the_engine():
    """The derived 16,384 / 512 lost to vLLM 0.26's own at 64 streams (bench/h200/README.md, settle):
    the h200 class passes neither, and its KV estimate assumes the engine's 8,192 tokens a step."""
    s = for_class("h200")
    assert (s.max_num_batched_tokens, s.max_num_seqs) == (None, None)
    args = s.vllm_args((0, 26, 0))
    assert "--max-num-batched-tokens" not in args and "--max-num-seqs" not in args
    assert args[:2] == ["--gpu-memory-utilization", "0.90"] and "--enable-prefix-caching" in args
    derived = sizing.settings_for("h200", 143_771, chunked_prefill=True, max_model_len=MAX_MODEL_LEN)
    assert s.kv_cache_tokens - derived.kv_cache_tokens == (16_384 - 8_192) * 100 * 1024 // sizing.KV_BYTES_PER_TOKEN


def test_rtx_4090_estimate_stays_below_what_vllm_gave_an_emulated_24gb_card():
    """vLLM 0.26 on the H200 held to a 4090's budget (utilisation 0.1544 = 0.90 x 23.99 / 139.8 GiB),
    with the rtx-4090 row's batch sizes, gave 6.35 GiB / 237,840 tokens of KV cache (bench/h200/README.md,
    card24). The formula may be conservative, never above: an estimate above it would promise contexts
    the card cannot hold."""
    s = for_class("rtx-4090")
    assert s.kv_cache_tokens <= 237_840
    assert s.kv_cache_tokens >= 0.85 * 237_840


def test_card_too_small_for_one_full_context_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="less than one 32768-token context"):
        sizing.settings_for("t4-16gb", 15_360, chunked_prefill=False, max_model_len=MAX_MODEL_LEN)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 4090 D", "rtx-4090"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA H200", "h200"),
        ("Tesla T4", None),
    ],
)
def test_nvml_names_map_to_classes(name, expected):
    assert sizing.classify(name, CLASSES) == expected


def test_baseline_key_uses_the_sizing_class_for_known_cards_and_the_name_otherwise():
    from glmdeploy.serving import nodefacts

    assert nodefacts.hardware_class({"gpus": ["NVIDIA H200"]}, CLASSES) == "h200x1"
    assert nodefacts.hardware_class({"gpus": ["NVIDIA GeForce RTX 4090"] * 2}, CLASSES) == "rtx-4090x2"
    assert nodefacts.hardware_class({"gpus": ["NVIDIA B200"]}, CLASSES) == "b200x1"
    assert nodefacts.hardware_class({"gpus": [], "cpu_count": 2}, CLASSES) == "cpu2"


def test_two_rtx_4090_in_tensor_parallel_by_hand():
    """Per GPU: 0.90 x 24,564 MiB, minus half the weights, minus 32,768 x 100 KiB, minus 1 GiB,
    at 14 KiB per token (each GPU keeps one of ChatGLM3's two KV groups)."""
    kib = 1024
    per_gpu = 24_564 * 2**20 * 0.90 - 6_243_584_000 * 2 / 2 - 32_768 * 100 * kib - 2**30
    s = for_class("rtx-4090", tensor_parallel=2)
    assert s.kv_cache_tokens == int(per_gpu // (14 * kib)) == 872_539
    assert s.contexts_32k == 26 and s.vllm_args()[:4] == [
        "--tensor-parallel-size",
        "2",
        "--distributed-executor-backend",
        "mp",
    ]
    assert sizing.kv_bytes_per_token_per_gpu(4) == 14 * kib  # past 2-way the groups are replicated
    with pytest.raises(ValueError, match="32 attention heads"):
        for_class("rtx-4090", tensor_parallel=3)


def test_h200_asks_for_four_api_servers_only_from_an_engine_that_has_the_option():
    """--api-server-count (bench/h200, 2026-12-02 front end: 256 streams 8.3-11.1 k -> 16.4-16.6 k out tok/s)
    reaches vLLM 0.26.0 and later; 0.4.3's parser refuses it, and an unknown engine gets nothing."""
    s = for_class("h200")
    assert s.api_server_count == 4
    assert s.vllm_args((0, 26, 0))[-2:] == ["--api-server-count", "4"]
    assert s.vllm_args((1, 0, 0))[-2:] == ["--api-server-count", "4"]
    for engine in ((0, 4, 3), (0, 25, 9), None):
        assert "--api-server-count" not in s.vllm_args(engine)
    assert s.vllm_args() == s.vllm_args(None)


@pytest.mark.parametrize("gpu_class", ["rtx-4090", "rtx-3090", "a10", "l4"])
def test_24gb_classes_keep_one_api_server_on_any_engine(gpu_class):
    s = for_class(gpu_class)
    assert s.api_server_count == 1
    assert "--api-server-count" not in s.vllm_args((0, 26, 0))
    assert "--api-server-count" not in for_class(gpu_class, tensor_parallel=2).vllm_args((0, 26, 0))


@pytest.mark.parametrize(
    ("installed", "expected"),
    [("0.4.3", (0, 4, 3)), ("0.26.0", (0, 26, 0)), ("0.26.0+cu130", (0, 26, 0)), ("0.27", (0, 27, 0)), ("dev", None)],
)
def test_engine_version_reads_the_installed_vllm(monkeypatch, installed, expected):
    monkeypatch.setattr(sizing.importlib.metadata, "version", lambda name: installed)
    assert sizing.engine_version() == expected


def test_engine_version_is_none_without_vllm(monkeypatch):
    def missing(name):
        raise sizing.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(sizing.importlib.metadata, "version", missing)
    assert sizing.engine_version() is None


def test_json_output_passes_the_installed_engine_to_the_arguments(monkeypatch, capsys, tmp_path):
    classes = tmp_path / "classes.json"
    classes.write_text(json.dumps({name: dataclasses.asdict(c) for name, c in CLASSES.items()}))
    show = ["show", "h200", "--json", "--classes", str(classes), "--max-model-len", str(MAX_MODEL_LEN)]
    monkeypatch.setattr(sizing, "engine_version", lambda: (0, 26, 0))
    assert sizing.main(show) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "0.26.0" and out["api_server_count"] == 4
    assert out["vllm_args"][-2:] == ["--api-server-count", "4"]
    monkeypatch.setattr(sizing, "engine_version", lambda: (0, 4, 3))
    assert sizing.main(show) == 0
    assert "--api-server-count" not in json.loads(capsys.readouterr().out)["vllm_args"]


def test_node_json_carries_the_registrys_classes_to_the_nodes_sizing(tmp_path, capsys):
    """A GPU node reads its classes from its own node.json (the plan's, rendered by the role):
    the registry is the only place a class is written."""
    import node_json

    path = node_json.write(tmp_path / "node.json", "gpu-cu121")
    assert sizing.load_classes(path) == CLASSES
    assert sizing.main(["show", "rtx-4090", "--json", "--node-json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["kv_cache_tokens"] == for_class("rtx-4090").kv_cache_tokens
    assert node_json.render("cpu")["gpu"] == {}


def test_a_class_with_several_api_servers_and_no_engine_version_is_refused_by_the_registry():
    data = registry.tomllib.loads(REGISTRY.path.read_text())
    del data["kit"]["gpu_classes"]["h200"]["api_servers_since"]
    with pytest.raises(registry.RegistryError, match=r"gpu_classes.h200.*api_servers_since"):
        registry.parse(data, REGISTRY.path)


def test_prefix_caching_off_leaves_the_flag_out_on_0_4_3_and_turns_it_off_on_0_26():
    """vllm_server_prefix_caching=false (users who must not share the engine's prefix cache:
    CVE-2025-25183, CVE-2025-46570): 0.4.3 caches only when told, 0.26 unless told not to."""
    s = for_class("rtx-4090")
    assert "--enable-prefix-caching" in s.vllm_args((0, 4, 3))
    off_043 = s.vllm_args((0, 4, 3), prefix_caching=False)
    assert not [a for a in off_043 if "prefix-caching" in a]
    assert "--no-enable-prefix-caching" in for_class("h200").vllm_args((0, 26, 0), prefix_caching=False)
    assert [a for a in off_043 if "prefix" not in a] == [a for a in s.vllm_args((0, 4, 3)) if "prefix" not in a]
