"""Tokenizer golden lock: record what a model's tokenizer does once, then catch any drift.

Why: the classic break after an upgrade is silent: the serving stack moves to a
new transformers/tokenizers release and the same text now maps to different
ids, so the model sees different input and answers worse, with no error. A
golden file per model revision records the tokenizer's file hashes, its size,
every special token's id and the ids of a fixed probe set; every check
compares against it and names the probe that changed. `vocab_size` and
`len(tokenizer)` are two facts: ChatGLM3's class gives 64798 and 64796.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from glmdeploy.manifest import file_sha256
from glmdeploy.model import chatglm3
from glmdeploy.model.prompt import PromptBuilder, load_tokenizer

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "tokenization_chatglm.py",
)

#: Fixed probe texts: each exercises a part of the tokenizer that upgrades have broken.
PROBES: dict[str, str] = {
    "chinese": "晚上睡不着应该怎么办",
    "english": "The quick brown fox jumps over the lazy dog.",
    "code": "def add(a, b):\n    return a + b  # sum\n",
    "emoji": "部署成功 🎉🚀 ok",
    "whitespace_runs": "a  b   c\t\td\n\n\ne    ",
    "role_lookalikes": "<|user|> <|assistant|> [gMASK]sop <|observation|>",
    "mixed": "GPU显存24GB, batch=64, 吞吐 8871 tok/s",
}

#: Chats built the way the kit sends prompts (role markers as ids). `one_turn` is
#: the published ChatGLM3 example: [gMASK] sop <|user|> "\n" 你好 <|assistant|>.
CHAT_PROBES: dict[str, list[dict[str, str]]] = {
    "one_turn": [{"role": "user", "content": "你好"}],
    "multi_turn": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "你好"},
        {"role": "assistant", "content": "你好！有什么可以帮你？"},  # noqa: RUF001 (Chinese punctuation on purpose)
        {"role": "user", "content": "Write <|user|> as plain text."},
    ],
}


def record(model_dir: str | Path, trust_remote_code: bool = False) -> dict[str, Any]:
    """Everything the golden file holds, read from the tokenizer as this Python environment loads it."""
    model_dir = Path(model_dir)
    tokenizer = load_tokenizer(str(model_dir), trust_remote_code)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    builder = PromptBuilder.from_tokenizer(tokenizer)
    return {
        "files": {name: file_sha256(model_dir / name) for name in TOKENIZER_FILES if (model_dir / name).exists()},
        "vocab_size": tokenizer.vocab_size,
        "len_tokenizer": len(tokenizer),
        "embedding_rows": config.get("padded_vocab_size"),
        "special_ids": {tok: tokenizer.convert_tokens_to_ids(tok) for tok in chatglm3.SPECIAL_TOKENS},
        "eos_id": tokenizer.eos_token_id,
        "pad_id": tokenizer.pad_token_id,
        "probes": {name: tokenizer.encode(text) for name, text in PROBES.items()},
        "chats": {name: builder.chat_ids(messages) for name, messages in CHAT_PROBES.items()},
    }


def compare(golden: dict[str, Any], current: dict[str, Any], label: str = "current") -> list[str]:
    """One readable line per difference; keys absent from the golden file are not checked.

    The golden file for the real model starts with only the published facts
    (special ids, two sequences); a first real deployment records the rest.
    """
    diffs = []
    for key in ("vocab_size", "len_tokenizer", "embedding_rows", "eos_id", "pad_id"):
        if key in golden and golden[key] != current.get(key):
            diffs.append(f"{key}: golden {golden[key]}, {label} {current.get(key)}")
    for section in ("special_ids", "probes", "chats", "files"):
        for name, want in golden.get(section, {}).items():
            got = current.get(section, {}).get(name)
            if got != want:
                diffs.append(f"{section}[{name}]: golden {_short(want)}, {label} {_short(got)}")
    return diffs


def dumps(record: dict[str, Any]) -> str:
    """JSON with one line per entry, so a re-recorded golden file diffs by probe in review."""
    lines = ["{"]
    keys = sorted(record)
    for i, key in enumerate(keys):
        value, comma = record[key], "," if i < len(keys) - 1 else ""
        if isinstance(value, dict) and value:
            inner = [
                f"    {json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
                for k, v in sorted(value.items())
            ]
            lines.append(f"  {json.dumps(key)}: {{\n" + ",\n".join(inner) + f"\n  }}{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{comma}")
    return "\n".join(lines) + "\n}\n"


def _short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 160 else text[:157] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy.model.golden", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    rec = sub.add_parser("record", help="print (or write) the golden record of a model directory's tokenizer")
    rec.add_argument("model_dir", type=Path)
    rec.add_argument("--output", type=Path, help="write here instead of stdout")
    chk = sub.add_parser("check", help="compare a model directory's tokenizer with a golden file")
    chk.add_argument("model_dir", type=Path)
    chk.add_argument("golden", type=Path)
    for p in (rec, chk):
        p.add_argument(
            "--trust-remote-code",
            action=argparse.BooleanOptionalAction,
            default=False,
            help="the tokenizer is the model's own code (ChatGLM3's is); transformers refuses it otherwise",
        )
    args = parser.parse_args(argv)
    try:
        current = record(args.model_dir, args.trust_remote_code)
    except ImportError as exc:
        # The model's own tokenizer file imports what it needs (the published ChatGLM3-6B-32k one: torch).
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(
            f"error: the tokenizer code of {args.model_dir} cannot be loaded by {sys.executable}: {first}; "
            "fix: use the reference environment (`rm -rf .venv/tokenizer-ref && make tokenizer-lock` rebuilds it, "
            "with the CPU torch it needs)",
            file=sys.stderr,
        )
        return 2
    if args.action == "record":
        text = dumps(current)
        if args.output:
            args.output.write_text(text, encoding="utf-8")
            print(f"wrote {args.output}")
        else:
            sys.stdout.write(text)
        return 0
    diffs = compare(json.loads(args.golden.read_text(encoding="utf-8")), current)
    for line in diffs:
        print(f"DRIFT {line}", file=sys.stderr)
    if diffs:
        print(
            f"fix: the tokenizer differs from {args.golden}; if the change is intended, re-record it with "
            "`make tokenizer-lock`",
            file=sys.stderr,
        )
        return 1
    print(f"{args.model_dir}: tokenizer matches {args.golden}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
