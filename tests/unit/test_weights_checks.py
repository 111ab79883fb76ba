"""Cheap checks before expensive ones: a checkpoint that cannot be served is refused before any conversion.

Every refusal here is found from the index, config.json and the shards' tensor metadata
(names, shapes, dtypes; no tensor data read), for all shards, before the first shard is
converted: at the real size, seconds instead of the minutes of converting the shards
before the fault (issue 50). The sources are the fixture generator's `published` shape
(seven `.bin` shards, the real revision's file set), copied and altered one way each.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from fixture_model import generate  # tests/support/, on sys.path through conftest.py

from glmdeploy_control import checkpoint, weights

COMMIT = "0123456789abcdef0123456789abcdef01234567"
DEST_NAME = "chatglm3-6b-32k"
BIN_SHARDS = [f"pytorch_model-{k:05d}-of-00007.bin" for k in range(1, 8)]
LAST = BIN_SHARDS[-1]
FAKE_TENSOR = "transformer.encoder.layers.0.self_attention.not_in_any_shard.weight"


@pytest.fixture(scope="module")
def published_src(tmp_path_factory) -> Path:
    """A plain copy of the repo in the published revision's shape (.bin shards only)."""
    path = tmp_path_factory.mktemp("published") / DEST_NAME
    generate(path, shape="published")
    return path


@pytest.fixture
def copy(published_src, tmp_path) -> Path:
    out = tmp_path / "copy" / DEST_NAME
    shutil.copytree(published_src, out)
    return out


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def _convert(src: Path, tmp_path: Path) -> tuple[Path, list[str], str]:
    """checkpoint.convert_bin into an empty directory; the refusal, the progress lines and what it wrote."""
    config = json.loads((src / "config.json").read_text())
    dest = tmp_path / "converted"
    dest.mkdir()
    lines: list[str] = []
    with pytest.raises(checkpoint.CheckpointError) as refused:
        checkpoint.convert_bin(src, dest, checkpoint.read_layout(src), config, progress=lines.append)
    return dest, lines, str(refused.value)


def _stage_from(src: Path, tmp_path: Path, capsys) -> tuple[int, str, str]:
    """weights.main --from src: exit code, the refusal (the line after `error: `) and stdout."""
    dest = tmp_path / "models" / DEST_NAME
    rc = weights.main(["--revision", COMMIT, "--dest", str(dest), "--from", str(src), "--work", str(tmp_path / "w")])
    out, err = capsys.readouterr()
    assert not dest.exists() and not (tmp_path / "w").exists(), "a refused run left files behind"
    return rc, err.removeprefix("error: ").split("\nnothing was changed in")[0], out


def _one_line_with_a_fix(message: str) -> None:
    assert "\n" not in message, message
    assert re.search(r"; fix: \S.*$", message), f"no fix at the end: {message!r}"


def _drop_tensor(shard: Path, name: str) -> None:
    """Write the shard again without one tensor (torch.save, the format the published shards have)."""
    import torch

    state = torch.load(str(shard), map_location="cpu", weights_only=True)
    del state[name]
    torch.save(state, str(shard))


# ------------------------------------------------------------------------------------ the index


def test_an_index_naming_a_tensor_no_shard_holds_is_refused_before_any_conversion(copy, tmp_path):
    """The entry is put in the last shard: checked shard by shard, six would have been converted first."""
    _edit_json(copy / checkpoint.BIN_INDEX, lambda index: index["weight_map"].update({FAKE_TENSOR: LAST}))
    dest, lines, message = _convert(copy, tmp_path)
    assert list(dest.iterdir()) == [], "a shard was converted before the refusal"
    assert not [line for line in lines if "converting" in line], lines
    assert message.startswith(f"{checkpoint.BIN_INDEX} names {FAKE_TENSOR} in {LAST}, but none of the 7 shards")
    assert "config.json implies no such parameter" in message  # the index is wrong, not the shard
    _one_line_with_a_fix(message)


def test_an_index_naming_a_tensor_no_shard_holds_is_refused_by_make_weights_naming_tensor_and_shard(
    copy, tmp_path, capsys
):
    _edit_json(copy / checkpoint.BIN_INDEX, lambda index: index["weight_map"].update({FAKE_TENSOR: LAST}))
    rc, message, out = _stage_from(copy, tmp_path, capsys)
    assert rc == 1
    assert FAKE_TENSOR in message and LAST in message, message
    assert "converting" not in out, out
    _one_line_with_a_fix(message)


def test_a_parameter_the_index_names_but_its_shard_lacks_blames_that_shard(copy, tmp_path):
    index = json.loads((copy / checkpoint.BIN_INDEX).read_text())["weight_map"]
    name = sorted(n for n, s in index.items() if s == LAST)[0]
    _drop_tensor(copy / LAST, name)
    dest, _, message = _convert(copy, tmp_path)
    assert list(dest.iterdir()) == []
    assert message.startswith(f"{checkpoint.BIN_INDEX} names {name} in {LAST}, but none of the 7 shards holds it")
    assert f"{LAST} is damaged or from another revision" in message
    _one_line_with_a_fix(message)


def test_an_index_that_puts_a_tensor_in_another_shard_than_holds_it_is_refused(copy, tmp_path):
    index = json.loads((copy / checkpoint.BIN_INDEX).read_text())["weight_map"]
    name = sorted(n for n, s in index.items() if s == LAST)[0]
    _edit_json(copy / checkpoint.BIN_INDEX, lambda data: data["weight_map"].update({name: BIN_SHARDS[0]}))
    dest, _, message = _convert(copy, tmp_path)
    assert list(dest.iterdir()) == []
    assert message.startswith(f"{checkpoint.BIN_INDEX} puts {name} in {BIN_SHARDS[0]}, but {LAST} holds it")
    _one_line_with_a_fix(message)


# ------------------------------------------------------------------------------------ config.json


def test_a_shape_that_disagrees_with_config_is_refused_with_a_fix(copy, tmp_path):
    """config.json of another model (ffn_hidden_size doubled): the message names tensor, shapes and the field."""
    import torch

    config = json.loads((copy / "config.json").read_text())
    ffn = int(config["ffn_hidden_size"])
    _edit_json(copy / "config.json", lambda data: data.update({"ffn_hidden_size": 2 * ffn}))
    dest, _, message = _convert(copy, tmp_path)
    assert list(dest.iterdir()) == []
    found = re.match(r"^(\S+): (\S+) has shape (\[[\d, ]+\]), config\.json implies (\[[\d, ]+\]) \((.*?)\): ", message)
    assert found, message
    shard, name, shape, implied, why = found.groups()
    tensor = torch.load(str(copy / shard), map_location="cpu", weights_only=True, mmap=True)[name]
    assert json.loads(shape) == list(tensor.shape)
    want = checkpoint.expected_shapes({**config, "ffn_hidden_size": 2 * ffn})[name]
    assert json.loads(implied) == list(want) != list(tensor.shape)
    assert "ffn_hidden_size" in why and f"ffn_hidden_size={2 * ffn}" in why, why
    _one_line_with_a_fix(message)


def test_a_shape_that_disagrees_with_config_is_refused_by_make_weights_before_the_copy(copy, tmp_path, capsys):
    _edit_json(copy / "config.json", lambda data: data.update({"hidden_size": 2 * int(data["hidden_size"])}))
    rc, message, out = _stage_from(copy, tmp_path, capsys)
    assert rc == 1
    assert message.startswith(f"{copy}: "), message  # the source, checked before its 34 MB are copied
    assert "has shape" in message and "hidden_size=" in message, message
    assert "converting" not in out
    _one_line_with_a_fix(message)


def test_a_layer_beyond_num_layers_is_refused_naming_the_field(copy, tmp_path):
    _edit_json(copy / "config.json", lambda data: data.update({"num_layers": int(data["num_layers"]) - 1}))
    dest, _, message = _convert(copy, tmp_path)
    assert list(dest.iterdir()) == []
    assert re.search(r"holds transformer\.encoder\.layers\.\d+\.\S+, but config\.json's num_layers=\d+", message)
    _one_line_with_a_fix(message)


def test_a_dtype_that_disagrees_with_config_is_refused_with_a_fix(copy, tmp_path):
    _edit_json(copy / "config.json", lambda data: data.update({"torch_dtype": "bfloat16"}))
    _, _, message = _convert(copy, tmp_path)
    assert re.search(r": \S+ is float16, config\.json says torch_dtype bfloat16", message), message
    _one_line_with_a_fix(message)


# ------------------------------------------------------------------------------------ the shards


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.0], ids=["half", "all_but_the_end", "empty"])
def test_a_truncated_shard_given_through_from_is_refused(copy, tmp_path, capsys, keep):
    shard = BIN_SHARDS[3]
    data = (copy / shard).read_bytes()
    (copy / shard).write_bytes(data[: int(len(data) * keep)])
    rc, message, out = _stage_from(copy, tmp_path, capsys)
    assert rc == 1
    assert message.startswith(f"{copy}: {shard} is truncated: {int(len(data) * keep)} bytes"), message
    assert "converting" not in out
    _one_line_with_a_fix(message)


def test_a_truncated_shard_is_refused_before_any_shard_is_converted(copy, tmp_path):
    (copy / LAST).write_bytes((copy / LAST).read_bytes()[:1000])
    dest, _, message = _convert(copy, tmp_path)
    assert list(dest.iterdir()) == []
    assert message.startswith(f"{LAST} is truncated")


def test_the_checks_map_the_shards_instead_of_reading_their_tensors(published_src):
    """The first pass maps each shard (the kernel reads a page only when touched): seconds at any size."""
    shard = published_src / BIN_SHARDS[0]
    state = checkpoint.load_bin(shard)
    mapped = Path("/proc/self/maps").read_text()
    assert str(shard) in mapped, "the shard was read into memory, not mapped"
    del state


def test_a_whole_published_revision_passes_the_checks(published_src, capsys):
    config, layout = weights.check_checkpoint(published_src)
    assert layout.kind == "bin" and layout.shards == BIN_SHARDS
    assert config["num_layers"] > 0
    assert "no tensor data read" in capsys.readouterr().out
