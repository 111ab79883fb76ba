"""What a run leaves for people: latency plots per shape, the sweep's table and plots."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def plot(results: list[dict[str, Any]], out_dir: Path, title: str) -> list[Path]:
    """Throughput and latency percentiles against concurrency, one line per (input, output) length."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed here: plots skipped (the control node's tool venv has it)", file=sys.stderr)
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    shapes = sorted({(r["input_len"], r["output_len"]) for r in results})
    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for inp, out in shapes:
        rows = sorted(
            (r for r in results if (r["input_len"], r["output_len"]) == (inp, out)), key=lambda r: r["concurrency"]
        )
        ax.plot(
            [r["concurrency"] for r in rows],
            [r["output_tokens_per_s"] for r in rows],
            marker="o",
            label=f"{inp} in / {out} out",
        )
    ax.set(xscale="log", xlabel="concurrent streams", ylabel="output tokens/s", title=f"Throughput - {title}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out_dir / "throughput.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    for ax, metric, label in zip(
        axes,
        ("ttft_ms", "itl_ms", "e2e_ms"),
        ("time to first token", "inter-token latency", "end-to-end latency"),
        strict=True,
    ):
        for inp, out in shapes:
            rows = sorted(
                (r for r in results if (r["input_len"], r["output_len"]) == (inp, out)), key=lambda r: r["concurrency"]
            )
            conc = [r["concurrency"] for r in rows]
            line = ax.plot(conc, [r[metric]["p50"] for r in rows], marker="o", label=f"{inp}/{out} p50")[0]
            ax.plot(
                conc, [r[metric]["p99"] for r in rows], linestyle="--", color=line.get_color(), label=f"{inp}/{out} p99"
            )
        ax.set(xscale="log", yscale="log", xlabel="concurrent streams", ylabel="ms", title=label)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Latency percentiles - {title}")
    fig.tight_layout()
    written.append(out_dir / "latency.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def sweep_table(summary: list[dict[str, Any]], slo: dict[str, float]) -> str:
    """Per offered rate: the figures' means with their 95 % interval."""
    targets = ", ".join(f"{k.upper()} <= {v:g} ms" for k, v in slo.items())
    rows = [
        f"goodput: requests/s meeting {targets}",
        f"{'offered':>8} {'req/s':>14} {'goodput':>14} {'out tok/s':>16} {'TTFT p99 ms':>16} {'failed':>6}",
    ]
    for row in summary:
        rows.append(
            f"{row['rate']!s:>8} {_cell(row, 'requests_per_s'):>14} {_cell(row, 'goodput_per_s'):>14}"
            f" {_cell(row, 'output_tokens_per_s', 1):>16} {_cell(row, 'ttft_p99_ms', 0):>16} {row['failed']:>6}"
        )
    return "\n".join(rows)


def _cell(row: dict[str, Any], key: str, digits: int = 2) -> str:
    return f"{row[key]['mean']:.{digits}f} ±{row[key]['ci95']:.{digits}f}"


def plot_sweep(
    summary: list[dict[str, Any]], best: dict[str, Any] | None, out_dir: Path, title: str, slo: dict[str, float]
) -> Path | None:
    """Throughput against P99 latency, one point per offered rate, the knee marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed here: plot skipped (the control node's tool venv has it)", file=sys.stderr)
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = [r["output_tokens_per_s"]["mean"] for r in summary]
    for key, label in (("ttft_p99_ms", "TTFT p99"), ("e2e_p99_ms", "end-to-end p99")):
        y = [r[key]["mean"] for r in summary]
        ax.errorbar(x, y, yerr=[r[key]["ci95"] for r in summary], marker="o", capsize=3, label=label)
    for r, xi in zip(summary, x, strict=True):
        ax.annotate(
            f"{r['rate']}/s", (xi, r["ttft_p99_ms"]["mean"]), fontsize=7, textcoords="offset points", xytext=(4, 4)
        )
    if best:
        ax.axvline(
            best["output_tokens_per_s"]["mean"], color="red", linestyle="--", label=f"knee: {best['rate']} req/s"
        )
    if "ttft" in slo:
        ax.axhline(slo["ttft"], color="gray", linestyle=":", label=f"TTFT target {slo['ttft']:g} ms")
    ax.set(yscale="log", xlabel="output tokens/s", ylabel="ms (mean of the passes, 95 % interval)")
    ax.set_title(f"Rate sweep - {title}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "sweep.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
