#!/usr/bin/env bash
# The rate sweep of this machine's deployed node, against the same engine taking one request at a
# time, in one run: bench/cpu/<date>/ gets both sweeps, their plots, the comparison and the
# one-at-a-time server's cold start. Run from the checkout after `make deploy` (cpu profile).
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() {
  cat <<'EOF'
usage: bench/cpu/sweep.sh [OUT_DIR]

Sweeps request rates on this machine's deployed node (make bench), then starts a second server
from the same release, model and arguments but --max-num-seqs 1 (one request at a time, the
naive deployment) on port ONE_PORT, measures its cold start (launch to first generated token),
sweeps it the same way, stops it, and prints `glmdeploy.bench compare` of the two.

  OUT_DIR       where the results go (default: bench/cpu/YYYY-MM-DD)
  RATES         offered rates, req/s (default 0.25,0.5,1,2,4)
  PASS_SECONDS  seconds of arrivals per pass (default 20)
  REPEATS       passes per rate (default 3)
  INPUT_LEN / OUTPUT_LEN   tokens (default 128 / 64)
  ONE_PORT      the one-at-a-time server's port (default 8010)

The deployed server keeps running (idle) while the second one is measured.
EOF
}
case "${1:-}" in -h|--help) usage; exit 0 ;; esac

OUT=${1:-bench/cpu/$(date -u +%F)}
RATES=${RATES:-0.25,0.5,1,2,4}
PASS_SECONDS=${PASS_SECONDS:-20}
REPEATS=${REPEATS:-3}
INPUT_LEN=${INPUT_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-64}
ONE_PORT=${ONE_PORT:-8010}
NODE=/etc/glmdeploy/node.json
REL=/opt/glmdeploy/current
PY=.venv/tools/bin/python

[ -r "$NODE" ] && [ -x "$REL/bin/vllm_server" ] ||
  { echo "error: no deployed node here ($NODE, $REL/bin/vllm_server): run make deploy first" >&2; exit 2; }
[ -x "$PY" ] || { echo "error: $PY is missing: run make tools" >&2; exit 2; }
mkdir -p "$OUT"
sweep_args=(--rates "$RATES" --pass-seconds "$PASS_SECONDS" --repeats "$REPEATS"
  --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN")

echo "==> [1/3] the deployed node: make bench ${sweep_args[*]}"
"$PY" -m glmdeploy.bench sweep --node-config "$NODE" --label "deployed node" \
  --json "$OUT/sweep-node.json" --plots "$OUT/node" "${sweep_args[@]}" | tee "$OUT/sweep-node.txt"

# The release's own launch arguments: the last line of its launcher, with the port moved and one
# sequence at a time (the arguments are plain words: the cpu profile's launcher quotes none); the
# environment and user of the running server process (its caches, thread settings).
read -r -a launch <<<"$(tail -1 "$REL/bin/vllm_server" | sed "s/--port [0-9]*/--port $ONE_PORT/")"
model=$(readlink -f "$REL/model")
pid=$(pgrep -f "vllm.entrypoints.openai.api_server --model $model" | head -1 || true)
[ -n "$pid" ] || { echo "error: the deployed server's process is not running" >&2; exit 2; }
mapfile -d '' envs < "/proc/$pid/environ"
user=$(stat -c %U "/proc/$pid")  # as the service user: the caches it writes stay the service's
served=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['served_model_name'])" "$NODE")

echo "==> [2/3] one request at a time: $REL/venv/bin/python -m vllm.entrypoints.openai.api_server ... ${launch[*]} --max-num-seqs 1"
start=$(date +%s.%N)
setpriv --reuid "$user" --regid "$(id -g "$user")" --init-groups env -i "${envs[@]}" "$REL/venv/bin/python" -m vllm.entrypoints.openai.api_server --model "$model" \
  --tokenizer "$REL/tokenizer" "${launch[@]}" --max-num-seqs 1 > "$OUT/server-one-seq.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
# Cold start: launch to the first generated token (the readiness check's one-token request).
"$PY" - "$ONE_PORT" "$served" "$start" "$server" <<'EOF' | tee "$OUT/cold-start-one-seq.txt"
import json, os, sys, time, urllib.request
port, served, start, pid = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
body = json.dumps({"model": served, "prompt": [64790, 64792, 30910], "max_tokens": 1}).encode()
deadline = time.time() + 600
while time.time() < deadline:
    if not os.path.exists(f"/proc/{pid}"):
        sys.exit("error: the one-at-a-time server exited; see its log")
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            if json.load(resp)["choices"]:
                print(f"cold start (launch to first generated token): {time.time() - start:.1f} s")
                break
    except OSError:
        pass
    time.sleep(0.5)
else:
    sys.exit("error: the one-at-a-time server did not generate within 600 s")
EOF
"$PY" -m glmdeploy.bench sweep --url "http://127.0.0.1:$ONE_PORT/v1" --model "$served" --label "one request at a time" \
  --json "$OUT/sweep-one-seq.json" --plots "$OUT/one-seq" "${sweep_args[@]}" | tee "$OUT/sweep-one-seq.txt"
kill "$server"; wait "$server" 2>/dev/null || true; trap - EXIT

echo "==> [3/3] compare"
"$PY" -m glmdeploy.bench compare "$OUT/sweep-node.json" "$OUT/sweep-one-seq.json" --json "$OUT/compare.json" |
  tee "$OUT/compare.txt"
