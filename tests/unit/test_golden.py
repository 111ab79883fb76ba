import json
import shutil
from pathlib import Path

import pytest

from glmdeploy.model.chatglm3 import (
    EOS_ID,
    PAD_ID,
    PADDED_VOCAB_SIZE,
    PREFIX_IDS,
    ROLE_IDS,
    SPECIAL_TOKENS,
    STRUCTURAL_IDS,
    TOKENIZER_LEN,
    VOCAB_SIZE,
)
from glmdeploy.model.golden import compare, main, record

GOLDEN = Path(__file__).resolve().parents[2] / "smoke_tests" / "golden"


@pytest.fixture(scope="module")
def fixture_record(fixture_dir):
    return record(fixture_dir, trust_remote_code=True)


def test_reference_stack_matches_the_shipped_fixture_golden(fixture_record):
    assert compare(json.loads((GOLDEN / "chatglm3-fixture.json").read_text()), fixture_record) == []


def test_real_model_golden_agrees_with_the_kits_token_facts_and_prompt_shape(fixture_record):
    """The real model's golden file (published facts only) and the kit's code must not disagree:
    special ids, sizes, and the published one-turn chat built in the shape the kit's builder uses
    (the fixture shares the real special ids, so its recorded chat has the same structure)."""
    golden = json.loads((GOLDEN / "chatglm3-6b-32k.json").read_text())
    assert golden["special_ids"] == SPECIAL_TOKENS
    assert (golden["vocab_size"], golden["len_tokenizer"]) == (VOCAB_SIZE, TOKENIZER_LEN)
    assert golden["embedding_rows"] == PADDED_VOCAB_SIZE
    assert (golden["eos_id"], golden["pad_id"]) == (EOS_ID, PAD_ID)
    published, built = golden["chats"]["one_turn"], fixture_record["chats"]["one_turn"]
    structure = [[i for i in chat if i in STRUCTURAL_IDS] for chat in (published, built)]
    assert structure[0] == structure[1] == [*PREFIX_IDS, ROLE_IDS["user"], ROLE_IDS["assistant"]]
    assert published[:3] == built[:3] and published[-1] == built[-1]


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
    assert compare({"len_tokenizer": 64796, "probes": {}}, fixture_record) == []


def test_check_command_exits_nonzero_with_the_fix(tmp_path, fixture_dir, fixture_record, capsys):
    golden = dict(fixture_record, len_tokenizer=1)
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(golden))
    assert main(["check", str(fixture_dir), str(path), "--trust-remote-code"]) == 1
    err = capsys.readouterr().err
    assert "DRIFT len_tokenizer: golden 1, current 64796" in err and "make tokenizer-lock" in err


def test_fixture_golden_pins_the_sentencepiece_model_and_the_remote_code(fixture_record):
    assert set(fixture_record["files"]) == {"tokenizer.model", "tokenizer_config.json", "tokenization_chatglm.py"}


def test_tokenizer_code_needing_a_missing_package_is_named_in_one_line(tmp_path, fixture_dir, capsys):
    model = tmp_path / "needs-a-package"
    shutil.copytree(fixture_dir, model)
    code = model / "tokenization_chatglm.py"
    code.write_text(code.read_text().replace("import json\n", "import json\nimport glmdeploy_no_such_package\n", 1))
    assert main(["check", str(model), str(GOLDEN / "chatglm3-fixture.json"), "--trust-remote-code"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "glmdeploy_no_such_package" in err[0] and "fix: " in err[0]
