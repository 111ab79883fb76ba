"""glmdeploy_control.fanout: holders double each round, the control node is the last source, estimates."""

from __future__ import annotations

import math

import pytest

from glmdeploy_control import fanout
from glmdeploy_control.fanout import CONTROL, Node


def nodes(count: int, store: str = "m-1", complete: int = 0, share: bool = True) -> list[Node]:
    return [Node(f"n{i:02d}", store, i < complete, share) for i in range(count)]


def test_eight_new_nodes_take_four_rounds_and_each_holder_sends_once_a_round():
    got = fanout.plan(nodes(8))
    assert got["rounds"] == 4 == math.ceil(math.log2(8 + 1))
    by_round: dict[int, list[str]] = {}
    for name, step in got["hosts"].items():
        by_round.setdefault(step["round"], []).append(name)
    assert [len(by_round[r]) for r in range(4)] == [1, 2, 4, 1]
    held = {CONTROL}
    for r in range(4):
        sources = [got["hosts"][name]["from"] for name in by_round[r]]
        assert set(sources) <= held and len(sources) == len(set(sources)), (r, sources)
        held |= set(by_round[r])
    control_rounds = [got["hosts"][name]["round"] for name in got["serves"][CONTROL]]
    assert control_rounds == sorted(set(control_rounds)) and len(control_rounds) == 3  # once a round at most
    assert got["hosts"]["n07"]["from"] != CONTROL  # the last round's one node comes from a node


def test_nodes_that_hold_the_store_serve_first_and_are_not_sent_it():
    got = fanout.plan(nodes(4, complete=2))
    assert set(got["hosts"]) == {"n02", "n03"} and got["rounds"] == 1
    assert {got["hosts"]["n02"]["from"], got["hosts"]["n03"]["from"]} == {"n00", "n01"}
    assert CONTROL not in got["serves"]


def test_a_node_that_cannot_share_receives_but_never_sends():
    got = fanout.plan(nodes(3, share=False))
    assert all(step["from"] == CONTROL for step in got["hosts"].values()) and got["rounds"] == 3


def test_each_store_has_its_own_tree():
    got = fanout.plan([*nodes(2, "cpu-model"), Node("g1", "gpu-model", False, True)])
    assert got["hosts"]["g1"] == {"round": 0, "from": CONTROL}
    assert got["hosts"]["n01"]["from"] in {"n00", CONTROL}


def test_nothing_to_send_is_zero_rounds():
    assert fanout.plan(nodes(5, complete=5)) == {"rounds": 0, "hosts": {}, "serves": {}}


def test_fifty_nodes_over_1_gbe_fan_out_in_six_rounds_instead_of_fifty_transfers():
    e = fanout.estimate(50, 12.5e9, 1e9)
    assert e["one_transfer_s"] == pytest.approx(100.0)
    assert e["single_source_s"] == pytest.approx(5000.0) and e["fan_out_rounds"] == 6
    assert e["fan_out_s"] == pytest.approx(600.0)


def test_an_arrival_check_is_paid_once_a_round_by_fan_out_and_once_by_a_single_source():
    e = fanout.estimate(50, 12.5e9, 1e10, hash_rate=1.25e9)
    assert e["check_s"] == pytest.approx(10.0)
    assert e["fan_out_s"] == pytest.approx(6 * (10.0 + 10.0)) and e["single_source_s"] == pytest.approx(500.0 + 10.0)


def test_estimate_cli_prints_both_links(capsys):
    assert fanout.main(["estimate", "--nodes", "50", "--size", "12.5e9"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:5] == ["1G", "1:40", "83:20", "6", "10:00"]
    assert out[2].split()[:5] == ["10G", "0:10", "8:20", "6", "1:00"]


def test_a_holder_that_does_not_want_the_store_still_serves_and_is_not_sent_it():
    got = fanout.plan([Node("old", "pack", True, True, wanted=False), Node("new", "pack", False, True)])
    assert got["hosts"] == {"new": {"round": 0, "from": "old"}}
    assert fanout.plan([Node("skip", "pack", False, True, wanted=False)])["rounds"] == 0
