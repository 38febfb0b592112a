"""What one characterization measurement accumulates: time, per-rail energy (integrated), utilization, clock."""

from __future__ import annotations

from dataclasses import dataclass, field

from governor.backends.rails import ENERGY_RAILS


@dataclass
class SettingMeasurement:
    """Sums over the measured steps. Energy per rail is the integral of its power over the run (J)."""

    steps: int = 0
    duration_s: float = 0.0
    rail_energy_j: dict[str, float] = field(default_factory=dict)
    util_pct_s: float = 0.0  # utilization x time, for a time-weighted mean
    util_time_s: float = 0.0  # the time over which utilization was known
    freq_hz_s: float = 0.0
    freq_time_s: float = 0.0

    @classmethod
    def start(cls) -> SettingMeasurement:
        return cls()

    def add_interval(self, duration_s: float, rails_mw: dict[str, float], util_pct: float | None,
                     freq_hz: float | None) -> None:
        """One interval at constant (average) power: a simulated step, or the span between two rail samples."""
        self.duration_s += duration_s
        for rail, mw in rails_mw.items():
            self.rail_energy_j[rail] = self.rail_energy_j.get(rail, 0.0) + mw * duration_s / 1e3
        if util_pct is not None:
            self.util_pct_s += util_pct * duration_s
            self.util_time_s += duration_s
        if freq_hz:
            self.freq_hz_s += freq_hz * duration_s
            self.freq_time_s += duration_s

    @property
    def energy_j(self) -> float:
        """Total over ENERGY_RAILS (VDDQ is fed from VIN_SYS_5V0 and is not added)."""
        return sum(self.rail_energy_j.get(r, 0.0) for r in ENERGY_RAILS)

    def rail_power_mw(self, rail: str) -> float | None:
        if rail not in self.rail_energy_j or self.duration_s <= 0:
            return None
        return self.rail_energy_j[rail] / self.duration_s * 1e3

    @property
    def gpu_util_pct(self) -> float | None:
        return self.util_pct_s / self.util_time_s if self.util_time_s > 0 else None

    @property
    def mean_freq_hz(self) -> float | None:
        return self.freq_hz_s / self.freq_time_s if self.freq_time_s > 0 else None
