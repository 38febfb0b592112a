"""Curves for benchmarks/bench_tuner.py and tuner_bound.py (and the tuner tests that want real shapes).

A curve is one workload's energy and time per step at each level of a table. Three sets (bench_tuner's fourth,
simulated, runs the energy model's workloads):

- real: the measured Jetson AGX Xavier and Xavier NX inference curves (benchmarks/data/loudva, MIT, see its README): one
  curve per (board, batch_size), energy_j and latency_s per batch at each pinned GPU clock;
- adversarial: shapes made here, deterministically, to break a search that trusts a smooth U: the minimum at either
  end, flat bottoms, a plateau before the dip, two dips, a single spike up or down, on tables of 11, 15 and 25 levels;
- fine: the real curves spread over tables of 3 and 8 times as many levels (every third and every sixth curve), as a
  GPU listing dozens of clocks would show them: log energy and step time interpolated linearly between the measured
  levels. The minimum stays at a measured level, a V between its neighbours: harder for a search than a smooth
  curve, whose levels near the bottom would differ by less.

A Curve is a board of governor/sim/tuned_job.py, whose one loop runs the benchmarks' jobs on it through a meter.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO / "benchmarks" / "data" / "loudva"  # shipped in the repo: every clone can run the benchmarks


@dataclass(frozen=True)
class Curve:
    name: str
    levels_hz: tuple[int, ...]
    energy_j: tuple[float, ...]  # per step, noise-free, one per level
    time_s: tuple[float, ...]

    def best_index(self, max_slowdown: float | None = None) -> int:
        feasible = [i for i in range(len(self.levels_hz))
                    if max_slowdown is None or self.time_s[i] <= (1 + max_slowdown) * self.time_s[-1]]
        return min(feasible, key=lambda i: self.energy_j[i])

    def energy_at(self, hz: int) -> float:
        return self.energy_j[self.levels_hz.index(hz)]

    def time_at(self, hz: int) -> float:
        return self.time_s[self.levels_hz.index(hz)]

    # A Board of governor.sim.tuned_job: every step at a level is the curve's, noise-free (a meter adds the noise).
    def expected(self, hz: int) -> tuple[float, float]:
        i = self.levels_hz.index(hz)
        return self.energy_j[i], self.time_s[i]

    step = expected


def real_curves(data_dir: Path = DEFAULT_DATA) -> list[Curve]:
    """The Jetson curves, one per (board, batch_size), levels ascending."""
    rows: dict[tuple[str, int], list[tuple[int, float, float]]] = defaultdict(list)
    with open(Path(data_dir) / "jetson_inference_dvfs.csv", newline="") as f:
        for r in csv.DictReader(f):
            rows[(r["board"], int(r["batch_size"]))].append(
                (int(r["gpu_freq_hz"]), float(r["energy_j"]), float(r["latency_s"])))
    curves = []
    for (board, batch), pts in sorted(rows.items()):
        pts.sort()
        curves.append(Curve(f"{board}/b{batch}", tuple(p[0] for p in pts), tuple(p[1] for p in pts),
                            tuple(p[2] for p in pts)))
    return curves


def spread(curve: Curve, factor: int) -> Curve:
    """``curve`` on a table of ``factor`` times as many levels: ``factor - 1`` levels between each measured pair, log
    energy and step time linear in between (levels rounded to 100 kHz, as the Jetson tables are)."""
    levels, energy, times = [], [], []
    for k in range(len(curve.levels_hz) - 1):
        for j in range(factor):
            f = j / factor
            levels.append(int(round((curve.levels_hz[k] * (1 - f) + curve.levels_hz[k + 1] * f) / 1e5)) * 100000)
            energy.append(math.exp(math.log(curve.energy_j[k]) * (1 - f) + math.log(curve.energy_j[k + 1]) * f))
            times.append(curve.time_s[k] * (1 - f) + curve.time_s[k + 1] * f)
    return Curve(f"{curve.name}x{factor}", (*levels, curve.levels_hz[-1]), (*energy, curve.energy_j[-1]),
                 (*times, curve.time_s[-1]))


def paced(curve: Curve, top_step_s: float) -> Curve:
    """``curve`` with its steps scaled so that the top level's takes ``top_step_s``: energy and time per step by the
    same factor, every level's power and the curve's shape unchanged (LoudVA's batches take 27 ms to 13 s; a
    fine-tuning step on a large GPU, 25-80 ms)."""
    f = top_step_s / curve.time_s[-1]
    return Curve(f"{curve.name}@{1000 * top_step_s:g}ms", curve.levels_hz, tuple(e * f for e in curve.energy_j),
                 tuple(t * f for t in curve.time_s))


def fine_curves(data_dir: Path = DEFAULT_DATA) -> list[Curve]:
    """Every third real curve on a table 3 times as fine, every sixth 8 times (about 40 and 100 levels)."""
    real = real_curves(data_dir)
    return [spread(c, 3) for c in real[::3]] + [spread(c, 8) for c in real[::6]]


def _table(n: int) -> tuple[int, ...]:
    return tuple(int(round((300e6 + k * 1000e6 / (n - 1)) / 1e5)) * 100000 for k in range(n))  # 300-1300 MHz


def adversarial_curves(sizes: tuple[int, ...] = (11, 15, 25)) -> list[Curve]:
    """Shapes that a walk trusting a smooth U gets wrong, each on tables of 11, 15 and 25 levels (x in [0, 1] across
    the table). Step time is a + b/f (compute-bound with a fixed part), so max_slowdown can be tried on them too."""
    def u(x, at, width=0.5):
        return ((x - at) / width) ** 2 * 0.25

    shapes: dict[str, Callable[[float], float]] = {
        "min-at-bottom": lambda x: 0.6 * x ** 1.5,
        "min-at-top": lambda x: 0.6 * (1 - x) ** 1.5,
        "min-at-top-shallow": lambda x: 0.08 * (1 - x),
        "min-at-bottom-shallow": lambda x: 0.08 * x,
        "flat-bottom": lambda x: 1.5 * max(0.0, abs(x - 0.5) - 0.2) ** 2,
        "flat-bottom-low": lambda x: 1.5 * max(0.0, abs(x - 0.3) - 0.15) ** 2,
        "plateau-then-dip-low": lambda x: (0.12 if x > 0.45 else 0.0) + u(x, 0.25) + 0.02 * max(0.0, x - 0.45),
        "plateau-then-dip-high": lambda x: (0.12 if x < 0.55 else 0.0) + u(x, 0.78) + 0.02 * max(0.0, 0.55 - x),
        "two-dips-global-high": lambda x: min(u(x, 0.3, 0.35) + 0.06, u(x, 0.75, 0.35)),
        "two-dips-global-low": lambda x: min(u(x, 0.3, 0.35), u(x, 0.75, 0.35) + 0.06),
        "spike-up-on-descent": lambda x: u(x, 0.45) + (0.3 if abs(x - 0.7) < 0.04 else 0.0),
        "spike-down-far": lambda x: u(x, 0.45) - (0.15 if abs(x - 0.85) < 0.04 else 0.0),
        "steep-u-high": lambda x: u(x, 0.85, 0.25),
        "steep-u-low": lambda x: u(x, 0.15, 0.25),
    }
    curves = []
    for n in sizes:
        levels = _table(n)
        for name, shape in shapes.items():
            xs = [k / (n - 1) for k in range(n)]
            energy = tuple(1.0 + shape(x) for x in xs)
            times = tuple(0.05 + 0.2 / (hz / 1e9) for hz in levels)
            curves.append(Curve(f"{name}/{n}", levels, energy, times))
    return curves
