"""Streamlit chat app: multi-turn history, streamed replies, sampling settings.

Run with `streamlit run glmdeploy/ui.py`; settings come from the node config
(GLMDEPLOY_NODE_CONFIG). Prompts are built as token ids by `prompt.py`, so a
user typing `<|user|>` never creates a role marker.
"""

from __future__ import annotations

import os
import time
from typing import Any

import streamlit as st

from glmdeploy.client import ApiClient, ServerError, ServerUnavailable
from glmdeploy.config import NodeConfig
from glmdeploy.prompt import PromptBuilder, PromptInjectionError, load_tokenizer


@st.cache_resource(show_spinner="Loading the tokenizer...")
def _builder(model_dir: str) -> PromptBuilder:
    trust = os.environ.get("GLMDEPLOY_TRUST_REMOTE_CODE") == "1"
    return PromptBuilder.from_tokenizer(load_tokenizer(model_dir, trust))


@st.cache_resource(show_spinner=False)
def _node() -> NodeConfig:
    return NodeConfig.load()


def _sidebar() -> dict[str, Any]:
    with st.sidebar:
        st.header("Settings")
        settings = {
            "temperature": st.slider("Temperature", 0.0, 2.0, 0.8, 0.05),
            "top_p": st.slider("Top-p", 0.05, 1.0, 0.8, 0.05),
            "max_tokens": st.number_input("Max new tokens", 1, 8192, 256, 16),
        }
        if st.button("Clear chat"):
            st.session_state.history = []
    return settings


def main() -> None:
    st.set_page_config(page_title="ChatGLM3 chat", page_icon=":speech_balloon:")
    node = _node()
    st.title("ChatGLM3-6B-32k")
    st.caption(f"profile {node.profile} · model {node.served_model_name} · {node.api_url}")
    settings = _sidebar()
    builder = _builder(node.model_dir)  # before the input box: the first reply must not wait on it
    history: list[dict[str, str]] = st.session_state.setdefault("history", [])
    for message in history:
        with st.chat_message(message["role"]):
            st.markdown(message["content"])
    prompt = st.chat_input("Type a message")
    if not prompt:
        return
    history.append({"role": "user", "content": prompt})
    with st.chat_message("user"):
        st.markdown(prompt)
    client = ApiClient.for_node(node)
    with st.chat_message("assistant"):
        try:
            ids = builder.chat_ids(history)
            started = time.monotonic()
            reply = st.write_stream(
                client.stream_completion(
                    ids, int(settings["max_tokens"]), float(settings["temperature"]), float(settings["top_p"])
                )
            )
            # Shown once the reply is complete (and what tells a test the stream ended).
            st.caption(f"replied in {time.monotonic() - started:.1f} s")
        except ServerUnavailable as exc:
            history.pop()
            st.error(f"The model server is not answering: {exc}. Check the node with `make smoke`.")
            return
        except ServerError as exc:
            history.pop()
            st.error(f"The model server failed this reply: {exc}. Check the node with `make smoke`.")
            return
        except PromptInjectionError as exc:
            history.pop()
            st.error(f"Message refused: {exc}")
            return
    history.append({"role": "assistant", "content": str(reply)})


main()
