"""The board's measurements as training data: curves from the store's tuner windows, labels from bracketed minima,
their weights against the characterization sweeps, and the board's correction of those sweeps.

1. Board curves: the store's tuned jobs grouped by their features; each level's energy per step is the
   step-weighted mean of every window measured there. Windows at the default governor are not part of a curve.
2. Labels: a curve yields one when its least measured level has both table neighbours measured and worse (at an
   end of the table, its one neighbour).
3. Weights: a characterization sweep counts 1; a bracketed board curve BOARD_WEIGHT times its confidence (how
   clearly its neighbours are worse, in standard deviations of the difference, over Z_CLEAR, capped at 1). A sweep
   whose workload the board itself measured is replaced by the board's curve.
4. Correction: each user's board curve against the nearest characterization sweep, level by level (log energies,
   their mean removed); a level's log offset, the board's systematic departure, is applied only where at least
   MIN_AGREEING_JOBS jobs of MIN_AGREEING_UIDS users agree within AGREE_SPREAD, capped at MAX_LOG_OFFSET; every
   sweep's energies are multiplied by exp(offset) and relabelled before fitting.

The rules and the reasons for them: docs/store.md, "Retraining".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from governor.features import Features
from governor.pipeline import dataset
from governor.pipeline.dataset import Sweep

BOARD_WEIGHT = 3.0
Z_CLEAR = 2.0
NOISE_REL = 0.03  # one window's relative noise, as the daemon's tuner assumes (tuner.noise_rel)
# The correction of the sweeps (rule 4). Board B of the simulator departs by up to 0.13 at a level
# (governor/sim/learning.py), its users' curves within about 0.05 of each level's median.
MAX_LOG_OFFSET = 0.15  # |log offset| per level: at most 16% dearer or 14% cheaper than the sweeps say
AGREE_SPREAD = 0.05  # a curve agrees with a level's median within this much log energy (about 5%)
MIN_AGREEING_JOBS = 3
MIN_AGREEING_UIDS = 2


@dataclass
class BoardCurve:
    """One workload as the board measured it: level -> mean J/step, and the windows and jobs behind it."""

    features: Features
    energy_j: dict[int, float]
    windows: dict[int, int]
    jobs: int
    label_hz: int | None = None
    confidence: float = 0.0
    uids: frozenset = frozenset()  # the users whose jobs the curve pools (None: a record without one)

    @property
    def weight(self) -> float:
        return BOARD_WEIGHT * self.confidence


def feature_key(f: Features) -> tuple:
    """A workload's identity: its features rounded; an unknown gpu_util stays None (unknown is not 0% load)."""
    return (f.model_type, f.num_layers, f.hidden_size, round(f.seq_len, 1),
            None if f.gpu_util is None else round(f.gpu_util))


def feature_util(r) -> float | None:
    """The job's gpu_util as the tree means it, the load at the default governor: as recorded where the client gave
    it or the daemon measured it there; where the daemon measured it under a pin (gpu_util_at_hz: a decision that did
    not test it pins at once, and the load is read at the pin, higher at a low clock), the mean of the loads read as
    the job's windows at the default governor closed (its tuner's baseline), else unknown. Trained on the load at a
    pin, a tree split on numbers that new jobs, measured at the default governor, never show."""
    if getattr(r, "gpu_util_at_hz", None) is None:
        return None if r.gpu_util is None else float(r.gpu_util)
    loads = [w.gpu_util for w in r.windows if w.level_hz is None and w.gpu_util is not None]
    return sum(loads) / len(loads) if loads else None


def board_curves(records: Iterable, levels_hz: tuple[int, ...], by_uid: bool = False) -> list[BoardCurve]:
    """Group tuned jobs by features (and by uid, ``by_uid``); pool their windows per level (only levels of the
    characterization table). A job registered without gpu_util and never measured groups with the others of unknown
    load."""
    sums: dict[tuple, dict] = {}
    for r in records:
        wins = [w for w in r.windows if w.level_hz in levels_hz and w.joules_per_step > 0 and w.steps > 0]
        if not wins:
            continue
        f = Features(model_type=r.model_type, num_layers=r.num_layers, hidden_size=r.hidden_size,
                     seq_len=float(r.seq_len), gpu_util=feature_util(r))
        key = (*feature_key(f), r.uid if r.uid is not None else -1) if by_uid else feature_key(f)
        g = sums.setdefault(key, {"features": f, "j": {}, "steps": {}, "n": {}, "jobs": 0, "uids": set()})
        g["jobs"] += 1
        g["uids"].add(r.uid)
        for w in wins:
            g["j"][w.level_hz] = g["j"].get(w.level_hz, 0.0) + w.joules_per_step * w.steps
            g["steps"][w.level_hz] = g["steps"].get(w.level_hz, 0) + w.steps
            g["n"][w.level_hz] = g["n"].get(w.level_hz, 0) + 1
    curves = []
    for key in sorted(sums, key=lambda k: (*k[:4], -1 if k[4] is None else k[4], *k[5:])):
        g = sums[key]
        curve = BoardCurve(g["features"], {hz: g["j"][hz] / g["steps"][hz] for hz in sorted(g["j"])},
                           dict(sorted(g["n"].items())), g["jobs"], uids=frozenset(g["uids"]))
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


def shape_difference(c: BoardCurve, sweeps: list[Sweep]) -> dict[int, float] | None:
    """Per level, log(board) - log(nearest sweep), its mean over the common levels removed; None for one level."""
    levels = sweeps[0].levels_hz
    common = [hz for hz in c.energy_j if hz in levels]
    if len(common) < 2:
        return None  # one level has no shape
    s = nearest_sweep(c.features, sweeps)
    d = {hz: math.log(c.energy_j[hz]) - math.log(s.energy_j[hz]) for hz in common}
    mean = sum(d.values()) / len(d)
    return {hz: v - mean for hz, v in d.items()}


def level_offsets(curves: list[BoardCurve], sweeps: list[Sweep]) -> dict[int, float]:
    """Per level, the log offset of rule 4 (``curves``: one per workload and user, board_curves(by_uid=True)); 0
    everywhere when no level has agreement."""
    levels = sweeps[0].levels_hz
    shapes = [(c, d) for c in curves if (d := shape_difference(c, sweeps)) is not None]
    need_uids = min(MIN_AGREEING_UIDS, len({u for c, _ in shapes for u in c.uids}))
    agreed = {}
    for hz in levels:
        values = [(d[hz], c) for c, d in shapes if hz in d]
        if not values:
            continue
        median = statistics.median(v for v, _ in values)
        near = [(v, c) for v, c in values if abs(v - median) <= AGREE_SPREAD]
        uids = frozenset().union(*(c.uids for _, c in near))
        if sum(c.jobs for _, c in near) >= MIN_AGREEING_JOBS and len(uids) >= need_uids:
            mean = sum(v * c.windows[hz] for v, c in near) / sum(c.windows[hz] for _, c in near)
            agreed[hz] = max(-MAX_LOG_OFFSET, min(MAX_LOG_OFFSET, mean))
    if not agreed:
        return {hz: 0.0 for hz in levels}
    return {hz: agreed[min(agreed, key=lambda k: (abs(k - hz), k))] for hz in levels}


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


def build_samples(sweeps: list[Sweep], curves: list[BoardCurve], offsets: dict[int, float]) -> list[Sample]:
    """The training rows: the sweeps corrected by ``offsets`` (level_offsets), the board's labelled curves in their
    place where the board measured the same workload."""
    fixed = corrected(sweeps, offsets)
    labelled = [c for c in curves if c.label_hz is not None and c.confidence > 0]
    covered = {feature_key(c.features) for c in labelled}
    samples = [sweep_sample(s) for s in fixed if feature_key(s.features) not in covered]
    samples += [curve_sample(c, nearest_sweep(c.features, fixed), i) for i, c in enumerate(labelled)]
    return samples
