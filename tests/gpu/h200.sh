#!/usr/bin/env bash
# The kit's GPU checks and benchmarks on the project's H200 machine (no network there).
#
# What runs there is NOT the gpu-cu121 lock (vLLM 0.4.3 / torch 2.3.0 cannot run on that image):
# it is vLLM 0.26.0 on the machine's own torch 2.11.0+cu130, serving the ChatGLM3-6B-32k
# architecture with random weights (`python -m glmdeploy_control.fixture --full-size`, vLLM
# `--load-format dummy`), started with the settings glmdeploy.sizing derives for the H200,
# and measured through HTTP with the kit's own client (glmdeploy.bench) and smoke suite.
#
# Carried from the control node (see tests/gpu/README.md for how they are made):
#   .whl/                      vLLM's missing pure-Python/runtime dependencies (wheels, py3.12)
#   .gpu/vllm.tar.xz.partN     vLLM 0.26.0 with unused kernels removed, in pieces under 64 MiB
#   .gpu/chatglm3-6b-32k-architecture   real-size config + the fixture's tokenizer, no weights
#
# The tokenizer is the kit's production path (roles/vllm_server/tasks/config.yml): a release
# `tokenizer/` directory (tokenization_glmdeploy.py rendered from the role's template, the
# model's tokenizer_config.json with auto_map -> GlmdeployServedTokenizer and the kit's
# chatglm3.jinja as chat_template), given to vLLM as `--tokenizer <dir> --trust-remote-code`,
# no --chat-template. The model's tokenizer is ChatGLM3's slow SentencePiece one (remote code,
# no tokenizer.json). GLMDEPLOY_H200_TOKENIZER=model-chat-template gives the path of the
# 2026-12-01 run instead (the model directory's tokenizer + --chat-template).
#
#   tests/gpu/h200.sh stage1   install the wheels, stash piece 1, NVML smoke checks
#   tests/gpu/h200.sh stage2   assemble vLLM, start the kit-tuned server, smoke suite, bench
#   tests/gpu/h200.sh stage3   engine defaults, prefix caching off, one request at a time
#   tests/gpu/h200.sh tp2      (nvidia-h200-x2, after stage1) tensor parallel 2 with the kit's TP sizing
#   tests/gpu/h200.sh baseline the smoke suite's throughput baseline (after stage1)
#   tests/gpu/h200.sh served   (after stage1) kit-tuned server on the served tokenizer: the whole
#                              smoke suite (smoke_tests/), bench 1/4/16/64/256 streams, the
#                              detokenizer's CPU cost (bench/h200/detok_cost.py)
#   tests/gpu/h200.sh frontend CONFIG...   (after stage1) the 256-stream front-end limit: for each
#                              CONFIG a fresh server on the served tokenizer, bench 64 and 256 streams
#                              (512 in / 256 out); CONFIG: kit (sizing's settings, one API server),
#                              kit-ascN (+ --api-server-count N), kit-siN (+ --stream-interval N),
#                              default (engine defaults). One tar per call in $OUT (8-file limit).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-/tmp/out}
SITE=/tmp/glmdeploy-site
STASH=/tmp/glmdeploy-stash
MODEL=$PWD/.gpu/chatglm3-6b-32k-architecture
export PYTHONPATH=$SITE:$PWD/service
NODE=/tmp/node.json
TOKENIZER_MODE=${GLMDEPLOY_H200_TOKENIZER:-served}
TOKDIR=/tmp/glmdeploy-release/tokenizer
mkdir -p "$OUT" "$SITE" "$STASH"

served_tokenizer() {  # the release's tokenizer/ directory, built as roles/vllm_server renders it
  python3 - "$MODEL" "$TOKDIR" <<'PY'
import json, sys
from pathlib import Path
import jinja2
model, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
env = jinja2.Environment(keep_trailing_newline=True)
env.filters["to_json"] = json.dumps  # Ansible's filter; `string` is Jinja's own
template = Path("roles/vllm_server/templates/tokenization_glmdeploy.py.j2").read_text(encoding="utf-8")
(out / "tokenization_glmdeploy.py").write_text(env.from_string(template).render(vllm_server_model_dir=model))
# vllm_server_tokenizer_config: the model's own, auto_map replaced, chat_template added
# (lookup('file') strips trailing whitespace; to_nice_json sorts keys, indents 4).
config = json.loads(Path(model, "tokenizer_config.json").read_text(encoding="utf-8"))
config["auto_map"] = {"AutoTokenizer": ["tokenization_glmdeploy.GlmdeployServedTokenizer", None]}
config["chat_template"] = Path("roles/vllm_server/files/chatglm3.jinja").read_text(encoding="utf-8").rstrip()
(out / "tokenizer_config.json").write_text(json.dumps(config, indent=4, sort_keys=True) + "\n")
print(f"==> served tokenizer in {out}: {sorted(p.name for p in out.iterdir())}")
PY
}

tokenizer_args() {  # the server's tokenizer arguments for TOKENIZER_MODE
  case "$TOKENIZER_MODE" in
  served) echo "--tokenizer $TOKDIR" ;;
  model-chat-template) echo "--chat-template $PWD/roles/vllm_server/files/chatglm3.jinja" ;;
  *) echo "GLMDEPLOY_H200_TOKENIZER: served or model-chat-template, not $TOKENIZER_MODE" >&2; exit 2 ;;
  esac
}

node_json() {  # the node config the smoke suite and the bench read
  cat > "$NODE" <<EOF
{"api_url": "http://127.0.0.1:8000/v1", "served_model_name": "chatglm3-6b-32k", "model_dir": "$MODEL",
 "model_name": "chatglm3-fixture", "server_returns_token_ids": true,
 "profile": "h200-architecture", "dtype": "float16", "max_model_len": 32768, "trust_remote_code": true,
 "gpu": {"min_driver": "530.30.02", "min_memory_mib": 22500},
 "service_unit": "none", "service_log_file": "$1"}
EOF
}

start_server() {  # $1: label; the rest: extra vLLM arguments
  local label=$1; shift
  local log=$OUT/server-$label.log
  node_json "$log"
  [ "$TOKENIZER_MODE" != served ] || [ -f "$TOKDIR/tokenizer_config.json" ] || served_tokenizer || return 1
  local tok; tok=$(tokenizer_args) || return 1
  echo "==> [$label] vllm serve ($TOKENIZER_MODE tokenizer): $tok $*"
  local t0=$SECONDS
  # `python -m vllm.entrypoints.openai.api_server` (the kit's launcher) parses --api-server-count
  # and ignores it (its __main__ always runs one server); `vllm serve` (cli/serve.py) honours it.
  local entry=(-m vllm.entrypoints.openai.api_server) servers=1 a prev=""
  for a in "$@"; do [ "$prev" != --api-server-count ] || { entry=(-m vllm.entrypoints.cli.main serve); servers=$a; }; prev=$a; done
  echo "==> [$label] python3 ${entry[*]} (API servers: $servers)"
  python3 "${entry[@]}" --model "$MODEL" --served-model-name chatglm3-6b-32k \
    --load-format dummy --dtype float16 --max-model-len 32768 --host 127.0.0.1 --port 8000 \
    --trust-remote-code $tok "$@" > "$log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 300); do
    if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; then
      echo "==> [$label] ready after $((SECONDS - t0)) s"
      # Several API servers: /health answers once the first serves; wait (<= 60 s) for the others.
      for _ in $(seq 1 60); do [ "$(grep -c 'Application startup complete' "$log")" -ge "$servers" ] && break; sleep 1; done
      [ "$servers" -eq 1 ] || echo "==> [$label] API servers started: $(grep -c 'Application startup complete' "$log") of $servers, after $((SECONDS - t0)) s"
      return 0
    fi
    if ! kill -0 $SERVER 2>/dev/null; then echo "==> [$label] server died"; tail -40 "$log"; return 1; fi
    sleep 1
  done
  echo "==> [$label] not ready after 300 s"; tail -40 "$log"; return 1
}

kit_args() {  # the settings glmdeploy.sizing derives for this node's GPU, as vLLM arguments ($@: sizing options)
  python3 -m glmdeploy.sizing detect --json "$@" | python3 -c "import json,sys; print(' '.join(json.load(sys.stdin)['vllm_args']))"
}

stop_server() {  # and wait until the GPU is free again (the next server takes 90 % of it)
  kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; sleep 2
  for _ in $(seq 1 30); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && return 0; sleep 1
  done
  echo "==> GPU still held after the server ended: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader)"
}

bench() {  # $1: label; the rest: bench arguments
  local label=$1; shift
  python3 -m glmdeploy.bench run --node-config "$NODE" --label "$label" --json "$OUT/bench-$label.json" "$@"
}

case "${1:-}" in
stage1)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
  cp .gpu/vllm.tar.xz.part* "$STASH"/
  nvidia-smi --query-gpu=name,driver_version,memory.total,persistence_mode,ecc.mode.current --format=csv | tee "$OUT/gpu.txt"
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
  python3 -m glmdeploy.sizing detect --json | tee "$OUT/sizing.json"
  node_json /dev/null
  GLMDEPLOY_NODE_CONFIG=$NODE python3 -m pytest -q -rs -p no:cacheprovider smoke_tests/test_gpu.py 2>&1 | tee "$OUT/smoke-nvml.txt"
  ;;
stage2b)  # the benches of stage2 only (vLLM already unpacked on a warm machine)
  start_server kit $(kit_args) || exit 1
  bench kit --input-lens 512 --output-lens 256 --concurrency 1,4,16,64,256 --plots "$OUT/plots"
  bench kit-long --input-lens 2048,8192,16384 --output-lens 128 --concurrency 1,16 --requests 16
  stop_server
  ;;
stage2)
  cp .gpu/vllm.tar.xz.part* "$STASH"/ 2>/dev/null
  cat "$STASH"/vllm.tar.xz.part* | xz -d -T0 | tar -C "$SITE" -xf - || exit 1
  python3 -c "import vllm; print('vllm', vllm.__version__)"
  start_server kit $(kit_args) || exit 1
  GLMDEPLOY_NODE_CONFIG=$NODE python3 -m pytest -q -rs -p no:cacheprovider smoke_tests/test_gpu.py \
    smoke_tests/test_node.py smoke_tests/test_generation.py --junitxml "$OUT/smoke.xml" 2>&1 | tee "$OUT/smoke.txt"
  bench kit --input-lens 512 --output-lens 256 --concurrency 1,4,16,64,256 --plots "$OUT/plots"
  bench kit-long --input-lens 2048,8192,16384 --output-lens 128 --concurrency 1,16 --requests 16
  python3 -m glmdeploy.bench multiturn --node-config "$NODE" --json "$OUT/multiturn-kit.json"
  stop_server
  ;;
baseline)  # the smoke suite's throughput baseline for this class, then the smoke check against it
  cp .gpu/vllm.tar.xz.part* "$STASH"/ 2>/dev/null
  [ -d "$SITE/vllm" ] || { cat "$STASH"/vllm.tar.xz.part* | xz -d -T0 | tar -C "$SITE" -xf - || exit 1; }
  start_server kit $(kit_args) || exit 1
  python3 -m glmdeploy.bench baseline --node-config "$NODE" --label "tests/gpu/h200.sh baseline" --out "$OUT/baseline.json"
  cls=$(python3 -c "import json; d=json.load(open('$OUT/baseline.json')); print(d['profile'] + '-' + d['hardware_class'])")
  cp "$OUT/baseline.json" "smoke_tests/baselines/$cls.json"
  GLMDEPLOY_NODE_CONFIG=$NODE python3 -m pytest -q -rs -p no:cacheprovider smoke_tests/test_throughput.py 2>&1 | tee "$OUT/smoke-throughput.txt"
  stop_server
  ;;
tp2)  # tensor parallel across both GPUs of an nvidia-h200-x2 machine (after stage1 there)
  cp .gpu/vllm.tar.xz.part* "$STASH"/ 2>/dev/null
  [ -d "$SITE/vllm" ] || { cat "$STASH"/vllm.tar.xz.part* | xz -d -T0 | tar -C "$SITE" -xf - || exit 1; }
  python3 -m glmdeploy.sizing detect --tensor-parallel 2 --json | tee "$OUT/sizing-tp2.json"
  start_server tp2 $(kit_args --tensor-parallel 2) || exit 1
  grep -iE "KV cache|GPU blocks|tensor_parallel_size=" "$OUT/server-tp2.log" | cut -c1-400 | tee "$OUT/kv-tp2.txt"
  GLMDEPLOY_NODE_CONFIG=$NODE python3 -m pytest -q -rs -p no:cacheprovider smoke_tests/test_gpu.py \
    smoke_tests/test_node.py smoke_tests/test_generation.py --junitxml "$OUT/smoke-tp2.xml" 2>&1 | tee "$OUT/smoke-tp2.txt"
  bench tp2 --input-lens 512 --output-lens 256 --concurrency 1,64
  stop_server
  ;;
served)  # the production tokenizer path on the kit-tuned server (2026-12-02; after stage1)
  cp .gpu/vllm.tar.xz.part* "$STASH"/ 2>/dev/null
  [ -d "$SITE/fastapi" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" .whl/*.whl || exit 1
  [ -d "$SITE/vllm" ] || { cat "$STASH"/vllm.tar.xz.part* | xz -d -T0 | tar -C "$SITE" -xf - || exit 1; }
  python3 -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
  served_tokenizer || exit 1
  label=kit-served-tokenizer
  start_server $label $(kit_args) || exit 1
  grep -iE "slow tokenizer|tokenizer=|KV cache|max_num_batched_tokens" "$OUT/server-$label.log" | cut -c1-300 | head -20
  GLMDEPLOY_NODE_CONFIG=$NODE SMOKE_JSON=$OUT/smoke-served-tokenizer.json python3 -m pytest -q -rs -p no:cacheprovider \
    smoke_tests --junitxml "$OUT/smoke-served-tokenizer.xml" 2>&1 | tee "$OUT/smoke-served-tokenizer.txt"
  bench $label --input-lens 512 --output-lens 256 --concurrency 1,4,16,64,256
  stop_server
  python3 bench/h200/detok_cost.py "$MODEL" "$TOKDIR" --json "$OUT/detok-served-tokenizer.json"
  # The same server with no tokenizer in it at all (--skip-tokenizer-init: ids in, ids out, no
  # detokenization), same session: what the HTTP path gives when detokenization costs nothing.
  start_server kit-no-detokenize $(kit_args) --skip-tokenizer-init || exit 1
  bench kit-no-detokenize --input-lens 512 --output-lens 256 --concurrency 1,4,16,64,256
  stop_server
  ;;
frontend)  # the 256-stream front-end limit (issue 19; after stage1): CONFIG... as in the header
  shift
  [ $# -gt 0 ] || { echo "frontend: name the configurations (kit kit-asc4 kit-si4 default ...)" >&2; exit 2; }
  RES=/tmp/frontend-$(date -u +%H%M%S); mkdir -p "$RES"; OUT_FINAL=$OUT; OUT=$RES
  TAR=$OUT_FINAL/frontend-$(echo "$*" | tr ' ' '_').tar
  keep() { (cd "$RES" && gzip -f server-*.log 2>/dev/null; tar -cf "$TAR" .); }  # after each step: survives a timeout
  cp .gpu/vllm.tar.xz.part* "$STASH"/ 2>/dev/null
  [ -d "$SITE/fastapi" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" .whl/*.whl || exit 1
  [ -d "$SITE/vllm" ] || { cat "$STASH"/vllm.tar.xz.part* | xz -d -T0 | tar -C "$SITE" -xf - || exit 1; }
  python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" | tee "$RES/versions.txt"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$RES/versions.txt"
  nproc | sed 's/^/cpus /' | tee -a "$RES/versions.txt"
  served_tokenizer || exit 1
  # The front-end options this vLLM has, from its own --help (in the background, while servers start).
  ( python3 -m vllm.entrypoints.cli.main serve --help=all > "$RES/serve-help.txt" 2>&1
    grep -nE -A3 -- "--api-server-count|--stream-interval|--skip-tokenizer-init|--tokens-only|--disable-log-stats|--disable-uvicorn-access-log" \
      "$RES/serve-help.txt" | cut -c1-200 > "$RES/serve-help-frontend.txt" ) &
  HELP=$!
  # The kit's settings as measured 2026-12-02 (one API server): sizing's arguments without any
  # --api-server-count it may add for this vLLM, so `kit` stays the same configuration.
  base=$(kit_args | python3 -c "import sys; a=sys.stdin.read().split(); i=a.index('--api-server-count') if '--api-server-count' in a else -1; print(' '.join(a[:i] + a[i+2:] if i >= 0 else a))")
  echo "==> kit settings: $base"
  for cfg in "$@"; do
    case "$cfg" in
    kit) args=$base ;;
    kit-asc[0-9]*) args="$base --api-server-count ${cfg#kit-asc}" ;;
    kit-si[0-9]*) args="$base --stream-interval ${cfg#kit-si}" ;;
    default) args="" ;;
    *) echo "frontend: unknown configuration $cfg" >&2; continue ;;
    esac
    # shellcheck disable=SC2086
    start_server "$cfg" $args || { keep; continue; }
    grep -iE "api_server_count|stream_interval|KV cache|Defaulting|disabling stats" "$RES/server-$cfg.log" | cut -c1-300 | head -8
    # Which process is busy while the bench runs: top's second sample (1 s) every ~2 s, full command lines.
    ( while :; do top -b -c -w 200 -n 2 -d 1 | awk '/^top -/{n++} n==2' | head -20 || sleep 2; done ) > "$RES/top-$cfg.txt" 2>&1 & TOP=$!
    # FRONTEND_WARM=1: first 33 requests of other prompts (500 in), so that every API-server process has
    # served before the measured levels, whose prompts are then not in the prefix cache either.
    [ -z "${FRONTEND_WARM:-}" ] || bench "$cfg-warmup" --input-lens 500 --output-lens 256 --concurrency 16
    bench "$cfg" --input-lens 512 --output-lens 256 --concurrency "${FRONTEND_CONCURRENCY:-64,256}"
    kill $TOP 2>/dev/null; wait $TOP 2>/dev/null
    case " ${FRONTEND_TWO_CLIENTS:-} " in *" $cfg "*)
      # Is the client (one Python process, a thread per stream) the limit? Two at once, 128 streams each.
      bench "$cfg-client1of2" --input-lens 512 --output-lens 256 --concurrency 128 & c1=$!
      bench "$cfg-client2of2" --input-lens 512 --output-lens 256 --concurrency 128 & c2=$!
      wait $c1 $c2 ;;
    esac
    stop_server
    keep
  done
  wait $HELP; keep
  python3 - "$RES" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("bench-*.json")):
    d = json.loads(f.read_text())
    for r in d["results"]:
        print(f"{d['label']:28} {r['concurrency']:4} {r['output_tokens_per_s']:10.1f} tok/s  {r['output_tokens_per_s'] / 14345:6.1%} of 14,345"
              f"  TTFT p50 {r['ttft_ms']['p50']:8.1f}  ITL p50/p99 {r['itl_ms']['p50']:6.2f} / {r['itl_ms']['p99']:7.2f} ms  {r['duration_s']} s")
PY
  ls -la "$OUT_FINAL"
  ;;
stage3)
  start_server default || exit 1
  bench default --input-lens 512 --output-lens 256 --concurrency 1,64
  stop_server
  start_server no-prefix-cache --no-enable-prefix-caching || exit 1
  python3 -m glmdeploy.bench multiturn --node-config "$NODE" --json "$OUT/multiturn-noprefix.json"
  stop_server
  start_server naive --max-num-seqs 1 || exit 1
  bench naive --input-lens 512 --output-lens 256 --concurrency 64 --requests 64
  stop_server
  ;;
*)
  echo "usage: $0 stage1|stage2|stage2b|stage3|served|baseline|tp2|frontend CONFIG..." >&2; exit 2 ;;
esac
