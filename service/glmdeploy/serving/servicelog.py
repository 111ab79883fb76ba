"""What the running vLLM engine said about itself when it started.

Why: the model's config.json and the node's settings say what the engine
*should* run; only the engine's own start line ("Initializing ... LLM engine
(vX) with config: model=..., dtype=torch.float16, ...") says what it resolved
and runs now. That line is in the service's log: the journal under systemd,
the kit's log file under supervisord.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ENGINE_LINE = re.compile(r"Initializing an? (?:V1 )?LLM engine \(v(?P<version>[^)]+)\) with config: (?P<config>.*)")


@dataclass(frozen=True)
class EngineStart:
    version: str
    model: str
    dtype: str
    line: str


def _field(config: str, name: str) -> str:
    match = re.search(rf"(?:^|, ){name}=(?P<value>'[^']*'|[^,]*)", config)
    return match.group("value").strip("'") if match else ""


def last_engine_start(lines: Iterable[str]) -> EngineStart | None:
    """The most recent engine start in a log: the one that is running now."""
    found = None
    for line in lines:
        match = ENGINE_LINE.search(line)
        if match:
            config = match.group("config")
            dtype = _field(config, "dtype").removeprefix("torch.")
            found = EngineStart(match.group("version"), _field(config, "model"), dtype, line.strip())
    return found


def service_log(unit: str, log_file: str) -> tuple[str, list[str]]:
    """The service's log lines and where they came from (journal when systemd runs the node)."""
    if Path("/run/systemd/system").is_dir():
        proc = subprocess.run(
            ["journalctl", "--no-pager", "-o", "cat", "-n", "100000", "-u", unit],
            capture_output=True,
            text=True,
            check=False,
        )
        return f"journalctl -u {unit}", proc.stdout.splitlines()
    path = Path(log_file)
    return str(path), path.read_text(encoding="utf-8", errors="replace").splitlines() if path.exists() else []
