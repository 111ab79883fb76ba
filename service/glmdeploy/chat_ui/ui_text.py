"""The chat UI's words, in English and Chinese, and what a failed reply is said to be.

Why a table here: ChatGLM3 is a bilingual model and its users read Chinese as often as English;
every string the page shows comes from STRINGS, so a test can check that both languages have the
same keys. Why failures are sorted: a request the server refuses (too long, a bad setting) is the
user's to fix; a server that does not answer or breaks off is the node's, for the admin. The
server's JSON never reaches the page, only its `message`.
"""

# ruff: noqa: RUF001  (Chinese text takes Chinese, full-width punctuation)
from __future__ import annotations

import json
from dataclasses import dataclass

from glmdeploy.api.client import ServerError, ServerUnavailable

LANGUAGES = {"en": "English", "zh": "中文"}

STRINGS: dict[str, dict[str, str]] = {
    "en": {
        "title": "ChatGLM3-6B-32k",
        "input": "Type a message",
        "settings": "Settings",
        "system": "System prompt",
        "system_help": "Sent before every chat; kept when earlier turns are left out.",
        "temperature": "Temperature",
        "top_p": "Top-p",
        "max_tokens": "Max new tokens",
        "clear": "Clear chat",
        "stop": "Stop",
        "regenerate": "Regenerate the last reply",
        "stopped": "stopped by you",
        "stats": "first token {ttft:.2f} s · {tokens} tokens · {rate:.1f} tokens/s",
        "dropped": "{count} earlier messages are not sent: the chat is longer than this node's {limit:,}-token window.",
        "too_long": (
            "Your message is {tokens:,} tokens; this node takes {limit:,} tokens, the reply's {reply:,} included."
            " Shorten it by {over:,} tokens, or lower Max new tokens."
        ),
        "refused": "The server refused this request: {detail}. Change the message or the settings and send again.",
        "busy": "The node is busy (too many requests): try again in a moment.",
        "key": "The node refused the chat page's key. Tell the admin: the UI's API key for {node} is wrong.",
        "down": "The model server at {node} is not answering. Tell the admin: run `make smoke` for this node.",
        "broken": "The model server at {node} failed while answering ({detail}). Tell the admin: run `make smoke`.",
        "injection": "Message refused: {detail}.",
        "status_ok": "generating",
        "status_down": "not generating",
        "status": "node {node} · profile {profile} · model {model} · release {release} · {state}",
    },
    "zh": {
        "title": "ChatGLM3-6B-32k",
        "input": "输入消息",
        "settings": "设置",
        "system": "系统提示词",
        "system_help": "每次对话前发送；省略较早的消息时仍保留。",
        "temperature": "温度",
        "top_p": "Top-p",
        "max_tokens": "最大生成 token 数",
        "clear": "清空对话",
        "stop": "停止",
        "regenerate": "重新生成上一条回复",
        "stopped": "已被你停止",
        "stats": "首个 token {ttft:.2f} 秒 · {tokens} 个 token · 每秒 {rate:.1f} 个 token",
        "dropped": "有 {count} 条较早的消息未发送：对话超出了本节点 {limit:,} 个 token 的上下文窗口。",
        "too_long": (
            "你的消息有 {tokens:,} 个 token；本节点最多接受 {limit:,} 个 token（含回复的 {reply:,} 个）。"
            "请缩短 {over:,} 个 token，或调低最大生成 token 数。"
        ),
        "refused": "服务器拒绝了这个请求：{detail}。请修改消息或设置后重新发送。",
        "busy": "节点繁忙（请求过多）：请稍后再试。",
        "key": "节点拒绝了聊天页面的密钥。请告诉管理员：{node} 的 UI API 密钥有误。",
        "down": "{node} 上的模型服务没有响应。请告诉管理员：对该节点运行 `make smoke`。",
        "broken": "{node} 上的模型服务在回复时出错（{detail}）。请告诉管理员：运行 `make smoke`。",
        "injection": "消息被拒绝：{detail}。",
        "status_ok": "正在生成",
        "status_down": "无法生成",
        "status": "节点 {node} · 配置 {profile} · 模型 {model} · 版本 {release} · {state}",
    },
}


def language_of(accept_language: str | None) -> str:
    """The first language of an Accept-Language header the UI has ("zh-CN,zh;q=0.9" -> "zh")."""
    for part in (accept_language or "").split(","):
        code = part.split(";")[0].strip().lower().split("-")[0]
        if code in STRINGS:
            return code
    return "en"


@dataclass(frozen=True)
class Failure:
    """Whose problem a failed reply is ("user" or "node") and what the page says."""

    whose: str
    text: str


def server_detail(exc: ServerError) -> str:
    """The server's own message from an error answer, without its JSON ("... HTTP 400: {...}")."""
    text = str(exc)
    start = text.find("{")
    if start >= 0:
        try:
            body = json.loads(text[start:])
        except ValueError:
            return text[start:][:300]
        error = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])[:300]
    return text.split(": ", 1)[-1][:300]


def describe(exc: Exception, lang: str, node: str) -> Failure:
    """The page's words for a failed reply, by cause."""
    words = STRINGS[lang]
    if isinstance(exc, ServerUnavailable):
        return Failure("node", words["down"].format(node=node))
    if isinstance(exc, ServerError):
        code = exc.code if isinstance(exc.code, int) else None
        if code in (400, 404, 413, 422):
            return Failure("user", words["refused"].format(detail=server_detail(exc)))
        if code == 429:
            return Failure("user", words["busy"])
        if code in (401, 403):
            return Failure("node", words["key"].format(node=node))
        detail = f"HTTP {code}" if code else server_detail(exc)
        return Failure("node", words["broken"].format(node=node, detail=detail))
    return Failure("node", words["broken"].format(node=node, detail=type(exc).__name__))
