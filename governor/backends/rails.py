"""INA3221 power rails through hwmon: discovery, power in mW, energy by integration over time.

Power of a rail = mV x mA / 1000. Channel 7 (sum of shunt voltages) is skipped, and so are unused channels: JetPack 5
labels them ``NC``, JetPack 6 gives them no label file (and fails reads of their inputs).

Which rails an energy figure adds up depends on the board (ENERGY_SUMS, first match wins): an Orin NX or Nano
module measures its input, VDD_IN, which is the total; an AGX Orin has no VDD_IN, so its figure is
VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0 (AGX_ENERGY_RAILS). VDDQ_VDD2_1V8AO is fed from VIN_SYS_5V0: adding it would
count that power twice.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections import deque
from pathlib import Path

from governor.errors import BackendError
from governor.policy.windows import NVML_COUNTER_UPDATE_S
from governor.sysfs import Root, read_int, read_text

log = logging.getLogger(__name__)

RAIL_GPU_SOC = "VDD_GPU_SOC"
RAIL_CPU_CV = "VDD_CPU_CV"
RAIL_SYS_5V0 = "VIN_SYS_5V0"
RAIL_VDDQ = "VDDQ_VDD2_1V8AO"
AGX_ORIN_RAILS = (RAIL_GPU_SOC, RAIL_CPU_CV, RAIL_SYS_5V0, RAIL_VDDQ)
AGX_ENERGY_RAILS = (RAIL_GPU_SOC, RAIL_CPU_CV, RAIL_SYS_5V0)
ENERGY_RAILS = AGX_ENERGY_RAILS  # the sum the energy model and the characterization data are defined by
RAIL_IN = "VDD_IN"  # Orin NX / Orin Nano: the module's input
RAIL_CPU_GPU_CV = "VDD_CPU_GPU_CV"
RAIL_SOC = "VDD_SOC"
NX_ORIN_RAILS = (RAIL_IN, RAIL_CPU_GPU_CV, RAIL_SOC)
# (rails, what the sum is): the first whose rails are all present is the board's energy figure.
ENERGY_SUMS = (
    ((RAIL_IN,), "the module's total input (Orin NX/Nano)"),
    (AGX_ENERGY_RAILS, "GPU+SoC, CPU and the 5 V system rail (AGX Orin)"),
)
HWMON_CLASS = "/sys/class/hwmon"
_CHANNEL = re.compile(r"in(\d+)_label$")


# The INA3221's hwmon update_interval assumed when no chip's update_interval file can be read: the sensor's average
# refreshes this often. 140 ms is unverified on a board (not in the sources we checked; docs/hardware.md): the chips'
# own file, read at discovery, wins.
DEFAULT_UPDATE_INTERVAL_S = 0.140


class Rails:
    """The board's labelled INA3221 channels: label -> (voltage file, current file). ``update_interval_s``: how often
    their readings refresh (each an average over that interval), from the chips' hwmon ``update_interval``."""

    def __init__(self, channels: dict[str, tuple[Path, Path]], update_interval_s: float = DEFAULT_UPDATE_INTERVAL_S):
        self.channels = channels
        self.update_interval_s = update_interval_s
        chosen = next(((rails, what) for rails, what in ENERGY_SUMS if all(r in channels for r in rails)), None)
        self.energy_rails: list[str] = list(chosen[0]) if chosen else []
        self.energy_sum = chosen[1] if chosen else None  # what energy_rails add up to, for the log

    @property
    def names(self) -> list[str]:
        return sorted(self.channels)

    def describe_energy(self) -> str:
        """One phrase for the start-up log: which sum job energy counts, or why there is none."""
        if not self.energy_rails:
            known = "; ".join("+".join(rails) for rails, _ in ENERGY_SUMS)
            return f"no known energy sum among these rails (known: {known}): job energy will be reported as null"
        return f"job energy counts {'+'.join(self.energy_rails)}: {self.energy_sum}"

    def read_mw(self) -> dict[str, float]:
        """Instantaneous power per rail, mW."""
        out = {}
        for label, (volt, curr) in self.channels.items():
            out[label] = read_int(volt) * read_int(curr) / 1000.0
        return out

    def total_mw(self, power_mw: dict[str, float]) -> float:
        return sum(power_mw[r] for r in self.energy_rails)


def discover(root: Root) -> Rails | None:
    """Find the INA3221 rails by scanning hwmon devices whose name is ina3221; None when the board has none."""
    class_dir = root.path(HWMON_CLASS)
    try:
        entries = sorted(os.listdir(class_dir))
    except OSError:
        return None
    channels: dict[str, tuple[Path, Path]] = {}
    intervals_s: list[float] = []
    for entry in entries:
        hwmon = root.resolve(class_dir / entry)
        try:
            if read_text(hwmon / "name") != "ina3221":
                continue
            files = os.listdir(hwmon)
        except (BackendError, OSError):
            continue
        if "update_interval" in files:
            try:
                intervals_s.append(read_int(hwmon / "update_interval") / 1000.0)
            except BackendError:
                pass  # unreadable: the driver's default is assumed
        for name in files:
            m = _CHANNEL.match(name)
            if not m or m.group(1) == "7":
                continue
            try:
                label = read_text(hwmon / name)
            except BackendError:
                continue  # listed, then gone or unreadable: not a channel to count
            ch = m.group(1)
            if not label or label == "NC" or label.startswith("NC_") or label.startswith("sum of"):
                continue
            volt, curr = hwmon / f"in{ch}_input", hwmon / f"curr{ch}_input"
            if volt.exists() and curr.exists():
                channels[label] = (volt, curr)
    if not channels:
        return None
    positive = [s for s in intervals_s if s > 0]
    return Rails(channels, max(positive) if positive else DEFAULT_UPDATE_INTERVAL_S)


class EnergyMeter:
    """Total power (ENERGY_RAILS, mW) integrated over time: joules since start. ``update_s``: how often the power read
    refreshes (the INA3221's update_interval); each reading is the mean power over the interval before its refresh,
    so it lags the power by about one interval.

    ``add``: a sample (the daemon's sampler and tick; a report of a client that sends no step_end_s), integrated
    (trapezoid) into ``energy_j`` and kept in ``samples``, the edges of windows. ``total_j``: a job's whole energy at
    its end, read then without adding a sample, with the readings' lag taken out: one interval at the power read now,
    less one at the power read at the start (at the end the sensor has yet to show the job's last interval; at the
    start it still showed the board before the job). A job's own meter takes only the sampler's samples: reads at
    the steps' ends see the readings of one part of a step more often than the rest, and integrated they bent a
    job's energy by up to 2% (steps of 0.2-0.7 s against a 140 ms average: governor.sim.meters).
    """

    KEEP_SAMPLES = 64  # the recent (time_s, energy_j) samples a tuner's windows take their edges from

    def __init__(self, t_s: float, total_mw: float, update_s: float = DEFAULT_UPDATE_INTERVAL_S):
        self.last_t_s, self.last_mw, self.energy_j = t_s, total_mw, 0.0
        self.start_mw = total_mw
        self.update_s = update_s
        self.samples: deque[tuple[float, float]] = deque(maxlen=self.KEEP_SAMPLES)

    def add(self, t_s: float, total_mw: float) -> float:
        dt = max(0.0, t_s - self.last_t_s)
        self.energy_j += dt * (self.last_mw + total_mw) / 2.0 / 1000.0
        self.last_t_s, self.last_mw = t_s, total_mw
        self.samples.append((t_s, self.energy_j))
        return self.energy_j

    def recent_j(self, max_age_s: float) -> float:
        """The integral so far (its last sample; reading nothing), as CounterMeter.recent_j."""
        return self.energy_j

    def last_read(self) -> tuple[float, float]:
        """(energy_j, monotonic s) as of the last sample, reading nothing, as CounterMeter.last_read."""
        return self.energy_j, self.last_t_s

    def total_j(self, t_s: float, total_mw: float) -> float:
        """The whole energy since start at ``t_s``, where the power reads ``total_mw``: the integral carried to now
        (not added), less the readings' lag."""
        since_j = max(0.0, t_s - self.last_t_s) * (self.last_mw + total_mw) / 2.0 / 1000.0
        return self.energy_j + since_j + self.update_s * (total_mw - self.start_mw) / 1000.0


# A GPU's energy counter moving faster than this is no GPU's power (an H200 board is 700 W, a GB200 superchip about
# 2.7 kW): over at least a second, so that a read just after one of NVML's 100 ms updates is never taken for one.
MAX_COUNTER_W = 10_000.0


class CounterReads:
    """One GPU's energy counter as every meter on it reads it, remembering the last read (J) and when (monotonic s):
    a read of NVML's counter costs milliseconds of CPU, so a figure that may be a little old takes the last one."""

    def __init__(self, read_j, what: str = "the energy counter"):
        self._read_j = read_j
        self.what = what
        self.last_j: float | None = None
        self.last_s = -math.inf
        # NVML's counter counts from the driver's load: one that reads less than before started again (a GPU reset;
        # unverified what a reset does to it). Its reads then go on from the last one (the offset), so that no
        # meter's difference goes below 0: a job's energy that did made its state file one no start could read, the
        # GPU's baseline with it. What ran between the last read and the restart is not counted.
        self._raw_j: float | None = None
        self._offset_j = 0.0
        self.restarts = 0
        self.jumps = 0
        # What the reads cost, in wall time (on an H200 a read took 8-10 ms of the process's CPU, of which the
        # calling thread's clock saw about half and the wall about all): the last read's, for the pace of a job's
        # reads, and all of them, for status (the reads' share of a core, scripts/daemon_cpu.py).
        self.last_cost_s = 0.0
        self.reads = 0
        self.read_s = 0.0

    def __call__(self) -> float:
        start_s = time.perf_counter()
        raw_j = self._read_j()
        self.last_cost_s = time.perf_counter() - start_s
        if self._raw_j is not None and self.last_j is not None and raw_j < self._raw_j:
            self._offset_j = self.last_j - raw_j
            self.restarts += 1
            (log.warning if self.restarts == 1 else log.debug)(
                "%s went back from %.1f J to %.1f J (started again: a GPU reset?): energy goes on from its last "
                "reading, and what ran since that reading is not counted", self.what, self._raw_j, raw_j)
        elif self._raw_j is not None and self.last_j is not None and (
                raw_j - self._raw_j > MAX_COUNTER_W * max(time.monotonic() - self.last_s, 1.0)):
            # More than any GPU board draws: a counter that jumped (a glitch, a driver's new origin), not energy.
            # Taken as energy it went whole into the job's energy and the window open across it: one level read
            # thousands of times dearer, or a baseline's saving near 100%. Dropped, as a restart is.
            self._offset_j = self.last_j - raw_j
            self.jumps += 1
            (log.warning if self.jumps == 1 else log.debug)(
                "%s jumped from %.1f J to %.1f J in %.1f s, above %g W: taken for a glitch, energy goes on from its "
                "last reading, and what ran since that reading is not counted", self.what, self._raw_j, raw_j,
                time.monotonic() - self.last_s, MAX_COUNTER_W)
        self._raw_j = raw_j
        self.last_j = raw_j + self._offset_j
        self.last_s = time.monotonic()
        self.reads += 1
        self.read_s += self.last_cost_s
        return self.last_j

    def recent_j(self, max_age_s: float) -> float:
        """The last read if it is at most ``max_age_s`` old, else a read now."""
        if self.last_j is None or time.monotonic() - self.last_s > max_age_s:
            return self()
        return self.last_j


class CounterMeter:
    """Energy from a hardware counter that already integrates (NVML's total energy, J): the difference since start.

    Same interface as EnergyMeter, so the daemon need not care which a job has; the power argument is unused.
    ``update_s``: how often the counter moves (NVML's: every 100 ms, holding between updates). ``read_j``: a
    CounterReads shared by the GPU's meters, or a plain function.
    """

    def __init__(self, read_j, update_s: float = NVML_COUNTER_UPDATE_S):
        self.read_j = read_j if isinstance(read_j, CounterReads) else CounterReads(read_j)
        self.update_s = update_s
        self.start_j = self.read_j()

    @property
    def energy_j(self) -> float:
        return self.read_j() - self.start_j

    def recent_j(self, max_age_s: float) -> float:
        """energy_j as of a read at most ``max_age_s`` old (any meter's on the GPU): for figures that may lag."""
        return self.read_j.recent_j(max_age_s) - self.start_j

    def last_read(self) -> tuple[float, float]:
        """(energy_j, monotonic s) as of the counter's last read (any meter's on the GPU, at least this meter's
        first), reading nothing: what stands for the energy where the counter cannot be read now."""
        assert self.read_j.last_j is not None, "the meter's start read the counter"
        return self.read_j.last_j - self.start_j, self.read_j.last_s

    def add(self, t_s: float, total_mw: float) -> float:
        return self.energy_j

    def total_j(self, t_s: float, total_mw: float) -> float:
        return self.energy_j
