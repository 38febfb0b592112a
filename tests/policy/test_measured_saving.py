"""governor.policy.measured_saving: a tuned job's measured saving, the tuned side's steps and its own uncertainty."""

from __future__ import annotations

import math
import random

import pytest

from governor.policy.measured_saving import MeasuredSaving
from governor.policy.windows import Measurement

PICK, OTHER = 800_000_000, 900_000_000
BASELINE = Measurement(None, 2.0, 0.5, 100, 101, noise_rel=0.01, duration_s=50.0)


def _points(start: tuple[float, float, float], steps: int, joules: float, step_s: list[float]) -> list:
    """Step-end points from ``start``: ``joules`` a step at a steady power (so a step's energy is its time's share)."""
    n, e, t = start
    power_w = joules / (sum(step_s) / len(step_s))
    out = []
    for k in range(steps):
        n, e, t = n + 1, e + power_w * step_s[k], t + step_s[k]
        out.append((n, e, t))
    return out


def test_the_tuned_side_is_every_step_at_the_pick_once_the_meter_settled():
    s = MeasuredSaving(0.03, 4, meter_update_s=0.1, settle_s=1.0)
    pts = _points((0, 0.0, 0.0), 400, 1.5, [0.5] * 400)
    s.converged_at(PICK, pts[:200])
    s.interrupt()  # a confirmation window elsewhere
    s.window_at_pick(Measurement(OTHER, 9.0, 0.5, 20, 21, noise_rel=0.02, duration_s=10.0))
    s.window_at_pick(Measurement(PICK, 1.5, 0.5, 20, 21, noise_rel=0.02, duration_s=10.0))
    s.converged_at(PICK, pts[200:])
    out = s.result(BASELINE, PICK, [])
    # Each stretch begins 1 s (two steps) after its first point: 200 - 1 - 2 steps in each, and the window's 20.
    assert out["tuned_steps"] == 2 * 197 + 20 and out["tuned_over"] == "steps after convergence"
    assert out["saved_pct"] == pytest.approx(25.0) and out["tuned_j_per_step"] == pytest.approx(1.5)
    assert out["baseline_steps"] == 100 and out["measured_steps"] == 100 + 414


def test_the_tuned_sides_uncertainty_is_its_steps_scatter_over_their_number():
    rng = random.Random(4)
    for cv, steps in ((0.15, 1000), (0.15, 4000), (0.05, 1000)):
        s = MeasuredSaving(0.03, 4, meter_update_s=0.1)
        times = [rng.gammavariate(1 / cv**2, 0.5 * cv**2) for _ in range(steps + 1)]
        s.converged_at(PICK, [(0, 0.0, 0.0), *_points((0, 0.0, 0.0), steps, 1.5, times)])
        out = s.result(BASELINE, PICK, [])
        expected = math.hypot(cv / math.sqrt(steps), 0.1 / (0.5 * steps * math.sqrt(6)))
        assert out["tuned_rel"] == pytest.approx(expected, rel=0.15), (cv, steps)
        # The saving's s.d.: the ratio times the two sides' in quadrature.
        ratio = out["tuned_j_per_step"] / 2.0
        assert out["saved_pct_err"] == pytest.approx(100 * ratio * math.hypot(0.01, out["tuned_rel"]), abs=0.01)


def test_a_stretch_shared_with_another_job_leaves_the_tuner_windows_as_the_tuned_side():
    s = MeasuredSaving(0.03, 4)
    s.converged_at(PICK, _points((0, 0.0, 0.0), 100, 1.5, [0.5] * 100))
    s.shared()
    windows = [Measurement(PICK, 1.6, 0.5, 10, 11, noise_rel=0.02), Measurement(OTHER, 1.8, 0.4, 10, 11)]
    out = s.result(BASELINE, PICK, windows)
    assert out["tuned_over"] == "tuner windows" and out["tuned_steps"] == 10
    assert out["saved_pct"] == pytest.approx(20.0) and out["tuned_rel"] == pytest.approx(0.03)  # the prior's floor


def test_no_tuned_side_no_saving():
    assert MeasuredSaving(0.03, 4).result(BASELINE, PICK, []) is None
