"""The gpu-cu121 path rehearsed on vLLM 0.4.3's own code, in a mixed fleet deployed from this GPU-less machine.

Two fresh test hosts (tests/hosts/hostctl.py): testhost1 set to the cpu profile, testhost2 set to
gpu-cu121 in the inventory. `make deploy` gives each its own profile: testhost2 gets the real
gpu-cu121 environment (vLLM 0.4.3, torch 2.3.0+cu121, transformers 4.40.2) from its wheelhouse
through the kit's own roles, the real-shaped fixture at ChatGLM3-6B-32k's full sizes
(`make rehearsal-model`), the launcher the kit renders for the rtx-4090 class, and the kit's own
unit. One piece is replaced: vLLM's GPU executor, by the stand-in in tests/rehearsal/ (installed
into the node's environment by a systemd drop-in before each start; no model math). So this proves
the API, config, tokenizer, template and flag plumbing of the production path, not the model math
(docs/rehearsal.md). Runs after test_fleet.py (file order): its hosts are gone by then.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import FIGURES, ROOT, make

sys.path.insert(0, str(ROOT / "tests" / "hosts"))
import hostctl

STATE = hostctl.STATE
KEY = STATE / "id_ed25519"
CPU, GPU = "testhost1", "testhost2"
STANDIN = "/opt/glmdeploy-rehearsal"
DROPIN = f"""# glmdeploy rehearsal (tests/e2e/test_rehearsal.py): vLLM's GPU executor replaced by a stand-in.
[Service]
ExecStartPre=+/usr/bin/python3 {STANDIN}/install_standin.py --venv /opt/glmdeploy/current/venv
Environment=GLMDEPLOY_REHEARSAL_GPU_CLASS=rtx-4090 GLMDEPLOY_REHEARSAL_LOG_PROMPTS=1
"""
REASON = "gpu-cu121 rehearsal on a test host, the GPU executor of vLLM is a stand-in (docs/rehearsal.md)"


def on_host(host: str, command: str) -> subprocess.CompletedProcess[str]:
    return hostctl.ssh(host, KEY, command)


def put_standin(host: str) -> None:
    """The stand-in's files and the unit drop-in that installs them, before the kit's first deploy."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("install_standin.py", "standin_hook.py", "standin_executor.py"):
            tar.add(ROOT / "tests" / "rehearsal" / name, arcname=name)
    dropin = "/etc/systemd/system/glmdeploy-vllm_server.service.d"
    command = (
        f"mkdir -p {STANDIN} {dropin} && tar -x -C {STANDIN} && cat > {dropin}/rehearsal.conf <<'EOF'\n{DROPIN}EOF"
    )
    ssh = ["ssh", "-i", str(KEY), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    out = subprocess.run([*ssh, "-o", "LogLevel=ERROR", f"root@{hostctl.host_ip(host)}", command], input=buf.getvalue())
    assert out.returncode == 0, f"could not place the stand-in on {host}"


def write_inventory() -> Path:
    base = (STATE / "inventory.ini").read_text().split("[glmdeploy_lb]")[0]
    nodes = re.sub(
        rf"^({CPU} .*)$",
        r"\1 glmdeploy_profile=cpu",
        re.sub(
            rf"^({GPU} .*)$",
            rf"\1 glmdeploy_profile=gpu-cu121 vllm_server_gpu_class=rtx-4090 model_name=chatglm3-rehearsal"
            rf" preflight_require_gpu=false nvidia_driver_gpu_present=false python_env_pack=false"
            rf" vllm_server_extra_env={{}} smoke_gpu_absent_reason='{REASON}'",
            base,
            flags=re.M,
        ),
        flags=re.M,
    )
    inventory = STATE / "rehearsal.ini"
    inventory.write_text(nodes)
    return inventory


@pytest.fixture(scope="module")
def mixed():
    assert make("rehearsal-model").returncode == 0, "make rehearsal-model failed"
    created = make("hosts", "N=2")
    assert created.returncode == 0, "make hosts failed"
    timings: dict[str, float] = {}
    try:
        put_standin(GPU)
        yield {"inventory": write_inventory(), "timings": timings}
    finally:
        FIGURES["gpu-cu121 rehearsal, mixed fleet (s)"] = timings
        make("hosts-down")


def node_json(host: str) -> dict:
    out = on_host(host, "cat /etc/glmdeploy/node.json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def journal(host: str) -> str:
    return on_host(host, "journalctl -u glmdeploy-vllm_server -o cat --no-pager").stdout


def test_mixed_fleet_deploys_each_host_with_its_own_profile(mixed):
    proc = make("deploy", f"INVENTORY={mixed['inventory']}", timeout=2700)
    mixed["timings"]["deploy_s"] = round(proc.elapsed, 1)
    assert proc.returncode == 0, "make deploy of the mixed fleet failed"
    assert proc.stdout.count("smoke:  ") == 2
    assert node_json(CPU)["profile"] == "cpu" and node_json(GPU)["profile"] == "gpu-cu121"
    assert node_json(GPU)["server_returns_token_ids"] is False


def test_rehearsal_node_runs_vllm_043_on_the_kits_rtx_4090_launcher(mixed):
    launcher = on_host(GPU, "cat /opt/glmdeploy/current/bin/vllm_server").stdout
    for flag in ("--trust-remote-code", "--disable-log-requests", "--tokenizer", "--enable-prefix-caching"):
        assert flag in launcher, f"{flag} missing from the launcher:\n{launcher}"
    assert "--chat-template" not in launcher and "--max-num-batched-tokens 32768" in launcher
    log = journal(GPU)
    assert "glmdeploy rehearsal: GPU executor replaced by the stand-in" in log
    start = re.search(r"Initializing an LLM engine \(v0\.4\.3\) with config: .*", log)
    assert start and "dtype=torch.float16" in start.group(0) and "max_seq_len=32768" in start.group(0), log[-3000:]
    assert re.search(r"# GPU blocks: 13656\b", log), "the stand-in's KV cache is not the sizing table's rtx-4090 row"


def test_rehearsal_smoke_suite_passes_and_says_why_gpu_checks_skip(mixed):
    report = json.loads((ROOT / "reports" / "smoke" / GPU / "smoke.json").read_text())
    assert report["counts"]["failed"] == 0, [r for r in report["results"] if r["outcome"] == "failed"]
    skipped = [r for r in report["results"] if r["outcome"] == "skipped"]
    assert skipped and all(
        "no GPU on this node, on purpose" in r.get("reason", "") or "baseline" in r.get("reason", "") for r in skipped
    ), skipped
    assert report["counts"]["passed"] >= 15


OPENAI_CHAT = """
import json, sys
from openai import OpenAI
node = json.load(open('/etc/glmdeploy/node.json'))
client = OpenAI(base_url=node['api_url'], api_key=node['api_key'] or 'none')
messages = json.loads(sys.argv[1])
reply = client.chat.completions.create(model=node['served_model_name'], messages=messages, max_tokens=4)
sys.path.insert(0, '/opt/glmdeploy/current/app')
from glmdeploy.prompt import PromptBuilder, load_tokenizer
want = PromptBuilder.from_tokenizer(load_tokenizer(node['model_dir'], True)).chat_ids(messages)
print(json.dumps({'prompt_tokens': reply.usage.prompt_tokens, 'want': want, 'text': reply.choices[0].message.content}))
"""


@pytest.mark.parametrize("host", [CPU, GPU])
def test_openai_client_chat_runs_chatglm3_role_ids_and_keeps_typed_markers_as_text(mixed, host):
    messages = [{"role": "user", "content": "Type <|user|> and <|assistant|> literally."}]
    out = on_host(
        host,
        f"cd /tmp && HF_HUB_OFFLINE=1 /opt/glmdeploy/current/venv/bin/python - '{json.dumps(messages)}' "
        f"<<'PY'\n{OPENAI_CHAT}\nPY",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    want = result["want"]
    assert [i for i in want if i >= 64789] == [64790, 64792, 64795, 64796], want
    assert result["prompt_tokens"] == len(want)
    if host == GPU:  # the stand-in logs the ids the engine got: the exact sequence, not only its length
        logged = re.findall(r"glmdeploy rehearsal: prompt of \S+: (\d+) ids (\[[^\]]*\])", journal(GPU))
        assert any(json.loads(ids) == want[:64] and int(n) == len(want) for n, ids in logged), (want, logged[-3:])


def test_verify_prints_both_profiles_side_by_side(mixed):
    proc = make("verify", f"INVENTORY={mixed['inventory']}", timeout=900)
    mixed["timings"]["verify_s"] = round(proc.elapsed, 1)
    assert proc.returncode == 0, "make verify failed on the mixed fleet"
    assert f"| field | {CPU} | {GPU} |" in proc.stdout
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| profile |"))
    assert "cpu" in row and "gpu-cu121" in row, row


TP2_PARSE = """
import shlex, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.openai.cli_args import make_arg_parser
text = open('/opt/glmdeploy/current/bin/vllm_server').read()
words = shlex.split(text.split('vllm.entrypoints.openai.api_server', 1)[1].replace('\\\\\\n', ' '))
paths = {'$M': '/opt/glmdeploy/current/model', '$R/tokenizer': '/opt/glmdeploy/current/tokenizer'}
args = make_arg_parser().parse_args([paths.get(w, w) for w in words] + sys.argv[1:])
config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
print(config.parallel_config.tensor_parallel_size, config.parallel_config.distributed_executor_backend)
"""


def test_tensor_parallel_2_launcher_parses_on_vllm_043(mixed):
    """The kit's TP 2 arguments (glmdeploy.sizing) through 0.4.3's own parser and engine config."""
    sizing = on_host(
        GPU,
        "PYTHONPATH=/opt/glmdeploy/current/app /opt/glmdeploy/current/venv/bin/python -m glmdeploy.sizing "
        "show rtx-4090 --tensor-parallel 2 --json",
    )
    tp_args = " ".join(json.loads(sizing.stdout)["vllm_args"])
    out = on_host(
        GPU,
        f"cd /tmp && GLMDEPLOY_REHEARSAL_STANDIN=0 /opt/glmdeploy/current/venv/bin/python - {tp_args} "
        f"<<'PY'\n{TP2_PARSE}\nPY",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["2", "mp"], out.stdout
