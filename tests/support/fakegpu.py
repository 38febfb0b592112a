"""An in-memory GPU for pure tests of the daemon's pin logic: its limits are what was last pinned or restored."""

from __future__ import annotations

from governor.backends.base import GpuBase, Limits, Reading


class LimitsGpu(GpuBase):
    """Keeps its limits in memory; reads them back with the clock at the max and 50% load; every pin holds.
    Subclasses set ``levels_hz`` and ``limits``."""

    id = "0"
    limits: Limits

    def snapshot(self) -> Limits:
        return self.limits

    def pin(self, freq_hz: int) -> None:
        self.limits = Limits(freq_hz, freq_hz)

    def restore(self, limits: Limits) -> None:
        self.limits = limits

    def read(self) -> Reading:
        return Reading(self.limits.min_hz, self.limits.max_hz, self.limits.max_hz, 50.0)

    def pin_holds(self, reading: Reading | None = None) -> bool:
        return True
