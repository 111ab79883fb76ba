"""The kit's run output: ansible.posix.profile_tasks' timings, then the run's summary as the very
last lines a user sees.

Why a callback and not a final debug task: a deploy's summary (each node's UI and API URLs, its
smoke result, the balancer's URLs) used to be printed in the node's play, about 200 lines above
the end, under the balancer, exporter and firewall plays, the recap and the slowest tasks. Roles
hand their lines over with ``ansible.builtin.set_stats`` (key ``glmdeploy_summary``: a mapping of
a heading to its lines); this callback prints them after everything else. It extends
profile_tasks rather than sitting beside it because Ansible runs collection callbacks after the
kit's own: beside it, the slowest-tasks list would follow the summary.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.ansible.posix.plugins.callback.profile_tasks import CallbackModule as ProfileTasks

DOCUMENTATION = """
    name: glmdeploy_summary
    type: aggregate
    short_description: profile_tasks' timings, then the run's summary (glmdeploy_summary stats) last
    description:
      - Each task's duration and the slowest tasks, as ansible.posix.profile_tasks prints them.
      - Then every line roles handed over with ansible.builtin.set_stats under glmdeploy_summary.
    requirements:
      - enable in configuration (callbacks_enabled = glmdeploy_summary)
    options:
      output_limit:
        description: Number of tasks to display in the summary
        default: 20
        env:
          - name: PROFILE_TASKS_TASK_OUTPUT_LIMIT
        ini:
          - section: callback_profile_tasks
            key: task_output_limit
      sort_order:
        description: Adjust the sorting output of summary tasks
        choices: ['descending', 'ascending', 'none']
        default: 'descending'
        env:
          - name: PROFILE_TASKS_SORT_ORDER
        ini:
          - section: callback_profile_tasks
            key: sort_order
      summary_only:
        description: Only show the summary, not each task's time.
        type: bool
        default: false
        env:
          - name: PROFILE_TASKS_SUMMARY_ONLY
        ini:
          - section: callback_profile_tasks
            key: summary_only
"""

#: The set_stats key roles write their summary lines under.
KEY = "glmdeploy_summary"


class CallbackModule(ProfileTasks):  # type: ignore[misc]
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "glmdeploy_summary"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_stats(self, stats: Any) -> None:
        super().v2_playbook_on_stats(stats)
        sections = (stats.custom.get("_run") or {}).get(KEY) or {}
        if not sections:
            return
        self._display.display("")
        self._display.display("SUMMARY " + "=" * 72)
        for heading in sorted(sections):
            self._display.display(f"{heading}:")
            for line in sections[heading]:
                if line:
                    self._display.display(f"  {line}")
