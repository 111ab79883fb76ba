"""Soak: a bounded mixed load for a set time, measured in windows and judged against gates.

Why: a leak or a slow drift passes every short check. vLLM's tracker has repeated reports of a
server whose memory grows linearly under load, or a release that leaks where the one before did
not; a smoke suite of a minute cannot see either. A soak keeps a fixed number of streams busy
with chat-shaped requests (a short question, a turn with its history, a long document, a long
answer: `MIX`) for the whole duration, and every `window` records the failed requests, the
time-to-first-token p95, the output tokens per second, the memory of the model server's whole
process tree (PSS, every process of its runs: glmdeploy.serving.procguard marks them) and, where NVML
answers, the GPU memory in use. At the end, a verdict against the gates (`Gates`): no failed
request; the memory's slope (least squares over the samples after the first window, which is
warm-up) below a limit in MB per hour; the TTFT p95 of the run's last third no more than a share
above its first third's (after warm-up). It runs on the node (`make soak`), where the server's processes are.

    glmdeploy-soak run --node-config /etc/glmdeploy/node.json --duration 3m --json soak.json
    glmdeploy-soak plot --json soak.json --out soak/       # on the control node (matplotlib)
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from glmdeploy.api.client import ApiClient
from glmdeploy.config import NodeConfig
from glmdeploy.serving import nodefacts
from glmdeploy.tools.bench.client import PROMPT_ID_RANGE, SEED, one_request, percentiles, server_versions

#: Request shapes (prompt tokens, output tokens), drawn in turn from a seeded generator: a short
#: question, a chat turn with its history, a long document with a question, a long answer.
MIX: tuple[tuple[int, int], ...] = ((64, 64), (512, 128), (2048, 128), (256, 256))
SERVICE = nodefacts.SERVICE
#: One request as the soak records it: when it ended (s into the run), its TTFT (s; None: it
#: failed), its output tokens, its error (empty when it succeeded).
Request = tuple[float, float | None, int, str]


@dataclass(frozen=True)
class Gates:
    """What a soak must show to pass. The defaults hold for the kit's nodes (docs/howto/upgrade-proof.md,
    "Leaks and drift: the soak")."""

    #: Growth of the server's memory, MB per hour (least-squares slope after the warm-up window).
    memory_mb_per_h: float = 256.0
    #: TTFT p95 of the run's last third over its first third's, minus one (0.5: at most 50% slower).
    p95_drift: float = 0.5
    #: Failed requests allowed.
    failed: int = 0


@dataclass
class Window:
    start_s: float
    requests: int = 0
    failed: int = 0
    ttft_p95_ms: float = 0.0
    output_tokens_per_s: float = 0.0
    service_mb: float | None = None
    gpu_mb: float | None = None


@dataclass
class Sample:
    t_s: float
    service_mb: float | None
    gpu_mb: float | None


@dataclass
class _Run:
    """What the load threads and the sampler record while the soak runs."""

    start: float
    requests: list[Request] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _stream(client: ApiClient, run: _Run, end: float, shapes: list[tuple[int, int]], seed: int) -> None:
    rng = random.Random(seed)
    while time.perf_counter() < end:
        prompt_len, output_len = rng.choice(shapes)
        prompt = [rng.randrange(*PROMPT_ID_RANGE) for _ in range(prompt_len)]
        entry: Request
        try:
            result = one_request(client, prompt, output_len)
            entry = (time.perf_counter() - run.start, result.ttft_s, result.output_tokens, "")
        except Exception as exc:  # every failure counts; the first few are named in the report
            entry = (time.perf_counter() - run.start, None, 0, str(exc)[:200])
        with run.lock:
            run.requests.append(entry)


def _sample(run: _Run, end: float, every_s: float, service: str) -> None:
    while True:
        run.samples.append(
            Sample(
                round(time.perf_counter() - run.start, 1),
                nodefacts.service_memory_mb(service),
                nodefacts.gpu_memory_mb(),
            )
        )
        if time.perf_counter() + every_s > end:
            return
        time.sleep(every_s)


def run_soak(
    client: ApiClient,
    duration_s: float,
    concurrency: int,
    max_model_len: int,
    window_s: float,
    sample_s: float = 2.0,
    service: str = SERVICE,
) -> tuple[list[Request], list[Sample]]:
    """Drive the load for `duration_s` and return its requests and memory samples."""
    shapes = [(p, o) for p, o in MIX if p + o <= max_model_len] or [(16, 16)]
    run = _Run(time.perf_counter())
    end = run.start + duration_s
    threads = [threading.Thread(target=_sample, args=(run, end, sample_s, service), daemon=True)]
    threads += [
        threading.Thread(target=_stream, args=(client, run, end, shapes, SEED + i), daemon=True)
        for i in range(concurrency)
    ]
    for thread in threads:
        thread.start()
    last = -1
    while any(t.is_alive() for t in threads):
        elapsed = int((time.perf_counter() - run.start) // window_s)
        if elapsed != last and elapsed > 0:
            print(f"soak: {elapsed * window_s:.0f} of {duration_s:.0f} s, {len(run.requests)} requests", flush=True)
        last = elapsed
        time.sleep(1)
    return run.requests, run.samples


def windows(requests: list[Request], samples: list[Sample], window_s: float, duration_s: float) -> list[Window]:
    """Requests by the window they ended in (those still running at the end: the last window's);
    memory as the mean of the window's samples."""
    count = max(1, int(duration_s // window_s))

    def index(t: float) -> int:
        return min(int(t // window_s), count - 1)

    out = [Window(start_s=i * window_s) for i in range(count)]
    for i, w in enumerate(out):
        done = [r for r in requests if index(r[0]) == i]
        ttfts = [r[1] for r in done if r[1] is not None]
        w.requests, w.failed = len(done), sum(1 for r in done if r[3])
        w.ttft_p95_ms = percentiles(ttfts)["p95"]
        w.output_tokens_per_s = round(sum(r[2] for r in done) / window_s, 1)  # the last: with the tail
        mem = [s.service_mb for s in samples if index(s.t_s) == i and s.service_mb is not None]
        gpu = [s.gpu_mb for s in samples if index(s.t_s) == i and s.gpu_mb is not None]
        w.service_mb = round(statistics.fmean(mem), 1) if mem else None
        w.gpu_mb = round(statistics.fmean(gpu), 1) if gpu else None
    return out


def memory_slope_mb_per_h(samples: list[Sample], after_s: float) -> float | None:
    """Least-squares slope of the server's memory over the samples after `after_s`, in MB per hour."""
    points = [(s.t_s, s.service_mb) for s in samples if s.t_s >= after_s and s.service_mb is not None]
    if len(points) < 3 or len({t for t, _ in points}) < 2:
        return None
    slope = statistics.linear_regression([t for t, _ in points], [m for _, m in points]).slope
    return round(slope * 3600, 1)


def ttft_drift(requests: list[Request], warm_up_s: float, duration_s: float) -> tuple[float, float, float] | None:
    """TTFT p95 of the last third of the run (after warm-up) over the first third's, minus one, with
    both p95s in ms. Thirds, not single windows: a window of a mixed load holds a few dozen
    requests, whose p95 is close to their slowest; a third holds enough for a p95 that means one."""
    third = (duration_s - warm_up_s) / 3
    ok = [(t, ttft) for t, ttft, _, error in requests if ttft is not None and not error and t >= warm_up_s]
    first = [ttft for t, ttft in ok if t < warm_up_s + third]
    last = [ttft for t, ttft in ok if t >= warm_up_s + 2 * third]
    if len(first) < 5 or len(last) < 5:
        return None
    early, late = percentiles(first)["p95"], percentiles(last)["p95"]
    return round(late / early - 1, 3), early, late


def verdict(
    requests: list[Request], samples: list[Sample], window_s: float, duration_s: float, gates: Gates
) -> list[dict[str, Any]]:
    """One entry per gate: its name, whether it passed, the measured value and the limit, in words.
    The first window is warm-up (caches, allocator growth): left out of the slope and the drift."""
    failed = sum(1 for *_, error in requests if error)
    out = [{"gate": "failed requests", "passed": failed <= gates.failed, "value": failed, "limit": gates.failed}]
    slope = memory_slope_mb_per_h(samples, after_s=window_s)
    out.append(
        {
            "gate": "memory slope (MB/h)",
            "passed": slope is not None and slope <= gates.memory_mb_per_h,
            "value": slope if slope is not None else "not measured: no process of the server here, or too few samples",
            "limit": gates.memory_mb_per_h,
        }
    )
    drift = ttft_drift(requests, window_s, duration_s)
    out.append(
        {
            "gate": "TTFT p95 drift",
            "passed": drift is not None and drift[0] <= gates.p95_drift,
            "value": drift[0] if drift else "too few requests in a third of the run: soak longer",
            "limit": gates.p95_drift,
            "detail": f"p95 {drift[1]} ms in the first third, {drift[2]} ms in the last" if drift else "",
        }
    )
    return out


def parse_duration(text: str) -> float:
    """`90`, `90s`, `3m`, `2h`, `72h` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write e.g. 90s, 3m or 72h")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def plot(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """Memory over time, and TTFT p95 and throughput per window: one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    samples = [s for s in report["samples"] if s["service_mb"] is not None]
    axes[0].plot([s["t_s"] / 60 for s in samples], [s["service_mb"] for s in samples], label="server (PSS)")
    gpu = [s for s in report["samples"] if s["gpu_mb"] is not None]
    if gpu:
        axes[0].plot([s["t_s"] / 60 for s in gpu], [s["gpu_mb"] for s in gpu], label="GPU in use")
    axes[0].set(xlabel="minutes", ylabel="MB", title="memory")
    axes[0].legend(fontsize=8)
    mids = [(w["start_s"] + report["window_s"] / 2) / 60 for w in report["windows"]]
    axes[1].plot(mids, [w["ttft_p95_ms"] for w in report["windows"]], marker="o")
    axes[1].set(xlabel="minutes", ylabel="ms", title="time to first token, p95 per window")
    axes[2].plot(mids, [w["output_tokens_per_s"] for w in report["windows"]], marker="o")
    axes[2].set(xlabel="minutes", ylabel="tokens/s", title="output tokens/s per window")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    verdict_ = "PASS" if report["passed"] else "FAIL"
    fig.suptitle(f"soak of {report['duration_s'] / 60:g} min, {report['concurrency']} streams - {verdict_}")
    fig.tight_layout()
    path = out_dir / "soak.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def _table(report: dict[str, Any]) -> str:
    lines = ["| window (s) | requests | failed | TTFT p95 (ms) | out tok/s | server MB | GPU MB |", "|---" * 7 + "|"]
    for w in report["windows"]:
        memory = [w[k] if w[k] is not None else "-" for k in ("service_mb", "gpu_mb")]
        lines.append(
            f"| {w['start_s']:.0f} | {w['requests']} | {w['failed']} | {w['ttft_p95_ms']} | {w['output_tokens_per_s']}"
            f" | {memory[0]} | {memory[1]} |"
        )
    lines.append("")
    for g in report["verdict"]:
        detail = f"; {g['detail']}" if g.get("detail") else ""
        lines.append(f"- {'pass' if g['passed'] else 'FAIL'}: {g['gate']}: {g['value']} (limit {g['limit']}{detail})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glmdeploy-soak", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="drive the load, sample, and judge against the gates")
    run.add_argument("--node-config", help="the node's node.json (default: the deployed node's)")
    run.add_argument("--url", help="send the load here instead (a balancer); memory is sampled on this machine")
    run.add_argument("--duration", type=parse_duration, default=parse_duration("3m"), help="e.g. 3m, 72h")
    run.add_argument("--window", type=parse_duration, default=parse_duration("30s"), help="measurement window")
    run.add_argument("--concurrency", type=int, default=4, help="streams kept busy")
    run.add_argument("--max-memory-mb-per-h", type=float, default=Gates.memory_mb_per_h)
    run.add_argument(
        "--max-p95-drift",
        type=float,
        default=Gates.p95_drift,
        help="0.5: the last third's TTFT p95 at most 1.5 x the first third's",
    )
    run.add_argument("--json", type=Path, required=True, help="where the report goes")
    show = sub.add_parser("plot", help="draw a report's plots (needs matplotlib: the control node's tool venv)")
    show.add_argument("--json", type=Path, required=True)
    show.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "plot":
        report = json.loads(args.json.read_text())
        for path in plot(report, args.out):
            print(f"plot -> {path}")
        return 0
    node = NodeConfig.load(args.node_config)
    client = ApiClient.for_node(node, timeout_s=600)
    if args.url:
        client = ApiClient(args.url, node.served_model_name, node.api_key, timeout_s=600)
    if args.window * 3 > args.duration:
        parser.error(
            f"--duration {args.duration:.0f}s holds fewer than 3 windows of {args.window:.0f}s: the drift needs 3"
        )
    if not client.health():
        print(f"error: no server answers at {client.base_url}: is the node deployed and running?", file=sys.stderr)
        return 2
    gates = Gates(memory_mb_per_h=args.max_memory_mb_per_h, p95_drift=args.max_p95_drift)
    print(
        f"soak: {args.duration:.0f} s, {args.concurrency} streams, windows of {args.window:.0f} s -> {client.base_url}"
    )
    requests, samples = run_soak(client, args.duration, args.concurrency, node.max_model_len, args.window)
    wins, errors = windows(requests, samples, args.window, args.duration), [e for *_, e in requests if e][:5]
    judged = verdict(requests, samples, args.window, args.duration, gates)
    report = {
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "endpoint": client.base_url,
        "duration_s": args.duration,
        "window_s": args.window,
        "concurrency": args.concurrency,
        "mix": MIX,
        "gates": asdict(gates),
        "hardware": nodefacts.hardware(),
        "versions": server_versions(client),
        "windows": [asdict(w) for w in wins],
        "samples": [asdict(s) for s in samples],
        "errors": errors,
        "verdict": judged,
        "passed": all(g["passed"] for g in judged),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(_table(report))
    for error in errors:
        print(f"  failed request: {error}")
    print(f"soak {'passed' if report['passed'] else 'FAILED'}: report {args.json}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
