"""The simulated Orin as characterization sees it: a GPU whose clock can be pinned, and a workload that runs steps.

Both keep simulated time: running a thousand steps of a 1 B model takes milliseconds, not hours. The GPU honours the
same snapshot/pin/restore protocol as the devfreq backend, so the characterization loop is the one that runs on a
board; "MAXN" is the baseline limits restored (the full range under the load-following governor).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from governor.backends.base import Limits, Reading
from governor.errors import PinError
from governor.pipeline.measure import SettingMeasurement
from governor.sim.energy import OrinEnergyModel, Workload


class SimulatedGpu:
    """An in-memory Orin GPU: limits only, no sysfs (the daemon's simulated tree lives in governor.sim.tree)."""

    id = "0"

    def __init__(self, levels_hz: tuple[int, ...]):
        self.levels_hz = tuple(levels_hz)
        self._limits = Limits(self.levels_hz[0], self.levels_hz[-1])

    def describe(self) -> dict:
        return {"backend": "simulated", "levels_hz": list(self.levels_hz)}

    def snapshot(self) -> Limits:
        return self._limits

    def pin(self, freq_hz: int) -> None:
        if freq_hz not in self.levels_hz:
            raise PinError(f"{freq_hz} Hz is not a level of the simulated GPU")
        self._limits = Limits(freq_hz, freq_hz)

    def restore(self, limits: Limits) -> None:
        self._limits = limits

    def read(self) -> Reading:
        cur = self._limits.max_hz if self.pinned_hz() is not None else None
        return Reading(self._limits.min_hz, self._limits.max_hz, cur, None)

    def pinned_hz(self) -> int | None:
        """The pinned clock, or None when the governor is free to move (MAXN)."""
        return self._limits.min_hz if self._limits.min_hz == self._limits.max_hz else None


@dataclass
class SimulatedRunner:
    """Runs a workload's steps on the energy model at whatever clock the simulated GPU holds.

    Each measurement gets its own noise stream, seeded from (seed, workload, clock): a resumed characterization
    produces the same rows as one that was never interrupted.
    """

    workload: Workload
    gpu: SimulatedGpu
    seed: int = 0
    noise: float = 0.0

    def run(self, steps: int, warmup: int = 0) -> SettingMeasurement:
        freq_hz = self.gpu.pinned_hz()
        model = OrinEnergyModel(noise=self.noise, seed=cell_seed(self.seed, self.workload.name, freq_hz),
                                levels_hz=self.gpu.levels_hz)
        for _ in range(warmup):
            model.step(self.workload, freq_hz)
        m = SettingMeasurement.start()
        for _ in range(steps):
            s = model.step(self.workload, freq_hz)
            m.add_interval(s.time_s, s.rails_mw, s.gpu_util_pct, s.mean_freq_hz)
        m.steps = steps
        return m


def cell_seed(seed: int, workload: str, freq_hz: int | None) -> int:
    """A stable per-measurement seed (crc32, not hash(): Python salts str hashes per process)."""
    return zlib.crc32(f"{seed}/{workload}/{freq_hz or 'maxn'}".encode())
