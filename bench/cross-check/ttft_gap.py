"""Where the TTFT gap between the kit's bench and `vllm bench serve` comes from (2026-12-04-ttft-gap.txt).

The same workload (128 in / 32 out, Poisson 2 req/s, 30 requests) through three clients, alternating,
N rounds: the kit's client sending ids (as make bench does), the kit's client sending the same prompts
as text (as vLLM's client does: the server then tokenizes them), and vLLM's client.

    HF_HUB_OFFLINE=1 /opt/glmdeploy/current/venv/bin/python bench/cross-check/ttft_gap.py [ROUNDS]

Runs in the deployed node's environment (vLLM, transformers and the kit's package are there).
"""
import json, subprocess, sys, os, statistics
from pathlib import Path
from transformers import AutoTokenizer
from glmdeploy import bench
from glmdeploy.client import ApiClient
from glmdeploy.config import NodeConfig

node = NodeConfig.load("/etc/glmdeploy/node.json")
client = ApiClient.for_node(node)
tok = AutoTokenizer.from_pretrained("/opt/glmdeploy/current/tokenizer", trust_remote_code=True)
orig = bench.level_bodies

def text_bodies(client, prompts, output_len):
    bodies = orig(client, prompts, output_len)
    for b, p in zip(bodies, prompts):
        b["prompt"] = tok.decode(p)
    return bodies

def ours(mode):
    bench.level_bodies = text_bodies if mode == "text" else orig
    lv = bench.run_sweep(client, [2.0], 128, 32, 30, 1, {"ttft": 1000.0})[0]
    return lv.output_tokens_per_s, lv.ttft_ms["p50"], lv.tpot_ms["p50"]

BENCH_SERVE = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)
def theirs(run):
    cmd = [sys.executable, "-c", BENCH_SERVE, "--backend", "openai", "--base-url", "http://127.0.0.1:8000",
           "--endpoint", "/v1/completions", "--model", node.model_dir, "--served-model-name", node.served_model_name,
           "--tokenizer", node.model_dir, "--trust-remote-code", "--dataset-name", "random",
           "--random-input-len", "128", "--random-output-len", "32", "--num-prompts", "30", "--request-rate", "2",
           "--seed", "20261201", "--ignore-eos", "--temperature", "0", "--save-result", "--result-dir", "/tmp",
           "--result-filename", f"xv-{run}.json"]
    subprocess.run(cmd, env=dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1"), capture_output=True, check=True)
    d = json.loads(Path(f"/tmp/xv-{run}.json").read_text())
    return d["output_throughput"], d["median_ttft_ms"], d["median_tpot_ms"]

rows = []
for run in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
    for name, fn in (("ids", lambda: ours("ids")), ("text", lambda: ours("text")), ("vllm", lambda: theirs(run))):
        r = fn(); rows.append((name, *r)); print(name, [round(x, 2) for x in r], flush=True)
for name in ("ids", "text", "vllm"):
    vals = [r for r in rows if r[0] == name]
    print("median", name, [round(statistics.median(v[i] for v in vals), 2) for i in (1, 2, 3)])
