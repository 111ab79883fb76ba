"""glmdeploy.tools.soak: windows, the memory slope and the verdict against the gates."""

from __future__ import annotations

import argparse

import pytest

from glmdeploy.tools import soak


def _samples(mb_at, seconds: int = 180, every: int = 2) -> list[soak.Sample]:
    return [soak.Sample(float(t), mb_at(t), None) for t in range(0, seconds + 1, every)]


def _requests(seconds: int = 180, ttft_at=lambda t: 0.2, every: int = 3) -> list[tuple[float, float | None, int, str]]:
    return [(float(t), ttft_at(t), 64, "") for t in range(1, seconds, every)]


def test_a_flat_server_passes_every_gate():
    samples = _samples(lambda t: 2000.0 + (5.0 if t % 4 else 0.0))  # noise, no growth
    judged = soak.verdict(_requests(), samples, 30, 180, soak.Gates())
    assert [g["passed"] for g in judged] == [True, True, True], judged


def test_a_leaking_server_fails_the_memory_gate_with_its_slope():
    """20 MB a minute is 1,200 MB an hour: named with the measured slope and the limit."""
    samples = _samples(lambda t: 2000.0 + t / 3)
    judged = {g["gate"]: g for g in soak.verdict(_requests(), samples, 30, 180, soak.Gates())}
    memory = judged["memory slope (MB/h)"]
    assert not memory["passed"] and 1150 < memory["value"] < 1250 and memory["limit"] == soak.Gates.memory_mb_per_h


def test_warm_up_growth_in_the_first_window_is_not_a_leak():
    samples = _samples(lambda t: 1000.0 + min(t, 30) * 20)  # +600 MB while warming up, flat after
    assert soak.memory_slope_mb_per_h(samples, after_s=30) == 0.0


def test_failed_requests_and_a_slower_last_third_fail_their_gates():
    requests = [*_requests(ttft_at=lambda t: 0.2 if t < 130 else 0.5), (100.0, None, 0, "HTTP 500")]
    samples = _samples(lambda t: 2000.0)
    judged = {g["gate"]: g for g in soak.verdict(requests, samples, 30, 180, soak.Gates())}
    assert judged["failed requests"]["value"] == 1 and not judged["failed requests"]["passed"]
    assert judged["TTFT p95 drift"]["value"] == 1.5 and not judged["TTFT p95 drift"]["passed"]
    assert judged["TTFT p95 drift"]["detail"] == "p95 200.0 ms in the first third, 500.0 ms in the last"


def test_a_single_slow_window_within_a_third_does_not_fail_the_drift_gate():
    """A busy moment (another job on the machine) is a few requests of a third's dozens."""
    requests = _requests(ttft_at=lambda t: 2.0 if 150 <= t < 152 else 0.2, every=1)
    judged = {g["gate"]: g for g in soak.verdict(requests, _samples(lambda t: 2000.0), 30, 180, soak.Gates())}
    assert judged["TTFT p95 drift"]["passed"], judged["TTFT p95 drift"]


def test_memory_not_measured_is_said_and_does_not_pass():
    samples = [soak.Sample(float(t), None, None) for t in range(0, 181, 2)]
    judged = {g["gate"]: g for g in soak.verdict(_requests(), samples, 30, 180, soak.Gates())}
    assert not judged["memory slope (MB/h)"]["passed"] and "not measured" in judged["memory slope (MB/h)"]["value"]


def test_requests_still_running_at_the_end_count_in_the_last_window():
    wins = soak.windows([(179.0, 0.1, 8, ""), (185.0, 0.1, 8, "")], [], 30, 180)
    assert len(wins) == 6 and wins[-1].requests == 2


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("3m", 180), ("72h", 259200)])
def test_durations_read_as_people_write_them(text, seconds):
    assert soak.parse_duration(text) == seconds


def test_a_duration_without_unit_sense_is_refused_naming_the_form():
    with pytest.raises(argparse.ArgumentTypeError, match=r"write e\.g\. 90s, 3m or 72h"):
        soak.parse_duration("three minutes")
