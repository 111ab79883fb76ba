#!/bin/sh
# The kit's GPU exporter (service/glmdeploy/monitoring/gpu_exporter.py) on the device machine's real GPU:
# one scrape idle, one while torch multiplies matrices on it. Carried: .whl/mon (nvidia-ml-py and
# prometheus-client at the gpu-cu121 lock's versions, py3-none-any). Output: $OUT/gpu-exporter-*.txt
set -eu
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/mon
python3 -m pip install -q --no-deps --no-index --target /tmp/mon .whl/mon/*.whl
export PYTHONPATH=/tmp/mon:service
{ nvidia-smi --query-gpu=name,driver_version,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,power.limit,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.width.current --format=csv; } > "$OUT/gpu-exporter-nvidia-smi.txt" 2>&1 || true
python3 -m glmdeploy.monitoring.gpu_exporter --port 9812 --node device-h200 > /tmp/exporter.log 2>&1 &
EXPORTER=$!
python3 - <<'PY'
import os, subprocess, threading, time, urllib.request
out = os.environ.get("OUT", "/tmp/out")
def scrape(name):
    for _ in range(50):
        try:
            text = urllib.request.urlopen("http://127.0.0.1:9812/metrics", timeout=5).read().decode()
            break
        except OSError:
            time.sleep(0.2)
    lines = [l for l in text.splitlines() if l.startswith("glmdeploy_")]
    open(f"{out}/gpu-exporter-{name}.txt", "w").write("\n".join(lines) + "\n")
    return lines
t0 = time.perf_counter(); idle = scrape("idle"); print(f"idle scrape: {len(idle)} series in {time.perf_counter()-t0:.3f}s")
import torch
stop = threading.Event()
def load():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(50):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
th = threading.Thread(target=load); th.start(); time.sleep(8)
busy = scrape("busy"); stop.set(); th.join()
for name in ("utilization_ratio", "power_draw_watts", "sm_clock_hertz", "memory_used_bytes", "temperature_celsius"):
    print(name, [l.rsplit(" ", 1)[1] for l in idle if l.startswith("glmdeploy_gpu_" + name + "{")],
          "->", [l.rsplit(" ", 1)[1] for l in busy if l.startswith("glmdeploy_gpu_" + name + "{")])
print("unsupported:", [l for l in busy if l.startswith("glmdeploy_gpu_field_unsupported")])
print("errors:", [l for l in busy if l.startswith("glmdeploy_gpu_field_error")])
PY
kill $EXPORTER
cat /tmp/exporter.log
