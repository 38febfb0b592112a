"""A synchronous data-parallel group on simulated GPUs whose speeds differ, for the trim (governor.policy.trim).

Each step every rank computes, then all wait at the all-reduce for the slowest: the step takes the slowest rank's
compute plus the collective. A rank's compute scales with its clock for ``bound`` of it (the rest is memory-bound),
and with its GPU's speed (nominally identical GPUs differ by 8% on average and 22% at most: SC'22, "Not all GPUs are
created equal"). Power: idle plus the dynamic part, times (clock / top)^2 while computing (the fake NVML's rule); at
idle power while waiting. The constants are an H200's published figures where there are any (700 W TDP); the
exponent and the split are invented, not measured.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# SC'22: speeds of nominally identical GPUs differ by 8% on average, 22% at most.
MEAN_SPREAD_REL = 0.08
MAX_SPREAD_REL = 0.22


def gpu_speeds(count: int, rng: random.Random) -> list[float]:
    """Relative speeds at the same clock (1.0: the fastest a GPU of the kind gets): each GPU slower by a fraction
    0.22 x Beta(2, 3.5), whose mean is MEAN_SPREAD_REL and which never reaches MAX_SPREAD_REL."""
    a = 2.0
    b = a * (MAX_SPREAD_REL / MEAN_SPREAD_REL - 1.0)
    return [1.0 - MAX_SPREAD_REL * rng.betavariate(a, b) for _ in range(count)]


@dataclass
class SimGroup:
    speeds: list[float]
    levels_hz: list[int]
    compute_top_s: float = 0.100  # a nominal GPU's compute per step at the top clock
    bound: float = 0.8  # the part of the compute that scales with the clock
    collective_s: float = 0.010
    idle_w: float = 90.0
    dynamic_w: float = 560.0  # at the top clock, busy
    noise_rel: float = 0.002  # one window's step-time noise (relative s.d.)
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    @property
    def top_hz(self) -> int:
        return max(self.levels_hz)

    def compute_s(self, rank: int, hz: int) -> float:
        scale = self.bound * self.top_hz / hz + (1.0 - self.bound)
        return self.compute_top_s * scale / self.speeds[rank]

    def step_s(self, levels: list[int]) -> float:
        """The true step time with rank i at ``levels[i]``."""
        return max(self.compute_s(i, hz) for i, hz in enumerate(levels)) + self.collective_s

    def energy_j(self, levels: list[int]) -> float:
        """The group's true energy per step (J), summed over its GPUs."""
        step = self.step_s(levels)
        total = 0.0
        for i, hz in enumerate(levels):
            busy = self.compute_s(i, hz)
            total += (self.idle_w + self.dynamic_w * (hz / self.top_hz) ** 2) * busy + self.idle_w * (step - busy)
        return total

    def window(self, levels: list[int]) -> tuple[float, dict[int, float]]:
        """One measured window: the group's step time (with noise) and each rank's compute time per step."""
        step = self.step_s(levels) * (1.0 + self.rng.gauss(0.0, self.noise_rel))
        return step, {i: self.compute_s(i, hz) for i, hz in enumerate(levels)}

    def best_single_level(self) -> int:
        """One level for the whole group: the least energy per step (what the group's tuner converges on)."""
        return min(self.levels_hz, key=lambda hz: self.energy_j([hz] * len(self.speeds)))
