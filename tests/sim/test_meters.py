"""The meter-window simulation of governor/sim/tuned_job.py (bench_tuner's and tuner_bound's --meter) on a flat curve:
its windows read the curve's J/step on average, and NVML's 4-step windows on 26 ms steps scatter as the H200's did
(13-32%, issue 23)."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.bench_tuner import Run, meter_rows, target_row, wilson
from benchmarks.tuner_curves import Curve
from governor.policy.tuner import OnlineTuner
from governor.sim.tuned_job import level_windows, run_tuned_job, window_rule

STEP_S = 0.026
POWER_W = 300.0
J_PER_STEP = POWER_W * STEP_S


@pytest.mark.parametrize("meter", ["nvml", "ina3221"])
def test_windows_read_the_curves_energy_per_step_on_average(meter):
    """400 windows of 4 steps: their mean J/step within 2% of the curve's (the s.d. of that mean is about 1%)."""
    ms = level_windows(meter, J_PER_STEP, STEP_S, seed=3, windows=400)
    assert statistics.fmean(m.joules_per_step for m in ms) == pytest.approx(J_PER_STEP, rel=0.02)


def test_nvml_four_step_windows_scatter_as_the_h200s_did():
    for seed in range(3):
        j = [m.joules_per_step for m in level_windows("nvml", J_PER_STEP, STEP_S, seed=seed, windows=300)]
        assert 0.13 <= statistics.stdev(j) / statistics.fmean(j) <= 0.32


def test_windows_sized_by_the_rule_are_long_and_carry_their_noise():
    ms = level_windows("nvml", J_PER_STEP, STEP_S, seed=1, windows=20, rule=window_rule("nvml"))
    j = [m.joules_per_step for m in ms]
    assert statistics.fmean(m.measured_steps for m in ms) > 30
    assert statistics.stdev(j) / statistics.fmean(j) < 0.05
    assert all(m.noise_rel is not None for m in ms)


def test_a_job_is_charged_every_step_of_its_search():
    levels = tuple(300_000_000 + 100_000_000 * k for k in range(8))
    energy = (1.6, 1.3, 1.1, 1.0, 1.1, 1.3, 1.6, 2.0)
    curve = Curve("v", levels, energy, tuple(0.3 / (hz / 1e9) for hz in levels))
    tuner = OnlineTuner(levels, levels[-1], noise_rel=0.03, total_steps=2000)
    job = run_tuned_job(curve, levels[-1], 2000, meter="nvml", seed=0, rule="time", tuner=tuner, max_steps=200_000)
    assert job.best_hz == levels[3]
    searched = sum(n * curve.energy_at(hz) for hz, n in job.steps_at_hz.items())
    assert job.clean_energy_j == pytest.approx(searched + (2000 - job.profiled_steps) * 1.0)
    assert job.clean_energy_j > 2000 * 1.0


def test_wilson_interval():
    lo, hi = wilson(0, 100)
    assert lo == 0.0 and hi == pytest.approx(0.037, abs=0.001)
    lo, hi = wilson(10, 100)
    assert lo == pytest.approx(0.0552, abs=0.001) and hi == pytest.approx(0.1744, abs=0.001)


def _runs(level_regrets, job_regrets):
    return [Run("c", "top", "new", lv, jb, 10, 0.0, 0.0, 0.0, meter="nvml", rule="time")
            for lv, jb in zip(level_regrets, job_regrets, strict=True)]


def test_rows_give_the_p99_not_the_worst_and_the_rate_beyond_six_percent():
    runs = _runs([0.0] * 197 + [0.03, 0.07, 0.5], [0.01] * 200)
    (row,) = meter_rows("real", runs)
    assert row[4] == 200
    assert row[5] == "+0.30% / +3.00%"  # p99 by nearest rank (index 197 of 0-199), not the 50% outlier
    assert row[6].startswith("2 (1.00%, ")


def test_targets_are_marked_met_or_not():
    row = target_row("real", _runs([0.004] * 100, [0.02] * 100))
    assert row[3] == 100
    assert row[4:] == ("+0.40% (met)", "+0.40% (met)", "+2.00% (not met)", "+2.00% (met)")
