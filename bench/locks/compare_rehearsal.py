"""Compare two reports of tests/rehearsal/run_rehearsal.py (one lock's venv against another's):
every check's and observation's detail, with response ids, creation times and log times
normalised. Prints each that differs; exit 1 if any check's result or generated text differs.

    python3 bench/locks/compare_rehearsal.py OLD.json NEW.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any


def normalised(detail: Any) -> str:
    text = json.dumps(detail, sort_keys=True)
    text = re.sub(r'"(id|created)": "?[^,}]*"?', r'"\1": X', text)
    return re.sub(r"\d\d-\d\d \d\d:\d\d:\d\d", "T", text)


def entries(report: dict[str, Any]) -> dict[str, tuple[object, str]]:
    found: dict[str, tuple[object, str]] = {}
    for check in report["checks"]:
        found["check: " + check["check"]] = (check["ok"], normalised(check.get("detail")))
    for note in report["observations"]:
        found["observation: " + str(note.get("observation", ""))] = (None, normalised(note.get("detail")))
    return found


def main() -> int:
    old, new = (entries(json.loads(Path(path).read_text())) for path in sys.argv[1:3])
    differ = [name for name in old if old[name] != new.get(name)]
    print(f"{len(old)} entries, {len(old) - len(differ)} identical")
    for name in differ:
        print(f"differs: {name}\n  old: {old[name][1][:300]}\n  new: {new.get(name, (None, 'absent'))[1][:300]}")
    return 1 if any(name.startswith("check: ") for name in differ) else 0


if __name__ == "__main__":
    sys.exit(main())
