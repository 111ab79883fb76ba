"""glmdeploy.monitoring.gpu_exporter against NVML's own error codes: the real pynvml bindings (the version the
gpu-cu121 lock pins), their device calls replaced by cards that answer as a GeForce, a data-centre
card, a card that fell off the bus and a host without a driver would (no GPU here)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from glmdeploy.monitoring import gpu_exporter

ROOT = Path(__file__).resolve().parents[2]
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


class Card:
    """One GPU's answers; a field listed in `fails` raises NVMLError with that code."""

    def __init__(self, name: str, fails: dict[str, int] | None = None, throttle: int = 0) -> None:
        self.name, self.fails, self.throttle = name, fails or {}, throttle

    def answer(self, field: str, value: object) -> object:
        if field in self.fails:
            raise pynvml.NVMLError(self.fails[field])
        return value


def install(monkeypatch: pytest.MonkeyPatch, cards: list[Card], init_error: int | None = None) -> None:
    def init() -> None:
        if init_error is not None:
            raise pynvml.NVMLError(init_error)

    calls = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "550.54.15",
        "nvmlDeviceGetCount": lambda: len(cards),
        "nvmlDeviceGetHandleByIndex": lambda i: cards[i],
        "nvmlDeviceGetName": lambda c: c.answer("name", c.name),
        "nvmlDeviceGetUtilizationRates": lambda c: c.answer("utilization", SimpleNamespace(gpu=87, memory=40)),
        "nvmlDeviceGetMemoryInfo": lambda c: c.answer("memory", SimpleNamespace(used=20 << 30, total=24 << 30)),
        "nvmlDeviceGetTemperature": lambda c, _: c.answer("temperature", 71),
        "nvmlDeviceGetPowerUsage": lambda c: c.answer("power", 312_500),
        "nvmlDeviceGetEnforcedPowerLimit": lambda c: c.answer("power_limit", 450_000),
        "nvmlDeviceGetClockInfo": lambda c, kind: c.answer("clocks", 2520 if kind == pynvml.NVML_CLOCK_SM else 10501),
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda c: c.answer("throttle", c.throttle),
        "nvmlDeviceGetTotalEccErrors": lambda c, kind, _: c.answer("ecc", 2 if kind else 0),
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda c: c.answer("pcie", 4),
        "nvmlDeviceGetCurrPcieLinkWidth": lambda c: c.answer("pcie", 16),
    }
    for name, call in calls.items():
        monkeypatch.setattr(pynvml, name, call)


Samples = list[tuple[str, dict[str, str], float]]


def scrape() -> Samples:
    """One scrape as Prometheus would parse it."""
    registry = CollectorRegistry()
    registry.register(gpu_exporter.GpuCollector("gpu-node-01"))
    text = generate_latest(registry).decode()
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def series(got: Samples, name: str) -> list[tuple[dict[str, str], float]]:
    return [(labels, value) for n, labels, value in got if n == name]


def value(got: Samples, metric: str, **labels: str) -> float | None:
    """The one sample of `name` whose labels include `labels`; None when there is none."""
    found = [v for n, have, v in got if n == metric and labels.items() <= have.items()]
    assert len(found) <= 1, (metric, labels, found)
    return found[0] if found else None


RTX = {"node": "gpu-node-01", "gpu": "0", "name": "NVIDIA GeForce RTX 4090", "driver": "550.54.15"}


def test_geforce_ecc_is_reported_unsupported_never_as_zero(monkeypatch):
    install(monkeypatch, [Card("NVIDIA GeForce RTX 4090", {"ecc": NOT_SUPPORTED})])
    got = scrape()
    assert value(got, "glmdeploy_gpu_field_unsupported", **RTX, field="ecc_errors") == 1
    assert not series(got, "glmdeploy_gpu_ecc_errors"), "an unsupported field must have no value series"
    assert value(got, "glmdeploy_gpu_utilization_ratio", **RTX) == 0.87
    assert value(got, "glmdeploy_gpu_memory_used_bytes", **RTX) == 20 << 30
    assert value(got, "glmdeploy_gpu_power_draw_watts", **RTX) == 312.5
    assert value(got, "glmdeploy_gpu_sm_clock_hertz", **RTX) == 2520e6
    assert all(
        set(labels) >= {"node", "gpu", "name", "driver"}
        for n, labels, _ in got
        if n.startswith("glmdeploy_gpu_") and n != "glmdeploy_gpu_exporter_up"
    )


def test_a_function_the_driver_lacks_is_unsupported_too(monkeypatch):
    install(monkeypatch, [Card("NVIDIA GeForce RTX 4090", {"power_limit": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})])
    got = scrape()
    assert value(got, "glmdeploy_gpu_field_unsupported", **RTX, field="power_limit_watts") == 1
    assert value(got, "glmdeploy_gpu_power_draw_watts", **RTX) == 312.5


def test_other_nvml_errors_of_one_field_are_named_and_the_rest_is_read(monkeypatch):
    install(
        monkeypatch,
        [
            Card(
                "NVIDIA GeForce RTX 4090",
                {"temperature": pynvml.NVML_ERROR_NO_PERMISSION, "pcie": pynvml.NVML_ERROR_UNKNOWN},
            )
        ],
    )
    got = scrape()
    assert value(got, "glmdeploy_gpu_field_error", **RTX, field="temperature_celsius", error="NoPermission") == 1
    assert value(got, "glmdeploy_gpu_field_error", **RTX, field="pcie_link_width", error="Unknown") == 1
    assert not series(got, "glmdeploy_gpu_temperature_celsius") and not series(got, "glmdeploy_gpu_field_unsupported")
    assert value(got, "glmdeploy_gpu_memory_total_bytes", **RTX) == 24 << 30


def test_a_data_centre_card_reports_its_ecc_counts_by_type(monkeypatch):
    install(monkeypatch, [Card("NVIDIA A10")])
    got = scrape()
    assert value(got, "glmdeploy_gpu_ecc_errors", name="NVIDIA A10", type="uncorrected") == 2
    assert value(got, "glmdeploy_gpu_ecc_errors", name="NVIDIA A10", type="corrected") == 0
    assert not series(got, "glmdeploy_gpu_field_unsupported")


def test_a_lost_gpu_is_marked_and_the_next_gpu_is_still_read(monkeypatch):
    install(monkeypatch, [Card("NVIDIA L4", {"memory": pynvml.NVML_ERROR_GPU_IS_LOST}), Card("NVIDIA L4")])
    got = scrape()
    assert value(got, "glmdeploy_gpu_lost", gpu="0", name="NVIDIA L4") == 1
    assert value(got, "glmdeploy_gpu_lost", gpu="1", name="NVIDIA L4") == 0
    assert [labels["gpu"] for labels, _ in series(got, "glmdeploy_gpu_memory_used_bytes")] == ["1"]


def test_nvml_that_cannot_start_is_exporter_down_with_the_reason_not_a_crash(monkeypatch):
    install(monkeypatch, [], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    got = scrape()
    assert got == [("glmdeploy_gpu_exporter_up", {"node": "gpu-node-01", "error": "DriverNotLoaded"}, 0.0)]


def test_thermal_throttling_sets_its_named_reason_only(monkeypatch):
    install(monkeypatch, [Card("NVIDIA GeForce RTX 3090", throttle=pynvml.nvmlClocksThrottleReasonHwThermalSlowdown)])
    got = series(scrape(), "glmdeploy_gpu_throttle_reason")
    assert [labels["reason"] for labels, v in got if v == 1] == ["hw_thermal_slowdown"]
    assert len(got) == len(gpu_exporter.THROTTLE_REASONS)


def test_the_bindings_tested_here_are_the_versions_the_gpu_lock_pins():
    """The unit tests run in the reference environment: its NVML and Prometheus client must be the
    ones GPU nodes install, or these tests prove another version's behaviour."""
    from importlib.metadata import version

    lock = (ROOT / "constraints" / "gpu-cu121-py311.txt").read_text()
    for package in ("nvidia-ml-py", "prometheus-client"):
        pinned = re.search(rf"^{package}==(\S+)", lock, re.M)
        assert pinned and version(package) == pinned.group(1), (package, version(package))


def test_the_driver_problems_are_exported_each_as_0_or_1_and_read_again_only_after_the_interval(monkeypatch):
    """The driver's state read with this machine's own tools (no NVIDIA driver here: every problem 0),
    then a node whose next-boot kernel lost its module (recorded dkms output): 1 for that problem,
    but only once the reading interval has passed (dkms is too slow for every scrape)."""
    collector = gpu_exporter.DriverCollector("node-a", "libnvidia-ml1")
    registry = CollectorRegistry()
    registry.register(collector)

    def values() -> dict[str, float]:
        text = generate_latest(registry).decode()
        family = next(f for f in text_string_to_metric_families(text) if f.name == "glmdeploy_driver_problem")
        return {s.labels["problem"]: s.value for s in family.samples if s.labels["node"] == "node-a"}

    assert values() == dict.fromkeys(gpu_exporter.DRIVER_PROBLEMS, 0)
    dkms = (ROOT / "tests" / "unit" / "data" / "driver" / "dkms-3-installed.txt").read_text()
    broken = gpu_exporter.driver_state.DriverState(next_kernel="6.1.0-99-amd64", dkms_status=dkms)
    monkeypatch.setattr(gpu_exporter.driver_state, "read_state", lambda package: (broken, True))
    assert values()["next_boot_module"] == 0, "read again before the interval passed"
    collector.read_at -= gpu_exporter.DRIVER_EVERY
    assert values() == {"next_boot_module": 1, "version_mismatch": 0, "secure_boot": 0}
