"""Wait until the node can really generate, not merely answer /health.

Why: a vLLM server with a broken model (wrong head size on CPU, wrong dtype on
GPU) starts, reports healthy on /health, then fails or emits only token 0 on
every request. Deploy is done only when a real generation returns non-empty
text made of varied token ids.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from glmdeploy.api.client import ApiClient, Completion, ServerError, ServerUnavailable
from glmdeploy.config import NodeConfig
from glmdeploy.model.prompt import PromptBuilder, distinct_ratio, load_tokenizer

# A server that exited this many times since the wait began is crash-looping (its service
# manager restarts it): waiting out the whole timeout would only hide the cause.
CRASHES_TO_GIVE_UP = 2
PROBE = [{"role": "user", "content": "Hello, who are you?"}]
MIN_DISTINCT = 0.2


class LogWatch:
    """Exits of the server since the wait began, and its last output: a crash loop ends the wait.

    Under systemd: the unit's automatic restarts (NRestarts) and its journal. Under the kit's
    supervisord: "exited: <program>" lines in supervisord.log beside the program's log `path`
    (named <program>.log), and that log. The wait starts after the restart returned, so the
    old process's exit is not counted.
    """

    def __init__(self, path: Path | None = None, unit: str | None = None) -> None:
        self.path = path
        self.unit = unit if unit and Path("/run/systemd/system").is_dir() else None
        self.since = math.ceil(time.time())
        self.restarts0 = self._restarts()
        self.supervisor_log = path.parent / "supervisord.log" if path else None
        self.offsets = {p: p.stat().st_size if p and p.is_file() else 0 for p in (path, self.supervisor_log)}

    def _restarts(self) -> int:
        if not self.unit:
            return 0
        argv = ["systemctl", "show", "-p", "NRestarts", "--value", self.unit]
        out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()
        return int(out) if out.isdigit() else 0

    def _new_text(self, path: Path | None) -> str:
        if path is None or not path.is_file():
            return ""
        with path.open("rb") as fh:
            fh.seek(self.offsets[path] if path.stat().st_size >= self.offsets[path] else 0)
            return fh.read()[-200_000:].decode("utf-8", "replace")

    def crashes(self) -> int:
        if self.unit:
            return self._restarts() - self.restarts0
        if self.path is None:
            return 0
        return self._new_text(self.supervisor_log).count(f"exited: {self.path.stem} ")

    def last_error(self) -> str:
        if self.unit:
            argv = ["journalctl", "-u", self.unit, "-o", "cat", "--no-pager", "--since", f"@{self.since}"]
            text = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        else:
            text = self._new_text(self.path)
        lines = [line for line in text.splitlines() if line.strip()]
        # The cause is the last error line (a usage text or a traceback can bury it).
        errors = [line for line in lines if re.search(r"\berror\b|Error\b", line)]
        return "\n".join(([f"last error: {errors[-1].strip()}"] if errors else []) + lines[-10:])

    def where(self) -> str:
        return f"journalctl -u {self.unit}" if self.unit else str(self.path)


def wait_for_health(client: ApiClient, timeout_s: float, log: LogWatch | None = None) -> float:
    start = time.monotonic()
    last = 0.0
    while time.monotonic() - start < timeout_s:
        if client.health():
            return time.monotonic() - start
        crashes = log.crashes() if log is not None else 0
        if log is not None and crashes >= CRASHES_TO_GIVE_UP:
            why = f"exited {crashes} times ({log.where()})"
            raise RuntimeError(f"model server keeps failing to start: {why}:\n{log.last_error()}")
        if time.monotonic() - last > 15:
            print(f"... waiting for {client.base_url} ({time.monotonic() - start:.0f}s)", flush=True)
            last = time.monotonic()
        time.sleep(1)
    raise TimeoutError(f"model server at {client.base_url} did not answer /health within {timeout_s:.0f}s")


def prompt_mismatch(result: Completion, sent: list[int]) -> str | None:
    """Why the server did not run the prompt the kit built, or None when it did.

    Servers that return prompt ids are compared id for id; the others (vLLM 0.4.3)
    by the count they report in `usage.prompt_tokens`, which every server sends:
    a prompt that was re-tokenized from text or padded with a template differs in length.
    """
    if result.prompt_token_ids is not None:
        return None if result.prompt_token_ids == sent else f"served {result.prompt_token_ids}, built {sent}"
    if result.prompt_tokens is None:
        return "the server reported neither prompt ids nor usage.prompt_tokens"
    if result.prompt_tokens != len(sent):
        return f"the server counted {result.prompt_tokens} prompt tokens, the kit built {len(sent)}: {sent}"
    return None


@dataclass
class Generation:
    """One readiness generation and what is wrong with it (nothing, on a node that can serve)."""

    text: str
    token_ids: list[int]
    first_token_s: float | None
    varied: bool
    problems: list[str]


def generate_once(client: ApiClient, builder: PromptBuilder, tokens: int = 24, stream: bool = False) -> Generation:
    """The readiness generation, judged: the kit's prompt run, non-empty text, varied ids.

    Not streamed by default: every server reports usage on a whole reply (streams only on
    some), so the prompt's length is checked everywhere. The prober streams it, for the first
    token's latency; a stream without usage skips only that comparison.
    """
    prompt = builder.chat_ids(PROBE)
    result = client.complete(prompt, max_tokens=tokens, temperature=0.8, ignore_eos=True, stream=stream)
    ids = result.token_ids or builder.text_ids(result.text)
    problems = []
    reported = result.prompt_token_ids is not None or result.prompt_tokens is not None
    mismatch = prompt_mismatch(result, prompt) if reported or not stream else None
    if mismatch:
        problems.append(f"the server did not run the kit's prompt ({mismatch})")
    if not result.text.strip():
        problems.append("generated text is empty")
    varied = distinct_ratio(ids) >= MIN_DISTINCT
    if not varied:
        problems.append(f"generated ids barely vary ({len(set(ids))} distinct of {len(ids)}): {ids[:12]}")
    return Generation(result.text, ids, result.first_token_s, varied, problems)


def check_generation(client: ApiClient, builder: PromptBuilder, tokens: int = 24) -> dict[str, object]:
    generation = generate_once(client, builder, tokens)
    if generation.problems:
        raise RuntimeError("model server is up but cannot generate properly: " + "; ".join(generation.problems))
    return {"text": generation.text, "token_ids": generation.token_ids, "first_token_s": generation.first_token_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy.serving.ready", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="node config (default: $GLMDEPLOY_NODE_CONFIG or /etc/glmdeploy/node.json)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for the server (default 300)")
    parser.add_argument("--log", type=Path, help="server log file: stop early when the server keeps crashing")
    parser.add_argument("--unit", help="the server's systemd unit: its journal, when systemd runs it")
    args = parser.parse_args(argv)
    node = NodeConfig.load(args.config)
    client = ApiClient.for_node(node)
    watch = LogWatch(args.log, args.unit) if args.log or args.unit else None
    try:
        waited = wait_for_health(client, args.timeout, watch)
        builder = PromptBuilder.from_tokenizer(load_tokenizer(node.model_dir, node.trust_remote_code))
        report = check_generation(client, builder)
    except (TimeoutError, RuntimeError, ServerUnavailable, ServerError) as exc:
        print(f"NOT READY: {exc}", file=sys.stderr)
        # Where this node keeps the server's output: the journal under systemd, a file under supervisord.
        where = watch.where() if watch is not None else node.service_log_file or "the server's log"
        print(f"fix: read the server's output ({where}) for the cause", file=sys.stderr)
        return 1
    report["health_after_s"] = round(waited, 1)
    print(json.dumps(report, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
