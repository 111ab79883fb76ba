"""`make releases`: one table of which release each node runs and which it would roll back to.

The nodes' status comes back as one JSON file per node (playbooks/releases.yml runs the
``glmdeploy_release`` module's ``status`` there); this prints them side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def table(statuses: dict[str, dict[str, Any]]) -> str:
    """One line per node: which release it runs and which it would roll back to."""
    lines = [f"{'node':<16} {'current':<44} {'previous':<44} releases kept"]
    for node, info in sorted(statuses.items()):
        kept = ", ".join(f"{row['id']}({row['state']})" for row in info.get("releases", []))
        lines.append(f"{node:<16} {info.get('current') or '-':<44} {info.get('previous') or '-':<44} {kept}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy_control.releases", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="<node>.json files written by playbooks/releases.yml")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        print(f"ERROR: no release status in {', '.join(missing)}; fix: run `make releases` first", file=sys.stderr)
        return 2
    print(table({f.stem: json.loads(f.read_text()) for f in args.files}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
