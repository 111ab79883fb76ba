#!/usr/bin/env bash
# The kit's GPU checks and benchmarks on the project's H200 machine (no network there).
#
# What runs there is NOT the gpu-cu121 lock (vLLM 0.4.3 / torch 2.3.0 cannot run on that image):
# it is vLLM 0.26.0 on the machine's own torch 2.11.0+cu130, serving the ChatGLM3-6B-32k
# architecture with random weights (`python -m fixture_model --full-size`, tests/support/, vLLM
# `--load-format dummy`), started with the settings glmdeploy.serving.sizing derives for the H200,
# and measured through HTTP with the kit's own client (glmdeploy.tools.bench) and smoke suite.
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
#   tests/gpu/h200.sh rehearsal-weights DEST   (with stage1's call) the kit's rehearsal model made
#                              ON this machine as the control node makes it: the fixture in the
#                              published revision's shape (seven .bin pickles, the 2023-10-26
#                              tokenizer file), staged by `make weights`'s module into DEST
#                              (checked, converted to safetensors, SHA256SUMS), and its manifest
#                              compared with the control node's (bench/h200/weights/control-node-SHA256SUMS)
#   tests/gpu/h200.sh staged MODEL_DIR   (after stage1) serve a model directory staged by
#                              `make weights` with its REAL weights (no --load-format dummy) on the
#                              kit's settings and served tokenizer: first as staged, then with
#                              tests/gpu/compat (transformers >= 4.45 vs the 2023 tokenizer's _pad);
#                              each time one generation via the kit's ids path checked against a
#                              plain-torch forward of the weights (tests/gpu/staged_probe.py) and
#                              the smoke suite; then a copy missing one tensor, to see whether vLLM
#                              refuses it (0.26 does not). One tar in $OUT (staged.tar), rewritten
#                              after each phase.
#   tests/gpu/h200.sh params MODEL_DIR   (after stage1 + rehearsal-weights) every parameter of vLLM's
#                              loaded model compared bit for bit with the staged checkpoint
#                              (tests/gpu/staged_params.py), then the same for the copy missing one
#                              tensor: vLLM 0.26's own "not initialized" check does not cover
#                              linear/embedding weights (bench/h200/README.md, 2026-12-02 staged).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-/tmp/out}
SITE=/tmp/glmdeploy-site
STASH=/tmp/glmdeploy-stash
MODEL=$PWD/.gpu/chatglm3-6b-32k-architecture
MODEL_NAME=chatglm3-fixture   # node.json's model_name: the golden file the model's tokenizer matches
NODE_PROFILE=h200-architecture
LOAD_ARGS="--load-format dummy"   # random weights; `staged` loads the model directory's own
export PYTHONPATH=$SITE:$PWD/service:$PWD/tests/support
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

node_json() {  # the node config the smoke suite, the bench and the sizing read (the GPU classes: the registry's, as a node's plan gives them)
  cat > "$NODE" <<EOF
{"api_url": "http://127.0.0.1:8000/v1", "served_model_name": "chatglm3-6b-32k", "model_dir": "$MODEL",
 "model_name": "$MODEL_NAME", "server_returns_token_ids": true,
 "profile": "$NODE_PROFILE", "dtype": "float16", "max_model_len": 32768, "trust_remote_code": true,
 "gpu": {"min_driver": "530.30.02", "min_memory_mib": 22500, "classes": $(python3 -m glmdeploy_control.registry get kit.gpu_classes)},
 "service_unit": "none", "service_log_file": "$1", "api_key": "", "ui_url": ""}
EOF
}

start_server() {  # $1: label; the rest: extra vLLM arguments
  local label=$1; shift
  local log=$OUT/server-$label.log
  node_json "$log"
  [ "$TOKENIZER_MODE" != served ] || [ -f "$TOKDIR/tokenizer_config.json" ] || served_tokenizer || return 1
  local tok; tok=$(tokenizer_args) || return 1
  echo "==> [$label] vllm serve ($TOKENIZER_MODE tokenizer) $MODEL ${LOAD_ARGS:-(weights from the checkpoint)}: $tok $*"
  local t0=$SECONDS
  # `python -m vllm.entrypoints.openai.api_server` (the kit's launcher) parses --api-server-count
  # and ignores it (its __main__ always runs one server); `vllm serve` (cli/serve.py) honours it.
  local entry=(-m vllm.entrypoints.openai.api_server) servers=1 a prev=""
  for a in "$@"; do [ "$prev" != --api-server-count ] || { entry=(-m vllm.entrypoints.cli.main serve); servers=$a; }; prev=$a; done
  echo "==> [$label] python3 ${entry[*]} (API servers: $servers)"
  # The kit's service marks (glmdeploy.serving.procguard): the soak and the prober find and measure the
  # server's processes by them, as on a node the launcher sets them.
  GLMDEPLOY_SERVICE=vllm_server GLMDEPLOY_SERVICE_RUN=$label \
  python3 "${entry[@]}" --model "$MODEL" --served-model-name chatglm3-6b-32k \
    $LOAD_ARGS --dtype float16 --max-model-len 32768 --host 127.0.0.1 --port 8000 \
    --trust-remote-code $tok "$@" > "$log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 "${START_WAIT:-300}"); do
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
  echo "==> [$label] not ready after ${START_WAIT:-300} s"; tail -40 "$log"; return 1
}

kit_args() {  # the settings glmdeploy.serving.sizing derives for this node's GPU, as vLLM arguments ($@: sizing options)
  [ -f "$NODE" ] || node_json /dev/null
  python3 -m glmdeploy.serving.sizing detect --node-json "$NODE" --json "$@" | python3 -c "import json,sys; print(' '.join(json.load(sys.stdin)['vllm_args']))"
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
  python3 -m glmdeploy.tools.bench run --node-config "$NODE" --label "$label" --json "$OUT/bench-$label.json" "$@"
}

missing_one() {  # $1: a staged model dir; a copy (symlinks) with one tensor taken out of its shard, index unchanged
  local neg=/tmp/glmdeploy-models/$(basename "$1")-missing-one; rm -rf "$neg"; mkdir -p "$neg"
  for f in "$1"/*; do ln -s "$f" "$neg/"; done
  python3 - "$1" "$neg" <<'PY'
import json, os, sys
from safetensors.torch import load_file, save_file
src, neg = sys.argv[1:]
name = "transformer.encoder.layers.13.self_attention.dense.weight"
shard = json.load(open(f"{src}/model.safetensors.index.json"))["weight_map"][name]
t = load_file(f"{src}/{shard}"); del t[name]
os.unlink(f"{neg}/{shard}"); save_file(t, f"{neg}/{shard}", metadata={"format": "pt"})
print(f"negative control: {name} removed from {shard} (index still names it)")
PY
  echo "$neg"
}

ensure_vllm() {  # the wheels and vLLM in $SITE (once per machine), the release's tokenizer
  cp .gpu/vllm.tar.xz.part* "$STASH"/ 2>/dev/null
  [ -d "$SITE/fastapi" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" .whl/*.whl || return 1
  [ -d "$SITE/vllm" ] || { cat "$STASH"/vllm.tar.xz.part* | xz -d -T0 | tar -C "$SITE" -xf - || return 1; }
  served_tokenizer || return 1
}

versions() {  # $1: file
  { python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nproc | sed 's/^/cpus /'; date -u +"%Y-%m-%dT%H:%M:%SZ"; } 2>&1 | tee "$1"
}

results_dir() {  # $1: name; sets RES (work) and TAR (in $OUT, rewritten by keep after each step)
  RES=/tmp/$1-$(date -u +%H%M%S); mkdir -p "$RES"; OUT_FINAL=$OUT; OUT=$RES; TAR=$OUT_FINAL/$1.tar
}
keep() { (cd "$RES" && gzip -f server-*.log 2>/dev/null; tar -cf "$TAR" .); }

monitor_start() {  # the kit's GPU exporter and prober on this GPU, and a scrape of both and vLLM every 5 s
  python3 -m glmdeploy.monitoring.gpu_exporter --port 9812 --node device-h200 > "$RES/exporter.log" 2>&1 & EXPORTER=$!
  python3 -m glmdeploy.monitoring.prober --config "$NODE" --port 9813 --interval 5 --kit-root "$SITE" > "$RES/prober.log" 2>&1 & PROBER=$!
  python3 - "$RES/monitor.jsonl" <<'PY' & SCRAPER=$!
import json, sys, time, urllib.request
KEEP = ("glmdeploy_", "vllm:num_requests", "vllm:kv_cache_usage", "vllm:gpu_cache_usage", "vllm:num_preemptions")
with open(sys.argv[1], "a") as out:
    while True:
        row = {"t": round(time.time(), 1)}
        for name, port in (("exporter", 9812), ("prober", 9813), ("vllm", 8000)):
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read().decode()
                row[name] = [l for l in text.splitlines() if l.startswith(KEEP)]
            except Exception as e:
                row[name] = f"unreachable: {e}"
        out.write(json.dumps(row) + "\n"); out.flush()
        time.sleep(5)
PY
}
monitor_stop() { kill $EXPORTER $PROBER $SCRAPER 2>/dev/null; wait $EXPORTER $PROBER $SCRAPER 2>/dev/null; }

sweep() {  # $1: result name; the rest: glmdeploy.tools.bench sweep arguments
  local name=$1; shift
  python3 -m glmdeploy.tools.bench sweep --node-config "$NODE" --label "$name" --json "$RES/$name.json" "$@" 2>&1 | tail -12
}

config_args() {  # $1: a configuration name -> vLLM arguments
  case "$1" in
  kit) kit_args ;;                            # sizing's h200 row (with --api-server-count 4 on vLLM >= 0.26)
  default) echo "" ;;                         # the engine's own defaults
  asc[0-9]*) echo "--api-server-count ${1#asc}" ;;   # defaults + N API-server processes, nothing else
  kit-noasc) kit_args | python3 -c "import sys; a=sys.stdin.read().split(); i=a.index('--api-server-count'); print(' '.join(a[:i]+a[i+2:]))" ;;
  *) echo "unknown configuration $1" >&2; return 1 ;;
  esac
}

node_json /dev/null   # every stage's sizing reads the GPU classes from it; servers rewrite it with their log
case "${1:-}" in
stage1)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
  cp .gpu/vllm.tar.xz.part* "$STASH"/
  nvidia-smi --query-gpu=name,driver_version,memory.total,persistence_mode,ecc.mode.current --format=csv | tee "$OUT/gpu.txt"
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
  node_json /dev/null
  python3 -m glmdeploy.serving.sizing detect --node-json "$NODE" --json | tee "$OUT/sizing.json"
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
  python3 -m glmdeploy.tools.bench multiturn --node-config "$NODE" --json "$OUT/multiturn-kit.json"
  stop_server
  ;;
baseline)  # the smoke suite's throughput baseline for this class, then the smoke check against it
  cp .gpu/vllm.tar.xz.part* "$STASH"/ 2>/dev/null
  [ -d "$SITE/vllm" ] || { cat "$STASH"/vllm.tar.xz.part* | xz -d -T0 | tar -C "$SITE" -xf - || exit 1; }
  start_server kit $(kit_args) || exit 1
  python3 -m glmdeploy.tools.bench baseline --node-config "$NODE" --label "tests/gpu/h200.sh baseline" --out "$OUT/baseline.json"
  cls=$(python3 -c "import json; d=json.load(open('$OUT/baseline.json')); print(d['profile'] + '-' + d['hardware_class'])")
  cp "$OUT/baseline.json" "smoke_tests/baselines/$cls.json"
  GLMDEPLOY_NODE_CONFIG=$NODE python3 -m pytest -q -rs -p no:cacheprovider smoke_tests/test_throughput.py 2>&1 | tee "$OUT/smoke-throughput.txt"
  stop_server
  ;;
tp2)  # tensor parallel across both GPUs of an nvidia-h200-x2 machine (after stage1 there)
  cp .gpu/vllm.tar.xz.part* "$STASH"/ 2>/dev/null
  [ -d "$SITE/vllm" ] || { cat "$STASH"/vllm.tar.xz.part* | xz -d -T0 | tar -C "$SITE" -xf - || exit 1; }
  python3 -m glmdeploy.serving.sizing detect --node-json "$NODE" --tensor-parallel 2 --json | tee "$OUT/sizing-tp2.json"
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
rehearsal-weights)  # the rehearsal model made here as the control node makes it (`make rehearsal-source`, `make weights`)
  dest=${2:?usage: $0 rehearsal-weights DEST}
  src=/tmp/glmdeploy-published/$(basename "$dest")
  python3 -c "import sentencepiece, google.protobuf, numpy, safetensors, torch, huggingface_hub as h; print('sentencepiece', sentencepiece.__version__, 'protobuf', google.protobuf.__version__, 'numpy', numpy.__version__, 'safetensors', safetensors.__version__, 'torch', torch.__version__, 'huggingface_hub', h.__version__)" 2>&1 | tee "$OUT/weights-staging.txt"
  rm -rf "$src" "$dest" /tmp/glmdeploy-staging
  t0=$SECONDS
  { echo "\$ python3 -m fixture_model --shape published --kv-geometry $src"
    python3 -m fixture_model --shape published --kv-geometry "$src" || exit 1
    ls -l "$src"
    echo "\$ python3 -m glmdeploy_control.weights --revision c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00 --from $src --dest $dest --work /tmp/glmdeploy-staging"
    python3 -m glmdeploy_control.weights --revision c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00 --from "$src" --dest "$dest" --work /tmp/glmdeploy-staging || exit 1
    ls -l "$dest"; echo "(source + staging: $((SECONDS - t0)) s)"
  } 2>&1 | tee -a "$OUT/weights-staging.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
  # The control node's staged manifest (artifacts/models/chatglm3-rehearsal/SHA256SUMS, copied into bench/h200/weights/)
  # and SOURCE.json, whose only machine-specific field is the source directory's path.
  if diff <(grep -v ' SOURCE.json$' bench/h200/weights/control-node-SHA256SUMS | sort -k2) \
          <(grep -v ' SOURCE.json$' "$dest/SHA256SUMS" | sort -k2) > "$OUT/weights-sha256-diff.txt"; then
    echo "==> every staged file but SOURCE.json has the control node's SHA256 ($(grep -vc ' SOURCE.json$' "$dest/SHA256SUMS") files)" | tee -a "$OUT/weights-staging.txt"
  else
    echo "==> staged files differ from the control node's (weights-sha256-diff.txt)" | tee -a "$OUT/weights-staging.txt"
  fi
  python3 - bench/h200/weights/control-node-SOURCE.json "$dest/SOURCE.json" <<'PY' 2>&1 | tee -a "$OUT/weights-staging.txt"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
pa, pb = a.pop("source", None), b.pop("source", None)
print("==> SOURCE.json", "same as the control node's" if a == b else "DIFFERS from the control node's", f"apart from the source path ({pa} / {pb})")
PY
  (cd "$dest" && sha256sum -c --quiet SHA256SUMS && echo "==> sha256sum -c SHA256SUMS: all OK") 2>&1 | tee -a "$OUT/weights-staging.txt"
  ;;
staged)  # a model directory staged by `make weights`, served with its real weights (after stage1)
  MODEL=$(cd "${2:?usage: $0 staged MODEL_DIR}" && pwd) || exit 1
  MODEL_NAME=$(basename "$MODEL") NODE_PROFILE=h200-staged LOAD_ARGS=""
  TOKDIR=/tmp/glmdeploy-release-staged/tokenizer
  RES=/tmp/staged-$(date -u +%H%M%S); mkdir -p "$RES"; OUT_FINAL=$OUT; OUT=$RES
  keep() { (cd "$RES" && tar -cf "$OUT_FINAL/staged.tar" .); }
  cp .gpu/vllm.tar.xz.part* "$STASH"/ 2>/dev/null
  [ -d "$SITE/fastapi" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" .whl/*.whl || exit 1
  [ -d "$SITE/vllm" ] || { cat "$STASH"/vllm.tar.xz.part* | xz -d -T0 | tar -C "$SITE" -xf - || exit 1; }
  { python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "model $MODEL ($(du -sh "$MODEL" | cut -f1))"; cat "$MODEL/REVISION"
    (cd "$MODEL" && sha256sum -c --quiet SHA256SUMS && echo "SHA256SUMS: all OK")
    grep -n "^import torch\|^FILE_SHAPE" "$MODEL/tokenization_chatglm.py"
  } 2>&1 | tee "$RES/versions.txt"
  served_tokenizer || exit 1
  weights_lines() {  # vLLM's own lines on where the weights came from and what loading took
    grep -iE "load_format|load.format|Loading weights|Loading safetensors|Model loading took|not initialized|weights were|dummy|Starting to load model|ValueError|padding_side|Error" \
      "$RES/server-$1.log" | cut -c1-400 | head -40 | tee "$RES/weights-lines-$1.txt"
  }
  smoke() {  # $1: label
    GLMDEPLOY_NODE_CONFIG=$NODE SMOKE_JSON=$RES/smoke-$1.json timeout 180 python3 -m pytest -q -rs -p no:cacheprovider \
      smoke_tests --junitxml "$RES/smoke-$1.xml" 2>&1 | tee "$RES/smoke-$1.txt" | tail -40
  }
  probe() {  # $1: label
    timeout 180 python3 tests/gpu/staged_probe.py --node "$NODE" --json "$RES/probe-$1.json" 2>&1 | tee "$RES/probe-$1.txt" | tail -c 4000
  }
  args=$(kit_args); echo "==> kit settings: $args" | tee -a "$RES/versions.txt"
  # 1. The model directory exactly as staged, on this stack's transformers.
  # shellcheck disable=SC2086
  if start_server staged-asis $args; then
    weights_lines staged-asis; probe staged-asis; smoke staged-asis; stop_server
  else
    weights_lines staged-asis; stop_server
  fi
  cp "$NODE" "$RES/node.json"; keep
  # 2. The same, with the padding_side shim (tests/gpu/compat/sitecustomize.py) in every process.
  export PYTHONPATH=$PWD/tests/gpu/compat:$PYTHONPATH
  # shellcheck disable=SC2086
  if start_server staged $args; then
    weights_lines staged; probe staged; smoke staged; stop_server
  else
    weights_lines staged; stop_server
  fi
  keep
  # 3. Negative control: the same directory with one tensor taken out of its shard (index unchanged):
  #    does vLLM's loader refuse to start ("not initialized from checkpoint")? vLLM 0.26 does not (see `params`).
  neg=$(missing_one "$MODEL" | tee "$RES/negative.txt" | tail -1)
  MODEL=$neg
  # shellcheck disable=SC2086
  if START_WAIT=150 start_server staged-missing-one $args; then
    echo "==> vLLM served a checkpoint missing a tensor (its own check did not catch it)" | tee -a "$RES/negative.txt"; stop_server
  else
    echo "==> vLLM refused the checkpoint missing a tensor" | tee -a "$RES/negative.txt"; stop_server
  fi
  weights_lines staged-missing-one
  keep; ls -la "$RES"
  ;;
params)  # (after stage1) every parameter vLLM loaded vs the staged checkpoint, bit for bit; then the negative control
  MODEL=$(cd "${2:?usage: $0 params MODEL_DIR}" && pwd) || exit 1
  cp .gpu/vllm.tar.xz.part* "$STASH"/ 2>/dev/null
  [ -d "$SITE/vllm" ] || { cat "$STASH"/vllm.tar.xz.part* | xz -d -T0 | tar -C "$SITE" -xf - || exit 1; }
  neg=$(missing_one "$MODEL" | tee "$OUT/negative.txt" | tail -1)
  for d in "$MODEL" "$neg"; do
    b=$(basename "$d")
    echo "==> python3 tests/gpu/staged_params.py $d $MODEL"
    timeout 240 python3 tests/gpu/staged_params.py "$d" "$MODEL" "$OUT/params-$b.json" > "$OUT/params-$b.log" 2>&1; echo "rc $?"
    grep -E "Loading weights took|Model loading took|not initialized|Error|^\{" "$OUT/params-$b.log" | cut -c1-1500 | tail -8
  done
  ;;
settle)  # (after stage1) kit vs defaults, settled: per CONFIG a fresh server, 512 in / 256 out; the
         # exporter and the prober watch the GPU and the server the whole time. CONFIG is NAME or
         # NAME:PARTS, PARTS a +-joined subset of streams (16/64/256 streams, 3 passes each), rates
         # (a Poisson rate sweep with goodput, 3 passes of 10 s per rate) and soak (the kit's soak,
         # SOAK_DURATION, on the same server afterwards); default streams+rates. One tar in $OUT.
  shift
  [ $# -gt 0 ] || { echo "settle: name the configurations (kit default asc4 kit-noasc, NAME:streams+rates+soak)" >&2; exit 2; }
  results_dir "settle-$(echo "$*" | tr ' :+' '_--')"
  ensure_vllm || exit 1
  versions "$RES/versions.txt"
  node_json "$RES/server-none.log"; cp "$NODE" "$RES/node.json"
  monitor_start
  for spec in "$@"; do
    cfg=${spec%%:*}; parts=+${spec#*:}+; [ "$spec" != "$cfg" ] || parts=+streams+rates+
    args=$(config_args "$cfg") || continue
    echo "==> [$cfg] parts ${parts//+/ }; vLLM arguments: ${args:-none, the engine defaults}" | tee -a "$RES/configs.txt"
    # shellcheck disable=SC2086
    start_server "$cfg" $args || { keep; continue; }
    grep -iE "KV cache|max_num_seqs|max_num_batched_tokens|api_server_count|prefix" "$RES/server-$cfg.log" | cut -c1-300 | head -8 >> "$RES/configs.txt"
    if [[ $parts == *+streams+* ]]; then
      for c in 16 64 256; do
        sweep "$cfg-c$c" --rates inf --max-concurrency "$c" --requests $((c < 64 ? 64 : 2 * c)) --repeats 3 \
          --input-len 512 --output-len 256
        keep
      done
    fi
    if [[ $parts == *+rates+* ]]; then
      sweep "$cfg-rates" --rates "${SETTLE_RATES:-40,55,70}" --pass-seconds "${SETTLE_PASS_SECONDS:-10}" --repeats 3 \
        --input-len 512 --output-len 256 --slo-ttft-ms 1000 --slo-tpot-ms 50 --plots "$RES/plots-$cfg"
      keep
    fi
    if [[ $parts == *+soak+* ]]; then
      python3 -m glmdeploy.tools.soak run --node-config "$NODE" --duration "${SOAK_DURATION:-6m}" --window 30s \
        --concurrency "${SOAK_CONCURRENCY:-64}" --json "$RES/soak-$cfg.json" 2>&1 | tail -30 | tee "$RES/soak-$cfg.txt"
      keep
    fi
    stop_server
    keep
  done
  monitor_stop; keep
  python3 tests/gpu/settle_table.py "$RES" | tee "$RES/table.txt"; keep
  ls -la "$OUT_FINAL"
  ;;
card24)  # (after stage1) a 24 GB card emulated: the engine's memory budget cut to an RTX 4090's at the
         # kit's setting, the rtx-4090 row's settings; vLLM's KV cache against the sizing formula, a
         # 32k-token prompt end to end, and the concurrency where the cache runs out.
  results_dir card24
  ensure_vllm || exit 1
  versions "$RES/versions.txt"
  python3 -m glmdeploy.serving.sizing show rtx-4090 --node-json "$NODE" --json > "$RES/sizing-rtx-4090.json"
  # The budget vLLM plans with is gpu_memory_utilization x the card's total memory: the 4090 row's
  # 0.90 x 23.99 GiB; here the same bytes are that budget over the H200's total.
  args=$(python3 tests/gpu/card24_args.py "$RES/sizing-rtx-4090.json" 2> "$RES/arithmetic.txt") || exit 1
  cat "$RES/arithmetic.txt"
  echo "==> [card24] vLLM arguments: $args" | tee -a "$RES/arithmetic.txt"
  # shellcheck disable=SC2086
  start_server card24 $args || { keep; exit 1; }
  grep -iE "KV cache|Available|memory|CUDA graph|max_num" "$RES/server-card24.log" | cut -c1-300 | head -20 | tee "$RES/kv.txt"
  keep
  sweep card24-32k --input-len 32000 --output-len 64 --rates inf --max-concurrency 1 --requests 2 --repeats 1; keep
  sweep card24-32k-x8 --input-len 32000 --output-len 64 --rates inf --max-concurrency 8 --requests 8 --repeats 1; keep
  for c in 32 64; do
    sweep "card24-4k-c$c" --input-len 4096 --output-len 256 --rates inf --max-concurrency "$c" --requests $((2 * c)) --repeats 1; keep
  done
  stop_server; keep
  ls -la "$OUT_FINAL"
  ;;
stage3)
  start_server default || exit 1
  bench default --input-lens 512 --output-lens 256 --concurrency 1,64
  stop_server
  start_server no-prefix-cache --no-enable-prefix-caching || exit 1
  python3 -m glmdeploy.tools.bench multiturn --node-config "$NODE" --json "$OUT/multiturn-noprefix.json"
  stop_server
  start_server naive --max-num-seqs 1 || exit 1
  bench naive --input-lens 512 --output-lens 256 --concurrency 64 --requests 64
  stop_server
  ;;
*)
  echo "usage: $0 stage1|stage2|stage2b|stage3|served|baseline|tp2|frontend CONFIG...|settle CONFIG...|card24|rehearsal-weights DEST|staged MODEL_DIR|params MODEL_DIR" >&2; exit 2 ;;
esac
