"""Start vLLM 0.4.3's real OpenAI server on the kit's arguments with the stand-in executor, and check it.

    PYTHONPATH=service python3 tests/rehearsal/run_rehearsal.py \
        --venv /var/cache/glmdeploy/rehearsal-venv --model /tmp/rehearsal-model \
        --chat-template /tmp/rehearsal-chatglm3.jinja --report /tmp/rehearsal-report.json

The venv must have the stand-in installed (install_standin.py). The launcher arguments are the
ones roles/vllm_server renders for the gpu-cu121 profile: served name, loopback host, port,
float16, 32k context, remote code, the sizing's `vllm_args` for the GPU class (computed by the
venv's own Python, like the role does), --disable-log-requests, and --chat-template. Every request
goes to 127.0.0.1. Exit status 0 when every check passed; the JSON report lists each check, each
observation (behaviour worth knowing that is not a pass/fail) and the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

SERVICE = Path(__file__).resolve().parents[2] / "service"
if str(SERVICE) not in sys.path:  # run as `python3 tests/rehearsal/run_rehearsal.py` from a checkout
    sys.path.insert(0, str(SERVICE))
from glmdeploy.api import sse  # noqa: E402  (stdlib only: any python3 runs it)
from glmdeploy_control import registry  # noqa: E402  (stdlib only too)

HOST = "127.0.0.1"
SERVED = "chatglm3-6b-32k"
STOP_IDS = [2, 64795, 64797]
#: [gMASK] sop <|user|> "▁" "\n" 100 200 <|assistant|>: a chat prompt as the kit builds it, as ids.
PROMPT_IDS = [64790, 64792, 64795, 30910, 13, 100, 200, 64796]
ENGINE_LINE = re.compile(r"Initializing an LLM engine \(v0\.4\.3\) with config: .*dtype=torch\.float16")
BANNER = "glmdeploy rehearsal: GPU executor replaced by the stand-in (no model math)"


#: The registry's GPU classes as a JSON file (what a node has in its node.json), for the sizing
#: and the stand-in, which run outside a deployed node here.
CLASSES_FILE = Path(os.environ.get("TMPDIR", "/tmp")) / "glmdeploy-rehearsal-gpu-classes.json"


def tp_args(tensor_parallel: int) -> list[str]:
    """The sizing's arguments: the class table, the context length and the parallelism."""
    kit = registry.load()
    CLASSES_FILE.write_text(json.dumps(kit.to_dict()["kit"]["gpu_classes"]))
    max_model_len = kit.profile(kit.kit.auto.gpu).runtime.max_model_len  # type: ignore[union-attr]
    return [
        "--classes",
        str(CLASSES_FILE),
        "--max-model-len",
        str(max_model_len),
        "--tensor-parallel",
        str(tensor_parallel),
    ]


def sizing_show(venv: Path, gpu_class: str, tensor_parallel: int) -> subprocess.CompletedProcess[str]:
    """`python -m glmdeploy.serving.sizing show CLASS --json` with the venv's Python, as roles/vllm_server runs it."""
    command = ["-m", "glmdeploy.serving.sizing", "show", gpu_class, "--json", *tp_args(tensor_parallel)]
    return subprocess.run(
        [str(venv / "bin/python"), *command],
        capture_output=True,
        text=True,
        env={**os.environ, "GLMDEPLOY_REHEARSAL_STANDIN": "0", "PYTHONPATH": str(SERVICE)},
    )


def sizing_args(venv: Path, gpu_class: str, tensor_parallel: int) -> list[str]:
    out = sizing_show(venv, gpu_class, tensor_parallel)
    out.check_returncode()
    return list(json.loads(out.stdout)["vllm_args"])


def launch_args(
    venv: Path, gpu_class: str, port: int, chat_template: str | None, tensor_parallel: int = 1
) -> list[str]:
    args = ["--served-model-name", SERVED, "--host", HOST, "--port", str(port), "--dtype", "float16"]
    args += ["--max-model-len", "32768", "--trust-remote-code"]
    args += sizing_args(venv, gpu_class, tensor_parallel)
    args += ["--disable-log-requests"]
    if chat_template is not None:
        args += ["--chat-template", chat_template]
    return args


def server_env(scratch: Path, gpu_class: str) -> dict[str, str]:
    """The unit's offline environment (roles/vllm_server defaults), with every cache under scratch."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM")}
    cache = scratch / "cache"
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HOME=str(scratch),
        HF_HOME=str(cache / "huggingface"),
        VLLM_CACHE_ROOT=str(cache / "vllm"),
        XDG_CACHE_HOME=str(cache),
        TMPDIR=str(scratch / "tmp"),
        GLMDEPLOY_REHEARSAL_GPU_CLASS=gpu_class,
        GLMDEPLOY_REHEARSAL_CLASSES=str(CLASSES_FILE),
        # The launcher's PYTHONPATH is the release's app dir: the kit's code, glmdeploy.serving.sizing included.
        PYTHONPATH=str(SERVICE),
    )
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    return env


class Server:
    def __init__(self, venv: Path, model: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.port = int(args[args.index("--port") + 1])
        self.headers = {"Authorization": f"Bearer {env['VLLM_API_KEY']}"} if env.get("VLLM_API_KEY") else {}
        self.log = log
        self._out = log.open("wb")
        cmd = [str(venv / "bin/python"), "-m", "vllm.entrypoints.openai.api_server", "--model", model, *args]
        self.started = time.monotonic()
        # Own process group: stopping the server stops whatever it forked, and nothing else.
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)

    def url(self, path: str) -> str:
        return f"http://{HOST}:{self.port}{path}"

    def wait_healthy(self, timeout: float) -> float:
        while time.monotonic() - self.started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before /health; see {self.log}")
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - self.started
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        raise RuntimeError(f"no /health within {timeout} s; see {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._out.close()

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.url(path), data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **self.headers}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                raw = r.read().decode()
                status = r.status
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read().decode() or "null")
        if body.get("stream"):
            # The kit's one SSE decoder: an error event or a stream without [DONE] raises
            # (sse.StreamError, naming the server's message), and main() records it as a failure.
            return status, list(sse.iter_json([raw]))
        return status, json.loads(raw)

    def get(self, path: str, auth: bool = True) -> tuple[int, Any]:
        req = urllib.request.Request(self.url(path), headers=self.headers if auth else {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read().decode() or "null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read().decode() or "null")


class Report:
    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []
        self.observations: list[dict[str, Any]] = []
        self.timings: dict[str, float] = {}

    def check(self, name: str, ok: bool, detail: Any) -> None:
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'} {name}: {json.dumps(detail, ensure_ascii=False)[:400]}", flush=True)

    def observe(self, name: str, detail: Any) -> None:
        self.observations.append({"observation": name, "detail": detail})
        print(f"NOTE {name}: {json.dumps(detail, ensure_ascii=False)[:400]}", flush=True)

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks)


def run_requests(server: Server, report: Report) -> None:
    if server.headers:
        status, body = server.get("/v1/models", auth=False)
        report.check("VLLM_API_KEY set: /v1/models without the key is 401", status == 401, body)
        status, _ = server.get("/health", auth=False)
        report.observe("VLLM_API_KEY set: /health without the key", status)
    status, models = server.get("/v1/models")
    report.check("GET /v1/models lists the served name", SERVED in [m["id"] for m in models["data"]], models)

    base = {"model": SERVED, "prompt": PROMPT_IDS, "max_tokens": 8, "temperature": 0.0, "stop_token_ids": STOP_IDS}
    forced = {**base, "logit_bias": {"2": 100}}
    for stream in (False, True):
        label = "stream" if stream else "non-stream"
        status, out = server.post("/v1/completions", {**forced, "stream": stream})
        if stream:
            finish = [c["choices"][0]["finish_reason"] for c in out if c.get("choices")]
            text = "".join(c["choices"][0]["text"] for c in out if c.get("choices"))
            usage = next((c["usage"] for c in reversed(out) if c.get("usage")), None)
            report.check(
                f"completion, logit_bias eos 2 forced, {label}: finish_reason stop",
                status == 200 and finish[-1:] == ["stop"] and (usage or {}).get("completion_tokens", 9) <= 1,
                {"status": status, "finish_reasons": finish, "text": text, "usage": usage},
            )
        else:
            choice = out["choices"][0]
            report.check(
                f"completion, logit_bias eos 2 forced, {label}: finish_reason stop",
                status == 200 and choice["finish_reason"] == "stop" and out["usage"]["completion_tokens"] <= 1,
                {"status": status, "finish_reason": choice["finish_reason"], "usage": out["usage"]},
            )
        status, out = server.post("/v1/completions", {**base, "stream": stream, "logprobs": 0})
        if stream:
            finish = [c["choices"][0]["finish_reason"] for c in out if c.get("choices")]
            tokens = [t for c in out if c.get("choices") for t in (c["choices"][0].get("logprobs") or {})["tokens"]]
            text = "".join(c["choices"][0]["text"] for c in out if c.get("choices"))
            usage = next((c["usage"] for c in reversed(out) if c.get("usage")), None)
            chunks = len([c for c in out if c.get("choices")])
        else:
            choice = out["choices"][0]
            finish, tokens, text, usage, chunks = [choice["finish_reason"]], choice["logprobs"]["tokens"], None, None, 1
            text, usage = choice["text"], out["usage"]
        report.check(
            f"completion without bias, {label}: finish_reason length, 8 varied tokens, 8 prompt tokens",
            status == 200
            and finish[-1] == "length"
            and len(tokens) == 8
            and len(set(tokens)) >= 6
            and (usage or {}).get("prompt_tokens") == len(PROMPT_IDS)
            and (usage or {}).get("completion_tokens") == 8,
            {"status": status, "finish": finish[-1], "tokens": tokens, "text": text, "usage": usage, "chunks": chunks},
        )
        report.timings.setdefault("text", {})[label] = text  # type: ignore[index]

    same = report.timings["text"]["stream"] == report.timings["text"]["non-stream"]  # type: ignore[index]
    report.check("streamed and non-streamed replies are the same ids (deterministic stand-in)", same, None)
    del report.timings["text"]

    chat = {"model": SERVED, "messages": [{"role": "user", "content": "你好"}], "max_tokens": 16}
    chat["stop_token_ids"] = STOP_IDS
    status, out = server.post("/v1/chat/completions", chat)
    msg = out["choices"][0]["message"]["content"] if status == 200 else None
    report.check(
        "chat completion, non-stream: text and finish_reason length",
        status == 200 and bool(msg and msg.strip()) and out["choices"][0]["finish_reason"] == "length",
        {"status": status, "content": msg, "usage": out.get("usage") if status == 200 else out},
    )
    if status == 200:
        # The chat prompt's length tells which template built it: the kit's ChatGLM3 one gives
        # [gMASK] sop <|user|> + the content + <|assistant|>.
        report.observe("chat prompt tokens (usage.prompt_tokens) for one user message '你好'", out["usage"])
    status, out = server.post("/v1/chat/completions", {**chat, "stream": True})
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in out if c.get("choices")] if status == 200 else []
    report.check(
        "chat completion, stream: several chunks with text",
        status == 200 and len(pieces) >= 5 and "".join(pieces).strip() != "",
        {"status": status, "chunks": len(pieces), "text": "".join(pieces)},
    )

    # Behaviour the kit must know (the audit's table), recorded, not judged here.
    status, out = server.post("/v1/completions", {**base, "return_token_ids": True})
    report.observe("completion with return_token_ids: true", {"status": status, "body": out})
    status, out = server.post("/v1/completions", {**base, "stream": True, "stream_options": {"include_usage": True}})
    report.observe("completion with stream_options", {"status": status, "body": out if status != 200 else "200"})
    status, out = server.post("/v1/completions", {**base, "prompt": [1] * 32769})
    report.observe("completion with a 32,769-id prompt (over --max-model-len)", {"status": status, "body": out})


def log_checks(log: Path, report: Report, gpu_blocks: int | None) -> None:
    text = log.read_text(errors="replace")
    engine = next((line for line in text.splitlines() if ENGINE_LINE.search(line)), None)
    report.check("engine start line with dtype=torch.float16", engine is not None, engine)
    report.check("stand-in banner in the server log", BANNER in text, None)
    blocks = re.search(r"# GPU blocks: (\d+), # CPU blocks: (\d+)", text)
    detail = blocks.group(0) if blocks else None
    ok = blocks is not None and (gpu_blocks is None or int(blocks.group(1)) == gpu_blocks)
    report.check(f"'# GPU blocks' line (expected {gpu_blocks})", ok, detail)
    selected = re.search(r"vLLM selected (\w+)", text)
    report.observe("executor vLLM selected", selected.group(1) if selected else None)
    errors = [line for line in text.splitlines() if re.search(r"\b(ERROR|Traceback)\b", line)]
    report.check("no ERROR or traceback in the server log", not errors, errors[:10])


def expected_blocks(venv: Path, gpu_class: str, tensor_parallel: int) -> int | None:
    """What the kit's sizing predicts per GPU of the class, in vLLM's 16-token blocks."""
    out = sizing_show(venv, gpu_class, tensor_parallel)
    return json.loads(out.stdout)["kv_cache_tokens"] // 16 if out.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, required=True)
    parser.add_argument("--model", required=True, help="model directory (python -m fixture_model --full-size)")
    parser.add_argument("--chat-template", help="template file passed as --chat-template (omit: none passed)")
    parser.add_argument("--gpu-class", default="rtx-4090")
    parser.add_argument("--tensor-parallel", type=int, default=1, help="passed to the sizing, as the role does")
    parser.add_argument("--extra-arg", action="append", default=[], help="one more launcher argument (repeatable)")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/rehearsal-scratch"))
    parser.add_argument("--log", type=Path, default=Path("/tmp/rehearsal-server.log"))
    parser.add_argument("--report", type=Path, help="write the JSON report here")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for /health")
    parser.add_argument("--log-prompts", action="store_true", help="the stand-in logs each prompt's first 64 ids")
    parser.add_argument("--api-key", help="start the server with VLLM_API_KEY (as the unit does beyond loopback)")
    args = parser.parse_args(argv)

    report = Report()
    vllm_args = launch_args(args.venv, args.gpu_class, args.port, args.chat_template, args.tensor_parallel)
    vllm_args += args.extra_arg
    report.observe("launcher arguments", ["--model", args.model, *vllm_args])
    env = server_env(args.scratch, args.gpu_class)
    if args.log_prompts:
        env["GLMDEPLOY_REHEARSAL_LOG_PROMPTS"] = "1"
    if args.api_key:
        env["VLLM_API_KEY"] = args.api_key
    server = Server(args.venv, args.model, vllm_args, env, args.log)
    try:
        report.timings["start_to_health_s"] = round(server.wait_healthy(args.timeout), 1)
        t0 = time.monotonic()
        run_requests(server, report)
        report.timings["requests_s"] = round(time.monotonic() - t0, 1)
    except Exception as exc:
        report.check("server started and answered", False, f"{type(exc).__name__}: {exc}")
    finally:
        server.stop()
    log_checks(args.log, report, expected_blocks(args.venv, args.gpu_class, args.tensor_parallel))
    result = {
        "ok": report.ok,
        "checks": report.checks,
        "observations": report.observations,
        "timings": report.timings,
    }
    if args.report:
        args.report.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"==> {sum(c['ok'] for c in report.checks)}/{len(report.checks)} checks passed; log {args.log}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
