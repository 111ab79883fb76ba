"""Print how long each task took and, at the end, the slowest tasks of the run.

Why: a first deploy spends minutes in a few steps (wheel install, vLLM cold
start); admins and CI need to see where, without re-running with profilers.
Enabled from ansible.cfg; prints nothing per task that took under a second.
"""

from __future__ import annotations

import time
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: glmdeploy_timing
    type: aggregate
    short_description: per-task wall time and the slowest tasks of the run
    description:
      - Prints the wall time of each task that took one second or more and, at the end,
        the ten slowest tasks.
"""

TOP = 10


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "glmdeploy_timing"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._current: tuple[str, float] | None = None
        self._times: list[tuple[float, str]] = []

    def _close(self) -> None:
        if self._current is None:
            return
        name, start = self._current
        elapsed = time.monotonic() - start
        self._times.append((elapsed, name))
        if elapsed >= 1.0:
            self._display.display(f"  ({elapsed:.1f} s: {name})")
        self._current = None

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._close()
        self._current = (task.get_name().strip(), time.monotonic())

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._close()
        if not self._times:
            return
        total = sum(t for t, _ in self._times)
        self._display.display(f"slowest tasks ({total:.0f} s in all tasks):")
        for elapsed, name in sorted(self._times, reverse=True)[:TOP]:
            self._display.display(f"  {elapsed:7.1f} s  {name}")
