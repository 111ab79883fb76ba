"""`glmdeploy_fanout_plan`: which node fetches a store from which holder, in which round.

Why a filter: the plan is a pure function of facts the nodes already published (their store,
whether they hold it, want it and can share it); it is computed by glmdeploy_control.fanout,
where it is unit-tested, and needs no connection.
"""

from __future__ import annotations

from typing import Any

# The kit's control package: the tool environment (make tools) has it on its path.
from glmdeploy_control import fanout


def fanout_plan(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """nodes: each node's `glmdeploy_fanout_node` fact (roles/glmdeploy/tasks/fanout.yml)."""
    return fanout.plan(
        fanout.Node(
            name=str(n["name"]),
            store=str(n["store"]),
            complete=bool(n["complete"]),
            can_share=bool(n["can_share"]),
            wanted=bool(n["wanted"]),
        )
        for n in nodes
    )


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"glmdeploy_fanout_plan": fanout_plan}
