"""The board's measurements as training data: curves from the store's tuner windows, labels from bracketed minima,
their weights against the characterization sweeps, and the board's correction of those sweeps. The rules:

1. Board curves. The store's tuned jobs are grouped by their features (one group per workload the board ran); each
   level's energy per step is the step-weighted mean of every window measured there, over every job of the group.
   Windows at the default governor (no level) are not part of a curve.
2. Labels. A curve yields a label when its windows bracket a minimum: the least measured level has both table
   neighbours measured and worse (at an end of the table, its one neighbour). The label is that level.
3. A partial curve against a full sweep. A characterization sweep measures every level (50 steps each) and counts
   with weight 1. A bracketed board curve counts BOARD_WEIGHT (it is this board, where the sweep is the simulated or
   reference board), times its confidence: how clearly its neighbours are worse, in standard deviations of the
   difference (``noise_rel`` per window, pooled over the windows behind each level), divided by Z_CLEAR and capped
   at 1. A minimum bracketed by a hair counts little; one confirmed over several jobs counts fully. A sweep whose
   workload the board itself measured (same features) is replaced by the board's curve.
4. The board's curves correct the simulated ones. Each board curve is compared, level by level, with the nearest
   characterization sweep (same model type, nearest in log layers, log hidden size, log sequence length and
   utilization): the difference of their log energies with its mean over the common levels removed (the shape, not
   the scale: the workloads differ in size). Pooled over the board's curves (weighted by windows) this is one log
   offset per level, the board's systematic departure (its voltage table, leakage, memory: what shifts every
   workload's curve alike); levels the board never measured take the nearest measured level's offset. Every sweep's
   energies are multiplied by exp(offset) and relabelled (1-2-1 smoothed optimum, as in training) before fitting.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from governor.features import Features
from governor.pipeline import dataset
from governor.pipeline.dataset import Sweep

BOARD_WEIGHT = 3.0
Z_CLEAR = 2.0
NOISE_REL = 0.03  # one window's relative noise, as the daemon's tuner assumes (tuner.noise_rel)


@dataclass
class BoardCurve:
    """One workload as the board measured it: level -> mean J/step, and the windows and jobs behind it."""

    features: Features
    energy_j: dict[int, float]
    windows: dict[int, int]
    jobs: int
    label_hz: int | None = None
    confidence: float = 0.0

    @property
    def weight(self) -> float:
        return BOARD_WEIGHT * self.confidence


def feature_key(f: Features) -> tuple:
    """A workload's identity: its features rounded; an unknown gpu_util stays None (unknown is not 0% load)."""
    return (f.model_type, f.num_layers, f.hidden_size, round(f.seq_len, 1),
            None if f.gpu_util is None else round(f.gpu_util))


def board_curves(records: Iterable, levels_hz: tuple[int, ...]) -> list[BoardCurve]:
    """Group tuned jobs by features; pool their windows per level (only levels of the characterization table).
    A job registered without gpu_util and never measured groups with the others of unknown load."""
    sums: dict[tuple, dict] = {}
    for r in records:
        wins = [w for w in r.windows if w.level_hz in levels_hz and w.joules_per_step > 0 and w.steps > 0]
        if not wins:
            continue
        f = Features(model_type=r.model_type, num_layers=r.num_layers, hidden_size=r.hidden_size,
                     seq_len=float(r.seq_len), gpu_util=None if r.gpu_util is None else float(r.gpu_util))
        g = sums.setdefault(feature_key(f), {"features": f, "j": {}, "steps": {}, "n": {}, "jobs": 0})
        g["jobs"] += 1
        for w in wins:
            g["j"][w.level_hz] = g["j"].get(w.level_hz, 0.0) + w.joules_per_step * w.steps
            g["steps"][w.level_hz] = g["steps"].get(w.level_hz, 0) + w.steps
            g["n"][w.level_hz] = g["n"].get(w.level_hz, 0) + 1
    curves = []
    for key in sorted(sums, key=lambda k: (*k[:4], -1 if k[4] is None else k[4])):
        g = sums[key]
        curve = BoardCurve(g["features"], {hz: g["j"][hz] / g["steps"][hz] for hz in sorted(g["j"])},
                           dict(sorted(g["n"].items())), g["jobs"])
        curve.label_hz, curve.confidence = bracket(curve, levels_hz)
        curves.append(curve)
    return curves


def bracket(curve: BoardCurve, levels_hz: tuple[int, ...],
            noise_rel: float = NOISE_REL) -> tuple[int | None, float]:
    """(label, confidence) when the measured minimum has worse measured neighbours on both sides, else (None, 0)."""
    best = min(curve.energy_j, key=lambda hz: (curve.energy_j[hz], hz))
    i = levels_hz.index(best)
    neighbours = [levels_hz[j] for j in (i - 1, i + 1) if 0 <= j < len(levels_hz)]
    if any(hz not in curve.energy_j for hz in neighbours):
        return None, 0.0
    z = min(math.log(curve.energy_j[hz] / curve.energy_j[best])
            / (noise_rel * math.sqrt(1 / curve.windows[hz] + 1 / curve.windows[best])) for hz in neighbours)
    return best, min(1.0, max(z, 0.0) / Z_CLEAR)


def _distance(a: Features, b: Features) -> float:
    if a.model_type != b.model_type:
        return math.inf
    return math.dist((math.log(a.num_layers), math.log(a.hidden_size), math.log(a.seq_len), (a.gpu_util or 0) / 25),
                     (math.log(b.num_layers), math.log(b.hidden_size), math.log(b.seq_len), (b.gpu_util or 0) / 25))


def nearest_sweep(f: Features, sweeps: list[Sweep]) -> Sweep:
    return min(sweeps, key=lambda s: (_distance(f, s.features), s.workload))


def level_offsets(curves: list[BoardCurve], sweeps: list[Sweep]) -> dict[int, float]:
    """Per level, the pooled log-energy shape difference board - nearest sweep; 0 everywhere without board curves."""
    levels = sweeps[0].levels_hz
    num = {hz: 0.0 for hz in levels}
    den = {hz: 0.0 for hz in levels}
    for c in curves:
        common = [hz for hz in c.energy_j if hz in levels]
        if len(common) < 2:
            continue  # one level has no shape
        s = nearest_sweep(c.features, sweeps)
        d = {hz: math.log(c.energy_j[hz]) - math.log(s.energy_j[hz]) for hz in common}
        mean = sum(d.values()) / len(d)
        for hz in common:
            num[hz] += c.windows[hz] * (d[hz] - mean)
            den[hz] += c.windows[hz]
    known = [hz for hz in levels if den[hz] > 0]
    if not known:
        return {hz: 0.0 for hz in levels}
    out = {}
    for hz in levels:
        nearest = hz if den[hz] > 0 else min(known, key=lambda k: (abs(k - hz), k))
        out[hz] = num[nearest] / den[nearest]
    return out


def corrected(sweeps: list[Sweep], offsets: dict[int, float]) -> list[Sweep]:
    return [replace(s, energy_j={hz: e * math.exp(offsets.get(hz, 0.0)) for hz, e in s.energy_j.items()})
            for s in sweeps]


@dataclass
class Sample:
    """One training row: features, label, weight, and how to price any level (for regret)."""

    name: str
    features: Features
    label_hz: int
    weight: float
    energy_at: Callable[[int], tuple[float, bool]]  # level -> (energy per step, estimated?)
    optimum_j: float  # the least energy per step measured


def sweep_sample(s: Sweep) -> Sample:
    return Sample(s.workload, s.features, dataset.label_hz(s), 1.0, lambda hz, s=s: (s.energy_j[hz], False),
                  min(s.energy_j.values()))


def curve_sample(c: BoardCurve, reference: Sweep, index: int) -> Sample:
    def energy_at(hz: int) -> tuple[float, bool]:
        if hz in c.energy_j:
            return c.energy_j[hz], False
        m = min(c.energy_j, key=lambda k: (abs(k - hz), k))  # nearest measured level, scaled by the sweep's shape
        return c.energy_j[m] * reference.energy_j[hz] / reference.energy_j[m], True

    return Sample(f"board/{index}", c.features, c.label_hz, c.weight, energy_at, c.energy_j[c.label_hz])


def regret_pct(sample: Sample, hz: int) -> tuple[float, bool]:
    """Against the least energy measured (a sweep's raw minimum, as Sweep.regret_pct and the fit stage measure it;
    a board curve's bracketed minimum), not the label: a sweep's label is the smoothed one, which a pick can beat."""
    e, est = sample.energy_at(hz)
    return 100.0 * (e / sample.optimum_j - 1.0), est


def build_samples(sweeps: list[Sweep], curves: list[BoardCurve],
                  correct: bool = True) -> tuple[list[Sample], dict[int, float]]:
    offsets = level_offsets(curves, sweeps) if correct else {hz: 0.0 for hz in sweeps[0].levels_hz}
    fixed = corrected(sweeps, offsets)
    labelled = [c for c in curves if c.label_hz is not None and c.confidence > 0]
    covered = {feature_key(c.features) for c in labelled}
    samples = [sweep_sample(s) for s in fixed if feature_key(s.features) not in covered]
    samples += [curve_sample(c, nearest_sweep(c.features, fixed), i) for i, c in enumerate(labelled)]
    return samples, offsets
