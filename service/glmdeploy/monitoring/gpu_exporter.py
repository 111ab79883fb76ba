"""This node's GPUs for Prometheus, read through NVML on every scrape, on every card NVIDIA makes.

Why the kit's own: DCGM's exporter gives no profiling metrics on GeForce cards (RTX 4090/3090),
the cards many labs serve from. NVML itself answers on them, except for what a card lacks
(ECC memory on GeForce, some clocks or power readings on others): NVML then returns
NOT_SUPPORTED (or the driver lacks the function). Such a field is exported as
`glmdeploy_gpu_field_unsupported{field=...} 1` and its value series is left out: never a zero
that reads as "no errors", and never a crash that loses the other fields. Any other NVML error
of one field is `glmdeploy_gpu_field_error{field, error}`; a GPU that fell off the bus is
`glmdeploy_gpu_lost 1`; NVML that cannot start (no driver) is `glmdeploy_gpu_exporter_up 0`.

Every GPU series carries node, gpu (the index), name and driver labels.

The driver's own state beside the GPUs: `glmdeploy_driver_problem{node, problem}` is 1 while the
kernel the node boots next has no installed module (next_boot_module), the loaded module and the
libraries differ (version_mismatch), or Secure Boot would keep the module out (secure_boot), else
0; read with the node's own tools (glmdeploy.monitoring.driver_state, the code `make verify` runs)
at most every DRIVER_EVERY seconds, since `dkms status` is too slow for every scrape.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pynvml
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily

from glmdeploy.monitoring import driver_state

# NVML's codes for "this card or driver does not have it": reported as unsupported.
UNSUPPORTED = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
LABELS = ["node", "gpu", "name", "driver"]
DRIVER_PROBLEMS = ("next_boot_module", "version_mismatch", "secure_boot")
DRIVER_EVERY = 300.0

# The bits of nvmlDeviceGetCurrentClocksThrottleReasons, named as nvidia-smi names them.
THROTTLE_REASONS = {
    "gpu_idle": pynvml.nvmlClocksThrottleReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksThrottleReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksThrottleReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksThrottleReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksThrottleReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksThrottleReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksThrottleReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown,
}


@dataclass
class Reading:
    """One scrape's values of one GPU: name -> (help, [(extra labels, value)]), plus the fields it lacks."""

    values: dict[str, tuple[str, list[tuple[dict[str, str], float]]]] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)

    def read(self, name: str, help_text: str, getter: Callable[[], list[tuple[dict[str, str], float]]]) -> None:
        """Read one field; NVML's refusal becomes `unsupported` or `errors`, never a value."""
        try:
            samples = getter()
        except pynvml.NVMLError as exc:
            if exc.value in UNSUPPORTED:
                self.unsupported.append(name)
            elif exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise
            else:
                self.errors.append((name, type(exc).__name__.removeprefix("NVMLError_")))
            return
        self.values[name] = (help_text, samples)


def one(value: float) -> list[tuple[dict[str, str], float]]:
    return [({}, float(value))]


def read_gpu(handle: Any) -> Reading:
    """Every field of one GPU; GpuIsLost propagates (the caller marks the GPU lost)."""
    r = Reading()
    r.read(
        "utilization_ratio",
        "GPU busy fraction over NVML's last sample period",
        lambda: one(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100),
    )
    r.read(
        "memory_utilization_ratio",
        "Memory controller busy fraction",
        lambda: one(pynvml.nvmlDeviceGetUtilizationRates(handle).memory / 100),
    )
    r.read("memory_used_bytes", "GPU memory used", lambda: one(pynvml.nvmlDeviceGetMemoryInfo(handle).used))
    r.read("memory_total_bytes", "GPU memory total", lambda: one(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
    r.read(
        "temperature_celsius",
        "GPU core temperature",
        lambda: one(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
    )
    r.read("power_draw_watts", "Power draw", lambda: one(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000))
    r.read(
        "power_limit_watts", "Enforced power limit", lambda: one(pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000)
    )
    r.read("sm_clock_hertz", "SM clock", lambda: one(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) * 1e6))
    r.read(
        "memory_clock_hertz",
        "Memory clock",
        lambda: one(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM) * 1e6),
    )
    r.read("throttle_reason", "1 while the clocks are held down for this reason", lambda: throttle(handle))
    r.read("ecc_errors", "ECC errors since the driver loaded (volatile)", lambda: ecc(handle))
    r.read(
        "pcie_link_generation",
        "Current PCIe link generation",
        lambda: one(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
    )
    r.read(
        "pcie_link_width", "Current PCIe link width (lanes)", lambda: one(pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle))
    )
    return r


def throttle(handle: Any) -> list[tuple[dict[str, str], float]]:
    mask = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
    return [({"reason": reason}, 1.0 if mask & bit else 0.0) for reason, bit in THROTTLE_REASONS.items()]


def ecc(handle: Any) -> list[tuple[dict[str, str], float]]:
    kinds = {
        "corrected": pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
        "uncorrected": pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    }
    return [
        ({"type": kind}, float(pynvml.nvmlDeviceGetTotalEccErrors(handle, code, pynvml.NVML_VOLATILE_ECC)))
        for kind, code in kinds.items()
    ]


def text(value: str | bytes) -> str:
    """NVML strings: bytes from older bindings, str from newer."""
    return value.decode() if isinstance(value, bytes) else value


class GpuCollector:
    """Reads NVML at scrape time: the values are as fresh as the scrape, and nothing runs between."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.lock = threading.Lock()  # NVML handles are shared; scrapes may overlap

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.lock:
            yield from self._collect()

    def _collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "glmdeploy_gpu_exporter_up", "1 when NVML answered this scrape", labels=["node", "error"]
        )
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            up.add_metric([self.node, type(exc).__name__.removeprefix("NVMLError_")], 0)
            yield up
            return
        try:
            up.add_metric([self.node, ""], 1)
            yield up
            yield from self._gpus(text(pynvml.nvmlSystemGetDriverVersion()))
        finally:
            pynvml.nvmlShutdown()

    def _gpus(self, driver: str) -> Iterator[GaugeMetricFamily]:
        families: dict[str, GaugeMetricFamily] = {}
        lost = GaugeMetricFamily("glmdeploy_gpu_lost", "1 when NVML says the GPU fell off the bus", labels=LABELS)
        unsupported = GaugeMetricFamily(
            "glmdeploy_gpu_field_unsupported",
            "1 for each field this card or driver does not have",
            labels=[*LABELS, "field"],
        )
        errors = GaugeMetricFamily(
            "glmdeploy_gpu_field_error", "1 for each field NVML failed to read", labels=[*LABELS, "field", "error"]
        )
        for index in range(pynvml.nvmlDeviceGetCount()):
            base = [self.node, str(index), "", driver]
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                base[2] = text(pynvml.nvmlDeviceGetName(handle))
                reading = read_gpu(handle)
            except pynvml.NVMLError as exc:  # of read_gpu: only GpuIsLost gets through
                if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    lost.add_metric(base, 1)
                else:
                    errors.add_metric([*base, "device", type(exc).__name__.removeprefix("NVMLError_")], 1)
                continue
            lost.add_metric(base, 0)
            for name, (help_text, samples) in reading.values.items():
                for extra, value in samples:
                    if name not in families:
                        families[name] = GaugeMetricFamily(f"glmdeploy_gpu_{name}", help_text, labels=[*LABELS, *extra])
                    families[name].add_metric([*base, *extra.values()], value)
            for name in reading.unsupported:
                unsupported.add_metric([*base, name], 1)
            for name, error in reading.errors:
                errors.add_metric([*base, name, error], 1)
        yield lost
        yield unsupported
        yield errors
        yield from families.values()


class DriverCollector:
    """The driver's problems (driver_state.problems), read again once DRIVER_EVERY has passed."""

    def __init__(self, node: str, library_package: str) -> None:
        self.node, self.library_package = node, library_package
        self.lock = threading.Lock()
        self.read_at, self.kinds = float("-inf"), set[str]()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.lock:
            if time.monotonic() - self.read_at >= DRIVER_EVERY:
                state, _ = driver_state.read_state(self.library_package)
                self.kinds = {kind for kind, _ in driver_state.problems(state)}
                self.read_at = time.monotonic()
            family = GaugeMetricFamily(
                "glmdeploy_driver_problem",
                "1 while the driver would fail: no module for the next boot, module/library mismatch, Secure Boot",
                labels=["node", "problem"],
            )
            for kind in DRIVER_PROBLEMS:
                family.add_metric([self.node, kind], 1 if kind in self.kinds else 0)
            yield family


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glmdeploy-gpu-exporter", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1", help="address /metrics listens on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, required=True, help="port /metrics listens on")
    parser.add_argument("--node", default=socket.gethostname(), help="the node label (default: the host name)")
    parser.add_argument(
        "--driver-library-package",
        default="",
        help="the package whose version is the driver libraries' (the registry's [kit.apt] driver_libraries; "
        "none: the version mismatch is not checked)",
    )
    args = parser.parse_args(argv)
    registry = CollectorRegistry()
    registry.register(GpuCollector(args.node))
    registry.register(DriverCollector(args.node, args.driver_library_package))
    start_http_server(args.port, addr=args.listen, registry=registry)
    print(f"GPU metrics of {args.node} on {args.listen}:{args.port}", flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
