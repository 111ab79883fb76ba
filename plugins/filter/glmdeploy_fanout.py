"""`glmdeploy_fanout_plan`: which node fetches a store from which holder, in which round.

Why a filter: the plan is a pure function of facts the nodes already published (their store,
whether they hold it, whether they can share it); it is computed by glmdeploy_control.fanout,
where it is unit-tested, and needs no connection.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from glmdeploy_control import fanout
except ImportError:  # an ansible-playbook outside the kit's tool environment: use the checkout's
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "service"))
    from glmdeploy_control import fanout


def fanout_plan(nodes: list[dict[str, Any]], store_key: str, complete_key: str, share_key: str) -> dict[str, Any]:
    """nodes: hostvars of the batch; the keys name the facts that carry each node's store, whether
    it holds it, and whether it can share it."""
    return fanout.plan(
        fanout.Node(
            name=str(n["inventory_hostname"]),
            store=str(n[store_key]),
            complete=bool(n[complete_key]),
            can_share=bool(n[share_key]),
        )
        for n in nodes
        if store_key in n
    )


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"glmdeploy_fanout_plan": fanout_plan}
