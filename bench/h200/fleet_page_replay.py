"""The fleet page (roles/monitoring's Prometheus console) with a GPU run's values on it, from the
samples the run recorded: a stand-in of the GPU machine's exporters replays them to a real
Prometheus here, which evaluates the kit's recording rules and renders the kit's console; headless
Chromium takes the screenshot.

Why a replay: the GPU machine has no Prometheus or browser and is lent for minutes; its run
(`tests/gpu/h200.sh settle ...`) scrapes the GPU exporter, the prober and vLLM every 5 s into
`monitor.jsonl`. Here a loopback server answers each job's scrape with the recorded sample of the
matching moment (one recorded sample per 5 s of wall time, from `--from` seconds into the run), so
Prometheus sees the values in the order and at the pace they were taken. What it does not prove:
that the monitoring host scrapes a GPU node over the network (the test hosts' fleet test does that
without a GPU); only the series the run kept (`KEEP` in h200.sh: the kit's own, vLLM's request
and cache gauges) have values, so the page's tokens/s and TTFT cells are empty; the alerts are not
loaded (the prober's last-success timestamps are the run's own clock, which the no-generation
alert would read as a minute old), so the alerts column says none.

    .venv/tools/bin/python bench/h200/fleet_page_replay.py bench/h200/2026-12-05-soak-10min/monitor.jsonl \\
        --from 240 --seconds 150 --out bench/h200/2026-12-05-soak-10min/fleet-page.png
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / ".venv" / "tools" / "prometheus"
NODE = "device-h200"
JOBS = {"vllm": "vllm", "prober": "prober", "gpu": "exporter"}  # Prometheus job -> monitor.jsonl key


def samples(path: Path, start: float) -> list[dict[str, list[str]]]:
    """The recorded scrapes from `start` seconds after the first answered one, each job's lines."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows = [r for r in rows if isinstance(r.get("vllm"), list)]
    first = rows[0]["t"]
    return [
        {job: r[key] for job, key in JOBS.items() if isinstance(r.get(key), list)}
        for r in rows
        if r["t"] - first >= start
    ]


def serve(recorded: list[dict[str, list[str]]]) -> tuple[ThreadingHTTPServer, float]:
    begun = time.monotonic()

    class Replay(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            index = min(int((time.monotonic() - begun) / 5), len(recorded) - 1)
            body = ("\n".join(recorded[index].get(self.path.strip("/"), [])) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, begun


def config(port: int, replay: int, rules: Path) -> str:
    jobs = "".join(
        f"""  - job_name: {job}
    metrics_path: /{job}
{"    honor_labels: true" + chr(10) if job == "gpu" else ""}    static_configs:
      - targets: ["127.0.0.1:{replay}"]
        labels: {{node: {NODE}, profile: h200-run}}
"""
        for job in JOBS
    )
    return f"""global: {{scrape_interval: 5s, evaluation_interval: 5s}}
rule_files: ["{rules}/glmdeploy-recording.yml"]
scrape_configs:
  - job_name: prometheus
    static_configs: [{{targets: ["127.0.0.1:{port}"]}}]
{jobs}"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("monitor", type=Path, help="a GPU run's monitor.jsonl")
    parser.add_argument("--from", dest="start", type=float, default=240, help="seconds into the run to replay from")
    parser.add_argument("--seconds", type=float, default=150, help="how long to replay before the screenshot")
    parser.add_argument("--port", type=int, default=19090)
    parser.add_argument("--out", type=Path, required=True, help="the PNG")
    args = parser.parse_args()
    recorded = samples(args.monitor, args.start)
    replay, _ = serve(recorded)
    work = Path(tempfile.mkdtemp(prefix="glmdeploy-replay-"))
    (work / "prometheus.yml").write_text(
        config(args.port, replay.server_address[1], ROOT / "roles" / "monitoring" / "files" / "rules")
    )
    prom = subprocess.Popen(
        [str(PROMETHEUS / "usr/bin/prometheus"), f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{args.port}",
         f"--web.console.templates={ROOT / 'roles/monitoring/files/consoles'}",
         f"--web.console.libraries={PROMETHEUS / 'etc/prometheus/console_libraries'}"],
        stdout=subprocess.DEVNULL, stderr=(work / "prometheus.log").open("w"),
    )  # fmt: skip
    try:
        print(f"==> replaying {len(recorded)} samples of {args.monitor} to Prometheus on :{args.port}", flush=True)
        time.sleep(args.seconds)  # the replay's own pace: the page needs minutes of samples for its rates
        url = f"http://127.0.0.1:{args.port}/consoles/glmdeploy.html"
        urllib.request.urlopen(url, timeout=10).read()
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=shutil.which("chromium") or "/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page(viewport={"width": 1500, "height": 520})
            page.goto(url)
            rows = page.locator("table tr").all_inner_texts()
            page.screenshot(path=str(args.out), full_page=True)
            browser.close()
        print("\n".join(rows))
        print(f"==> {args.out}")
    finally:
        prom.terminate()
        prom.wait(10)
        replay.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
