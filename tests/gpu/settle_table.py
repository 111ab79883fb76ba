"""The settle stage's tables (tests/gpu/h200.sh settle): each configuration's figures side by side.

Reads the sweep JSONs a settle run wrote (`<config>-c<streams>.json`, `<config>-rates.json`) and
prints, per streams level and per offered rate, each configuration's mean over its passes with the
95 % interval (glmdeploy.tools.bench.sweep.interval95), and its ratio to the engine's defaults where those ran.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from glmdeploy.tools.bench.sweep import interval95


def load(res: Path) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for path in sorted(res.glob("*.json")):
        match = re.fullmatch(r"(.+)-(c\d+|rates)", path.stem)
        if match:
            runs.setdefault(match.group(1), {})[match.group(2)] = json.loads(path.read_text())
    return runs


def cell(values: list[float], digits: int = 0) -> str:
    got = interval95(values)
    return f"{got['mean']:.{digits}f} ±{got['ci95']:.{digits}f}"


def of(passes: list[dict[str, Any]], key: str, stat: str | None = None, digits: int = 0) -> str:
    """One figure over the passes: pass[key] or pass[key][stat]."""
    return cell([p[key][stat] if stat else p[key] for p in passes], digits)


def failed(passes: list[dict[str, Any]]) -> int:
    return sum(p["failed"] + p["incomplete"] for p in passes)


def streams_table(runs: dict[str, dict[str, Any]]) -> list[str]:
    rows = ["streams  config        out tok/s (n=3)      vs default  TTFT p50 ms      TPOT p50 ms    failed"]
    levels = sorted({k for r in runs.values() for k in r if k.startswith("c")}, key=lambda k: int(k[1:]))
    for level in levels:
        base = runs.get("default", {}).get(level)
        base_mean = interval95([p["output_tokens_per_s"] for p in base["passes"]])["mean"] if base else None
        for config, run in runs.items():
            if level not in run:
                continue
            passes = run[level]["passes"]
            tok = [p["output_tokens_per_s"] for p in passes]
            ratio = f"{interval95(tok)['mean'] / base_mean:8.1%}" if base_mean else " " * 8
            ttft, tpot = of(passes, "ttft_ms", "p50", 1), of(passes, "tpot_ms", "p50", 2)
            row = f"{level[1:]:>7}  {config:12} {cell(tok):>18}  {ratio:>10}  {ttft:>14}  {tpot:>13}"
            rows.append(f"{row}  {failed(passes):>6}")
    return rows


def rates_table(runs: dict[str, dict[str, Any]]) -> list[str]:
    rows = []
    for config, run in runs.items():
        sweep = run.get("rates")
        if not sweep:
            continue
        slo = ", ".join(f"{k.upper()} <= {v:g} ms" for k, v in sweep["slo_ms"].items())
        knee = sweep["knee"]["rate"] if sweep["knee"] else "none"
        rows.append(f"{config}: goodput (requests/s meeting {slo}), knee {knee} req/s")
        rows.append(
            "  offered  req/s            goodput          out tok/s            TTFT p99 ms      TPOT p99 ms   failed"
        )
        for rate in sorted({p["rate"] for p in sweep["passes"]}, key=float):
            passes = [p for p in sweep["passes"] if p["rate"] == rate]
            figures = (
                of(passes, "requests_per_s", digits=2),
                of(passes, "goodput_per_s", digits=2),
                of(passes, "output_tokens_per_s"),
                of(passes, "ttft_ms", "p99"),
                of(passes, "tpot_ms", "p99", 1),
            )
            widths = (14, 14, 18, 14, 13)
            cells = "  ".join(f"{f:>{w}}" for f, w in zip(figures, widths, strict=True))
            rows.append(f"  {rate!s:>7}  {cells}  {failed(passes):>6}")
    return rows


def main(res: str) -> int:
    runs = load(Path(res))
    if not runs:
        print(f"no sweep results in {res}", file=sys.stderr)
        return 1
    print("\n".join([*streams_table(runs), "", *rates_table(runs)]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
