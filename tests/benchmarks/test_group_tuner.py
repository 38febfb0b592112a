"""benchmarks/group_tuner.py: the real GroupCoordinator in one simulated rank, read through the simulated NVML
counter at step ends. A handful of runs, not the benchmark's figures (docs/benchmarks.md, "group-tuner")."""

from __future__ import annotations

import pytest

from benchmarks.group_tuner import run_group
from benchmarks.tuner_curves import real_curves

pytest.importorskip("torch")  # the coordinator's collectives are torch tensors


def test_a_group_sized_by_the_rule_converges_near_the_minimum_on_windows_of_seconds():
    curve = real_curves()[3]  # 27-270 ms steps: a fixed 8-step window is a few updates of the counter
    for seed in range(3):
        sized = run_group(curve, "top", seed, 2000, sized=True)
        assert sized["converged"] and sized["level"] < 0.06, sized
        assert sized["window_s"] and sized["window_s"][0] >= 1.0, sized  # at least the rule's shortest


def test_a_group_searching_from_the_bottom_closes_windows_early_where_they_read_clearly_worse():
    """The reads inside a window are collectives while the search runs: a window at a level far above the incumbent
    closes at one of them (WindowRule.differs at explore_z), as a single job's window does."""
    curve = real_curves()[3]
    runs = [run_group(curve, "bottom", seed, 2000, sized=True) for seed in range(3)]
    assert all(r["converged"] and r["level"] < 0.06 for r in runs), runs
    assert sum(r["closed_early"] for r in runs) > 0, runs
    fixed = run_group(curve, "bottom", 0, 2000, sized=False)
    assert fixed["closed_early"] == 0  # no rule: no reads inside, no early close


def test_a_group_with_fixed_windows_still_runs_as_before():
    """An older daemon (no window rule in its reply): every window 8 steps, the tuner converges on something."""
    run = run_group(real_curves()[3], "mid-table", 0, 2000, sized=False)
    assert run["converged"] and run["window_s"] and run["window_s"][0] < 1.0, run
