"""benchmarks/bench_tuner.py's tables of the meter runs: the Wilson interval, p99 rather than the worst, the targets."""

from __future__ import annotations

import pytest

from benchmarks.bench_tuner import Run, meter_rows, target_row, wilson


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
