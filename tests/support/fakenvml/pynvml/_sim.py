"""The simulated GPUs behind the fake pynvml: state a test can configure and inspect.

A small physical picture, enough for a backend to be tested honestly: each GPU has a table of supported clocks per
memory clock, a locked-clock range (or none), a power limit with constraints, a utilization the test sets, and an
energy counter that integrates power over the system's clock. The clock the GPU runs at follows the lock, the load and
the power limit the way a datacenter GPU does (within reason; the exponents are invented, not measured).

The energy counter and the power reading report as a real H200's do (governor.sim.meters, calibrated on real NVML
traces): they move only at update instants ``meter_update_s`` (100 ms) apart and hold between them, the power being
the mean over the last period. ``meter_update_s`` 0 makes both exact, for tests that check energy arithmetic.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from governor.sim.meters import (
    NVML_UPDATE_JITTER_S,
    NVML_UPDATE_S,
    PowerTrace,
    UpdateClock,
    averaged_power_w,
    held_energy_j,
)

# Values quoted from NVIDIA's specifications where known; the H200 graphics table (345..1980 MHz in 15 MHz steps, 110
# clocks, memory 3201 MHz) is the one scripts/nvml_observe.py read off a real H200 (docs/nvml-observe/run.json).
H200_GRAPHICS_MHZ = tuple(range(1980, 344, -15))
H200_MEMORY_MHZ = (3201,)


class ManualClock:
    """A clock the test advances by hand, so energy figures are exact."""

    def __init__(self, start_s: float = 1000.0):
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@dataclass
class FakeGpu:
    index: int
    uuid: str
    name: str = "NVIDIA H200"
    memory_clocks_mhz: tuple[int, ...] = H200_MEMORY_MHZ
    # graphics clocks per memory clock, descending as NVML returns them; None: every memory clock gets the H200 table
    graphics_clocks_mhz: dict[int, tuple[int, ...]] | None = None
    idle_clock_mhz: int = 345
    util_gpu_pct: int = 0
    util_memory_pct: int = 0
    # A loop that starts when a test says so: util_busy_from_path names a file that holds its start (CLOCK_MONOTONIC
    # s, shared by the host's processes; no file yet: not started). GetUtilizationRates then reads the share of its
    # last util_period_s in which the loop ran, as a real one reads the share of its sample period ("between 1 second
    # and 1/6 second"). Only the reading: power and clock follow util_gpu_pct throughout. None: always busy.
    util_busy_from_path: str | None = None
    util_period_s: float = 1.0
    idle_power_mw: int = 90_000
    max_power_mw: int = 650_000  # at the top clock and 100% utilization
    power_limit_mw: int = 700_000
    default_power_limit_mw: int = 700_000
    power_limit_range_mw: tuple[int, int] = (200_000, 700_000)
    supports_locking: bool = True  # False: Set/ResetGpuLockedClocks answer NOT_SUPPORTED (pre-Volta, some boards)
    supports_energy: bool = True  # False: GetTotalEnergyConsumption answers NOT_SUPPORTED (pre-Volta)
    supports_power_limit: bool = True
    ignores_lock: bool = False  # the call succeeds but the clock does not follow (a broken driver, another tool)
    locked_mhz: tuple[int, int] | None = None
    energy_mj: float = 0.0  # the true energy, integrated at every state change and read
    last_update_s: float | None = None
    lost: bool = False  # every call answers GPU_IS_LOST
    # The driver's minor number, its device file's (/dev/nvidiaN): None, the index (usual); it need not be (a host
    # whose PCI probe order differs from NVML's enumeration). -1: GetMinorNumber answers NOT_SUPPORTED.
    minor_number: int | None = None
    # MIG mode on: GetUtilizationRates answers NOT_SUPPORTED for the whole GPU (nvitop issue #5: no GPU utilization on
    # MIG-enabled devices, from NVML or nvidia-smi); clocks, power and the energy counter stay the whole GPU's.
    mig_mode: bool = False
    meter_update_s: float = NVML_UPDATE_S  # the counter's and the power reading's update period; 0: exact
    meter_jitter_s: float = NVML_UPDATE_JITTER_S
    trace: PowerTrace | None = field(default=None, repr=False)  # the true power since the first settle
    trace_origin_mj: float = field(default=0.0, repr=False)  # energy_mj when the trace began

    def meter_clock(self) -> UpdateClock:
        return UpdateClock(self.meter_update_s, self.meter_jitter_s if self.meter_update_s > 0 else 0.0,
                           seed=self.index)

    def counter_mj(self) -> int:
        """What nvmlDeviceGetTotalEnergyConsumption reads (after a settle): the energy at the last update."""
        if self.trace is None:
            return int(self.energy_mj)
        return int(self.trace_origin_mj + 1000.0 * held_energy_j(self.trace, self.meter_clock(), self.trace.end_s))

    def reported_power_mw(self) -> float:
        """What nvmlDeviceGetPowerUsage reads (after a settle): the mean over the last update period."""
        if self.trace is None or self.meter_update_s <= 0:
            return self.power_mw()
        return 1000.0 * averaged_power_w(self.trace, self.meter_clock(), self.trace.end_s)

    def graphics_table(self, memory_mhz: int) -> tuple[int, ...] | None:
        if memory_mhz not in self.memory_clocks_mhz:
            return None
        if self.graphics_clocks_mhz is None:
            return H200_GRAPHICS_MHZ
        return tuple(self.graphics_clocks_mhz.get(memory_mhz, ()))

    @property
    def top_clock_mhz(self) -> int:
        return max(self.graphics_table(max(self.memory_clocks_mhz)) or (self.idle_clock_mhz,))

    def utilization_read_pct(self, now_s: float) -> int:
        """What GetUtilizationRates reads now: util_gpu_pct over the part of the last sample period the loop ran."""
        if self.util_busy_from_path is None:
            return self.util_gpu_pct
        try:
            busy_from_s = float(Path(self.util_busy_from_path).read_text())
        except FileNotFoundError:
            return 0
        ran = min(1.0, max(0.0, (now_s - busy_from_s) / self.util_period_s))
        return round(self.util_gpu_pct * ran)

    def power_at_mw(self, clock_mhz: int) -> float:
        dynamic = (self.max_power_mw - self.idle_power_mw) * (self.util_gpu_pct / 100.0)
        return self.idle_power_mw + dynamic * (clock_mhz / self.top_clock_mhz) ** 2

    def clock_and_reasons(self) -> tuple[int, set[str]]:
        """The graphics clock now and why it is not at the top (names of nvmlClocksEventReason* bits)."""
        reasons: set[str] = set()
        lock = None if self.ignores_lock else self.locked_mhz
        if self.util_gpu_pct == 0:
            reasons.add("GpuIdle")
            clock = lock[0] if lock else self.idle_clock_mhz
        else:
            clock = lock[1] if lock else self.top_clock_mhz
        if lock:
            reasons.add("ApplicationsClocksSetting")
        table = sorted(self.graphics_table(max(self.memory_clocks_mhz)) or ())
        while self.power_at_mw(clock) > self.power_limit_mw:
            lower = [c for c in table if c < clock]
            if not lower:
                break
            clock = lower[-1]
            reasons.add("SwPowerCap")
        return clock, reasons

    def power_mw(self) -> float:
        return self.power_at_mw(self.clock_and_reasons()[0])


@dataclass
class FakeSystem:
    gpus: list[FakeGpu] = field(default_factory=list)
    root: bool = True  # False: every Set*/Reset* answers NO_PERMISSION, as for a non-root user
    driver_loaded: bool = True  # False: nvmlInit answers DRIVER_NOT_LOADED
    library_found: bool = True  # False: nvmlInit answers LIBRARY_NOT_FOUND (no libnvidia-ml.so.1)
    driver_version: str = "570.00.fake"
    # False: a driver older than R535, whose libnvidia-ml.so has no nvmlDeviceGetCurrentClocksEventReasons (the older
    # ...ThrottleReasons only): pynvml then raises NVMLError(FUNCTION_NOT_FOUND) for it (leptonai/gpud PR #48).
    clock_events_api: bool = True
    # True: strings come back as bytes (UUID, name, driver version), as from the legacy `pynvml` package
    # (gpuopenanalytics/pynvml 11.4.1, shipped in NGC PyTorch containers), whose pynvml/ package shadows nvidia-ml-py's
    # pynvml.py when both are installed (vllm-project/vllm#7649, huggingface/optimum-benchmark#240). nvidia-ml-py
    # decodes them (its convertStrBytes).
    legacy_bytes: bool = False
    clock: Callable[[], float] = time.monotonic
    init_count: int = 0
    calls: list[str] = field(default_factory=list)  # every API function called, in order
    log_path: str | None = None  # also append each call's name to this file (for tests of other processes)
    # Faults a test brings on while another process (the daemon) runs: a JSON file, read at every call, of
    # {"system": {FN: CODE, "hang_s": {FN: S}}, "gpus": {"INDEX": {FN: CODE, "energy_offset_mj": MJ, "hang_s":
    # {FN: S}}}}. FN is an API function's name, or "*" for every call that names the GPU (15, GPU_IS_LOST: what a GPU
    # off the bus, Xid 79, answers); CODE an NVML error code that call then answers. energy_offset_mj is added to the
    # GPU's energy counter (never below 0: a counter that restarts, as after a GPU reset); hang_s makes the call (FN,
    # or "*": every call; under "system": any call, nvmlInit's included) block that long first (a GPU off the bus,
    # a driver that does not answer). No file: no faults.
    faults_path: str | None = None
    current: str = ""  # the API function being called (for its faults)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def faults(self, index: int | None = None) -> dict:
        """The faults file's part for the system (index None) or one GPU, as it reads now."""
        if not self.faults_path:
            return {}
        try:
            faults = json.loads(Path(self.faults_path).read_text())
        except FileNotFoundError:
            return {}
        return faults.get("system", {}) if index is None else faults.get("gpus", {}).get(str(index), {})

    def record(self, name: str) -> None:
        self.current = name
        self.calls.append(name)
        if self.log_path:
            with open(self.log_path, "a") as f:
                f.write(name + "\n")

    def settle(self, gpu: FakeGpu) -> None:
        """Integrate the GPU's energy counter up to now at the power of its state so far (before a state change)."""
        now = self.clock()
        if gpu.trace is None:
            gpu.trace = PowerTrace(now, keep_s=2.0)
            gpu.trace_origin_mj = gpu.energy_mj
        if gpu.last_update_s is not None and now > gpu.last_update_s:
            gpu.energy_mj += gpu.power_mw() * (now - gpu.last_update_s)  # mW x s = mJ
            gpu.trace.append(now - gpu.last_update_s, gpu.power_mw() / 1000.0)
        gpu.last_update_s = now

    def set_utilization(self, index: int, gpu_pct: int, memory_pct: int = 0) -> None:
        """Change a GPU's load (as a workload starting or stopping would), keeping its energy counter exact."""
        with self.lock:
            gpu = self.gpus[index]
            self.settle(gpu)
            gpu.util_gpu_pct, gpu.util_memory_pct = gpu_pct, memory_pct

    def writes(self) -> list[str]:
        """The calls that would have changed a real GPU's settings."""
        return [name for name in self.calls if name.startswith(("nvmlDeviceSet", "nvmlDeviceReset"))]


def default_gpus(count: int = 2) -> list[FakeGpu]:
    return [FakeGpu(index=i, uuid=f"GPU-{i:08x}-5a1e-4e55-9a3d-00000000f00{i}") for i in range(count)]


def system_from_config(config: dict) -> FakeSystem:
    """A FakeSystem from plain data (what FAKENVML_CONFIG's JSON file holds), so another process can be given one."""
    gpus = []
    for i, spec in enumerate(config.get("gpus", [{}, {}])):
        spec = dict(spec)
        spec.setdefault("index", i)
        spec.setdefault("uuid", f"GPU-{i:08x}-5a1e-4e55-9a3d-00000000f00{i}")
        if "memory_clocks_mhz" in spec:
            spec["memory_clocks_mhz"] = tuple(spec["memory_clocks_mhz"])
        if "graphics_clocks_mhz" in spec:
            spec["graphics_clocks_mhz"] = {int(k): tuple(v) for k, v in spec["graphics_clocks_mhz"].items()}
        if "power_limit_range_mw" in spec:
            spec["power_limit_range_mw"] = tuple(spec["power_limit_range_mw"])
        if spec.get("locked_mhz") is not None:
            spec["locked_mhz"] = tuple(spec["locked_mhz"])
        gpus.append(FakeGpu(**spec))
    system = FakeSystem(gpus=gpus)
    for key in ("root", "driver_loaded", "library_found", "driver_version", "log_path", "clock_events_api",
                "faults_path", "legacy_bytes"):
        if key in config:
            setattr(system, key, config[key])
    return system


def system_from_environment() -> FakeSystem:
    """FAKENVML_CONFIG names a JSON file describing the system; FAKENVML_LOG a file that receives every call's name."""
    path = os.environ.get("FAKENVML_CONFIG")
    config: dict = {}
    if path:
        with open(path) as f:
            config = json.load(f)
    system = system_from_config(config)
    if os.environ.get("FAKENVML_LOG"):
        system.log_path = os.environ["FAKENVML_LOG"]
    return system
