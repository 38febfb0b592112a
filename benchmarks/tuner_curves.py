"""Curves and job simulations for benchmarks/bench_tuner.py (and the tuner tests that want real shapes).

A curve is one workload's energy and time per step at each level of a table. Three sets:

- real: the measured Jetson AGX Xavier and Xavier NX inference curves (benchmarks/data/loudva, MIT, see its README): one
  curve per (board, batch_size), energy_j and latency_s per batch at each pinned GPU clock;
- adversarial: shapes made here, deterministically, to break a search that trusts a smooth U: the minimum at either
  end, flat bottoms, a plateau before the dip, two dips, a single spike up or down, on tables of 11, 15 and 25 levels;
- fine: the real curves spread over tables of 3 and 8 times as many levels (every third and every sixth curve), as a
  GPU listing dozens of clocks would show them: log energy and step time interpolated linearly between the measured
  levels. The minimum stays at a measured level, a V between its neighbours: harder for a search than a smooth
  curve, whose levels near the bottom would differ by less;
- simulated: the held-out workloads on the simulated Orin (governor.pipeline.workloads + governor.sim.energy), run
  step by step as governor/sim/tuned_job.py does (``run_model_job``).

``run_window_job`` is the per-window simulation for the first two: each window at a level returns the curve's J/step and
s/step, each times (1 + N(0, noise)); a job is the windows (warm-up steps after a change of level charged at that
level, like the measured steps) then the rest of the job at the converged level, all charged at noise-free energies.
"""

from __future__ import annotations

import csv
import math
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
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


# A follow-up that has only watched its pick for this many windows is not simulated further (benchmarks' time).
WATCHED_WINDOWS = 20


@dataclass
class JobResult:
    best_hz: int
    windows: int
    profiled_steps: int
    energy_j: float  # the whole job, exploration included, at noise-free per-step energies
    steps_at_hz: dict[int, int] = field(default_factory=dict)
    windows_by_phase: dict[str, int] = field(default_factory=dict)  # the tuner's phase when it asked for each window


def run_window_job(tuner, curve: Curve, rng: random.Random, noise: float, job_steps: int, warmup_steps: int = 1,
                   window_steps: int = 4, max_windows: int = 1000) -> JobResult:
    """Drive ``tuner`` window by window on ``curve`` with relative noise ``noise`` per window (energy and time drawn
    apart); charge every profiled step, then the rest of ``job_steps`` at the converged level. A tuner that follows
    its pick up (``follow_up``) gets windows after converging too, up to the job's end or until it has only watched
    its pick for WATCHED_WINDOWS windows (the rest is charged at the pick, as if its watch saw no drift)."""
    steps = 0
    watched = 0
    energy_j = 0.0
    pinned: int | None = None
    at: dict[int, int] = {}
    by_phase: dict[str, int] = {}
    while not tuner.converged or (tuner.follow_up and steps < job_steps and watched < WATCHED_WINDOWS):
        watched = watched + 1 if tuner.converged and not tuner.confirming else 0
        if tuner.probes >= max_windows and not tuner.converged:
            raise RuntimeError(f"{curve.name}: no convergence after {max_windows} windows")
        hz = tuner.next_level_hz()
        phase = tuner.state()["phase"]
        by_phase[phase] = by_phase.get(phase, 0) + 1
        n = window_steps + (warmup_steps if hz != pinned else 0)
        pinned = hz
        steps += n
        at[hz] = at.get(hz, 0) + n
        energy_j += n * curve.energy_at(hz)
        tuner.observe(hz, curve.energy_at(hz) * (1 + rng.gauss(0, noise)),
                      curve.time_at(hz) * (1 + rng.gauss(0, noise)))
    energy_j += max(0, job_steps - steps) * curve.energy_at(tuner.best_hz)
    return JobResult(tuner.best_hz, tuner.probes, steps, energy_j, at, by_phase)


def run_model_job(w, start_hz: int, job_steps: int, noise: float, seed: int, make_session) -> JobResult:
    """One job on the simulated Orin, step by step, as governor/sim/tuned_job.py runs it (the noisy model drives
    the windows; the session is ``make_session(levels_hz, start_hz)``); charged at the model's noise-free energies
    of the levels it ran at, so that it compares exactly with the fixed levels' noise-free jobs."""
    from governor.sim.energy import OrinEnergyModel

    model = OrinEnergyModel(noise=noise, seed=seed)
    clean = OrinEnergyModel()
    session = make_session(model.levels_hz, start_hz)
    energy_j = time_s = 0.0
    at: dict[int, int] = {}
    ran: dict[int, int] = {}  # every step's level: a tuner that follows its pick up moves it after converging
    pinned_hz = session.level_hz
    for step in range(1, job_steps + 1):
        sample = model.step(w, pinned_hz)
        energy_j += sample.energy_j
        time_s += sample.time_s
        ran[pinned_hz] = ran.get(pinned_hz, 0) + 1
        if not session.converged:
            at[pinned_hz] = at.get(pinned_hz, 0) + 1
        session.on_progress(step, energy_j, time_s)
        pinned_hz = session.level_hz
    if not session.converged:
        raise RuntimeError(f"{w.name}: no convergence in {job_steps} steps")
    best = session.tuner.best_hz
    profiled = sum(at.values())
    clean_j = sum(n * clean.expected(w, hz).energy_j for hz, n in ran.items())
    return JobResult(best, session.tuner.probes, profiled, clean_j, at)
