"""Output golden: what the served model says, greedily, to a fixed set of prompts, and any change.

Why: after an engine or library upgrade the same prompt with greedy decoding can give another
answer although the tokenizer is unchanged (numerics, kernels, sampling defaults). The tokenizer
golden cannot see that; this can. A recording per model, profile and hardware class (the same
class as the throughput baseline: GPU model and count, or CPU count) holds, for each prompt, the
greedy tokens and each position's top alternatives with their log-probabilities, as the server
returns them (OpenAI `logprobs`, which vLLM 0.4.3 and later answer alike, tokens as text).

How two runs are compared: token by token up to the first difference. A difference where each
run's token is among the other run's top alternatives is a near tie, which floating-point
differences between runs may flip; it ends the comparison of that prompt without a finding (the
rule of vLLM's own `check_logprobs_close`, which its tests use to compare engines). Any other
difference is a changed output, named with its prompt, position and both continuations.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmdeploy.api.client import ApiClient
from glmdeploy.config import NodeConfig
from glmdeploy.model.prompt import PromptBuilder, load_tokenizer
from glmdeploy.serving import nodefacts
from glmdeploy.tools.bench.client import server_versions

#: Alternatives kept per position (the OpenAI completions API allows at most 5).
TOP = 5
#: Tokens generated per prompt: long enough that a drifted model shows, short enough for a gate.
MAX_TOKENS = 24
#: Tokens left free below the context limit by the longest prompt.
LIMIT_MARGIN = MAX_TOKENS + 8

_PARAGRAPH = (
    "第{n}段：部署服务时，管理员先检查驱动版本，再核对模型文件的校验和，最后启动推理服务并运行冒烟测试。"  # noqa: RUF001
    " Section {n}: the operator pins the driver, checks every weight file against its SHA256 and"
    " starts the server only after the smoke tests pass.\n"
)


@dataclass(frozen=True)
class Probe:
    """One prompt of the set: a chat (role messages) or plain text, or filled to a share of the context."""

    name: str
    messages: tuple[tuple[str, str], ...] = ()
    text: str = ""
    #: Fill with numbered paragraphs up to this many tokens below the context limit (0: not filled).
    fill_to_limit: bool = False
    fill_tokens: int = 0
    question: str = ""


PROBES: tuple[Probe, ...] = (
    Probe("chat_zh_short", messages=(("user", "你好"),)),
    Probe("chat_en", messages=(("user", "Explain in one sentence what a GPU does."),)),
    Probe(
        "chat_multi_turn",
        messages=(
            ("system", "You are a helpful assistant."),
            ("user", "北京有什么好玩的地方？"),  # noqa: RUF001 (Chinese punctuation on purpose)
            ("assistant", "故宫、长城和颐和园都很值得一去。"),
            ("user", "Which one should I visit first, and why?"),
        ),
    ),
    Probe("plain_en", text="The three most important steps when deploying a language model are"),
    Probe("plain_zh", text="人工智能的发展历史可以分为以下几个阶段："),  # noqa: RUF001
    Probe("chat_long_zh", fill_tokens=1500, question="请用一句话总结上面的内容。"),
    Probe("chat_near_limit", fill_to_limit=True, question="What does section 3 say? Answer briefly."),
)


def _filled(builder: PromptBuilder, question: str, budget: int) -> list[int]:
    """A chat whose user message is numbered paragraphs then a question, at most `budget` ids long."""
    paragraphs: list[str] = []
    ids = builder.chat_ids([{"role": "user", "content": question}])
    while True:
        paragraphs.append(_PARAGRAPH.format(n=len(paragraphs) + 1))
        longer = builder.chat_ids([{"role": "user", "content": "".join(paragraphs) + question}])
        if len(longer) > budget:
            return ids
        ids = longer


def prompt_ids(probe: Probe, builder: PromptBuilder, max_model_len: int) -> list[int]:
    """The probe's prompt ids, built the way the kit sends prompts (role markers as ids)."""
    if probe.messages:
        return builder.chat_ids([{"role": r, "content": c} for r, c in probe.messages])
    if probe.text:
        return builder.text_ids(probe.text)
    room = max_model_len - LIMIT_MARGIN
    return _filled(builder, probe.question, room if probe.fill_to_limit else min(probe.fill_tokens, room))


def generate(client: ApiClient, ids: list[int]) -> dict[str, Any]:
    """One greedy generation: its tokens (as the server spells them), their top alternatives, its text."""
    body = client.completion_body(ids, MAX_TOKENS, temperature=0.0, top_p=1.0, stream=False)
    body["logprobs"] = TOP
    response = json.loads(client._request("POST", "/completions", body).read())
    choice = response["choices"][0]
    logprobs = choice.get("logprobs") or {}
    return {
        "prompt_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(),
        "prompt_tokens": len(ids),
        "tokens": list(logprobs.get("tokens") or []),
        "top": [sorted(alt or {}, key=lambda t: -(alt or {})[t]) for alt in logprobs.get("top_logprobs") or []],
        "text": choice.get("text", ""),
        "finish_reason": choice.get("finish_reason"),
    }


def record(
    node: NodeConfig, client: ApiClient, builder: PromptBuilder, max_model_len: int | None = None
) -> dict[str, Any]:
    """Every probe's greedy output on this node; `max_model_len` (a recording's) sizes the longest prompt."""
    limit = max_model_len or node.max_model_len
    return {
        "model": node.model_name,
        "profile": node.profile,
        "hardware_class": nodefacts.node_hardware_class(node),
        "max_model_len": limit,
        "max_tokens": MAX_TOKENS,
        "top": TOP,
        "server": server_versions(client).get("server", {}),
        "outputs": {p.name: generate(client, prompt_ids(p, builder, limit)) for p in PROBES},
    }


def _continuation(tokens: list[str], start: int) -> str:
    """The tokens from a position on, as the server spelled them (the first eight): a token's text
    alone cannot be joined back into the reply (byte pieces, word markers), a list shows each."""
    shown = tokens[start : start + 8]
    return repr(shown)[:-1] + (", ...]" if len(tokens) > start + 8 else "]")


@dataclass
class Comparison:
    """The findings (changed outputs) and the notes (near ties that ended a prompt's comparison)."""

    changed: list[str] = field(default_factory=list)
    near_ties: list[str] = field(default_factory=list)


def compare(golden: dict[str, Any], current: dict[str, Any]) -> Comparison:
    """Each probe's current output against the recording, as the module docstring says."""
    result = Comparison()
    for name, want in golden["outputs"].items():
        got = current["outputs"].get(name)
        if got is None:
            result.changed.append(f"{name}: not generated now")
            continue
        if got["prompt_sha256"] != want["prompt_sha256"]:
            result.changed.append(
                f"{name}: its prompt is other ids than recorded ({got['prompt_tokens']} vs {want['prompt_tokens']}"
                " ids): the tokenizer changed (the tokenizer golden names how)"
            )
            continue
        _compare_tokens(name, want, got, result)
    return result


def _differs(name: str, i: int, recorded: list[str], now: list[str]) -> str:
    was, now_text = _continuation(recorded, i), _continuation(now, i)
    return f"{name}: greedy output differs from token {i}: recorded {was}, now {now_text}"


def _compare_tokens(name: str, want: dict[str, Any], got: dict[str, Any], result: Comparison) -> None:
    a, b = want["tokens"], got["tokens"]
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x == y:
            continue
        if x in got["top"][i] and y in want["top"][i]:
            result.near_ties.append(f"{name}: near tie at token {i} ({x!r} / {y!r}), compared up to there")
            return
        result.changed.append(_differs(name, i, a, b))
        return
    if len(a) != len(b):
        i = min(len(a), len(b))
        finish = f" (finish: recorded {want.get('finish_reason')}, now {got.get('finish_reason')})"
        result.changed.append(_differs(name, i, a, b) + finish)


def recording_path(root: Path, node: NodeConfig) -> Path:
    """Where the recording of this node's model, profile and hardware class lives under smoke_tests/outputs/."""
    return root / node.model_name / f"{node.profile}-{nodefacts.node_hardware_class(node)}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="glmdeploy-outputs",
        description="Record the node's greedy outputs to the fixed prompt set (make output-lock), or compare them.",
    )
    parser.add_argument("action", choices=["record", "compare"])
    parser.add_argument("--node-config", default=None, help="the node's node.json (default: the deployed node's)")
    parser.add_argument("--out", type=Path, help="record: where to write the recording")
    parser.add_argument("--golden", type=Path, help="compare: the recording to compare with")
    args = parser.parse_args(argv)
    node = NodeConfig.load(args.node_config)
    client = ApiClient.for_node(node, timeout_s=600)
    builder = PromptBuilder.from_tokenizer(load_tokenizer(node.model_dir, node.trust_remote_code))
    if args.action == "record":
        if not args.out:
            parser.error("record needs --out")
        recording = record(node, client, builder)
        args.out.write_text(json.dumps(recording, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(
            f"recorded {len(recording['outputs'])} greedy outputs of {node.model_name} ({node.profile}, "
            f"{recording['hardware_class']}) in {args.out}"
        )
        return 0
    if not args.golden:
        parser.error("compare needs --golden")
    golden = json.loads(args.golden.read_text(encoding="utf-8"))
    found = compare(golden, record(node, client, builder, golden["max_model_len"]))
    for line in found.changed + found.near_ties:
        print(line)
    return 1 if found.changed else 0


if __name__ == "__main__":
    sys.exit(main())
