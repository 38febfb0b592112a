"""Energy for the daemon's jobs: the board's INA3221 rails integrated over time (Jetson), else the GPU's own counter."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from governor.backends.base import Gpu
from governor.backends.rails import CounterMeter, EnergyMeter, Rails
from governor.errors import BackendError

log = logging.getLogger("ftgovd")

POWER_CACHE_S = 0.02


class BoardEnergy:
    def __init__(self, rails: Rails | None):
        self.rails = rails
        self._power_cache: tuple[float, float] = (-1.0, 0.0)

    def total_mw(self) -> float:
        """Board power now (ENERGY_RAILS). Reused for POWER_CACHE_S: the INA3221 itself refreshes only every ~140 ms
        (update_interval), so a burst of registrations need not read eight files each."""
        if self.rails is None:
            return 0.0
        now = time.monotonic()
        if now - self._power_cache[0] < POWER_CACHE_S:
            return self._power_cache[1]
        try:
            mw = self.rails.total_mw(self.rails.read_mw())
        except BackendError as e:
            log.warning("cannot read the power rails: %s", e)
            return 0.0
        self._power_cache = (now, mw)
        return mw

    def new_meter(self, gpu: Gpu):
        """An energy meter from now: rails integrated over time (Jetson), else the GPU's own energy counter (NVML),
        else None. Feed it ``meter.add(time.monotonic(), self.total_mw())``; a counter meter ignores the power."""
        if self.rails is not None and self.rails.energy_rails:
            return EnergyMeter(time.monotonic(), self.total_mw(), self.rails.update_interval_s)
        if gpu.has_energy_counter:
            try:
                return CounterMeter(gpu.energy_j)
            except BackendError as e:
                log.info("GPU %s has no energy counter: %s", gpu.id, e)
        return None

    def source(self) -> str:
        if self.rails is not None:
            return "+".join(self.rails.energy_rails)
        return "GPU energy counter (whole GPU)"

    def sample(self, jobs: Iterable) -> None:
        """Integrate energy for the jobs given (their meters, and their tuners' own), at one power reading."""
        if self.rails is None:
            return
        meters = []
        for job in jobs:
            meters += [m for m in (job.meter, getattr(job.tuner, "meter", None))
                       if isinstance(m, EnergyMeter) and m not in meters]
        if not meters:
            return
        t, mw = time.monotonic(), self.total_mw()
        for meter in meters:
            meter.add(t, mw)

    @property
    def refresh_s(self) -> float | None:
        """How often the sampler reads the rails while jobs run: the INA3221's refresh (None: no rails to read)."""
        if self.rails is None or not self.rails.energy_rails:
            return None
        return self.rails.update_interval_s
