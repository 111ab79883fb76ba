"""Streamlit chat app: multi-turn history that fits the node's window, streamed replies that can
be stopped and regenerated, a system prompt, errors worded by whose they are, English and Chinese.

Run with `streamlit run glmdeploy/chat_ui/ui.py`; settings come from the node config
(GLMDEPLOY_NODE_CONFIG). Prompts are built as token ids by `prompt.py`, so a
user typing `<|user|>` never creates a role marker; `conversation.py` decides which turns
are sent and `ui_text.py` holds every word the page shows.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import streamlit as st

from glmdeploy.api.client import ApiClient, ServerError, ServerUnavailable
from glmdeploy.chat_ui import ui_text
from glmdeploy.config import ENV_VAR, NodeConfig
from glmdeploy.model.conversation import MessageTooLong, Reply, fit, stream_reply
from glmdeploy.model.prompt import PromptBuilder, PromptInjectionError, load_tokenizer

# How long the status line's "generating" check is reused: one tiny generation per 10 s at most,
# whatever the number of open pages.
STATUS_TTL_S = 10
# How often a streaming reply is redrawn (seconds): smooth to the eye, light for the browser.
DRAW_EVERY_S = 0.1


@st.cache_resource(show_spinner="Loading the tokenizer... / 正在加载分词器...")
def _builder(model_dir: str) -> PromptBuilder:
    trust = os.environ.get("GLMDEPLOY_TRUST_REMOTE_CODE") == "1"
    return PromptBuilder.from_tokenizer(load_tokenizer(model_dir, trust))


@st.cache_resource(show_spinner=False)
def _node() -> NodeConfig:
    return NodeConfig.load()


@st.cache_data(ttl=STATUS_TTL_S, show_spinner=False)
def _generating(api_url: str) -> bool:
    """Whether the server generates right now: one token of a one-turn chat (the readiness check's kind)."""
    node = _node()
    client = ApiClient.for_node(node, timeout_s=10)
    try:
        ids = _builder(node.model_dir).chat_ids([{"role": "user", "content": "hi"}])
        return client.complete(ids, max_tokens=1, temperature=0.0, stream=False).finish_reason is not None
    except (ServerError, ServerUnavailable, OSError):
        return False


def _release() -> str:
    """The release this node runs: release.json beside the node config the UI was started with."""
    config = Path(os.environ.get(ENV_VAR) or "/etc/glmdeploy/node.json").resolve()
    try:
        return str(json.loads((config.parent / "release.json").read_text())["id"])
    except (OSError, ValueError, KeyError):
        return "?"


def _browser_language() -> str:
    context = getattr(st, "context", None)  # Streamlit >= 1.37; the gpu locks carry 1.36
    headers = getattr(context, "headers", None) or {}
    return ui_text.language_of(headers.get("Accept-Language"))


def _sidebar() -> tuple[dict[str, str], dict[str, Any]]:
    with st.sidebar:
        codes = list(ui_text.LANGUAGES)
        # The browser's language on a new page; the widget keeps the user's choice after that.
        lang = st.selectbox(
            "Language / 语言",
            codes,
            index=codes.index(_browser_language()),
            format_func=ui_text.LANGUAGES.__getitem__,
            key="lang",
        )
        words = ui_text.STRINGS[lang]
        st.header(words["settings"])
        settings = {
            "system": st.text_area(words["system"], "", help=words["system_help"]),
            "temperature": st.slider(words["temperature"], 0.0, 2.0, 0.8, 0.05),
            "top_p": st.slider(words["top_p"], 0.05, 1.0, 0.8, 0.05),
            "max_tokens": st.number_input(words["max_tokens"], 1, 8192, 256, 16),
        }
        if st.button(words["clear"]):
            st.session_state.history = []
            st.session_state.pop("pending", None)
    return words, settings


def _caption(message: dict[str, Any], words: dict[str, str], target: Any = st) -> None:
    notes = []
    if message.get("dropped"):
        notes.append(words["dropped"].format(count=message["dropped"], limit=message["limit"]))
    if message.get("stats"):
        notes.append(words["stats"].format(**message["stats"]))
    if message.get("stopped"):
        notes.append(words["stopped"])
    if notes:
        target.caption(" · ".join(notes))


def _finish(reply: Reply, window_dropped: int, limit: int, stopped: bool) -> dict[str, Any]:
    stats = {"ttft": reply.first_token_s or 0.0, "tokens": reply.tokens, "rate": reply.tokens_per_s}
    return {
        "role": "assistant",
        "content": reply.text,
        "stats": stats if reply.tokens else None,
        "dropped": window_dropped,
        "limit": limit,
        "stopped": stopped,
    }


def _answer(
    node: NodeConfig, words: dict[str, str], settings: dict[str, Any], history: list[dict[str, Any]], stop: Any
) -> None:
    """Stream a reply to the chat's last user message, with a Stop button while it streams."""
    lang = st.session_state.get("lang", "en")
    host = socket.gethostname()
    max_tokens = int(settings["max_tokens"])
    turns = [{"role": m["role"], "content": m["content"]} for m in history]
    with st.chat_message("assistant"):
        try:
            window = fit(_builder(node.model_dir), turns, node.max_model_len, max_tokens, settings["system"])
        except MessageTooLong as exc:
            history.pop()
            over = exc.message_tokens + exc.reply_tokens - exc.max_model_len
            st.warning(
                words["too_long"].format(
                    tokens=exc.message_tokens, limit=exc.max_model_len, reply=exc.reply_tokens, over=over
                )
            )
            return
        except PromptInjectionError as exc:
            history.pop()
            st.warning(words["injection"].format(detail=exc))
            return
        # In the sidebar: a button inside the growing reply moves with every piece and is covered
        # by the text as it reflows; the sidebar keeps it still, where the hand expects it.
        stop.button(words["stop"], key=f"stop-{len(history)}", type="primary")
        # Both slots drawn at once: a regenerated reply must not show the old one's line under it
        # (Streamlit keeps an earlier run's element on the page until something takes its place).
        text, note = st.empty(), st.empty()
        reply = Reply()
        # A Stop (or any other click) reruns the script: the stream below is cut where it is, the
        # generator closed (the server aborts the request), and the next run files what arrived.
        st.session_state.pending = {"dropped": window.dropped, "limit": node.max_model_len, "reply": reply}
        client = ApiClient.for_node(node)
        pieces = stream_reply(
            client, window.ids, max_tokens, float(settings["temperature"]), float(settings["top_p"]), reply
        )
        try:
            with contextlib.closing(pieces):
                drawn = 0.0
                for _ in pieces:
                    # At most every DRAW_EVERY_S: the browser renders the whole reply again on each
                    # update, and a busy page answers the Stop click late (15 s at every token on
                    # the 2-core test machine).
                    if time.monotonic() - drawn >= DRAW_EVERY_S:
                        text.markdown(reply.text + " ▌")
                        drawn = time.monotonic()
        except (ServerError, ServerUnavailable) as exc:
            # Filed by a newer run already (a click as the stream failed): that run owns the history.
            if st.session_state.pop("pending", None) is not None:
                history.pop()
            stop.empty()
            failure = ui_text.describe(exc, lang, host)
            (st.warning if failure.whose == "user" else st.error)(failure.text)
            return
        # History first, drawing after: a click now interrupts at the next st.* call, and the
        # reply must already be filed by then (or filed by the newer run, as stopped).
        if st.session_state.pop("pending", None) is None:
            return
        message = _finish(reply, window.dropped, node.max_model_len, stopped=False)
        history.append(message)
        stop.empty()
        text.markdown(reply.text)
        _caption(message, words, note)


def _status(node: NodeConfig, words: dict[str, str]) -> None:
    state = words["status_ok"] if _generating(node.api_url) else words["status_down"]
    st.caption(
        words["status"].format(
            node=socket.gethostname(),
            profile=node.profile,
            model=node.served_model_name,
            release=_release(),
            state=state,
        )
    )


def main() -> None:
    st.set_page_config(page_title="ChatGLM3 chat", page_icon=":speech_balloon:")
    node = _node()
    stop = st.sidebar.empty()  # the top of the sidebar: where Stop appears while a reply streams
    words, settings = _sidebar()
    st.title(words["title"])
    _status(node, words)
    _builder(node.model_dir)  # before the input box: the first reply must not wait on it
    history: list[dict[str, Any]] = st.session_state.setdefault("history", [])
    pending = st.session_state.pop("pending", None)
    if pending is not None:  # the last run was cut mid-reply (Stop): keep what had arrived
        history.append(_finish(pending["reply"], pending["dropped"], pending["limit"], stopped=True))
    for message in history:
        with st.chat_message(message["role"]):
            st.markdown(message["content"])
            _caption(message, words)
    prompt = st.chat_input(words["input"])
    if prompt:
        history.append({"role": "user", "content": prompt})
        with st.chat_message("user"):
            st.markdown(prompt)
    elif st.session_state.pop("regenerate", False):
        pass  # Regenerate's callback took the last reply off before this run
    else:
        _regenerate_button(history, words)
        return
    _answer(node, words, settings, history, stop)
    _regenerate_button(history, words)  # under the reply just finished, not only after the next click


def _take_back_last_reply() -> None:
    """Regenerate's callback: Streamlit runs it before the rerun the click starts, so that run draws
    the chat without the reply and answers again (an st.rerun from the script drew it twice)."""
    history = st.session_state.get("history") or []
    if history and history[-1]["role"] == "assistant":
        history.pop()
        st.session_state.regenerate = True


def _regenerate_button(history: list[dict[str, Any]], words: dict[str, str]) -> None:
    """One button (one key) whichever run draws it: under a finished reply."""
    if history and history[-1]["role"] == "assistant":
        st.button(words["regenerate"], key="regenerate", on_click=_take_back_last_reply)


main()
