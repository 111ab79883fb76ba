"""glmdeploy.tools.outputs: how a node's greedy outputs are compared with their recording."""

from __future__ import annotations

import copy

from glmdeploy.model import chatglm3
from glmdeploy.model.prompt import PromptBuilder
from glmdeploy.tools import outputs


def _output(tokens: list[str], top: list[list[str]] | None = None, prompt: str = "p") -> dict:
    return {
        "prompt_sha256": prompt,
        "prompt_tokens": 3,
        "tokens": tokens,
        "top": top or [[t, "x", "y"] for t in tokens],
        "text": "".join(tokens),
        "finish_reason": "length",
    }


def _golden(**outs: dict) -> dict:
    return {"max_model_len": 4096, "outputs": outs}


def test_identical_outputs_have_no_finding():
    golden = _golden(a=_output(["\u2581Hello", "\u2581world"]))
    found = outputs.compare(golden, copy.deepcopy(golden))
    assert found.changed == [] and found.near_ties == []


def test_a_changed_token_names_prompt_position_and_both_continuations():
    golden = _golden(a=_output(["\u2581The", "\u2581cat", "\u2581sat"]))
    now = _golden(a=_output(["\u2581The", "\u2581dog", "\u2581ran"]))
    found = outputs.compare(golden, now)
    assert found.changed == [
        "a: greedy output differs from token 1: recorded ['\u2581cat', '\u2581sat'], now ['\u2581dog', '\u2581ran']"
    ]


def test_a_near_tie_ends_the_comparison_without_a_finding():
    """Each run's token among the other's top alternatives: a flip floating point may cause."""
    golden = _golden(a=_output(["A", "B", "C"], top=[["A"], ["B", "X"], ["C"]]))
    now = _golden(a=_output(["A", "X", "Z"], top=[["A"], ["X", "B"], ["Z"]]))
    found = outputs.compare(golden, now)
    assert found.changed == [] and found.near_ties == ["a: near tie at token 1 ('B' / 'X'), compared up to there"]


def test_a_token_outside_the_recorded_alternatives_is_a_change_even_if_close_now():
    golden = _golden(a=_output(["A", "B"], top=[["A"], ["B", "Y"]]))
    now = _golden(a=_output(["A", "X"], top=[["A"], ["X", "B"]]))
    assert outputs.compare(golden, now).changed


def test_a_shorter_output_is_a_change_naming_both_finish_reasons():
    golden = _golden(a=_output(["A", "B", "C"]))
    short = _output(["A", "B"])
    short["finish_reason"] = "stop"
    found = outputs.compare(golden, _golden(a=short))
    assert found.changed and "from token 2" in found.changed[0] and "now stop" in found.changed[0]


def test_other_prompt_ids_are_named_as_a_tokenizer_change():
    golden = _golden(a=_output(["A"]))
    found = outputs.compare(golden, _golden(a=_output(["A"], prompt="other")))
    assert "the tokenizer changed" in found.changed[0]


def test_a_missing_prompt_is_a_change():
    assert outputs.compare(_golden(a=_output(["A"])), _golden()).changed == ["a: not generated now"]


def test_prompt_set_covers_chat_plain_chinese_english_long_and_the_context_limit(fixture_dir):
    """Built with the fixture's own tokenizer: the near-limit prompt fills the context to its margin."""
    from glmdeploy.model.prompt import load_tokenizer

    builder = PromptBuilder.from_tokenizer(load_tokenizer(str(fixture_dir), trust_remote_code=True))
    ids = {p.name: outputs.prompt_ids(p, builder, 4096) for p in outputs.PROBES}
    assert {"chat_zh_short", "chat_en", "plain_en", "plain_zh", "chat_multi_turn"} <= set(ids)
    assert 4096 - outputs.LIMIT_MARGIN - 200 < len(ids["chat_near_limit"]) <= 4096 - outputs.LIMIT_MARGIN
    assert 1000 < len(ids["chat_long_zh"]) <= 1500
    user, assistant = chatglm3.ROLE_IDS["user"], chatglm3.ROLE_IDS["assistant"]
    assert ids["chat_zh_short"][:3] == [*chatglm3.PREFIX_IDS, user] and ids["chat_zh_short"][-1] == assistant
    assert ids["plain_en"][0] not in chatglm3.STRUCTURAL_IDS
