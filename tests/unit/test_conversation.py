"""The chat's window (glmdeploy.model.conversation) and the UI's words (glmdeploy.chat_ui.ui_text)."""

from __future__ import annotations

import string

import pytest

from glmdeploy.api.client import ServerError, ServerUnavailable
from glmdeploy.chat_ui import ui_text
from glmdeploy.model import chatglm3, conversation
from glmdeploy.model.prompt import PromptBuilder

# One id per character: sizes are easy to count by hand, and none is a structural id.
BUILDER = PromptBuilder(lambda text: [1000 + ord(c) for c in text])


def size(message: dict[str, str]) -> int:
    return len(BUILDER.message_ids(message["role"], message["content"]))


def chat(*turns: str) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": text} for i, text in enumerate(turns)]


def test_a_chat_that_fits_is_sent_whole_and_equals_the_builders_ids():
    history = chat("hello", "hi there", "and now?")
    window = conversation.fit(BUILDER, history, max_model_len=200, reply_tokens=50, system="be brief")
    whole = BUILDER.chat_ids([{"role": "system", "content": "be brief"}, *history])
    assert window.ids == whole and window.dropped == 0 and window.prompt_tokens == len(whole)


def test_the_oldest_whole_turns_are_left_out_and_the_system_prompt_stays():
    history = chat("a" * 40, "b" * 40, "c" * 40, "d" * 40, "last question")
    fixed = len(chatglm3.PREFIX_IDS) + 1 + size({"role": "system", "content": "sys"})
    # Room for the last three messages but not the fourth from the end: the window starts at a
    # user message, so the answer "d..." without its question "c..." is not sent either.
    budget = fixed + sum(size(m) for m in history[2:]) - 1
    window = conversation.fit(BUILDER, history, max_model_len=budget + 10, reply_tokens=10, system="sys")
    assert window.dropped == 4
    assert window.ids == BUILDER.chat_ids([{"role": "system", "content": "sys"}, history[-1]])
    assert window.prompt_tokens <= budget


def test_a_message_that_cannot_fit_alone_is_refused_with_its_size_and_the_limit():
    history = chat("x" * 300)
    with pytest.raises(conversation.MessageTooLong) as refused:
        conversation.fit(BUILDER, history, max_model_len=256, reply_tokens=64)
    assert refused.value.message_tokens == len(BUILDER.chat_ids(history))
    assert "this node takes 256 with the reply's 64" in str(refused.value)


def test_every_string_exists_in_english_and_chinese_with_the_same_fields():
    english, chinese = ui_text.STRINGS["en"], ui_text.STRINGS["zh"]
    assert english.keys() == chinese.keys()
    for key in english:
        fields = {name for _, name, _, _ in string.Formatter().parse(english[key]) if name}
        assert fields == {name for _, name, _, _ in string.Formatter().parse(chinese[key]) if name}, key


@pytest.mark.parametrize(
    ("header", "lang"), [("zh-CN,zh;q=0.9,en;q=0.8", "zh"), ("en-US,en", "en"), ("fr-FR,zh;q=0.5", "zh"), (None, "en")]
)
def test_the_page_follows_the_browsers_language(header, lang):
    assert ui_text.language_of(header) == lang


def test_a_refused_request_is_the_users_to_fix_and_shows_no_json():
    body = (
        '{"object":"error","message":"This model\'s maximum context length is 4096 tokens.","type":"BadRequestError"}'
    )
    failure = ui_text.describe(ServerError(f"POST /completions -> HTTP 400: {body}", code=400), "en", "node1")
    assert failure.whose == "user" and "maximum context length is 4096 tokens" in failure.text
    assert "{" not in failure.text and "BadRequestError" not in failure.text


@pytest.mark.parametrize(
    "exc",
    [
        ServerUnavailable("cannot reach the model server at http://127.0.0.1:8000/v1: refused"),
        ServerError("POST /completions -> HTTP 500: {}", code=500),
        ServerError("POST /completions: the stream ended before [DONE]"),
    ],
)
def test_a_server_that_is_down_or_breaks_off_is_the_nodes_with_what_to_tell_the_admin(exc):
    failure = ui_text.describe(exc, "zh", "node1")
    assert failure.whose == "node" and "node1" in failure.text and "make smoke" in failure.text
