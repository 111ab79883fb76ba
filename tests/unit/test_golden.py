import json
import shutil
from pathlib import Path

import pytest

from glmdeploy.golden import compare, main, record

GOLDEN = Path(__file__).resolve().parents[2] / "smoke_tests" / "golden"


@pytest.fixture(scope="module")
def fixture_record(fixture_dir):
    return record(fixture_dir, trust_remote_code=True)


def test_reference_stack_matches_the_shipped_fixture_golden(fixture_record):
    assert compare(json.loads((GOLDEN / "chatglm3-fixture.json").read_text()), fixture_record) == []


def test_real_model_golden_holds_the_published_sequences():
    golden = json.loads((GOLDEN / "chatglm3-6b-32k.json").read_text())
    assert golden["probes"]["chinese"] == [64790, 64792, 30910, 32820, 54266, 31876, 35153]
    assert golden["chats"]["one_turn"] == [64790, 64792, 64795, 30910, 13, 36474, 54591, 64796]
    assert golden["special_ids"]["<|observation|>"] == 64797 and golden["len_tokenizer"] == 64798


def test_changed_normalisation_is_named_by_probe_and_file(tmp_path, fixture_dir, fixture_record):
    from sentencepiece import sentencepiece_model_pb2

    changed = tmp_path / "model"
    shutil.copytree(fixture_dir, changed)
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString((changed / "tokenizer.model").read_bytes())
    model.normalizer_spec.remove_extra_whitespaces = True  # what a re-exported tokenizer can silently do
    (changed / "tokenizer.model").write_bytes(model.SerializeToString())
    drift = compare(fixture_record, record(changed, trust_remote_code=True), label="upgraded")
    assert any(line.startswith("files[tokenizer.model]: golden ") for line in drift)
    assert any(line.startswith("probes[whitespace_runs]: golden [64790, 64792,") for line in drift)
    assert not any("chinese" in line for line in drift), "a whitespace change must not touch Chinese ids"


def test_changed_special_id_is_named(fixture_record):
    golden = json.loads(json.dumps(fixture_record))
    golden["special_ids"]["<|user|>"] = 64000
    assert compare(golden, fixture_record) == ["special_ids[<|user|>]: golden 64000, current 64795"]


def test_partial_golden_checks_only_what_it_holds(fixture_record):
    assert compare({"len_tokenizer": 64798, "probes": {}}, fixture_record) == []


def test_check_command_exits_nonzero_with_the_fix(tmp_path, fixture_dir, fixture_record, capsys):
    golden = dict(fixture_record, len_tokenizer=1)
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(golden))
    assert main(["check", str(fixture_dir), str(path), "--trust-remote-code"]) == 1
    err = capsys.readouterr().err
    assert "DRIFT len_tokenizer: golden 1, current 64798" in err and "make tokenizer-lock" in err


def test_fixture_golden_pins_the_sentencepiece_model_and_the_remote_code(fixture_record):
    assert set(fixture_record["files"]) == {"tokenizer.model", "tokenizer_config.json", "tokenization_chatglm.py"}
