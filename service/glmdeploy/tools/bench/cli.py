"""`python -m glmdeploy.tools.bench` (glmdeploy-bench): run, baseline, sweep, multiturn, compare."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from glmdeploy.api.client import ApiClient
from glmdeploy.config import NodeConfig
from glmdeploy.serving import nodefacts, sizing
from glmdeploy.tools.bench.client import (
    DEFAULT_TOLERANCE,
    SEED,
    SMOKE_SCENARIO,
    multiturn,
    run_level,
    run_matrix,
    server_versions,
)
from glmdeploy.tools.bench.report import plot, plot_sweep, sweep_table
from glmdeploy.tools.bench.sweep import DEFAULT_SLO_MS, compare_sweeps, knee, run_sweep, sweep_summary


def _client(args: argparse.Namespace) -> tuple[ApiClient, dict[str, Any]]:
    settings: dict[str, Any] = {}
    if args.node_config:
        node = NodeConfig.load(args.node_config)
        settings = node.public()
        url, model, key = node.api_url, node.served_model_name, node.api_key
    else:
        url, model, key = args.url, args.model, os.environ.get("GLMDEPLOY_API_KEY", "")
    if not url or not model:
        raise SystemExit("error: give --node-config, or --url and --model")
    return ApiClient(url, model, key, timeout_s=args.timeout), settings


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    """The command line: run, baseline, sweep, multiturn (each against a node), compare (of files)."""
    parser = argparse.ArgumentParser(prog="python -m glmdeploy.tools.bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("run", "run a benchmark matrix"),
        ("multiturn", "first-token latency per turn of replayed multi-turn chats"),
        ("baseline", "record the smoke suite's throughput baseline"),
        ("sweep", "offered request rates up to saturation: throughput, latency and goodput per rate"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--node-config", help="read the endpoint from a node's node.json")
        p.add_argument("--url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
        p.add_argument("--model", help="served model name")
        p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
        p.add_argument("--label", default="", help="free text stored with the result (e.g. 'kit settings')")
    run = sub.choices["run"]
    run.add_argument("--input-lens", type=_ints, default=[512, 2048, 8192, 16384])
    run.add_argument("--output-lens", type=_ints, default=[128, 512])
    run.add_argument("--concurrency", type=_ints, default=[1, 4, 16, 64])
    run.add_argument("--requests", type=int, help="requests per level (default: 2 x concurrency, at least 4)")
    run.add_argument("--json", type=Path, required=True, help="where to write the results")
    run.add_argument("--plots", type=Path, help="directory for throughput.png and latency.png")
    multi = sub.choices["multiturn"]
    multi.add_argument("--conversations", type=int, default=8)
    multi.add_argument("--turns", type=int, default=5)
    multi.add_argument("--first-len", type=int, default=2048, help="tokens in the first prompt")
    multi.add_argument("--turn-len", type=int, default=256, help="new user tokens per later turn")
    multi.add_argument("--reply-len", type=int, default=128, help="tokens generated per turn")
    multi.add_argument("--json", type=Path, required=True)
    sw = sub.choices["sweep"]
    sw.add_argument("--rates", type=_rates, default=[0.5, 1, 2, 4, 8, float("inf")], help="req/s, `inf`: all at once")
    sw.add_argument("--input-len", type=int, default=128)
    sw.add_argument("--output-len", type=int, default=64)
    sw.add_argument("--requests", type=int, default=40, help="requests per rate and pass")
    sw.add_argument("--repeats", type=int, default=3, help="passes per rate (the 95 %% interval needs 2 or more)")
    sw.add_argument(
        "--pass-seconds",
        type=float,
        help="size each finite rate's pass to this many seconds of arrivals (requests = rate x seconds;"
        " default: --requests for every rate)",
    )
    sw.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    sw.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps: 1 Poisson, <1 burstier")
    sw.add_argument("--max-concurrency", type=int, help="at most this many requests running (default: no limit)")
    for key, default in DEFAULT_SLO_MS.items():
        sw.add_argument(f"--slo-{key}-ms", type=float, default=default, help=f"goodput's {key.upper()} target (ms)")
    sw.add_argument("--slo-e2e-ms", type=float, help="goodput's end-to-end target (ms; default none)")
    sw.add_argument("--json", type=Path, required=True, help="where to write the results")
    sw.add_argument("--plots", type=Path, help="directory for sweep.png")
    base = sub.choices["baseline"]
    base.add_argument("--out", type=Path, required=True, help="where to write the baseline JSON")
    base.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="allowed slowdown (0.15 = 15%%)")
    cmp = sub.add_parser(
        "compare",
        help="sweeps of different servers side by side, each rate's figures as a ratio to the first (no server needed)",
    )
    cmp.add_argument(
        "sweeps", type=Path, nargs="+", help="sweep JSONs (make bench / sweep --json); the first is the reference"
    )
    cmp.add_argument("--json", type=Path, help="also write the comparison here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "compare":
        return compare_command(args.sweeps, args.json)
    client, settings = _client(args)
    if not client.health():
        print(f"error: no server answers at {client.base_url} (is the node deployed and running?)", file=sys.stderr)
        return 2
    info = nodefacts.hardware()
    meta = {
        "command": shlex.join(["python", "-m", "glmdeploy.tools.bench", *(argv if argv is not None else sys.argv[1:])]),
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "label": args.label,
        "endpoint": client.base_url,
        "model": client.model,
        "seed": SEED,
        "hardware": info,
        "hardware_class": nodefacts.hardware_class(
            info, sizing.classes_from(settings.get("gpu", {}).get("classes", {}))
        ),
        "versions": server_versions(client),
        "settings": settings,
    }
    if args.command == "multiturn":
        out = multiturn(client, args.conversations, args.turns, args.first_len, args.turn_len, args.reply_len)
        _write(args.json, {**meta, "multiturn": out})
        print(f"TTFT median per turn (ms): {out['ttft_ms_median_per_turn']}; last/first {out['last_over_first']}")
        return 0
    if args.command == "baseline":
        s = SMOKE_SCENARIO
        level = run_level(client, s["input_len"], s["output_len"], s["concurrency"], s["requests"])
        out = {
            **meta,
            "profile": settings.get("profile", ""),
            "scenario": s,
            "tolerance": args.tolerance,
            "result": asdict(level),
        }
        _write(args.out, out)
        print(f"baseline: {level.output_tokens_per_s:.1f} out tok/s ({meta['hardware_class']}) -> {args.out}")
        return 0
    if args.command == "sweep":
        return sweep_command(client, args, meta)
    max_len = settings.get("max_model_len")  # none: --url without a node.json
    levels = run_matrix(
        client, args.input_lens, args.output_lens, args.concurrency, args.requests, int(max_len) if max_len else None
    )
    results = [asdict(r) for r in levels]
    _write(args.json, {**meta, "results": results})
    print(f"results -> {args.json}")
    if args.plots:
        for path in plot(results, args.plots, args.label or client.model):
            print(f"plot -> {path}")
    return 0


def sweep_command(client: ApiClient, args: argparse.Namespace, meta: dict[str, Any]) -> int:
    slo = {k: getattr(args, f"slo_{k}_ms") for k in ("ttft", "tpot", "e2e") if getattr(args, f"slo_{k}_ms") is not None}
    levels = run_sweep(
        client,
        args.rates,
        args.input_len,
        args.output_len,
        args.requests,
        args.repeats,
        slo,
        args.arrival == "poisson",
        args.burstiness,
        args.max_concurrency,
        args.pass_seconds,
    )
    summary = sweep_summary(levels)
    best = knee(summary)
    workload = {
        k: getattr(args, k)
        for k in ("input_len", "output_len", "requests", "repeats", "pass_seconds", "arrival", "burstiness")
    }
    passes = [asdict(lv) | {"rate": "inf" if lv.rate == float("inf") else lv.rate} for lv in levels]
    out = {**meta, "workload": workload, "slo_ms": slo, "passes": passes, "summary": summary, "knee": best}
    _write(args.json, out)
    print(sweep_table(summary, slo))
    print(f"knee: {best['rate']} req/s" if best else "knee: none (goodput below 90 % of the lowest rate offered)")
    print(f"results -> {args.json}")
    if args.plots:
        path = plot_sweep(summary, best, args.plots, args.label or client.model, slo)
        if path:
            print(f"plot -> {path}")
    return 0


def compare_command(paths: list[Path], json_out: Path | None) -> int:
    try:
        runs = [json.loads(path.read_text()) for path in paths]
        missing = [str(p) for p, run in zip(paths, runs, strict=True) if "summary" not in run]
        if missing:
            raise ValueError(f"{', '.join(missing)}: not a sweep's JSON (make bench writes reports/bench/sweep.json)")
        rows = compare_sweeps(runs)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{'offered':>8} {'server':<24} {'req/s':>8} {'goodput':>8} {'out tok/s':>10} {'TTFT p99':>10} {'first x':>8}"
    )
    for row in rows:
        for cell in row["runs"]:
            # "first x": the first sweep's goodput over this one's, how many times more requests
            # the first served within the targets at this offered rate.
            ratio = cell["ratio"]["goodput_per_s"]
            figures = (
                f"{cell['requests_per_s']:>8.2f} {cell['goodput_per_s']:>8.2f} {cell['output_tokens_per_s']:>10.1f}"
            )
            ratio_text = "-" if not ratio else f"{1 / ratio:.2f}"
            print(f"{row['rate']:>8} {cell['label'][:24]:<24} {figures} {cell['ttft_p99_ms']:>10.0f} {ratio_text:>8}")
    if json_out:
        _write(json_out, {"sweeps": [str(p) for p in paths], "rates": rows})
        print(f"comparison -> {json_out}")
    return 0


def _rates(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated rates (req/s) or inf, got {text!r}") from None


def _write(path: Path, data: dict[str, Any]) -> None:
    """Write next to the target, then rename: an interrupted run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
