"""Plan how an artifact store reaches the nodes that lack it: from nodes that hold it, in rounds.

Why: from the control node alone, a fleet's transfer time grows with the number of nodes (50
nodes x 12.5 GB over one 1 GbE link is about 85 minutes). A store named by its manifest is the
same bytes wherever it lies, so any node that holds it (and checked it on arrival) is as good a
source as the control node. Each round, every holder sends the store to one node that lacks it
(the control node among them); the receivers hold it in the next round, so the holders double
each round and N nodes are served in about log2(N + 1) rounds, each as long as one transfer.

The control node stays every receiver's last source: a holder that does not answer costs that
receiver a fallback, never the deploy.

Usage: ``python -m glmdeploy_control.fanout estimate --nodes 50 --size 12.5e9 --link 1e9``
prints the extrapolation (docs/howto/real-sizes.md) for a fleet that cannot be tried here.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

CONTROL = "control"


@dataclass(frozen=True)
class Node:
    """What the plan needs of a node: its store, whether it holds it, whether it can share it, and
    whether it wants it (a node that already runs what a pack holds only serves, if it holds it)."""

    name: str
    store: str
    complete: bool
    can_share: bool
    wanted: bool = True


def plan(nodes: Iterable[Node]) -> dict[str, Any]:
    """{"rounds": R, "hosts": {receiver: {"round": r, "from": holder}}, "serves": {holder: [receivers]}}.

    Receivers are served in the order given (the inventory's), per store. Nodes that cannot share
    (this machine's own node, a node without systemd) receive but never send.
    """
    by_store: dict[str, list[Node]] = {}
    for node in nodes:
        by_store.setdefault(node.store, []).append(node)
    hosts: dict[str, dict[str, Any]] = {}
    serves: dict[str, list[str]] = {}
    rounds = 0
    for members in by_store.values():
        holders = [n.name for n in members if n.complete and n.can_share] + [CONTROL]
        waiting = [n for n in members if not n.complete and n.wanted]
        r = 0
        while waiting:
            batch, waiting = waiting[: len(holders)], waiting[len(holders) :]
            for holder, node in zip(holders, batch, strict=False):
                hosts[node.name] = {"round": r, "from": holder}
                serves.setdefault(holder, []).append(node.name)
            holders = [n.name for n in batch if n.can_share] + holders
            r += 1
        rounds = max(rounds, r)
    return {"rounds": rounds, "hosts": hosts, "serves": serves}


def rounds_for(nodes: int) -> int:
    """Rounds to reach `nodes` receivers from the control node when every receiver can share."""
    return math.ceil(math.log2(nodes + 1)) if nodes > 0 else 0


def estimate(nodes: int, size: float, link: float, hash_rate: float = 0.0) -> dict[str, float]:
    """Seconds to place `size` bytes on `nodes` nodes over links of `link` bit/s, both ways.

    Assumes: every machine has one link of that speed (a switch that carries all of them at
    once: a non-blocking switch), a transfer runs at the link's speed (rsync over TCP on an idle
    LAN), a holder sends to one node at a time, and a receiver becomes a holder after its arrival
    check, which reads the store once at `hash_rate` bytes/s (0: free).
    """
    one = size * 8 / link
    check = size / hash_rate if hash_rate > 0 else 0.0
    rounds = rounds_for(nodes)
    return {
        "single_source_s": nodes * one + check,
        "fan_out_rounds": rounds,
        "fan_out_s": rounds * (one + check),
        "one_transfer_s": one,
        "check_s": check,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy_control.fanout", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    est = sub.add_parser("estimate", help="transfer time to a fleet, from one source and by fan-out")
    est.add_argument("--nodes", type=int, required=True, help="nodes that lack the store")
    est.add_argument("--size", type=float, required=True, help="bytes of the store (12.5e9: the real model)")
    est.add_argument("--link", type=float, action="append", help="link speed in bit/s (repeat; default 1e9 and 1e10)")
    est.add_argument("--hash-rate", type=float, default=0.0, help="bytes/s of a node's arrival check (0: not counted)")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.size <= 0:
        parser.error("--nodes must be 1 or more and --size more than 0")
    print(f"{'link':>8} {'one transfer':>14} {'from one source':>16} {'fan-out rounds':>15} {'fan-out':>10}")
    for link in args.link or [1e9, 1e10]:
        e = estimate(args.nodes, args.size, link, hash_rate=args.hash_rate)
        print(
            f"{link / 1e9:>6g}G {_mmss(e['one_transfer_s']):>14} {_mmss(e['single_source_s']):>16}"
            f" {e['fan_out_rounds']:>15.0f} {_mmss(e['fan_out_s']):>10}"
        )
    return 0


def _mmss(seconds: float) -> str:
    minutes, secs = divmod(math.ceil(seconds), 60)
    return f"{minutes}:{secs:02d}"


if __name__ == "__main__":
    raise SystemExit(main())
