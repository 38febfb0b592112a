"""governor.policy.trim on the simulated group of governor.sim.groups: the ranks that wait are lowered, the slowest
is not, the step time stays within the tolerance, and a trial that slows the group is undone."""

from __future__ import annotations

import random

import pytest

from governor.policy.trim import Trimmer
from governor.sim.groups import MAX_SPREAD_REL, SimGroup, gpu_speeds

LEVELS_HZ = [hz * 1_000_000 for hz in range(345, 1981, 15)]  # an H200's table


def trim(group: SimGroup, level_hz: int, windows: int = 400) -> Trimmer:
    t = Trimmer(LEVELS_HZ, level_hz, list(range(len(group.speeds))))
    for _ in range(windows):
        levels = [t.level_of(r) for r in range(len(group.speeds))]
        t.observe(*group.window(levels))
        if t.done:
            break
    return t


def test_the_speeds_spread_as_measured():
    speeds = gpu_speeds(10_000, random.Random(1))
    assert 0.075 < sum(1 - s for s in speeds) / len(speeds) < 0.085  # 8% slower than the fastest, on average
    assert 1 - MAX_SPREAD_REL < min(speeds) and max(speeds) <= 1.0


@pytest.mark.parametrize("seed", range(5))
def test_each_rank_is_lowered_until_one_level_more_would_slow_the_group(seed):
    rng = random.Random(seed)
    group = SimGroup(gpu_speeds(8, rng), LEVELS_HZ, noise_rel=0.0, rng=rng)
    level = group.best_single_level()
    t = trim(group, level)
    assert t.done
    final = [t.level_of(r) for r in range(8)]
    slowest = min(range(8), key=lambda r: group.speeds[r])
    assert final[slowest] == level and all(hz <= level for hz in final) and any(hz < level for hz in final)
    reference = group.step_s([level] * 8)
    for r, hz in enumerate(final):
        if r != slowest and hz > LEVELS_HZ[0]:
            lower = list(final)
            lower[r] = LEVELS_HZ[LEVELS_HZ.index(hz) - 1]
            assert group.step_s(lower) > reference * (1 + t.tolerance_rel), (r, hz)
    assert group.step_s(final) <= reference * (1 + t.tolerance_rel)
    assert group.energy_j(final) < group.energy_j([level] * 8)


@pytest.mark.parametrize("seed", range(5))
def test_with_noisy_windows_the_group_stays_within_one_percent(seed):
    rng = random.Random(seed)
    group = SimGroup(gpu_speeds(8, rng), LEVELS_HZ, rng=rng)
    level = group.best_single_level()
    t = trim(group, level)
    final = [t.level_of(r) for r in range(8)]
    assert t.done and group.step_s(final) <= group.step_s([level] * 8) * 1.01
    assert group.energy_j(final) < group.energy_j([level] * 8)


def test_a_trial_that_slows_the_group_is_undone():
    group = SimGroup([1.0, 1.0], LEVELS_HZ, noise_rel=0.0)  # equal GPUs: no rank waits
    level = group.best_single_level()
    t = trim(group, level)
    assert t.done and [t.level_of(r) for r in range(2)] == [level, level]
    assert t.windows == 2  # the reference, and the one trial undone


def test_a_rise_after_the_trials_gives_back_the_last_level_taken():
    t = Trimmer(LEVELS_HZ, LEVELS_HZ[50], ["a", "b"], tolerance_rel=0.005)
    t.observe(1.0, {"a": 0.5, "b": 0.9})
    assert t.trying == "a" and t.level_of("a") == LEVELS_HZ[49]
    t.observe(1.0)  # kept: a goes one lower
    t.observe(1.02)  # rose: back one, and a is done; b sets the step time and is never tried
    assert t.done and t.level_of("a") == LEVELS_HZ[49] and t.level_of("b") == LEVELS_HZ[50]
    t.observe(1.02)  # drift later: the last level taken is given back
    assert t.level_of("a") == LEVELS_HZ[50]
