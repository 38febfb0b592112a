"""The oracle of benchmarks/tuner_bound.py: with exact windows it picks the minimum of its band after one window a
level; with noise it re-measures until no contender could cost more than its tolerance."""

from __future__ import annotations

import random

from benchmarks.tuner_bound import oracle_pick
from benchmarks.tuner_curves import Curve

LEVELS = tuple(300_000_000 + 100_000_000 * k for k in range(8))


def curve(energy):
    return Curve("test", LEVELS, tuple(energy), tuple(0.1 for _ in LEVELS))


def test_exact_windows_pick_the_minimum_of_the_band_once_each():
    c = curve([1.5, 1.2, 1.05, 1.0, 1.08, 1.3, 1.6, 2.0])  # band 10%: levels 2, 3, 4
    regret, windows = oracle_pick(c, band=0.10, z=2.0, tol=1.2, noise=1e-9, rng=random.Random(0))
    assert regret == 0.0 and windows == 3


def test_noisy_close_levels_get_more_windows_and_far_ones_none():
    c = curve([1.5, 1.2, 1.02, 1.0, 1.01, 1.3, 1.6, 2.0])
    regret, windows = oracle_pick(c, band=0.10, z=2.5, tol=1.2, noise=0.03, rng=random.Random(1))
    assert windows > 3 and regret <= 0.02
